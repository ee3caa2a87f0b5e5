#!/usr/bin/env python3
"""Throughput of `emberlm serve-api` with several clients at once, one completion at a time
(`--parallel 1`) against completions decoded together (`--parallel N`), alternating in one run.

    python3 tools/bench_serve.py --binary target/release/emberlm \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf [--clients 8] [--tokens 64] [--parallel 4]
        [--runs 3] [--device cpu] [--out bench/results/DATE-serve.json]

Each client sends one greedy completion of `--tokens` tokens (end-of-text banned, so every
answer has its full length) at the same moment; the figure is the answered tokens over the
wall time from the first request to the last answer, and the mean time to an answer. Standard
library only.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

PROMPTS = [
    "Once upon a time",
    "The history of the printing press",
    "Write a short poem about the sea",
    "Explain how a bicycle stays upright",
    "A recipe for bread:",
    "The three laws of motion are",
    "In the year 2050, cities",
    "Dear diary, today",
]



def fresh_result_path(directory, stem):
    """The first of DIR/STEM.json, DIR/STEM-2.json, ... that does not exist yet (a second run
    on the same day keeps the first one's file, as `emberlm bench` names its results)."""
    first = os.path.join(directory, f"{stem}.json")
    if not os.path.exists(first):
        return first
    n = 2
    while os.path.exists(os.path.join(directory, f"{stem}-{n}.json")):
        n += 1
    return os.path.join(directory, f"{stem}-{n}.json")

def start_server(binary, model, device, parallel):
    proc = subprocess.Popen(
        [binary, "serve-api", "--device", device, "--port", "0", "--model", model,
         "--parallel", str(parallel), "--max-queue", "64"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if "http://" not in line:
        proc.kill()
        sys.exit(f"the server did not start: {line!r}")
    address = line.split("http://", 1)[1].split("/", 1)[0]
    return proc, address


def complete(address, prompt, tokens, eos_ids):
    body = json.dumps({
        "prompt": prompt, "max_tokens": tokens, "temperature": 0,
        "logit_bias": {str(i): -100 for i in eos_ids},
    }).encode()
    req = urllib.request.Request(f"http://{address}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.load(r)
    return time.perf_counter() - start, answer["usage"]["completion_tokens"], answer["choices"][0]["text"]


def run_once(binary, model, device, parallel, clients, tokens, eos_ids):
    proc, address = start_server(binary, model, device, parallel)
    try:
        # one warm-up request (page faults of the mapped file, the first allocations)
        complete(address, "Hello", 4, eos_ids)
        results = [None] * clients
        barrier = threading.Barrier(clients + 1)

        def client(i):
            barrier.wait()
            results[i] = complete(address, PROMPTS[i % len(PROMPTS)], tokens, eos_ids)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        barrier.wait()
        start = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        with urllib.request.urlopen(f"http://{address}/health", timeout=10) as r:
            health = json.load(r)
    finally:
        proc.kill()
        proc.wait()
    answered = sum(r[1] for r in results)
    return {
        "parallel": health["parallel"],
        "decoding_peak": health["decoding_peak"],
        "wall_s": wall,
        "tokens": answered,
        "tok_per_s": answered / wall,
        "mean_latency_s": statistics.mean(r[0] for r in results),
        "texts": [r[2] for r in results],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--binary", default="target/release/emberlm")
    p.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--device", default="cpu")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--eos", default="0,1,2", help="token ids banned so that answers run their length")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    eos_ids = [int(x) for x in a.eos.split(",") if x]
    runs = {1: [], a.parallel: []}
    for r in range(a.runs):
        for n in (1, a.parallel):
            res = run_once(a.binary, a.model, a.device, n, a.clients, a.tokens, eos_ids)
            runs[n].append(res)
            print(f"run {r + 1}, --parallel {n}: {res['tokens']} tokens in {res['wall_s']:.2f} s = "
                  f"{res['tok_per_s']:.1f} tok/s, mean answer {res['mean_latency_s']:.2f} s, "
                  f"peak {res['decoding_peak']} together", flush=True)
    same = all(x["texts"] == runs[1][0]["texts"] for rs in runs.values() for x in rs)
    summary = {}
    for n, rs in runs.items():
        summary[n] = {
            "tok_per_s_median": statistics.median(x["tok_per_s"] for x in rs),
            "mean_latency_s_median": statistics.median(x["mean_latency_s"] for x in rs),
            "decoding_peak": max(x["decoding_peak"] for x in rs),
        }
    base = summary[1]["tok_per_s_median"]
    for n, s in summary.items():
        print(f"--parallel {n}: {s['tok_per_s_median']:.1f} tok/s ({s['tok_per_s_median'] / base:.2f}x), "
              f"mean answer {s['mean_latency_s_median']:.2f} s")
    print(f"every answer the same text at every setting: {same}")
    out = a.out or fresh_result_path("bench/results", f"{datetime.date.today()}-serve")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({
            "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "model": a.model, "device": a.device, "clients": a.clients, "tokens": a.tokens,
            "runs": {str(n): [{k: v for k, v in x.items() if k != "texts"} for x in rs]
                     for n, rs in runs.items()},
            "summary": {str(n): s for n, s in summary.items()},
            "same_texts": same,
        }, f, indent=1)
    print(f"written {out}")
    if not same:
        sys.exit("the answers differ between settings")


if __name__ == "__main__":
    main()
