"""llama.cpp (through llama-cpp-python, CPU) on the same GGUF and token ids as `emberlm bench`.

Reads a JSON request {model, prompts: [[ids]], decode_prompt: [ids], decode: n, threads?} and
prints JSON (threads: the request's, else every core):
load time, prefill tok/s per prompt (fresh KV each), greedy decode tok/s over `decode` tokens.
"""
import json
import os
import sys
import time

import llama_cpp


def main():
    with open(sys.argv[1]) as f:
        req = json.load(f)
    longest = max(len(p) for p in req["prompts"] + [req["decode_prompt"]])
    n_ctx = longest + req["decode"] + 16
    threads = req.get("threads") or os.cpu_count() or 1
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=req["model"],
        n_ctx=n_ctx,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=False,
        verbose=False,
    )
    load_s = time.perf_counter() - t0
    # One untimed evaluation first: the weights paged in, the buffers and threads set up, so
    # that the first timed prefill is as warm as emberlm's (whose load touches every weight)
    llm.eval(req["prompts"][0][:32])
    prefill = []
    for ids in req["prompts"]:
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        prefill.append(len(ids) / (time.perf_counter() - t))
    llm.reset()
    llm.eval(req["decode_prompt"])
    # The first token comes from the prompt's logits; then decode - 1 single-token steps, as
    # emberlm's decode figure counts them.
    tok = llm.sample(temp=0.0)
    t = time.perf_counter()
    for _ in range(req["decode"] - 1):
        llm.eval([tok])
        tok = llm.sample(temp=0.0)
    decode_s = time.perf_counter() - t
    print(json.dumps({
        "version": llama_cpp.__version__,
        "load_s": load_s,
        "prefill_tok_s": prefill,
        "decode_tok_s": (req["decode"] - 1) / decode_s,
        "threads": threads,
    }))


if __name__ == "__main__":
    main()
