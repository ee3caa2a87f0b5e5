"""Tiny random-weight models of the architectures beyond Llama and GPT-2, with float64 goldens.

Usage (in the bench's venv, which has numpy, gguf and llama-cpp-python):
    .cache/bench/venv/bin/python tools/make_arch_fixtures.py [FIXTURE_DIR]

FIXTURE_DIR defaults to tests/fixtures. For each model below the script
1. writes `<name>.gguf` with random weights, the vocabulary of one of the tiny Llamas (the
   byte-level BPE of tiny-llama, or the SentencePiece one of tiny-llama-spm, as llama.cpp reads
   Phi-3's) and the metadata llama.cpp's converter writes for the architecture;
2. reads the file back, dequantizes every tensor exactly (gguf.quants) and runs its own float64
   forward pass over that tiny Llama's golden prompts (same vocabulary, so the same token ids);
3. writes `golden/<name>.golden.json` in the format tests/common/golden.rs reads (greedy
   continuation, top-5 along the greedy path, prompt NLL);
4. runs the same sequences through llama.cpp and fails unless llama.cpp agrees with the float64
   pass (its distance is stored in the golden file), so the fixture means what llama.cpp means.

Run once when a fixture changes, not at test time. The models:
- tiny-qwen2-f32: q/k/v biases, NEOX RoPE, untied output.
- tiny-qwen3-q8_0: QK-norm, a head size (32) other than width/heads, tied output, Q8_0 matrices.
- tiny-phi3-f32: fused qkv and gate+up matrices, NEOX RoPE, untied output, SentencePiece.
- tiny-gemma3-f32: six layers (five local with a window of 5, one global), QK-norm, pre and post
  norms, GeGLU, embedding scaled by sqrt(width), local and global RoPE bases, multi-query.
- tiny-llama3-rope-f32: Llama with Llama 3's RoPE frequency divisors (`rope_freqs.weight`).
"""
import json
import math
import os
import sys

import gguf
import llama3_rope
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize, quantize

FIX = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
GREEDY_STEPS = 8
LLAMA_CPP_STEPS = 24



class Vocab:
    """A fixture's tokenizer fields and golden prompts, taken from one of the tiny Llamas."""

    def __init__(self, kind, extra=()):
        self.kind = kind
        if kind == "bpe":
            # The tiny Llama's byte-level BPE (tokenizer.json), prompts without BOS.
            with open(os.path.join(FIX, "tiny-llama", "tokenizer.json"), encoding="utf-8") as f:
                tj = json.load(f)
            items = sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])
            self.tokens = [t for t, _ in items]
            assert [i for _, i in items] == list(range(len(self.tokens)))
            self.eos = self.bos = tj["model"]["vocab"]["<|endoftext|>"]
            self.unk = None
            self.merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
            self.scores = None
            self.types = [gguf.TokenType.CONTROL if t == "<|endoftext|>" else gguf.TokenType.NORMAL for t in self.tokens]
            golden_file = "tiny-llama-f32.golden.json"
        else:
            # The SentencePiece tiny Llama's vocabulary (scores, byte fallback), prompts with BOS.
            r = GGUFReader(os.path.join(FIX, "tiny-llama-spm-f32.gguf"))
            def array(key, decode=False):
                f = r.fields[key]
                return [bytes(f.parts[i]).decode() if decode else f.parts[i].tolist()[0] for i in f.data]
            def scalar(key):
                f = r.fields[key]
                return f.parts[f.data[0]].tolist()[0]
            self.tokens = array("tokenizer.ggml.tokens", decode=True)
            self.scores = array("tokenizer.ggml.scores")
            self.types = array("tokenizer.ggml.token_type")
            self.bos, self.eos = scalar("tokenizer.ggml.bos_token_id"), scalar("tokenizer.ggml.eos_token_id")
            self.unk = scalar("tokenizer.ggml.unknown_token_id")
            self.merges = None
            golden_file = "tiny-llama-spm-f32.golden.json"
        # Control tokens an architecture's loader in llama.cpp looks up by text (Phi-3's
        # `<|endoftext|>`), appended after the vocabulary so no prompt's ids change.
        for t in extra:
            self.tokens.append(t)
            self.types.append(gguf.TokenType.CONTROL)
            if self.scores is not None:
                self.scores.append(0.0)
        with open(os.path.join(FIX, "golden", golden_file), encoding="utf-8") as f:
            self.prompts = [(r["prompt"], r["add_bos"], r["prompt_tokens"]) for r in json.load(f)["results"]]

    def write(self, w):
        w.add_tokenizer_model("gpt2" if self.kind == "bpe" else "llama")
        w.add_tokenizer_pre("gpt-2" if self.kind == "bpe" else "default")
        w.add_token_list(self.tokens)
        w.add_token_types(self.types)
        if self.merges is not None:
            w.add_token_merges(self.merges)
        if self.scores is not None:
            w.add_token_scores(self.scores)
        w.add_bos_token_id(self.bos)
        w.add_eos_token_id(self.eos)
        if self.unk is not None:
            w.add_unk_token_id(self.unk)
        w.add_add_bos_token(self.kind == "spm")


class Spec:
    """One fixture: its architecture and shapes."""

    def __init__(self, name, arch, *, vocab="bpe", extra_tokens=(), d=64, layers=2, heads=4, kv_heads=2, head_dim=None, ff=160,
                 eps=1e-5, theta=10000.0, quant=None, tied=False, window=None, embed_std=0.5, seed=0):
        self.name, self.arch = name, arch
        self.vocab = Vocab(vocab, extra_tokens)
        self.d, self.layers, self.heads, self.kv_heads = d, layers, heads, kv_heads
        self.head_dim = head_dim or d // heads
        self.ff, self.eps, self.theta = ff, eps, theta
        self.quant, self.tied, self.window = quant, tied, window
        self.embed_std = embed_std
        self.rng = np.random.default_rng(seed)

    def randn(self, *shape, std):
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def gain(self, n):
        return (1 + self.rng.standard_normal(n) * 0.1).astype(np.float32)


def llama3_rope_divisors(head_dim, theta, factor, low, high, original):
    """Llama 3's per-pair frequency divisors (tools/llama3_rope.py) as float32."""
    return np.array(llama3_rope.divisors(head_dim, theta, factor, low, high, original), dtype=np.float32)


def weights(s):
    """The GGUF tensors of `s` as float32 arrays in GGUF's row-major [rows, cols] shapes."""
    d, hd, ff = s.d, s.head_dim, s.ff
    qd, kd = s.heads * hd, s.kv_heads * hd
    n_vocab = len(s.vocab.tokens)
    w = {"token_embd.weight": s.randn(n_vocab, d, std=s.embed_std), "output_norm.weight": s.gain(d)}
    if not s.tied:
        w["output.weight"] = s.randn(n_vocab, d, std=0.25)
    for i in range(s.layers):
        b = f"blk.{i}."
        w[b + "attn_norm.weight"] = s.gain(d)
        w[b + "ffn_norm.weight"] = s.gain(d)
        if s.arch == "phi3":
            w[b + "attn_qkv.weight"] = s.randn(qd + 2 * kd, d, std=0.25)
            w[b + "ffn_up.weight"] = s.randn(2 * ff, d, std=0.25)
        else:
            w[b + "attn_q.weight"] = s.randn(qd, d, std=0.25)
            w[b + "attn_k.weight"] = s.randn(kd, d, std=0.25)
            w[b + "attn_v.weight"] = s.randn(kd, d, std=0.25)
            w[b + "ffn_gate.weight"] = s.randn(ff, d, std=0.25)
            w[b + "ffn_up.weight"] = s.randn(ff, d, std=0.25)
        w[b + "attn_output.weight"] = s.randn(d, qd, std=0.25)
        w[b + "ffn_down.weight"] = s.randn(d, ff, std=0.15)
        if s.arch == "qwen2":
            w[b + "attn_q.bias"] = s.randn(qd, std=0.5)
            w[b + "attn_k.bias"] = s.randn(kd, std=0.5)
            w[b + "attn_v.bias"] = s.randn(kd, std=0.5)
        if s.arch in ("qwen3", "gemma3"):
            w[b + "attn_q_norm.weight"] = s.gain(hd)
            w[b + "attn_k_norm.weight"] = s.gain(hd)
        if s.arch == "gemma3":
            # Gains of about 3 so that the layers outweigh the token's own (tied) embedding.
            w[b + "post_attention_norm.weight"] = 3 * s.gain(d)
            w[b + "post_ffw_norm.weight"] = 3 * s.gain(d)
    if s.name.startswith("tiny-llama3-rope"):
        w["rope_freqs.weight"] = llama3_rope_divisors(hd, s.theta, 8.0, 1.0, 4.0, 32)
    return w


def write_gguf(s, path):
    w = gguf.GGUFWriter(path, s.arch)
    w.add_name(s.name)
    w.add_context_length(256)
    w.add_embedding_length(s.d)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ff)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_freq_base(s.theta)
    w.add_layer_norm_rms_eps(s.eps)
    if s.head_dim != s.d // s.heads:
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.head_dim)
    if s.window:
        w.add_sliding_window(s.window)
    w.add_file_type(7 if s.quant == "q8_0" else 0)
    s.vocab.write(w)
    for name, t in weights(s).items():
        if s.quant == "q8_0" and t.ndim == 2 and t.shape[1] % 32 == 0:
            w.add_tensor(name, quantize(t, Q.Q8_0), raw_dtype=Q.Q8_0)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_tensors(path):
    """Every tensor of the file, dequantized exactly, in float64, [rows, cols]."""
    r = GGUFReader(path)
    return {
        t.name: dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape.tolist())]).astype(np.float64)
        for t in r.tensors
    }


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def rms(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def rope(t, pos, theta, divisors, neox):
    """RoPE over [heads, n, hd]: NEOX rotates the two halves, Llama's GGUF layout adjacent pairs."""
    hd = t.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    if divisors is not None:
        inv = inv / divisors
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    if neox:
        a, b = t[..., : hd // 2], t[..., hd // 2 :]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)
    a, b = t[..., 0::2], t[..., 1::2]
    out = np.empty_like(t)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def forward(s, T, ids):
    """float64 logits [n, vocab] of `ids` under fixture `s` with tensors `T`."""
    n, d, hd, H, KV = len(ids), s.d, s.head_dim, s.heads, s.kv_heads
    pos = np.arange(n, dtype=np.float64)
    causal = np.triu(np.full((n, n), -np.inf), 1)
    if s.window:
        windowed = causal + np.where(pos[:, None] - pos[None, :] >= s.window, -np.inf, 0.0)
    neox = s.arch != "llama"
    divisors = T.get("rope_freqs.weight")
    x = T["token_embd.weight"][ids]
    if s.arch == "gemma3":
        x = x * np.sqrt(d)
    for i in range(s.layers):
        b = f"blk.{i}."
        h = rms(x, T[b + "attn_norm.weight"], s.eps)
        if s.arch == "phi3":
            qkv = h @ T[b + "attn_qkv.weight"].T
            q, k, v = qkv[:, : H * hd], qkv[:, H * hd : (H + KV) * hd], qkv[:, (H + KV) * hd :]
        else:
            q, k, v = (h @ T[b + f"attn_{p}.weight"].T for p in "qkv")
            if s.arch == "qwen2":
                q, k, v = q + T[b + "attn_q.bias"], k + T[b + "attn_k.bias"], v + T[b + "attn_v.bias"]
        q = q.reshape(n, H, hd).transpose(1, 0, 2)
        k = k.reshape(n, KV, hd).transpose(1, 0, 2)
        v = v.reshape(n, KV, hd).transpose(1, 0, 2)
        if s.arch in ("qwen3", "gemma3"):
            q, k = rms(q, T[b + "attn_q_norm.weight"], s.eps), rms(k, T[b + "attn_k_norm.weight"], s.eps)
        mask = causal
        theta = s.theta
        if s.arch == "gemma3":
            local = i % 6 < 5
            theta = 10000.0 if local else s.theta
            mask = windowed if local else causal
        elif s.window:
            mask = windowed
        q, k = rope(q, pos, theta, divisors, neox), rope(k, pos, theta, divisors, neox)
        k, v = np.repeat(k, H // KV, 0), np.repeat(v, H // KV, 0)
        att = softmax(q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask) @ v
        o = att.transpose(1, 0, 2).reshape(n, H * hd) @ T[b + "attn_output.weight"].T
        if s.arch == "gemma3":
            o = rms(o, T[b + "post_attention_norm.weight"], s.eps)
        x = x + o
        h = rms(x, T[b + "ffn_norm.weight"], s.eps)
        if s.arch == "phi3":
            gu = h @ T[b + "ffn_up.weight"].T
            g, u = gu[:, : s.ff], gu[:, s.ff :]
        else:
            g, u = h @ T[b + "ffn_gate.weight"].T, h @ T[b + "ffn_up.weight"].T
        act = gelu_tanh(g) if s.arch == "gemma3" else g / (1 + np.exp(-g))
        f = (act * u) @ T[b + "ffn_down.weight"].T
        if s.arch == "gemma3":
            f = rms(f, T[b + "post_ffw_norm.weight"], s.eps)
        x = x + f
    out = T.get("output.weight", T["token_embd.weight"])
    return rms(x, T["output_norm.weight"], s.eps) @ out.T


def golden(s, T):
    results = []
    for prompt, add_bos, ids in s.vocab.prompts:
        seq = list(ids)
        greedy = []
        for _ in range(GREEDY_STEPS):
            t = int(np.argmax(forward(s, T, seq)[-1]))
            greedy.append(t)
            seq.append(t)
        full = forward(s, T, seq)
        first = len(ids) - 1
        path = [[[int(t), float(full[j][t])] for t in np.argsort(-full[j])[:5]] for j in range(first, len(seq))]
        last = full[first]
        lp = full[:first] - (np.log(np.exp(full[:first] - full[:first].max(-1, keepdims=True)).sum(-1, keepdims=True)) + full[:first].max(-1, keepdims=True))
        nll = float(-np.mean([lp[j, ids[j + 1]] for j in range(first)]))
        results.append(dict(prompt=prompt, add_bos=add_bos, special=False, prompt_tokens=list(ids),
                            f64_greedy_tokens=greedy, f64_greedy_path_top5=path,
                            f64_last_prompt_logits_top10=[[int(t), float(last[t])] for t in np.argsort(-last)[:10]],
                            f64_prompt_nll=nll))
    return results


def llama_cpp_check(s, path, results):
    """llama.cpp's logits along each golden path: fails where llama.cpp reads the file otherwise."""
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=128, n_batch=128, logits_all=True, n_threads=2, verbose=False, seed=0)
    worst, total, count = 0.0, 0.0, 0
    for r in results:
        ids, greedy = r["prompt_tokens"], r["f64_greedy_tokens"]
        llm.reset()
        llm.eval(ids + greedy)
        rows = np.array(llm.scores[: len(ids) + len(greedy)])
        first = len(ids) - 1
        for j, top5 in enumerate(r["f64_greedy_path_top5"]):
            for t, v in top5:
                diff = abs(float(rows[first + j][t]) - v)
                worst, total, count = max(worst, diff), total + diff, count + 1
            margin = top5[0][1] - top5[1][1]
            got = int(np.argmax(rows[first + j]))
            if margin > 0.2 and got != top5[0][0]:
                raise SystemExit(f"{s.name}: llama.cpp's argmax {got} at path row {j} of {r['prompt']!r} is not the f64 top-1 {top5[0][0]} (margin {margin:.3f})")
        llm.reset()
        llm.eval(ids)
        cont = []
        for _ in range(LLAMA_CPP_STEPS):
            t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            cont.append(t)
            if t == s.vocab.eos:
                break
            llm.eval([t])
        r["llamacpp_greedy_tokens"] = cont
        r["llamacpp_greedy_text"] = llm.detokenize(cont).decode("utf-8", errors="replace")
    limit = 0.25 if s.quant else 0.05
    if worst > limit:
        raise SystemExit(f"{s.name}: llama.cpp is {worst:.4f} from the float64 pass (limit {limit})")
    return worst, total / max(count, 1)


SPECS = [
    Spec("tiny-qwen2-f32", "qwen2", eps=1e-6, theta=1000000.0, seed=2),
    Spec("tiny-qwen3-q8_0", "qwen3", head_dim=32, eps=1e-6, theta=1000000.0, quant="q8_0", tied=True, embed_std=0.25, seed=3),
    Spec("tiny-phi3-f32", "phi3", vocab="spm", extra_tokens=["<|endoftext|>"], seed=4),
    Spec("tiny-gemma3-f32", "gemma3", layers=6, kv_heads=1, head_dim=32, ff=128, eps=1e-6, theta=1000000.0,
         tied=True, window=5, embed_std=0.125, seed=5),
    Spec("tiny-llama3-rope-f32", "llama", theta=500000.0, seed=6),
]

if __name__ == "__main__":
    import llama_cpp

    for s in SPECS:
        path = os.path.join(FIX, s.name + ".gguf")
        write_gguf(s, path)
        T = read_tensors(path)
        results = golden(s, T)
        worst, mean = llama_cpp_check(s, path, results)
        out = dict(model=s.name + ".gguf", arch=s.arch,
                   generator=f"tools/make_arch_fixtures.py: numpy float64 forward on exactly dequantized weights, "
                             f"cross-checked by llama.cpp (llama-cpp-python {llama_cpp.__version__})",
                   llamacpp_vs_f64_path_max_abs_logit_diff=worst, llamacpp_vs_f64_path_mean_abs_logit_diff=mean,
                   results=results)
        with open(os.path.join(FIX, "golden", s.name + ".golden.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
        print(f"{s.name}: {os.path.getsize(path)} bytes; llama.cpp vs f64 along the greedy paths: max {worst:.2e}, mean {mean:.2e}")
