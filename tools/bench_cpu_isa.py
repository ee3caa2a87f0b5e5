#!/usr/bin/env python3
"""The CPU backend on each instruction set it can pick, beside llama.cpp, on the same files.

    python3 tools/bench_cpu_isa.py --llama-python VENV/bin/python MODEL.gguf [MODEL.gguf ...]
        [--binary target/release/emberlm] [--reps 3] [--new 32] [--threads 2] [--json OUT]

For every model: emberlm with `EMBERLM_CPU_ISA=avx2` (AVX2 kept where the CPU has AVX-512
VNNI), emberlm as it picks (VNNI where present), and llama.cpp through llama-cpp-python
(`tools/bench_llama_cpp.py`, the same token ids), in a rotating order per repetition so that
drift on the machine hits each alike; medians printed, every run kept in the JSON. Without
`--llama-python` only emberlm runs. The greedy tokens of both emberlm runs must agree (the paths
give the same bits), or the script fails.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press. Before that, books were "
    "copied by hand in monasteries and workshops, a slow and costly craft that kept written "
    "knowledge in the hands of a few. Within decades, presses spread across Europe, and the number "
    "of books grew from thousands to millions. Scholars argue about how much this changed the way "
    "people thought, but few doubt that cheap books helped spread the Reformation, the scientific "
    "revolution and, later, mass literacy. Today the same questions are asked about the internet "
    "and about machines that write."
)


def emberlm(args, model, isa):
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    env.pop("EMBERLM_CPU_ISA", None)
    if isa:
        env["EMBERLM_CPU_ISA"] = isa
    out = subprocess.run(
        [args.binary, "--device", "cpu", "generate", "--model", model, "--prompt", PROMPT,
         "--max-new-tokens", str(args.new), "--temperature", "0", "--json"],
        env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        sys.exit(f"emberlm failed on {model}: {out.stderr}")
    v = json.loads(out.stdout)
    s = v["stats"]
    return {"prefill_tok_s": s["prompt_tokens"] / s["prefill_ms"] * 1000,
            "decode_tok_s": s["decode_tok_per_s"]}, v["sequences"][0]["tokens"]


def llama_cpp(args, model, ids):
    req = {"model": model, "prompts": [ids], "decode_prompt": ids, "decode": args.new}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(req, f)
    env = dict(os.environ)
    out = subprocess.run([args.llama_python, os.path.join(os.path.dirname(__file__), "bench_llama_cpp.py"),
                          f.name], capture_output=True, text=True, check=False, env=env)
    os.unlink(f.name)
    if out.returncode:
        sys.exit(f"llama.cpp failed on {model}: {out.stderr}")
    v = json.loads(out.stdout)
    return {"prefill_tok_s": v["prefill_tok_s"][0], "decode_tok_s": v["decode_tok_s"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--binary", default="target/release/emberlm")
    p.add_argument("--llama-python")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args()
    if args.llama_python and args.threads != (os.cpu_count() or 1):
        sys.exit("llama.cpp runs on every core (tools/bench_llama_cpp.py): give --threads "
                 f"{os.cpu_count()} or leave out --llama-python")
    results = []
    for model in args.models:
        ids = json.loads(subprocess.run([args.binary, "tokenize", "--model", model, "--prompt", PROMPT],
                                        capture_output=True, text=True, check=True).stdout)["tokens"]
        names = ["emberlm avx2", "emberlm picked"] + (["llama.cpp"] if args.llama_python else [])
        runs = {n: [] for n in names}
        tokens = {}
        for r in range(args.reps):
            for name in names[r % len(names):] + names[:r % len(names)]:
                if name == "llama.cpp":
                    runs[name].append(llama_cpp(args, model, ids))
                else:
                    m, t = emberlm(args, model, "avx2" if name == "emberlm avx2" else None)
                    runs[name].append(m)
                    tokens[name] = t
        if tokens["emberlm avx2"] != tokens["emberlm picked"]:
            sys.exit(f"{model}: the greedy tokens differ between the instruction sets")
        med = {n: {k: statistics.median(x[k] for x in v) for k in ("prefill_tok_s", "decode_tok_s")}
               for n, v in runs.items()}
        print(f"{os.path.basename(model)}: {len(ids)}-token prompt, {args.new} generated, "
              f"{args.threads} threads, medians of {args.reps}")
        for n, m in med.items():
            line = f"  {n:15s} prefill {m['prefill_tok_s']:7.1f} tok/s  decode {m['decode_tok_s']:6.2f} tok/s"
            if "llama.cpp" in med and n != "llama.cpp":
                ref = med["llama.cpp"]
                line += (f"   ({m['prefill_tok_s'] / ref['prefill_tok_s']:.2f}x, "
                         f"{m['decode_tok_s'] / ref['decode_tok_s']:.2f}x llama.cpp)")
            print(line)
        results.append({"model": os.path.basename(model), "prompt_tokens": len(ids),
                        "generated": args.new, "threads": args.threads, "runs": runs, "medians": med})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
