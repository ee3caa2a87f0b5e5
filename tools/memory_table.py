#!/usr/bin/env python3
"""What fits where: for shape models of real sizes, the longest context whose memory plan fits a
4 GiB wasm32 page on the CPU backend and 2 / 4 / 8 GB of GPU memory, per KV-cache kind, as
`emberlm info --json` plans it. Prints a Markdown table (the README's "What fits where").

    python3 tools/memory_table.py [--emberlm target/release/emberlm] [--shapes DIR]
        [--tokenizer models/SmolLM2-135M-Instruct.Q4_1.gguf]

Shape models missing from DIR (default .cache/shapes) are written first with
tools/shape_model.py (random weights of the real shape; the memory plan depends only on the
shapes and types, never on the values).
"""

import json
import os
import subprocess
import sys

SHAPES = [
    ("Llama-3.2-1B", "llama-1b", "q4_0"),
    ("Qwen2.5-1.5B", "qwen-1.5b", "q4_0"),
    ("Llama-3.2-3B", "llama-3b", "q4_0"),
    ("Llama-3.1-8B", "llama-8b", "q4_0"),
]
KINDS = ["f32", "f16", "q8_0", "q4_0"]
GPU_GB = [2, 4, 8]
WASM32 = 4 << 30
# contexts are reported in steps of this many positions
STEP = 256


def info(emberlm, model, device, ctx, kind):
    out = subprocess.run(
        [emberlm, "--device", device, "info", "--model", model, "--json", "--ctx", str(ctx),
         "--kv-cache", kind],
        capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{model}: emberlm info failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def longest(emberlm, model, device, kind, budget, trained):
    """The longest context (a multiple of STEP, at most `trained`) whose planned total is at most
    `budget` bytes; 0 when not even STEP positions fit."""
    def fits(ctx):
        return info(emberlm, model, device, ctx, kind)["memory"]["total"] <= budget
    lo, hi = 0, trained // STEP
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * STEP):
            lo = mid
        else:
            hi = mid - 1
    return lo * STEP


def cell(ctx, trained):
    if ctx == 0:
        return "—"
    if ctx >= trained:
        return f"{trained // 1024}K (all)"
    return f"{ctx // 1024}K" if ctx >= 1024 else str(ctx)


def main(argv):
    opts = {"--emberlm": "target/release/emberlm", "--shapes": ".cache/shapes",
            "--tokenizer": "models/SmolLM2-135M-Instruct.Q4_1.gguf"}
    it = iter(argv[1:])
    for a in it:
        if a not in opts:
            raise SystemExit(__doc__)
        opts[a] = next(it)
    emberlm, shapes = opts["--emberlm"], opts["--shapes"]
    os.makedirs(shapes, exist_ok=True)
    head = ["model (matrices)", "weights", "KV / token (f32 · q8_0)",
            "page, CPU backend (4 GiB, f32 KV)"]
    head += [f"GPU {gb} GB ({' / '.join(KINDS)} KV)" for gb in GPU_GB]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for label, shape, mtype in SHAPES:
        model = os.path.join(shapes, f"{shape}-{mtype}.gguf")
        if not os.path.exists(model):
            here = os.path.dirname(os.path.abspath(__file__))
            subprocess.run([sys.executable, os.path.join(here, "shape_model.py"), "named", shape,
                            opts["--tokenizer"], model, "--type", mtype], check=True)
        first = info(emberlm, model, "cpu", STEP, "f32")
        trained = first["config"]["context_length"]
        weights = first["memory"]["weights"]
        per_token = {k: info(emberlm, model, "cpu", STEP, k)["memory"]["kv_bytes_per_token"]
                     for k in ("f32", "q8_0")}
        row = [f"{label} ({mtype.upper()})", f"{weights / 1e9:.2f} GB",
               f"{per_token['f32'] // 1024} KiB · {per_token['q8_0'] // 1024} KiB",
               cell(longest(emberlm, model, "cpu", "f32", WASM32, trained), trained)]
        for gb in GPU_GB:
            row.append(" / ".join(
                cell(longest(emberlm, model, "gpu", k, gb * 10**9, trained), trained)
                for k in KINDS))
        print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv)
