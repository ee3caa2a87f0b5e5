// The official `openai` npm client against emberlm: `emberlm serve-api` over HTTP, and the
// page's Engine (the WebAssembly build on its CPU backend, run here in Node) through the
// `openaiFetch` shim of www/openai_fetch.js. Both give the documented response shapes, honour
// a JSON schema, stream, and report bad requests as API errors naming the field. The worker
// client (`EngineClient`) answers the same API in headless Chromium.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import Ajv from 'ajv';
import OpenAI from 'openai';

const MODEL = resolve('tests/fixtures/tiny-llama-f32.gguf');
// the tool-calling checks: the same size with 256 positions, room for a call and its answer
const TOOL_MODEL = resolve('tests/fixtures/tiny-qwen2-f32.gguf');
const BINARY = resolve(process.env.EMBERLM_BIN ?? 'target/debug/emberlm');

const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', pattern: '^[a-z]{1,8}$' },
    n: { type: 'integer', minimum: 0, maximum: 99 },
  },
  required: ['name', 'n'],
  additionalProperties: false,
};

function checkRecord(text) {
  const value = JSON.parse(text);
  assert.deepEqual(Object.keys(value).sort(), ['n', 'name'], text);
  assert.match(value.name, /^[a-z]{1,8}$/, text);
  assert.ok(Number.isInteger(value.n) && value.n >= 0 && value.n <= 99, text);
}

// A chat template that reads `tools` and writes Hermes-style calls (short enough for the tiny
// model's 128 positions), and the tools of the tool-calling checks.
const TOOLS_TEMPLATE =
  '{% if tools %}Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}' +
  '{% for m in messages %}{{ m.role }}: {{ m.content }}' +
  '{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}</tool_call>{% endfor %}\n{% endfor %}' +
  '{% if add_generation_prompt %}assistant:{% endif %}';
const TEMPLATE_FILE = join(tmpdir(), `emberlm-tools-${process.pid}.jinja`);
writeFileSync(TEMPLATE_FILE, TOOLS_TEMPLATE);

const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Current weather in a city',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['celsius', 'fahrenheit'] } },
        required: ['city', 'unit'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'add',
      parameters: {
        type: 'object',
        properties: { a: { type: 'integer', minimum: -99, maximum: 99 }, b: { type: 'integer', minimum: -99, maximum: 99 } },
        required: ['a', 'b'],
        additionalProperties: false,
      },
    },
  },
];

const ajv = new Ajv({ allErrors: true });
const validators = Object.fromEntries(TOOLS.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));

function checkCall(call) {
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_/);
  const validate = validators[call.function.name];
  assert.ok(validate, `a call to an unknown tool: ${JSON.stringify(call)}`);
  const args = JSON.parse(call.function.arguments);
  assert.ok(validate(args), `${call.function.arguments}: ${ajv.errorsText(validate.errors)}`);
  // parameters without additionalProperties are held closed
  for (const key of Object.keys(args)) {
    const schema = TOOLS.find((t) => t.function.name === call.function.name).function.parameters;
    assert.ok(key in schema.properties, `${key} in ${call.function.arguments}`);
  }
}

// Tool calling for any client whose model has TOOLS_TEMPLATE: calls greedy and in 20 seeded
// samples, the stream giving the calls the whole answer gives, the results sent back, the
// choices, and bad definitions refused naming the tool.
async function exerciseTools(client) {
  const messages = [{ role: 'user', content: 'Weather in Oslo, and 2+3?' }];
  const ask = (extra) => client.chat.completions.create({ model: 'tiny', messages, tools: TOOLS, max_tokens: 180, ...extra });
  for (let seed = 0; seed < 21; seed += 1) {
    // seed 20 stands for greedy
    const sampling = seed < 20 ? { seed } : { temperature: 0 };
    const answer = await ask({ tool_choice: 'required', ...sampling });
    const choice = answer.choices[0];
    assert.ok(choice.message.tool_calls?.length > 0, JSON.stringify(answer));
    if (choice.finish_reason !== 'length') assert.equal(choice.finish_reason, 'tool_calls');
    choice.message.tool_calls.forEach(checkCall);
  }
  const whole = await ask({ tool_choice: 'required', seed: 3 });
  const stream = await ask({ tool_choice: 'required', seed: 3, stream: true });
  const items = [];
  let finish = null;
  for await (const chunk of stream) {
    items.push(...(chunk.choices[0]?.delta?.tool_calls ?? []));
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  const calls = whole.choices[0].message.tool_calls;
  assert.deepEqual(items.map((i) => i.index), calls.map((_, k) => k));
  assert.deepEqual(items.map((i) => i.function), calls.map((c) => c.function));
  assert.equal(finish, whole.choices[0].finish_reason);

  // the results go back (the assistant message as the client got it) and the answer is text
  const history = [...messages, whole.choices[0].message, ...calls.map((c) => ({ role: 'tool', tool_call_id: c.id, content: '21' }))];
  const final = await client.chat.completions.create({ messages: history, tools: TOOLS, tool_choice: 'none', max_tokens: 6, seed: 1 });
  assert.equal(typeof final.choices[0].message.content, 'string');
  assert.equal(final.choices[0].message.tool_calls, undefined);

  const named = await ask({ tool_choice: { type: 'function', function: { name: 'add' } }, temperature: 0 });
  assert.equal(named.choices[0].message.tool_calls.length, 1);
  assert.equal(named.choices[0].message.tool_calls[0].function.name, 'add');
  checkCall(named.choices[0].message.tool_calls[0]);

  await assert.rejects(
    ask({ tools: [TOOLS[1], TOOLS[1]] }),
    (error) => error instanceof OpenAI.BadRequestError && /`add`/.test(error.message),
  );
}

// The same checks for any client: a schema-constrained chat (n = 2), a stream, a plain
// completion, the models list and a refused request.
async function exercise(client) {
  const models = await client.models.list();
  assert.equal(models.data[0].object, 'model');

  const chat = await client.chat.completions.create({
    model: 'tiny',
    messages: [{ role: 'user', content: 'A record, please' }],
    n: 2,
    seed: 5,
    max_tokens: 60,
    response_format: { type: 'json_schema', json_schema: { name: 'record', schema: SCHEMA, strict: true } },
  });
  assert.equal(chat.object, 'chat.completion');
  assert.match(chat.id, /^chatcmpl-/);
  assert.equal(chat.model, 'tiny');
  assert.equal(typeof chat.created, 'number');
  assert.equal(chat.choices.length, 2);
  for (const [i, choice] of chat.choices.entries()) {
    assert.equal(choice.index, i);
    assert.equal(choice.message.role, 'assistant');
    assert.equal(choice.finish_reason, 'stop');
    checkRecord(choice.message.content);
  }
  assert.equal(chat.usage.total_tokens, chat.usage.prompt_tokens + chat.usage.completion_tokens);

  const stream = await client.chat.completions.create({
    messages: [{ role: 'user', content: 'A record, please' }],
    seed: 5,
    max_tokens: 60,
    stream: true,
    stream_options: { include_usage: true },
    response_format: { type: 'json_schema', json_schema: { name: 'record', schema: SCHEMA } },
  });
  let text = '';
  const chunks = [];
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    chunks.push(chunk);
    text += chunk.choices[0]?.delta?.content ?? '';
  }
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  assert.equal(chunks.at(-2).choices[0].finish_reason, 'stop');
  assert.equal(chunks.at(-1).usage.completion_tokens > 0, true);
  checkRecord(text);
  assert.equal(text, chat.choices[0].message.content, 'streamed and whole agree (same seed)');

  const plain = await client.completions.create({ model: 'tiny', prompt: 'Once upon', max_tokens: 5, temperature: 0 });
  assert.equal(plain.object, 'text_completion');
  assert.equal(plain.choices[0].finish_reason, 'length');
  assert.equal(plain.usage.completion_tokens, 5);

  await assert.rejects(
    client.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], temprature: 1 }),
    (error) => error instanceof OpenAI.BadRequestError && /temprature/.test(error.message),
  );

  // embeddings: the client asks for base64 unless told (and decodes it); both are the same f32s
  const texts = ['Permission is hereby granted', 'THE SOFTWARE IS PROVIDED'];
  const packed = await client.embeddings.create({ model: 'tiny', input: texts });
  const floats = await client.embeddings.create({ model: 'tiny', input: texts, encoding_format: 'float' });
  assert.equal(floats.object, 'list');
  assert.equal(floats.model, 'tiny');
  assert.ok(floats.usage.prompt_tokens > 4, JSON.stringify(floats.usage));
  assert.equal(floats.data.length, 2);
  for (const [i, item] of floats.data.entries()) {
    assert.equal(item.index, i);
    assert.equal(item.embedding.length, 64, 'the model width');
    const length = Math.hypot(...item.embedding);
    assert.ok(Math.abs(length - 1) < 1e-5, `unit length: ${length}`);
    assert.deepEqual(Array.from(packed.data[i].embedding), item.embedding.map(Math.fround));
  }
  await assert.rejects(
    client.embeddings.create({ model: 'tiny', input: 'x', dimensions: 3 }),
    (error) => error instanceof OpenAI.BadRequestError && /dimensions/.test(error.message),
  );
}

// `emberlm serve-api` on `model` (more arguments in `extra`): its base URL, the server killed
// when the test ends.
async function serveApi(t, model, extra = []) {
  assert.ok(existsSync(BINARY), `${BINARY} is missing: cargo build --bin emberlm`);
  const server = spawn(BINARY, ['serve-api', '--device', 'cpu', '--port', '0', '--model', model, ...extra], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  t.after(() => server.kill());
  return new Promise((resolveUrl, reject) => {
    let out = '';
    server.stdout.on('data', (data) => {
      out += data;
      const match = /http:\/\/[^\s]+\/v1\//.exec(out);
      if (match) resolveUrl(match[0]);
    });
    server.on('exit', (code) => reject(new Error(`serve-api exited (${code}): ${out}`)));
  });
}

test('the openai client talks to emberlm serve-api', async (t) => {
  const url = await serveApi(t, MODEL);
  await exercise(new OpenAI({ apiKey: 'unused', baseURL: url, maxRetries: 0 }));
  const tools = await serveApi(t, TOOL_MODEL, ['--chat-template', TEMPLATE_FILE]);
  await exerciseTools(new OpenAI({ apiKey: 'unused', baseURL: tools, maxRetries: 0 }));
});

test('the openai client talks to the page engine through openaiFetch', async () => {
  const { default: init, Engine } = await import(resolve('www/pkg/emberlm.js'));
  const { openaiFetch } = await import(resolve('www/openai_fetch.js'));
  await init({ module_or_path: readFileSync(resolve('www/pkg/emberlm_bg.wasm')) });
  const engine = await Engine.load(readFileSync(MODEL), { backend: 'cpu', name: 'tiny' });
  assert.equal(engine.info().toolFormat, 'generic');
  const client = (e) => new OpenAI({
    apiKey: 'unused',
    baseURL: 'https://emberlm.local/v1',
    fetch: openaiFetch(e, { model: 'tiny' }),
    maxRetries: 0,
  });
  await exercise(client(engine));
  const tooled = await Engine.load(readFileSync(TOOL_MODEL), { backend: 'cpu', name: 'tiny', chatTemplate: TOOLS_TEMPLATE });
  assert.equal(tooled.info().toolFormat, 'hermes');
  await exerciseTools(client(tooled));
});

test('EngineClient (the engine in a worker) answers chat.completions in the browser', async (t) => {
  const { chromium } = await import('playwright-core');
  const { CHROMIUM, CHROMIUM_ARGS } = await import('../../tools/chromium.mjs');
  const { startServer } = await import('../../tools/serve.mjs');
  const { server, url } = await startServer('www');
  t.after(() => server.close());
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
  t.after(() => browser.close());
  const page = await browser.newPage();
  await page.goto(`${url}token_stream.js`);
  const model = [...readFileSync(MODEL)];
  const out = await page.evaluate(async ({ model, toolModel, schema, template, tools }) => {
    const { EngineClient } = await import('/client.js');
    const client = new EngineClient();
    await client.load(new Uint8Array(model), { backend: 'cpu', name: 'tiny' });
    const request = {
      messages: [{ role: 'user', content: 'A record' }],
      seed: 2,
      max_tokens: 60,
      response_format: { type: 'json_schema', json_schema: { schema } },
    };
    const whole = await client.chat.completions.create(request);
    let streamed = '';
    const chunks = [];
    for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
      chunks.push(chunk);
      streamed += chunk.choices[0]?.delta?.content ?? '';
    }
    const text = await client.completions.create({ prompt: 'Once', max_tokens: 3, temperature: 0 });
    const toolClient = new EngineClient();
    await toolClient.load(new Uint8Array(toolModel), { backend: 'cpu', name: 'tiny', chatTemplate: template });
    const toolRequest = { messages: [{ role: 'user', content: 'Sum' }], tools, tool_choice: 'required', seed: 4, max_tokens: 180 };
    const called = await toolClient.chat.completions.create(toolRequest);
    const callChunks = [];
    for await (const chunk of await toolClient.chat.completions.create({ ...toolRequest, stream: true })) {
      callChunks.push(...(chunk.choices[0]?.delta?.tool_calls ?? []));
    }
    toolClient.terminate();
    const vectors = await client.embed(['Once', 'upon a time'], { pooling: 'last' });
    const shaped = await client.embeddings.create({ input: 'Once', encoding_format: 'float', pooling: 'last' });
    client.terminate();
    const embedded = {
      kinds: vectors.map((v) => v.constructor.name),
      widths: vectors.map((v) => v.length),
      first: Array.from(vectors[0]),
      shaped: shaped.data[0].embedding,
    };
    return { whole, streamed, chunks, text, embedded, called, callChunks };
  }, { model, toolModel: [...readFileSync(TOOL_MODEL)], schema: SCHEMA, template: TOOLS_TEMPLATE, tools: TOOLS });
  const calls = out.called.choices[0].message.tool_calls;
  assert.ok(calls.length > 0, JSON.stringify(out.called));
  calls.forEach(checkCall);
  assert.deepEqual(out.callChunks.map((c) => c.function), calls.map((c) => c.function));
  assert.equal(out.whole.object, 'chat.completion');
  checkRecord(out.whole.choices[0].message.content);
  assert.equal(out.streamed, out.whole.choices[0].message.content);
  assert.equal(out.chunks[0].choices[0].delta.role, 'assistant');
  assert.equal(out.chunks.at(-1).choices[0].finish_reason, 'stop');
  assert.equal(out.text.object, 'text_completion');
  assert.equal(out.text.choices[0].finish_reason, 'length');
  assert.deepEqual(out.embedded.kinds, ['Float32Array', 'Float32Array']);
  assert.deepEqual(out.embedded.widths, [64, 64]);
  // the same vector both ways
  assert.deepEqual(out.embedded.shaped.map(Math.fround), out.embedded.first);
});
