#!/usr/bin/env python3
"""Writes the seed inputs of every fuzz target into its corpus archive,
fuzz/corpus/<target>_seed_corpus.zip (standard library only).

Seeds are small on purpose (the committed corpus stays well under 2 MB): metadata-only GGUF files
carrying the fixtures' tokenizers, tiny GGUF models and Hugging Face folders with random weights
and a few dimensions (configuration keys copied from the fixtures, dimensions shrunk), one real
fixture model, tokenizer.json files of several kinds, and chat templates of the shapes real models
ship. Run from anywhere: `python3 fuzz/make_seeds.py`. Existing entries of the same name are
replaced; other corpus entries are left alone.
"""

import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus_archive  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
CORPUS = os.path.join(ROOT, "fuzz", "corpus")

# GGUF value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}

# GGML tensor types: (id, elements per block, bytes per block).
T_F32, T_F16, T_Q4_0, T_Q4_1, T_Q8_0 = (0, 1, 4), (1, 1, 2), (2, 32, 18), (3, 32, 20), (8, 32, 34)
T_Q4_K, T_Q5_K, T_Q6_K, T_BF16 = (12, 256, 144), (13, 256, 176), (14, 256, 210), (30, 1, 2)

rng = random.Random(20240601)


# ---------------------------------------------------------------------------------------------
# GGUF reading and writing


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def value(self, ty):
        if ty == STRING:
            return self.string()
        if ty == ARRAY:
            ety, n = self.take("<I"), self.take("<Q")
            return (ety, [self.value(ety) for _ in range(n)])
        return self.take(SCALAR[ty])


def read_metadata(path):
    """The metadata of a GGUF file as [(key, type, value)]; arrays are (element type, list)."""
    with open(path, "rb") as f:
        r = Reader(f.read())
    assert r.data[:4] == b"GGUF"
    r.pos = 8
    _n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    out = []
    for _ in range(n_kv):
        key = r.string()
        ty = r.take("<I")
        out.append((key, ty, r.value(ty)))
    return out


def put_value(out, ty, v):
    if ty == STRING:
        b = v.encode()
        out += struct.pack("<Q", len(b)) + b
    elif ty == ARRAY:
        ety, items = v
        out += struct.pack("<IQ", ety, len(items))
        for x in items:
            put_value(out, ety, x)
    else:
        out += struct.pack(SCALAR[ty], v)


def write_gguf(metadata, tensors=(), version=3, alignment=32):
    """A GGUF file; `tensors` is [(name, dims (fastest first), ggml type, bytes)]."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata)))
    for key, ty, v in metadata:
        put_value(out, STRING, key)
        out += struct.pack("<I", ty)
        put_value(out, ty, v)
    offset, data = 0, bytearray()
    for name, dims, (type_id, _, _), raw in tensors:
        put_value(out, STRING, name)
        out += struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", type_id, offset)
        data += raw + bytes(-len(raw) % alignment)
        offset = len(data)
    out += bytes(-len(out) % alignment)
    return bytes(out + data)


def tensor(name, shape, dtype):
    """A tensor of logical `shape` (outermost first) filled with small random values."""
    dims = list(reversed(shape))
    n = 1
    for d in shape:
        n *= d
    type_id, block, size = dtype
    assert n % block == 0, (name, shape, dtype)
    if dtype == T_F32:
        raw = struct.pack(f"<{n}f", *(rng.uniform(-0.5, 0.5) for _ in range(n)))
    elif dtype in (T_F16, T_BF16):
        raw = struct.pack(f"<{n}e", *(rng.uniform(-0.5, 0.5) for _ in range(n)))
    else:
        raw = bytes(rng.randrange(256) for _ in range(n // block * size))
    return (name, dims, dtype, raw)


def tokenizer_keys(metadata):
    return [m for m in metadata if m[0].startswith("tokenizer.")]


def set_key(metadata, key, ty, value):
    metadata = [m for m in metadata if m[0] != key]
    return metadata + [(key, ty, value)]


# ---------------------------------------------------------------------------------------------
# Tiny models


def llama_model(tok, arch="llama", d=8, heads=2, kv=1, ff=16, layers=1, mat=T_F32, tied=False,
                bias=False, vocab=None):
    vocab = vocab or len(dict((m[0], m[2]) for m in tok)["tokenizer.ggml.tokens"][1])
    hd = d // heads
    meta = [("general.architecture", STRING, arch), ("general.name", STRING, "tiny"),
            (f"{arch}.context_length", U32, 32), (f"{arch}.embedding_length", U32, d),
            (f"{arch}.block_count", U32, layers), (f"{arch}.feed_forward_length", U32, ff),
            (f"{arch}.attention.head_count", U32, heads),
            (f"{arch}.attention.head_count_kv", U32, kv),
            (f"{arch}.attention.layer_norm_rms_epsilon", F32, 1e-5),
            (f"{arch}.rope.freq_base", F32, 10000.0)] + tok
    ts = [tensor("token_embd.weight", [vocab, d], mat)]
    for i in range(layers):
        b = f"blk.{i}."
        ts += [tensor(b + "attn_norm.weight", [d], T_F32),
               tensor(b + "attn_q.weight", [heads * hd, d], mat),
               tensor(b + "attn_k.weight", [kv * hd, d], mat),
               tensor(b + "attn_v.weight", [kv * hd, d], mat),
               tensor(b + "attn_output.weight", [d, heads * hd], mat),
               tensor(b + "ffn_norm.weight", [d], T_F32),
               tensor(b + "ffn_gate.weight", [ff, d], mat),
               tensor(b + "ffn_up.weight", [ff, d], mat),
               tensor(b + "ffn_down.weight", [d, ff], mat)]
        if bias:
            ts += [tensor(b + "attn_q.bias", [heads * hd], T_F32),
                   tensor(b + "attn_k.bias", [kv * hd], T_F32),
                   tensor(b + "attn_v.bias", [kv * hd], T_F32)]
    ts.append(tensor("output_norm.weight", [d], T_F32))
    if not tied:
        ts.append(tensor("output.weight", [vocab, d], mat))
    return write_gguf(meta, ts)


def gpt2_model(tok, d=8, heads=2, ff=16, layers=1, ctx=16, mat=T_F16):
    vocab = len(dict((m[0], m[2]) for m in tok)["tokenizer.ggml.tokens"][1])
    meta = [("general.architecture", STRING, "gpt2"), ("gpt2.context_length", U32, ctx),
            ("gpt2.embedding_length", U32, d), ("gpt2.block_count", U32, layers),
            ("gpt2.feed_forward_length", U32, ff), ("gpt2.attention.head_count", U32, heads),
            ("gpt2.attention.layer_norm_epsilon", F32, 1e-5)] + tok
    ts = [tensor("token_embd.weight", [vocab, d], mat),
          tensor("position_embd.weight", [ctx, d], T_F32)]
    for i in range(layers):
        b = f"blk.{i}."
        for name, shape in [("attn_norm", [d]), ("attn_qkv", [3 * d, d]), ("attn_output", [d, d]),
                            ("ffn_norm", [d]), ("ffn_up", [ff, d]), ("ffn_down", [d, ff])]:
            ts.append(tensor(b + name + ".weight", shape, mat if len(shape) == 2 else T_F32))
            ts.append(tensor(b + name + ".bias", shape[:1], T_F32))
    ts += [tensor("output_norm.weight", [d], T_F32), tensor("output_norm.bias", [d], T_F32)]
    return write_gguf(meta, ts)


def bert_model(tok, d=8, heads=2, ff=16, layers=1, ctx=16, mat=T_F32, pooling=1):
    vocab = len(dict((m[0], m[2]) for m in tok)["tokenizer.ggml.tokens"][1])
    meta = [("general.architecture", STRING, "bert"), ("bert.context_length", U32, ctx),
            ("bert.embedding_length", U32, d), ("bert.block_count", U32, layers),
            ("bert.feed_forward_length", U32, ff), ("bert.attention.head_count", U32, heads),
            ("bert.attention.layer_norm_epsilon", F32, 1e-12),
            ("bert.attention.causal", BOOL, False), ("bert.pooling_type", U32, pooling)] + tok
    ts = [tensor("token_embd.weight", [vocab, d], mat),
          tensor("position_embd.weight", [ctx, d], T_F32),
          tensor("token_types.weight", [2, d], T_F32),
          tensor("token_embd_norm.weight", [d], T_F32), tensor("token_embd_norm.bias", [d], T_F32)]
    for i in range(layers):
        b = f"blk.{i}."
        for name, shape in [("attn_q", [d, d]), ("attn_k", [d, d]), ("attn_v", [d, d]),
                            ("attn_output", [d, d]), ("attn_output_norm", [d]),
                            ("ffn_up", [ff, d]), ("ffn_down", [d, ff]),
                            ("layer_output_norm", [d])]:
            ts.append(tensor(b + name + ".weight", shape, mat if len(shape) == 2 else T_F32))
            ts.append(tensor(b + name + ".bias", shape[:1], T_F32))
    return write_gguf(meta, ts)


# ---------------------------------------------------------------------------------------------
# Hugging Face folders


def safetensors(tensors):
    """[(name, dtype string, shape)] with random data, as a safetensors file."""
    header, data = {"__metadata__": {"format": "pt"}}, bytearray()
    for name, dtype, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        if dtype == "F32":
            raw = struct.pack(f"<{n}f", *(rng.uniform(-0.5, 0.5) for _ in range(n)))
        else:
            raw = struct.pack(f"<{n}e", *(rng.uniform(-0.5, 0.5) for _ in range(n)))
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(data)


def hf_llama(dtype="F32", d=8, heads=2, kv=1, ff=16, vocab=16, tied=False, model_type="llama",
             rope_scaling=None):
    config = {"model_type": model_type, "vocab_size": vocab, "hidden_size": d,
              "intermediate_size": ff, "num_hidden_layers": 1, "num_attention_heads": heads,
              "num_key_value_heads": kv, "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": tied,
              "bos_token_id": 1, "eos_token_id": [2, 3], "rope_scaling": rope_scaling}
    hd = d // heads
    p = "model.layers.0."
    ts = [("model.embed_tokens.weight", dtype, [vocab, d]),
          (p + "input_layernorm.weight", dtype, [d]),
          (p + "self_attn.q_proj.weight", dtype, [heads * hd, d]),
          (p + "self_attn.k_proj.weight", dtype, [kv * hd, d]),
          (p + "self_attn.v_proj.weight", dtype, [kv * hd, d]),
          (p + "self_attn.o_proj.weight", dtype, [d, heads * hd]),
          (p + "post_attention_layernorm.weight", dtype, [d]),
          (p + "mlp.gate_proj.weight", dtype, [ff, d]),
          (p + "mlp.up_proj.weight", dtype, [ff, d]),
          (p + "mlp.down_proj.weight", dtype, [d, ff]),
          (p + "self_attn.rotary_emb.inv_freq", "F32", [hd // 2]),
          ("model.norm.weight", dtype, [d])]
    if model_type == "qwen2":
        ts += [(p + f"self_attn.{x}_proj.bias", dtype, [n * hd])
               for x, n in (("q", heads), ("k", kv), ("v", kv))]
    if not tied:
        ts.append(("lm_head.weight", dtype, [vocab, d]))
    return json.dumps(config, indent=2).encode() + b"\0" + safetensors(ts)


def hf_gemma3(dtype="BF16", d=8, heads=2, kv=1, ff=16, vocab=16, layers=2, hd=4):
    config = {"model_type": "gemma3_text", "vocab_size": vocab, "hidden_size": d,
              "intermediate_size": ff, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "head_dim": hd, "max_position_embeddings": 32,
              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
              "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
              "query_pre_attn_scalar": hd, "hidden_activation": "gelu_pytorch_tanh",
              "rope_scaling": {"rope_type": "linear", "factor": 8.0},
              "final_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": [1, 106]}
    ts = [("model.embed_tokens.weight", dtype, [vocab, d]), ("model.norm.weight", dtype, [d])]
    for layer in range(layers):
        p = f"model.layers.{layer}."
        ts += [(p + "input_layernorm.weight", dtype, [d]),
               (p + "self_attn.q_proj.weight", dtype, [heads * hd, d]),
               (p + "self_attn.k_proj.weight", dtype, [kv * hd, d]),
               (p + "self_attn.v_proj.weight", dtype, [kv * hd, d]),
               (p + "self_attn.o_proj.weight", dtype, [d, heads * hd]),
               (p + "self_attn.q_norm.weight", dtype, [hd]),
               (p + "self_attn.k_norm.weight", dtype, [hd]),
               (p + "post_attention_layernorm.weight", dtype, [d]),
               (p + "pre_feedforward_layernorm.weight", dtype, [d]),
               (p + "post_feedforward_layernorm.weight", dtype, [d]),
               (p + "mlp.gate_proj.weight", dtype, [ff, d]),
               (p + "mlp.up_proj.weight", dtype, [ff, d]),
               (p + "mlp.down_proj.weight", dtype, [d, ff])]
    return json.dumps(config, indent=2).encode() + b"\0" + safetensors(ts)


def hf_bert(dtype="F32", d=8, heads=2, vocab=16, ctx=16, pooling=None):
    """A BERT folder; `pooling` merges sentence-transformers' pooling flags into the config
    (the fuzz target reads the config as `1_Pooling/config.json` too)."""
    config = {"model_type": "bert", "vocab_size": vocab, "hidden_size": d,
              "num_hidden_layers": 1, "num_attention_heads": heads, "intermediate_size": 2 * d,
              "max_position_embeddings": ctx, "type_vocab_size": 2, "hidden_act": "gelu",
              "layer_norm_eps": 1e-12, "position_embedding_type": "absolute", **(pooling or {})}
    p = "encoder.layer.0."
    ts = [("embeddings.word_embeddings.weight", dtype, [vocab, d]),
          ("embeddings.position_embeddings.weight", dtype, [ctx, d]),
          ("embeddings.token_type_embeddings.weight", dtype, [2, d]),
          ("embeddings.LayerNorm.weight", dtype, [d]), ("embeddings.LayerNorm.bias", dtype, [d]),
          ("pooler.dense.weight", dtype, [d, d])]
    for m, shape in [("attention.self.query", [d, d]), ("attention.self.key", [d, d]),
                     ("attention.self.value", [d, d]), ("attention.output.dense", [d, d]),
                     ("attention.output.LayerNorm", [d]), ("intermediate.dense", [2 * d, d]),
                     ("output.dense", [d, 2 * d]), ("output.LayerNorm", [d])]:
        ts += [(p + m + ".weight", dtype, shape), (p + m + ".bias", dtype, shape[:1])]
    return json.dumps(config).encode() + b"\0" + safetensors(ts)


def hf_gpt2(dtype="F32", d=8, heads=2, vocab=16, ctx=16):
    config = {"model_type": "gpt2", "vocab_size": vocab, "n_embd": d, "n_layer": 1,
              "n_head": heads, "n_positions": ctx, "n_inner": None,
              "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
              "bos_token_id": 0, "eos_token_id": 0}
    p = "h.0."
    ts = [("wte.weight", dtype, [vocab, d]), ("wpe.weight", dtype, [ctx, d]),
          (p + "ln_1.weight", dtype, [d]), (p + "ln_1.bias", dtype, [d]),
          (p + "attn.bias", "F32", [1, 1, ctx, ctx]),
          (p + "attn.c_attn.weight", dtype, [d, 3 * d]), (p + "attn.c_attn.bias", dtype, [3 * d]),
          (p + "attn.c_proj.weight", dtype, [d, d]), (p + "attn.c_proj.bias", dtype, [d]),
          (p + "ln_2.weight", dtype, [d]), (p + "ln_2.bias", dtype, [d]),
          (p + "mlp.c_fc.weight", dtype, [d, 4 * d]), (p + "mlp.c_fc.bias", dtype, [4 * d]),
          (p + "mlp.c_proj.weight", dtype, [4 * d, d]), (p + "mlp.c_proj.bias", dtype, [d]),
          ("ln_f.weight", dtype, [d]), ("ln_f.bias", dtype, [d])]
    return json.dumps(config).encode() + b"\0" + safetensors(ts)


# ---------------------------------------------------------------------------------------------
# tokenizer.json files beyond the fixtures'

WORDLEVEL = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": 0, "content": "[UNK]", "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True},
                     {"id": 5, "content": "[CLS]", "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
    "pre_tokenizer": {"type": "Whitespace"},
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                                  {"Sequence": {"id": "A", "type_id": 0}}],
                       "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                {"Sequence": {"id": "B", "type_id": 1}}],
                       "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [5], "tokens": ["[CLS]"]}}},
    "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
    "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 1, "world": 2, "!": 3, ",": 4,
                                             "[CLS]": 5}, "unk_token": "[UNK]"},
}

WORDPIECE = {
    "version": "1.0", "added_tokens": [],
    "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                   "strip_accents": None, "lowercase": True},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
    "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 100,
              "vocab": {"[UNK]": 0, "[PAD]": 1, "[CLS]": 2, "[SEP]": 3, "hel": 4, "##lo": 5,
                        "world": 6, "!": 7, "1": 8, "##2": 9}},
}

UNIGRAM = {
    "version": "1.0", "added_tokens": [{"id": 0, "content": "<unk>", "single_word": False,
                                        "lstrip": False, "rstrip": False, "normalized": False,
                                        "special": True}],
    "normalizer": {"type": "Precompiled", "precompiled_charsmap": None},
    "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                      "split": True},
    "post_processor": None,
    "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                "split": True},
    "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": False,
              "vocab": [["<unk>", 0.0], ["\u2581", -2.0], ["\u2581hello", -3.0], ["h", -4.0],
                        ["e", -4.0], ["l", -4.0], ["o", -4.0], ["\u2581world", -3.5],
                        ["!", -5.0]]},
}

BPE_BYTE_FALLBACK = {
    "version": "1.0", "added_tokens": [
        {"id": 0, "content": "<unk>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True},
        {"id": 1, "content": "<s>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True},
        {"id": 2, "content": "</s>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}],
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "pre_tokenizer": None,
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                  {"Sequence": {"id": "A", "type_id": 0}}],
                       "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                {"Sequence": {"id": "B", "type_id": 1}}],
                       "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
              "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
              "byte_fallback": True, "ignore_merges": False,
              "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "<0xC3>": 4, "<0xA9>": 5,
                        "\u2581": 6, "h": 7, "i": 8, "\u2581h": 9, "\u2581hi": 10},
              "merges": [["\u2581", "h"], ["\u2581h", "i"]]},
}

BYTELEVEL_SPLIT = {
    "version": "1.0", "added_tokens": [
        {"id": 6, "content": "<|im_start|>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True},
        {"id": 7, "content": "<|im_end|>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}| ?\\p{L}+|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "Digits", "individual_digits": True},
        {"type": "Punctuation", "behavior": "Isolated"},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]},
    "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                       "use_regex": True},
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
              "byte_fallback": False, "ignore_merges": True,
              "vocab": {"a": 0, "b": 1, "\u0120": 2, "\u0120a": 3, "ab": 4, "1": 5},
              "merges": ["\u0120 a", "a b"]},
}

TOKENIZER_CONFIG_CHATML = {
    "bos_token": None, "eos_token": "<|im_end|>", "pad_token": {"content": "<|im_end|>"},
    "unk_token": None, "add_bos_token": False,
    "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                     "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
}

# ---------------------------------------------------------------------------------------------
# Chat templates: the shapes real models ship, then hostile ones.

SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by "
           "Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
           "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
           "{{ '<|im_start|>assistant\\n' }}{% endif %}")

LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}"
          "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
          "{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
          "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}"
          "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
          "{% endif %}{% endfor %}")

LLAMA3 = ("{{- bos_token }}\n{%- if not date_string is defined %}\n"
          "    {%- set date_string = strftime_now('%d %b %Y') %}\n{%- endif %}\n"
          "{%- if messages[0]['role'] == 'system' %}\n"
          "    {%- set system_message = messages[0]['content']|trim %}\n"
          "    {%- set messages = messages[1:] %}\n{%- else %}\n"
          "    {%- set system_message = \"\" %}\n{%- endif %}\n"
          "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
          "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
          "{{- system_message }}\n{{- \"<|eot_id|>\" }}\n"
          "{%- for message in messages %}\n"
          "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
          "+ message['content'] | trim + '<|eot_id|>' }}\n{%- endfor %}\n"
          "{%- if add_generation_prompt %}\n"
          "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n")

MISTRAL_NS = ("{%- set ns = namespace(system='', count=0) %}"
              "{%- for m in messages %}{%- if m.role == 'system' %}"
              "{%- set ns.system = ns.system ~ m.content ~ '\\n' %}{%- continue %}{%- endif %}"
              "{%- set ns.count = ns.count + 1 %}"
              "{%- if m.role == 'user' %}[INST] {% if loop.last and ns.system %}{{ ns.system }}"
              "{% endif %}{{ m.content }}[/INST]{%- elif m.role == 'assistant' %}"
              " {{ m.content }}{{ eos_token }}{%- else %}{{ raise_exception('bad role: ' ~ m.role) }}"
              "{%- endif %}{%- if ns.count > 99 %}{% break %}{% endif %}{%- endfor %}")

GEMMA_MACRO = ("{% macro turn(role, text) -%}<start_of_turn>{{ 'model' if role == 'assistant' else role }}\n"
               "{{ text | trim }}<end_of_turn>\n{%- endmacro %}"
               "{{ bos_token }}{% for m in messages %}{{ turn(m.role, m.content) }}\n{% endfor %}"
               "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")

FILTERS = ("{{ messages | tojson(indent=2) }}\n{{ messages | map(attribute='role') | join(', ') }}\n"
           "{% for k, v in {'b': 1, 'a': [1, 2]} | dictsort %}{{ k }}={{ v | tojson }};{% endfor %}\n"
           "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}"
           "{{ (messages | last).content | upper | replace('A', 'b') | indent(2, first=true) }}"
           "{{ '%s-%05d' | format('x', 42) }}{{ 'a,b'.split(',') | reverse | list }}"
           "{{ messages[0].content.startswith('You') }}{{ range(3) | batch(2) | list }}"
           "{{ messages | groupby('role') | list | length }}{{ [3, 1, 2] | sort | unique | sum }}"
           "{{ 'x' * 3 }}{{ 7 // 2 }}{{ 2 ** 8 }}{{ 'abc'[::-1] }}{{ {'k': none} | items | list }}"
           "{{ messages | rejectattr('content') | first | default('none') }}")

# Templates that burn the whole fuel budget are left out: they take seconds each in the debug
# build that replays the corpus (tests/engine/chat.rs covers them).
HOSTILE = [
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% for a in messages %}{% for b in messages %}{% for c in messages %}{{ a.content }}"
    "{% endfor %}{% endfor %}{% endfor %}",
    "{{ 'x' * 999999 | length }}",
    "{% set s = 'ab' %}{% set s = s ~ s %}{% set s = s ~ s %}{% set s = s ~ s %}{{ s | length }}",
    "{% set ns = namespace(s='x') %}{% for i in range(4) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}{{ ns.s }}",
    "{{ messages[0].content | indent(40) }}{{ [0] * 3 | list }}{{ 'q' | center(9) }}",
    "{{ raise_exception('no') }}",
    "{% if %}",
    "{{ messages | tojson(separators=(',', ':'), sort_keys=true, ensure_ascii=true) }}",
]


# ---------------------------------------------------------------------------------------------
# Saved conversations (src/session/saved_state.rs)

KV_VALUES_PER_WORD = {"f32": 1, "f16": 2, "q8_0": 4, "q4_0": 8, "nf4": 8}


def kv_row_words(kind, kv_dim):
    """Words of one KV row of `kind` (KvKind::row_words)."""
    per = KV_VALUES_PER_WORD[kind]
    if kind in ("q8_0", "q4_0", "nf4"):
        blocks = -(-kv_dim // 32)
        return -(-blocks // 2) + blocks * 32 // per
    return -(-kv_dim // per)


def saved_state(k_kind="f32", v_kind="f32", kv_dim=8, layer_rows=(6, 6), pos=3, high=None,
                note=None, engine="0.1.0"):
    """A saved conversation: magic, version, JSON header, rows, SHA-256."""
    import hashlib
    header = {"engine": engine, "model": "ab" * 32, "kv_dim": kv_dim, "k_kind": k_kind,
              "v_kind": v_kind, "layer_rows": list(layer_rows), "pos": pos,
              "high": pos if high is None else high, "tokens": [(7 * i + 3) % 50 for i in range(pos)]}
    if note is not None:
        header["note"] = note
    head = json.dumps(header, separators=(",", ":")).encode()
    out = bytearray(b"EMBERKV\0" + struct.pack("<II", 1, len(head)) + head)
    for rows in layer_rows:
        n = min(pos, rows)
        for kind in (k_kind, v_kind):
            words = n * kv_row_words(kind, kv_dim)
            out += struct.pack(f"<{words}I", *[rng.getrandbits(32) for _ in range(words)])
    out += hashlib.sha256(out).digest()
    return bytes(out)


SEEDS = {}


# ---------------------------------------------------------------------------------------------
# Tool calling (src/chat/tools.rs, src/chat/tool_calls.rs): byte 0 even = a request's tools,
# odd = a model's answer.

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather {in} a \"city\"",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                   "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "strict": True, "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
    "required": ["a", "b"], "additionalProperties": False}}}
NOW = {"type": "function", "function": {"name": "now"}}


def tool_call_seeds():
    """The tool_calls target's seeds."""
    for name, body in [
        ("auto", {"tools": [WEATHER, ADD, NOW], "tool_choice": "auto"}),
        ("required-single", {"tools": [WEATHER, ADD], "tool_choice": "required",
                             "parallel_tool_calls": False}),
        ("named", {"tools": [WEATHER, NOW], "tool_choice": {"type": "function",
                                                            "function": {"name": "now"}}}),
        ("none", {"tools": [ADD], "tool_choice": "none"}),
        ("duplicate", {"tools": [ADD, ADD]}),
        ("bad-name", {"tools": [{"type": "function", "function": {"name": "a b"}}]}),
        ("bad-ref", {"tools": [{"type": "function", "function": {"name": "r", "parameters": {
            "type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}}}]}),
    ]:
        save("tool_calls", "tools-" + name, b"\0" + json.dumps(body).encode())
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    for name, text in [
        ("hermes-two", "Let me look. \n" + call + "\n" + call.replace("Oslo", "Bergen")),
        ("hermes-cut", call + "\n<tool_call>\n{\"name\": \"now\", \"argu"),
        ("hermes-nested", "a <tool b <tool_call> x <tool_call>{}</tool_call></tool_call>"),
        ("hermes-not-json", "<tool_call>\n[1, 2]\n</tool_call> é <tool_call>{\"name\": 1}</tool_call>"),
        ("llama3-call", '  {"name": "add", "parameters": {"a": 1, "b": 2.5}}'),
        ("llama3-text", "It is {not} a call."),
        ("mistral-list", '[TOOL_CALLS] [{"name": "now", "arguments": {}}, {"name": "add", "arguments": {"a": "]"}}]'),
        ("mistral-list-cut", '[TOOL_CALLS][{"name": "now", "arguments": {}, "id": "a1b2c3d4e"}, 7, {"na'),
        ("mistral-args", 'So: [TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]now[ARGS]{}[TOOL_CALLS]x[ARGS][1]'),
        ("mistral-args-cut", "[TOOL_CALLS][TOOL_CALLS]now[ARG"),
    ]:
        save("tool_calls", "answer-" + name, b"\x01" + text.encode())


def save(target, name, data):
    """Queues a seed; `main` writes them into each target's archive at the end."""
    if isinstance(data, str):
        data = data.encode()
    SEEDS.setdefault(target, {})[name] = data


def write_seeds():
    """Each target's seeds into its archive (fuzz/corpus/<target>_seed_corpus.zip), replacing
    entries of the same name and keeping the rest."""
    for target, seeds in sorted(SEEDS.items()):
        files = corpus_archive.read_archive(target)
        files.update(seeds)
        corpus_archive.write_archive(target, files)
        print(f"{target}: {len(seeds)} seeds written ({len(files)} inputs in its archive)")


def main():
    fx = lambda *p: os.path.join(FIXTURES, *p)
    gpt2_tok = tokenizer_keys(read_metadata(fx("tiny-llama-f32.gguf")))
    spm_tok = tokenizer_keys(read_metadata(fx("tiny-llama-spm-f32.gguf")))
    chat_tok = set_key(gpt2_tok, "tokenizer.chat_template", STRING, SMOLLM2)
    tokens = dict((m[0], m[2]) for m in gpt2_tok)["tokenizer.ggml.tokens"]
    chat_tok = set_key(chat_tok, "tokenizer.ggml.tokens",
                       ARRAY, (STRING, tokens[1] + ["<|im_start|>", "<|im_end|>"]))
    types = dict((m[0], m[2]) for m in gpt2_tok)["tokenizer.ggml.token_type"]
    chat_tok = set_key(chat_tok, "tokenizer.ggml.token_type", ARRAY, (I32, types[1] + [3, 3]))
    untyped = [m for m in spm_tok if m[0] != "tokenizer.ggml.token_type"]
    llama3_pre = set_key(gpt2_tok, "tokenizer.ggml.pre", STRING, "llama-bpe")
    bert_tok = tokenizer_keys(read_metadata(fx("tiny-bert-f32.gguf")))

    tool_call_seeds()

    # Saved conversations: kinds, a wrapped ring, a note, an empty one.
    for name, data in [
        ("saved-f32", saved_state()),
        ("saved-q8-f16-ring", saved_state("q8_0", "f16", kv_dim=64, layer_rows=(4, 12), pos=9,
                                          high=11)),
        ("saved-nf4-note", saved_state("nf4", "q4_0", kv_dim=40, layer_rows=(5,), pos=5,
                                       note={"system": "be brief", "messages": [
                                           {"role": "user", "content": "hi"}]})),
        ("saved-empty", saved_state(layer_rows=(), pos=0)),
    ]:
        save("saved_state", name, data)

    # Metadata only: the tokenizer targets, and the header parser.
    for name, meta in [("meta-gpt2-tokenizer", gpt2_tok), ("meta-spm-tokenizer", spm_tok),
                       ("meta-chatml-template", chat_tok), ("meta-spm-untyped", untyped),
                       ("meta-llama3-pre", llama3_pre), ("meta-bert-wordpiece", bert_tok)]:
        save("tokenizer_gguf", name + ".gguf", write_gguf(meta))
    save("gguf_header", "meta-chatml-template.gguf", write_gguf(chat_tok))

    # Tiny models.
    models = {
        "llama-f32": llama_model(gpt2_tok),
        "llama-spm-q8_0": llama_model(spm_tok, d=32, heads=4, kv=2, ff=32, mat=T_Q8_0),
        "llama-chatml-q4_0": llama_model(chat_tok, d=32, heads=2, kv=2, ff=32, mat=T_Q4_0),
        "qwen2-bias-tied-q4_1": llama_model(gpt2_tok, arch="qwen2", d=32, heads=4, kv=1, ff=32,
                                            mat=T_Q4_1, tied=True, bias=True),
        "llama-bf16-2-layers": llama_model(llama3_pre, d=8, layers=2, mat=T_BF16),
        "gpt2-f16": gpt2_model(gpt2_tok),
        "bert-f32-mean": bert_model(bert_tok),
        "bert-q8_0-cls": bert_model(bert_tok, d=32, heads=2, ff=32, mat=T_Q8_0, pooling=2),
    }
    for name, data in models.items():
        save("gguf_model", name + ".gguf", data)
    for name in ("llama-f32", "gpt2-f16", "llama-spm-q8_0"):
        save("gguf_header", name + ".gguf", models[name])
    with open(fx("tiny-llama-q4_0.gguf"), "rb") as f:
        save("gguf_model", "fixture-tiny-llama-q4_0.gguf", f.read())

    # Split sets (tests/fixtures/split/, written by gguf-py): every part after its 4-byte
    # length, in order and shuffled, the small-first set, one part alone; names and URLs.
    def framed(paths):
        out = b""
        for path in paths:
            with open(path, "rb") as f:
                data = f.read()
            out += struct.pack("<I", len(data)) + data
        return out
    split = lambda stem, k: fx("split", f"{stem}-{k:05d}-of-00003.gguf")
    save("gguf_split", "set-in-order.bin", framed([split("tiny-llama-q4_1", k) for k in (1, 2, 3)]))
    save("gguf_split", "set-shuffled.bin", framed([split("tiny-llama-q4_1", k) for k in (3, 1, 2)]))
    save("gguf_split", "set-small-first.bin",
         framed([split("tiny-llama-q4_1-small-first", k) for k in (1, 2, 3)]))
    save("gguf_split", "first-part-alone.bin", framed([split("tiny-llama-q4_1", 1)]))
    save("gguf_split", "two-of-three.bin", framed([split("tiny-llama-q4_1", k) for k in (1, 3)]))
    save("gguf_split", "url.txt", "https://example.org/models/Llama-3.2-1B-Q4_0-00001-of-00003.gguf?download=true")
    save("gguf_split", "name.txt", "model-000002-of-000012.gguf")

    # Header shapes: every tensor type, version 2, nested arrays, a header past the first
    # stream attempt (64 KiB), overlapping tensors.
    every_type = [tensor(f"t.{i}", [2, t[1]], t)
                  for i, t in enumerate([T_F32, T_F16, T_BF16, T_Q4_0, T_Q4_1, T_Q8_0, T_Q4_K,
                                         T_Q5_K, T_Q6_K])]
    meta = [("general.architecture", STRING, "llama"), ("general.alignment", U32, 64),
            ("a.u8", U8, 7), ("a.i8", I8, -7), ("a.u16", U16, 7), ("a.i16", I16, -7),
            ("a.u64", U64, 1 << 40), ("a.i64", I64, -1), ("a.f64", F64, 1e300),
            ("a.bool", BOOL, True), ("a.nested", ARRAY, (ARRAY, [(U8, [1, 2]), (STRING, ["x"])])),
            ("a.bools", ARRAY, (BOOL, [True, False])), ("a.empty", ARRAY, (F64, []))]
    save("gguf_header", "every-type.gguf", write_gguf(meta, every_type, alignment=64))
    save("gguf_header", "v2-no-tensors.gguf", write_gguf(meta, version=2))
    big = [("general.architecture", STRING, "gpt2"), ("pad", STRING, "p" * 70000)]
    save("gguf_header", "header-over-64k.gguf", write_gguf(big, every_type[:3]))
    save("gguf_header", "empty.gguf", write_gguf([]))

    # Hugging Face folders.
    hf = {
        "llama-f32": hf_llama(),
        "llama-bf16-tied": hf_llama(dtype="BF16", tied=True),
        "qwen2-f16": hf_llama(dtype="F16", model_type="qwen2"),
        "mistral-gqa": hf_llama(d=16, heads=4, kv=2, model_type="mistral"),
        "gpt2-f32": hf_gpt2(),
        "gpt2-f16": hf_gpt2(dtype="F16"),
        "gemma3-text-bf16": hf_gemma3(),
        "bert-f32": hf_bert(),
        "bert-f16-cls-pooling": hf_bert(dtype="F16", pooling={"pooling_mode_cls_token": True,
                                                             "pooling_mode_mean_tokens": False}),
        "llama-yarn": hf_llama(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                             "original_max_position_embeddings": 16,
                                             "beta_fast": 32, "beta_slow": 1}),
    }
    for name, data in hf.items():
        save("safetensors_hf", name, data)
    for family in ("tiny-gpt2", "tiny-llama", "tiny-llama-spm"):
        with open(fx(family, "config.json"), "rb") as f:
            save("safetensors_hf", f"fixture-config-{family}", f.read() + b"\0" +
                 safetensors([("model.norm.weight", "F32", [4])]))

    # tokenizer.json (+ tokenizer_config.json).
    with open(fx("tiny-llama", "tokenizer.json"), "rb") as f:
        save("tokenizer_json", "fixture-bytelevel-bpe.json", f.read())
    with open(fx("tiny-bert", "tokenizer.json"), "rb") as f:
        save("tokenizer_json", "fixture-bert-wordpiece.json", f.read())
    with open(fx("tiny-llama-spm", "tokenizer.json"), "rb") as f:
        spm_json = f.read()
    with open(fx("tiny-llama-spm", "tokenizer_config.json"), "rb") as f:
        save("tokenizer_json", "fixture-spm-with-config.json", spm_json + b"\0" + f.read())
    for name, tok in [("wordlevel", WORDLEVEL), ("wordpiece", WORDPIECE), ("unigram", UNIGRAM),
                      ("bpe-byte-fallback", BPE_BYTE_FALLBACK)]:
        save("tokenizer_json", name + ".json", json.dumps(tok, ensure_ascii=False))
    save("tokenizer_json", "bytelevel-split-chatml.json",
         json.dumps(BYTELEVEL_SPLIT, ensure_ascii=False) + "\0" +
         json.dumps(TOKENIZER_CONFIG_CHATML))

    # Chat templates.
    for name, src in [("smollm2", SMOLLM2), ("llama2", LLAMA2), ("llama3", LLAMA3),
                      ("mistral-namespace", MISTRAL_NS), ("gemma-macro", GEMMA_MACRO),
                      ("filters", FILTERS)]:
        save("chat_template", name, src + "\0Hello there, how are you?")
    for i, src in enumerate(HOSTILE):
        save("chat_template", f"hostile-{i}", src + "\0x")


if __name__ == "__main__":
    main()
    write_seeds()
