#!/usr/bin/env python3
"""The official `openai` Python client against `emberlm serve-api`: tool calling on the tiny
Qwen 2 fixture with a chat template that reads `tools` (the same as tests/e2e/openai.test.mjs
uses). Calls greedy and in 20 seeded samples, each call's arguments valid against its
function's parameters; a streamed answer gives the calls the whole one gives; the results go
back and the model answers in text; `tool_choice` forms; bad definitions refused with a 400
naming the tool.

Run by `./build.sh test` with the client unpacked into .cache/pyclient (on PYTHONPATH):
  PYTHONPATH=.cache/pyclient python3 tests/e2e/openai_python.py
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.environ.get("EMBERLM_BIN", os.path.join(ROOT, "target", "debug", "emberlm"))
MODEL = os.path.join(ROOT, "tests", "fixtures", "tiny-qwen2-f32.gguf")
TEMPLATE = (
    "{% if tools %}Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}</tool_call>{% endfor %}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        }, "required": ["city", "unit"]},
    }},
    {"type": "function", "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": -99, "maximum": 99},
            "b": {"type": "integer", "minimum": -99, "maximum": 99},
        }, "required": ["a", "b"], "additionalProperties": False},
    }},
]


def check_arguments(test, name, arguments):
    """The arguments (JSON text) satisfy the parameters of `name` (checked by hand: the two
    schemas above, closed as emberlm holds them)."""
    args = json.loads(arguments)
    test.assertIsInstance(args, dict, arguments)
    if name == "get_weather":
        test.assertEqual(set(args), {"city", "unit"}, arguments)
        test.assertIsInstance(args["city"], str)
        test.assertLessEqual(len(args["city"]), 12, arguments)
        test.assertIn(args["unit"], ("celsius", "fahrenheit"))
    elif name == "add":
        test.assertEqual(set(args), {"a", "b"}, arguments)
        for v in args.values():
            test.assertTrue(isinstance(v, int) and not isinstance(v, bool) and -99 <= v <= 99, arguments)
    else:
        test.fail(f"a call to an unknown tool {name}")


class ToolCalling(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(BINARY):
            raise unittest.SkipTest(f"{BINARY} is missing: cargo build --bin emberlm")
        cls.template = tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False)
        cls.template.write(TEMPLATE)
        cls.template.close()
        cls.server = subprocess.Popen(
            [BINARY, "serve-api", "--device", "cpu", "--port", "0", "--model", MODEL,
             "--chat-template", cls.template.name],
            stdout=subprocess.PIPE, text=True)
        line = cls.server.stdout.readline()
        match = re.search(r"http://\S+/v1/", line)
        if not match:
            cls.server.kill()
            raise RuntimeError(f"serve-api printed no address: {line!r}")
        cls.client = openai.OpenAI(api_key="unused", base_url=match.group(0), max_retries=0)

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.server.wait()
        os.unlink(cls.template.name)

    def ask(self, **extra):
        request = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Oslo, and 2+3?"}],
                   "tools": TOOLS, "max_tokens": 180}
        request.update(extra)
        return self.client.chat.completions.create(**request)

    def test_every_call_parses_and_satisfies_its_schema(self):
        for seed in range(21):
            sampling = {"seed": seed} if seed < 20 else {"temperature": 0}
            answer = self.ask(tool_choice="required", **sampling)
            choice = answer.choices[0]
            self.assertTrue(choice.message.tool_calls, answer.model_dump_json())
            if choice.finish_reason != "length":
                self.assertEqual(choice.finish_reason, "tool_calls")
            for call in choice.message.tool_calls:
                self.assertEqual(call.type, "function")
                self.assertTrue(call.id.startswith("call_"), call.id)
                check_arguments(self, call.function.name, call.function.arguments)

    def test_a_round_trip_streamed_and_whole(self):
        whole = self.ask(tool_choice="required", seed=3)
        calls = whole.choices[0].message.tool_calls
        items = []
        finish = None
        for chunk in self.ask(tool_choice="required", seed=3, stream=True):
            if chunk.choices:
                items.extend(chunk.choices[0].delta.tool_calls or [])
                finish = chunk.choices[0].finish_reason or finish
        self.assertEqual([i.index for i in items], list(range(len(calls))))
        self.assertEqual([(i.function.name, i.function.arguments) for i in items],
                         [(c.function.name, c.function.arguments) for c in calls])
        self.assertEqual(finish, whole.choices[0].finish_reason)

        # the assistant message goes back as the client returned it, then one result per call
        messages = [{"role": "user", "content": "Weather in Oslo, and 2+3?"},
                    whole.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "21"} for c in calls]
        final = self.client.chat.completions.create(
            model="tiny", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=6, seed=1)
        self.assertIsInstance(final.choices[0].message.content, str)
        self.assertIsNone(final.choices[0].message.tool_calls)

    def test_a_named_function_is_called_once(self):
        answer = self.ask(tool_choice={"type": "function", "function": {"name": "add"}}, temperature=0)
        calls = answer.choices[0].message.tool_calls
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0].function.name, "add")
        check_arguments(self, "add", calls[0].function.arguments)

    def test_bad_definitions_are_refused_naming_the_tool(self):
        with self.assertRaises(openai.BadRequestError) as caught:
            self.ask(tools=[TOOLS[1], TOOLS[1]])
        self.assertIn("`add`", str(caught.exception))
        broken = {"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"q": {"$ref": "#/nowhere"}}}}}
        with self.assertRaises(openai.BadRequestError) as caught:
            self.ask(tools=[TOOLS[0], broken])
        self.assertIn("tools[1] (`lookup`)", str(caught.exception))


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() and not result.skipped else 1)
