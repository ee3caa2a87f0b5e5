"""llama.cpp's embedding mode (through llama-cpp-python, CPU) on the same GGUF and texts as
`emberlm --device cpu bench --embed-texts N`.

Reads a JSON request {model, texts: [str], pooling: "mean" | "last" | "cls", threads?} and prints
JSON: load time, the seconds to embed every text (llama-cpp-python's `embed`, which batches
the texts into sequences of one step), texts/s, the tokens read, and the unit vectors themselves
(so that the bench can say how close emberlm's are).
"""
import json
import os
import sys
import time

import llama_cpp

POOLING = {
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
}


def main():
    with open(sys.argv[1]) as f:
        req = json.load(f)
    threads = req.get("threads") or os.cpu_count() or 1
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=req["model"],
        embedding=True,
        pooling_type=POOLING[req["pooling"]],
        n_ctx=req.get("n_ctx", 2048),
        n_batch=512,
        n_ubatch=512,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    load_s = time.perf_counter() - t0
    texts = req["texts"]
    # One untimed text first (weights paged in, buffers and threads set up), as emberlm's
    # session is warm when its texts are timed
    llm.embed(texts[:1], normalize=True)
    t = time.perf_counter()
    vectors, tokens = llm.embed(texts, normalize=True, return_count=True)
    seconds = time.perf_counter() - t
    print(json.dumps({
        "version": llama_cpp.__version__,
        "load_s": load_s,
        "seconds": seconds,
        "texts_per_s": len(texts) / seconds,
        "tokens": tokens,
        "threads": threads,
        "vectors": vectors,
    }))


if __name__ == "__main__":
    main()
