"""How far llama.cpp's own logits (CPU, through llama-cpp-python) are from the float64 goldens.

Usage: python tools/llama_cpp_golden.py MODEL GOLDEN [MODEL GOLDEN ...]

For each pair, runs every golden prompt's teacher-forced sequence (prompt + f64 greedy tokens)
through llama.cpp in one batch with every position's logits kept, and reports the largest
|logit - f64| over the f64 top-5 of every position from the last prompt token on (what
tests/common/golden.rs checks), their mean, and the largest |prompt NLL - f64|. Prints one JSON object per
model. The CPU backend's golden tolerances for 8-bit activations are set from these numbers.
"""
import json
import math
import sys

import llama_cpp


def measure(model, golden_path):
    with open(golden_path) as f:
        golden = json.load(f)
    longest = max(len(r["prompt_tokens"]) + len(r["f64_greedy_tokens"]) for r in golden["results"])
    llm = llama_cpp.Llama(
        model_path=model,
        n_ctx=longest + 8,
        n_batch=max(512, longest + 8),
        n_threads=2,
        logits_all=True,
        verbose=False,
    )
    worst = 0.0
    worst_nll = 0.0
    total = 0.0
    count_all = 0
    for r in golden["results"]:
        seq = r["prompt_tokens"] + r["f64_greedy_tokens"]
        llm.reset()
        llm.eval(seq)
        rows = llm.scores[: len(seq)]
        first = len(r["prompt_tokens"]) - 1
        for k, top5 in enumerate(r["f64_greedy_path_top5"]):
            row = rows[first + k]
            for tok, want in top5:
                d = abs(float(row[tok]) - want)
                worst = max(worst, d)
                total += d
                count_all += 1
        nll = 0.0
        count = len(r["prompt_tokens"]) - 1
        for i in range(count):
            row = rows[i]
            m = float(max(row))
            lse = m + math.log(sum(math.exp(float(v) - m) for v in row))
            nll += lse - float(row[seq[i + 1]])
        if count:
            worst_nll = max(worst_nll, abs(nll / count - r["f64_prompt_nll"]))
    return {
        "model": model,
        "golden": golden_path,
        "max_abs_logit_delta": worst,
        "mean_abs_logit_delta": total / max(count_all, 1),
        "max_nll_delta": worst_nll,
    }


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit(__doc__)
    for model, golden in zip(args[::2], args[1::2]):
        try:
            print(json.dumps(measure(model, golden)), flush=True)
        except Exception as e:  # a model llama.cpp cannot load is reported, not fatal
            print(json.dumps({"model": model, "golden": golden, "error": str(e)}), flush=True)


if __name__ == "__main__":
    main()
