"""llama.cpp (through llama-cpp-python, CPU) beside `emberlm bench --kv-compare`: the next token
at one length N, without a cache (the N tokens evaluated from an empty cache) and with one (a
decode step reading N cached positions), on the same GGUF and token ids.

Reads a JSON request {model, ids: [N ids], steps, threads?} and prints JSON: the milliseconds
of the prefill of N and of each timed decode step (after one untimed step), as emberlm's
section times them.
"""
import json
import os
import sys
import time

import llama_cpp


def main():
    with open(sys.argv[1]) as f:
        req = json.load(f)
    ids = req["ids"]
    steps = req["steps"]
    threads = req.get("threads") or os.cpu_count() or 1
    llm = llama_cpp.Llama(
        model_path=req["model"],
        n_ctx=len(ids) + steps + 16,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=False,
        verbose=False,
    )
    # One untimed evaluation first: the weights paged in, the buffers and threads set up, so
    # that the timed prefill is as warm as emberlm's
    llm.eval(ids[:32])
    llm.reset()
    t = time.perf_counter()
    llm.eval(ids)
    off_ms = (time.perf_counter() - t) * 1000.0
    # token 1 as emberlm's steps feed it: one untimed step, then `steps` timed ones
    llm.eval([1])
    t = time.perf_counter()
    for _ in range(steps):
        llm.eval([1])
    on_ms = (time.perf_counter() - t) * 1000.0 / max(steps, 1)
    print(json.dumps({
        "version": llama_cpp.__version__,
        "threads": threads,
        "kv_off_ms": off_ms,
        "kv_on_ms": on_ms,
    }))


if __name__ == "__main__":
    main()
