"""BERT encoders for the embedding tests: a tiny random-weight fixture in both forms, and float64
goldens for it and for a real sentence-embedding model.

Usage (in a venv with numpy, gguf, safetensors and tokenizers, e.g. the bench's):
    python tools/make_bert_fixtures.py tiny [FIXTURE_DIR]
        writes FIXTURE_DIR/tiny-bert/ (config.json, model.safetensors, tokenizer.json: the
        Hugging Face form), its GGUF twins tiny-bert-f32.gguf and tiny-bert-q8_0.gguf (the
        layout, metadata and vocabulary spelling llama.cpp's converter writes for `bert`), and
        golden/tiny-bert.golden.json.
    python tools/make_bert_fixtures.py real MODEL_DIR NAME [FIXTURE_DIR]
        writes golden/NAME.golden.json for the Hugging Face BERT folder MODEL_DIR (the one
        `./build.sh setup` fetches into models/all-MiniLM-L6-v2).
    python tools/make_bert_fixtures.py gguf MODEL_DIR OUT.gguf
        writes MODEL_DIR as an F32 GGUF the way llama.cpp's converter would (for checking
        llama.cpp's embeddings against the goldens: tools/bench_llama_cpp_embed.py).

FIXTURE_DIR defaults to tests/fixtures. Goldens hold, per text, the token ids (from the
`tokenizers` package over the folder's tokenizer.json: `[CLS] text [SEP]`) and the float64
forward pass's mean-pooled and first-token (`[CLS]`) states before normalisation: embeddings
from the weights as stored (f32), or for a quantized GGUF twin from its exactly dequantized
tensors (`mean_q8_0`, `cls_q8_0`).
"""
import json
import math
import os
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

ROOT = os.path.join(os.path.dirname(__file__), "..")
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# Texts for the goldens: plain, cased and accented (the normaliser lowercases and strips
# accents), punctuation, an unknown word, and a longer one.
TEXTS = [
    "Permission is hereby granted, free of charge.",
    "THE SOFTWARE IS PROVIDED AS IS, WITHOUT WARRANTY OF ANY KIND.",
    "A copy of this license is provided with the software.",
    "Café déjà vu: zyxwq!",
    " ".join(["The above copyright notice and this permission notice shall be included"] * 6),
]

# Words of the tiny vocabulary (with the letters and `##` letters every word falls back to).
WORDS = """the of and to in is or any this software license permission hereby granted free
charge provided as without warranty kind copy with notice above copyright shall be included
all copies substantial portions person obtaining files use merge publish distribute sell
deal restriction limitation rights cafe vu""".split()
SUFFIXES = ["##es", "##ed", "##ing", "##ly", "##er", "##tion"]


def gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def forward(t, cfg, ids):
    """Float64 BertModel forward over `t` (Hugging Face names, float64 arrays): [n, d]."""
    d, heads, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["layer_norm_eps"]
    hd = d // heads
    n = len(ids)
    p = lambda name: t[name]
    x = p("embeddings.word_embeddings.weight")[ids] + p("embeddings.position_embeddings.weight")[:n]
    x = x + p("embeddings.token_type_embeddings.weight")[0]
    x = layer_norm(x, p("embeddings.LayerNorm.weight"), p("embeddings.LayerNorm.bias"), eps)
    for i in range(cfg["num_hidden_layers"]):
        L = lambda s: t[f"encoder.layer.{i}.{s}"]
        lin = lambda x, m: x @ L(m + ".weight").T + L(m + ".bias")
        q = lin(x, "attention.self.query").reshape(n, heads, hd).transpose(1, 0, 2)
        k = lin(x, "attention.self.key").reshape(n, heads, hd).transpose(1, 0, 2)
        v = lin(x, "attention.self.value").reshape(n, heads, hd).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(1, 0, 2).reshape(n, d)
        x = layer_norm(lin(ctx, "attention.output.dense") + x, L("attention.output.LayerNorm.weight"),
                       L("attention.output.LayerNorm.bias"), eps)
        h = gelu(lin(x, "intermediate.dense"))
        x = layer_norm(lin(h, "output.dense") + x, L("output.LayerNorm.weight"), L("output.LayerNorm.bias"), eps)
    return x


def pooled(states):
    return states.mean(0), states[0]


# llama.cpp's GGUF names for BertModel's tensors.
def gguf_name(hf):
    whole = {
        "embeddings.word_embeddings.weight": "token_embd.weight",
        "embeddings.position_embeddings.weight": "position_embd.weight",
        "embeddings.token_type_embeddings.weight": "token_types.weight",
        "embeddings.LayerNorm.weight": "token_embd_norm.weight",
        "embeddings.LayerNorm.bias": "token_embd_norm.bias",
    }
    if hf in whole:
        return whole[hf]
    if not hf.startswith("encoder.layer."):
        return None
    rest = hf[len("encoder.layer."):]
    layer, rest = rest.split(".", 1)
    module, suffix = rest.rsplit(".", 1)
    names = {
        "attention.self.query": "attn_q",
        "attention.self.key": "attn_k",
        "attention.self.value": "attn_v",
        "attention.output.dense": "attn_output",
        "attention.output.LayerNorm": "attn_output_norm",
        "intermediate.dense": "ffn_up",
        "output.dense": "ffn_down",
        "output.LayerNorm": "layer_output_norm",
    }
    return f"blk.{layer}.{names[module]}.{suffix}"


def phantom(token):
    """llama.cpp's spelling of a WordPiece token: `▁word` for a word start, `piece` for `##piece`."""
    if token.startswith("[") and token.endswith("]"):
        return token
    if token.startswith("##"):
        return token[2:]
    return "\u2581" + token


def write_gguf(t, cfg, tok_json, path, qtype=None, pooling=1):
    """`t` (Hugging Face names) as llama.cpp's converter writes a BERT GGUF; matrices in
    `qtype` (Q8_0) or F32. Returns the tensors as stored, dequantized, by Hugging Face name."""
    w = gguf.GGUFWriter(path, "bert")
    w.add_name(os.path.basename(path))
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(pooling))
    vocab = tok_json["model"]["vocab"]
    tokens = [tok for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t_] for t_ in tokens] == list(range(len(tokens)))
    types = [gguf.TokenType.CONTROL if tok in SPECIALS else gguf.TokenType.NORMAL for tok in tokens]
    types[vocab["[UNK]"]] = gguf.TokenType.UNKNOWN
    w.add_tokenizer_model("bert")
    w.add_token_list([phantom(tok) for tok in tokens])
    w.add_token_types(types)
    w.add_unk_token_id(vocab["[UNK]"])
    w.add_sep_token_id(vocab["[SEP]"])
    w.add_pad_token_id(vocab["[PAD]"])
    w.add_bos_token_id(vocab["[CLS]"])
    w.add_eos_token_id(vocab["[SEP]"])
    # newer converters also name the CLS token (gguf-py 0.19 has no writer method for it)
    w.add_uint32("tokenizer.ggml.cls_token_id", vocab["[CLS]"])
    w.add_mask_token_id(vocab["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_token_type_count(cfg.get("type_vocab_size", 2))
    stored = {}
    for hf, a in t.items():
        name = gguf_name(hf)
        if name is None:
            continue
        a32 = a.astype(np.float32)
        if qtype is not None and a32.ndim == 2 and name != "token_types.weight":
            data = quantize(a32, qtype)
            w.add_tensor(name, data, raw_dtype=qtype)
            stored[hf] = dequantize(data, qtype).reshape(a32.shape).astype(np.float64)
        else:
            w.add_tensor(name, a32)
            stored[hf] = a32.astype(np.float64)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


def tiny(fix):
    rng = np.random.default_rng(20261207)
    vocab_list = SPECIALS + list("abcdefghijklmnopqrstuvwxyz") + ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    vocab_list += list(".,:;!?'-()") + WORDS + SUFFIXES
    vocab = {tok: i for i, tok in enumerate(vocab_list)}
    tk = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tk.decoder = decoders.WordPiece(prefix="##")
    tk.add_special_tokens(SPECIALS)
    cfg = {
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": len(vocab_list),
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "hidden_act": "gelu", "max_position_embeddings": 128, "type_vocab_size": 2,
        "layer_norm_eps": 1e-12, "position_embedding_type": "absolute", "pad_token_id": 0,
    }
    d, ff, V, P = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["max_position_embeddings"]
    g = lambda *shape, s=0.1: rng.normal(0.0, s, shape)
    t = {
        "embeddings.word_embeddings.weight": g(V, d, s=0.5),
        "embeddings.position_embeddings.weight": g(P, d, s=0.2),
        "embeddings.token_type_embeddings.weight": g(2, d, s=0.2),
        "embeddings.LayerNorm.weight": 1.0 + g(d),
        "embeddings.LayerNorm.bias": g(d),
        # read by nothing: the loader must skip them
        "pooler.dense.weight": g(d, d),
        "pooler.dense.bias": g(d),
    }
    for i in range(cfg["num_hidden_layers"]):
        pre = f"encoder.layer.{i}."
        for m, (o, n_in) in {"attention.self.query": (d, d), "attention.self.key": (d, d),
                             "attention.self.value": (d, d), "attention.output.dense": (d, d),
                             "intermediate.dense": (ff, d), "output.dense": (d, ff)}.items():
            t[pre + m + ".weight"] = g(o, n_in, s=1.5 / math.sqrt(n_in))
            t[pre + m + ".bias"] = g(o)
        for m in ["attention.output.LayerNorm", "output.LayerNorm"]:
            t[pre + m + ".weight"] = 1.0 + g(d)
            t[pre + m + ".bias"] = g(d)
    t = {k: v.astype(np.float32) for k, v in t.items()}
    folder = os.path.join(fix, "tiny-bert")
    os.makedirs(folder, exist_ok=True)
    save_file({**t, "embeddings.position_ids": np.arange(P, dtype=np.int64)[None, :]},
              os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    tk.save(os.path.join(folder, "tokenizer.json"))
    tok_json = json.loads(tk.to_str())
    t64 = {k: v.astype(np.float64) for k, v in t.items()}
    write_gguf(t, cfg, tok_json, os.path.join(fix, "tiny-bert-f32.gguf"))
    q8 = write_gguf(t, cfg, tok_json, os.path.join(fix, "tiny-bert-q8_0.gguf"), qtype=Q.Q8_0, pooling=2)
    results = []
    for text in TEXTS:
        ids = tk.encode(text).ids
        mean, cls = pooled(forward(t64, cfg, ids))
        mean_q, cls_q = pooled(forward(q8, cfg, ids))
        results.append({"text": text, "ids": ids, "mean": mean.tolist(), "cls": cls.tolist(),
                        "mean_q8_0": mean_q.tolist(), "cls_q8_0": cls_q.tolist()})
    golden = {"model": "tiny-bert", "pooling_f32_gguf": "mean", "pooling_q8_0_gguf": "cls",
              "results": results}
    with open(os.path.join(fix, "golden", "tiny-bert.golden.json"), "w") as f:
        json.dump(golden, f)
    print("wrote tiny-bert, its GGUF twins and golden/tiny-bert.golden.json;",
          "token counts", [len(r["ids"]) for r in results])


def load_folder(folder):
    t = load_file(os.path.join(folder, "model.safetensors"))
    t = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in t.items()}
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    return t, cfg


def real(folder, name, fix):
    t, cfg = load_folder(folder)
    t64 = {k: v.astype(np.float64) for k, v in t.items() if v.dtype != np.int64}
    tk = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    tk.no_truncation()
    tk.no_padding()
    results = []
    for text in TEXTS:
        ids = tk.encode(text).ids
        mean, cls = pooled(forward(t64, cfg, ids))
        results.append({"text": text, "ids": ids, "mean": [round(v, 9) for v in mean.tolist()],
                        "cls": [round(v, 9) for v in cls.tolist()]})
    with open(os.path.join(fix, "golden", f"{name}.golden.json"), "w") as f:
        json.dump({"model": name, "results": results}, f)
    print(f"wrote golden/{name}.golden.json; token counts", [len(r["ids"]) for r in results])


def to_gguf(folder, out):
    t, cfg = load_folder(folder)
    t = {k: v for k, v in t.items() if v.dtype != np.int64}
    with open(os.path.join(folder, "tokenizer.json")) as f:
        tok_json = json.load(f)
    write_gguf(t, cfg, tok_json, out)
    print("wrote", out)


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "tiny":
        tiny(sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "tests", "fixtures"))
    elif cmd == "real":
        real(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else os.path.join(ROOT, "tests", "fixtures"))
    elif cmd == "gguf":
        to_gguf(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
