#!/usr/bin/env python3
"""Shape models: a GGUF with a real model's header (metadata, tokenizer, tensor names, shapes and
types) and random weights, which loads and runs at exactly the real model's speed and memory.

    python3 tools/shape_model.py header REAL.gguf HEADER.bin   # the header alone (small)
    python3 tools/shape_model.py fill HEADER.bin OUT.gguf      # header + random weights
    python3 tools/shape_model.py like REAL.gguf OUT.gguf       # both steps in one
    python3 tools/shape_model.py named SHAPE TOKENIZER.gguf OUT.gguf [--type T] [--embedding T]

`named` writes a model of a named real shape (llama-1b, qwen-1.5b, llama-3b, llama-8b: the
published configurations of Llama-3.2-1B, Qwen2.5-1.5B, Llama-3.2-3B and Llama-3.1-8B) from
scratch, with the tokenizer (and so the vocabulary size) of TOKENIZER.gguf; its matrices in
type T (default q4_0), the token embedding in its own type (default q8_0), norms in f32.

Weights are drawn from a fixed seed so two runs write the same bytes. Block scales stay small
and finite (no NaN or infinity reaches a kernel); norm weights are 1. Python's standard library
alone.
Types written: F32, F16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K (others are refused by name).
"""

import struct
import sys

import random
from array import array
from math import prod

import llama3_rope

# GGML type id -> (name, elements per block, bytes per block)
TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144),
    14: ("Q6_K", 256, 210),
}
TYPE_IDS = {name.lower(): tt for tt, (name, _, _) in TYPES.items()}
NIBBLE_ZERO = bytes(
    ((b & 0x0F) or 8) | (((b >> 4) or 8) << 4) for b in range(256)
)
BYTE_ZERO = bytes(0 if b == 0x80 else b for b in range(256))
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class Reader:
    def __init__(self, f):
        self.f = f

    def read(self, fmt):
        n = struct.calcsize("<" + fmt)
        b = self.f.read(n)
        if len(b) != n:
            raise SystemExit(f"{self.f.name}: the GGUF header ends early")
        return struct.unpack("<" + fmt, b)

    def string(self):
        (n,) = self.read("Q")
        return self.f.read(n)

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            (et,) = self.read("I")
            (n,) = self.read("Q")
            return [self.value(et) for _ in range(n)]
        if t not in SCALARS:
            raise SystemExit(f"{self.f.name}: unknown metadata value type {t}")
        return self.read(SCALARS[t])[0]


def metadata(f, path):
    """Reads a GGUF's start from `f`: (its Reader, the tensor count, [(key, value, the entry's
    bytes)]), leaving `f` at the tensor infos."""
    r = Reader(f)
    if f.read(4) != b"GGUF":
        raise SystemExit(f"{path}: not a GGUF file")
    (version,) = r.read("I")
    if version < 2:
        raise SystemExit(f"{path}: GGUF version {version} is not supported")
    (n_tensors,) = r.read("Q")
    (n_kv,) = r.read("Q")
    entries = []
    for _ in range(n_kv):
        start = f.tell()
        key = r.string().decode()
        (t,) = r.read("I")
        v = r.value(t)
        end = f.tell()
        f.seek(start)
        entries.append((key, v, f.read(end - start)))
    return r, n_tensors, entries


def parse(path):
    """(header bytes up to the data section, [(name, dims, type, offset)], alignment)."""
    with open(path, "rb") as f:
        r, n_tensors, entries = metadata(f, path)
        align = next((int(v) for k, v, _ in entries if k == "general.alignment"), 32)
        tensors = []
        for _ in range(n_tensors):
            name = r.string().decode()
            (nd,) = r.read("I")
            dims = r.read("Q" * nd)
            (tt,) = r.read("I")
            (off,) = r.read("Q")
            tensors.append((name, dims, tt, off))
        end = f.tell()
        data = (end + align - 1) // align * align
        f.seek(0)
        return f.read(data), tensors, align


def nbytes(name, dims, tt):
    if tt not in TYPES:
        raise SystemExit(f"tensor {name}: GGML type {tt} is not written by this tool")
    _, block, size = TYPES[tt]
    n = prod(dims)
    if n % block:
        raise SystemExit(f"tensor {name}: {n} elements are not whole blocks of {block}")
    return n // block * size


def random_tensor(rng, name, dims, tt):
    """Random bytes of one tensor whose every value is small and finite: the sign and exponent
    bytes of each float (and of each block's scales) are set, the other bytes stay random."""
    n = prod(dims)
    _, block, size = TYPES[tt]
    buf = bytearray(rng.randbytes(n // block * size))
    if tt == 0:
        if "norm" in name:
            return array("f", [1.0]).tobytes() * n
        # exponent 2^-7 or 2^-6 with either sign: |w| in [0.0078, 0.031)
        buf[3::4] = bytes(0x3C | (b & 0x80) for b in buf[3::4])
    elif tt == 1:
        if "norm" in name:
            return struct.pack("<e", 1.0) * n
        buf[1::2] = bytes(0x20 | (b & 0x81) for b in buf[1::2])
    elif tt == 12:
        # Q4_K: d (bytes 0-1) in [2^-14, 2^-13) and dmin (2-3) 8 times larger, so that
        # d·sc·q − dmin·m (sc, m random 6-bit, q random 4-bit) is about as often negative as
        # positive and under about 0.06
        buf[1::size] = bytes(0x04 | (b & 0x03) for b in buf[1::size])
        buf[3::size] = bytes(0x10 | (b & 0x03) for b in buf[3::size])
    elif tt == 14:
        # Q6_K: d (bytes 208-209) in [2^-14, 2^-13); the 16 signed scales and the 6-bit values
        # (minus 32) are symmetric already
        buf[209::size] = bytes(0x04 | (b & 0x03) for b in buf[209::size])
    elif tt == 6:
        # Q5_0: the values (-16..15) lean negative by half a step; d of either sign in
        # [0.00195, 0.0039) makes every matrix's lean cancel over its blocks
        buf[1::size] = bytes(0x18 | (b & 0x83) for b in buf[1::size])
    elif tt == 7:
        # Q5_1: d in [0.00195, 0.0039) and the minimum m = -16 d (exponent + 4, negative), so
        # that d·q + m (q in 0..31) is about as often negative as positive
        buf[1::size] = bytes(0x18 | (b & 0x03) for b in buf[1::size])
        buf[2::size] = buf[0::size]
        buf[3::size] = bytes(0xA8 | (b & 0x03) for b in buf[1::size])
    else:
        # values symmetric about 0 (a uniform byte is not: -8..7 and -128..127 both lean
        # negative, and a common lean in every matrix makes every position's output the same):
        # a 4-bit 0 (-8) becomes 8 (0), an 8-bit -128 becomes 0
        buf = bytearray(buf.translate(NIBBLE_ZERO if tt in (2, 3) else BYTE_ZERO))
        # block scale d: a positive f16 with exponent 2^-9 (d in [0.00195, 0.0039)), or 2^-12
        # for Q8_0 (d in [0.00024, 0.00049)), so that |w| stays under about 0.06 in every type
        high = 0x0C if tt == 8 else 0x18
        buf[1::size] = bytes(high | (b & 0x03) for b in buf[1::size])
        if tt == 3:
            # Q4_1's minimum m = -8 d: the same mantissa, exponent + 3, negative
            buf[2::size] = buf[0::size]
            buf[3::size] = bytes(0xA4 | (b & 0x03) for b in buf[1::size])
    return bytes(buf)


def fill(header_path, out_path, fixed=None):
    """Writes the header at `header_path` and random weights to `out_path`; `fixed` maps tensor
    names to the bytes they hold instead."""
    fixed = fixed or {}
    header, tensors, align = parse(header_path)
    rng = random.Random(2026)
    with open(out_path, "wb") as out:
        out.write(header)
        base = len(header)
        for name, dims, tt, off in sorted(tensors, key=lambda t: t[3]):
            pos = out.tell() - base
            if off < pos:
                raise SystemExit(f"tensor {name}: offset {off} overlaps the tensor before it")
            out.write(b"\0" * (off - pos))
            data = fixed[name] if name in fixed else random_tensor(rng, name, dims, tt)
            assert len(data) == nbytes(name, dims, tt)
            out.write(data)
        pad = (-(out.tell() - base)) % align
        out.write(b"\0" * pad)
    print(f"{out_path}: {len(tensors)} tensors of random weights after {len(header)} bytes of header")

# The published configurations: (architecture, width, layers, heads, KV heads, FFN width,
# RoPE base, output tied to the embedding, Q/K/V biases, Llama 3 RoPE scaling).
SHAPES = {
    "llama-1b": ("llama", 2048, 16, 32, 8, 8192, 500000.0, True, False, True),
    "qwen-1.5b": ("qwen2", 1536, 28, 12, 2, 8960, 1000000.0, True, True, False),
    "llama-3b": ("llama", 3072, 28, 24, 8, 8192, 500000.0, True, False, True),
    "llama-8b": ("llama", 4096, 32, 32, 8, 14336, 500000.0, False, False, True),
}
U32, F32, STRING = 4, 6, 8


def kv_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, t, value):
    out = kv_string(key) + struct.pack("<I", t)
    if t == STRING:
        return out + kv_string(value)
    return out + struct.pack("<" + SCALARS[t], value)


def tokenizer_entries(path):
    """The raw metadata entries `tokenizer.*` of the GGUF at `path`, and its vocabulary size."""
    with open(path, "rb") as f:
        _, _, entries = metadata(f, path)
    tok = [(k, v, raw) for k, v, raw in entries if k.startswith("tokenizer.")]
    vocab = next((len(v) for k, v, _ in tok if k == "tokenizer.ggml.tokens"), 0)
    if not vocab:
        raise SystemExit(f"{path}: no tokenizer.ggml.tokens to borrow")
    return [raw for _, _, raw in tok], vocab


def named(shape, tokenizer_path, out_path, matrix_type, embedding_type):
    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
    for t in (matrix_type, embedding_type):
        if t not in TYPE_IDS:
            raise SystemExit(f"unknown type {t!r}: one of {', '.join(TYPE_IDS)}")
    arch, width, layers, heads, kv_heads, ffn, base, tied, bias, llama3 = SHAPES[shape]
    head_dim = width // heads
    kv_width = kv_heads * head_dim
    tok, vocab = tokenizer_entries(tokenizer_path)
    mt, et, f32 = TYPE_IDS[matrix_type], TYPE_IDS[embedding_type], 0
    tensors = [("token_embd.weight", (width, vocab), et)]
    for i in range(layers):
        b = f"blk.{i}."
        tensors += [
            (b + "attn_norm.weight", (width,), f32),
            (b + "attn_q.weight", (width, width), mt),
            (b + "attn_k.weight", (width, kv_width), mt),
            (b + "attn_v.weight", (width, kv_width), mt),
            (b + "attn_output.weight", (width, width), mt),
            (b + "ffn_norm.weight", (width,), f32),
            (b + "ffn_gate.weight", (width, ffn), mt),
            (b + "ffn_up.weight", (width, ffn), mt),
            (b + "ffn_down.weight", (ffn, width), mt),
        ]
        if bias:
            tensors += [
                (b + "attn_q.bias", (width,), f32),
                (b + "attn_k.bias", (kv_width,), f32),
                (b + "attn_v.bias", (kv_width,), f32),
            ]
    tensors.append(("output_norm.weight", (width,), f32))
    if not tied:
        tensors.append(("output.weight", (width, vocab), mt))
    meta = [
        kv("general.architecture", STRING, arch),
        kv("general.name", STRING, f"{shape} shape (random weights)"),
        kv("general.alignment", U32, 32),
        kv(f"{arch}.context_length", U32, 131072 if arch == "llama" else 32768),
        kv(f"{arch}.embedding_length", U32, width),
        kv(f"{arch}.block_count", U32, layers),
        kv(f"{arch}.feed_forward_length", U32, ffn),
        kv(f"{arch}.attention.head_count", U32, heads),
        kv(f"{arch}.attention.head_count_kv", U32, kv_heads),
        kv(f"{arch}.rope.dimension_count", U32, head_dim),
        kv(f"{arch}.rope.freq_base", F32, base),
        kv(f"{arch}.attention.layer_norm_rms_epsilon", F32, 1e-5 if arch == "llama" else 1e-6),
        kv(f"{arch}.vocab_size", U32, vocab),
    ]
    fixed = {}
    if llama3:
        # Llama 3's RoPE scaling as its GGUF files carry it: a divisor per frequency
        tensors.append(("rope_freqs.weight", (head_dim // 2,), f32))
        factor = 32.0 if width < 4096 else 8.0
        fixed["rope_freqs.weight"] = array(
            "f", llama3_rope.divisors(head_dim, base, factor, 1.0, 4.0, 8192)
        ).tobytes()
    meta += tok
    infos, offset = [], 0
    for name, dims, tt in tensors:
        infos.append(
            kv_string(name)
            + struct.pack("<I", len(dims))
            + struct.pack("<" + "Q" * len(dims), *dims)
            + struct.pack("<IQ", tt, offset)
        )
        offset += (nbytes(name, dims, tt) + 31) // 32 * 32
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)) + b"".join(meta)
    header += b"".join(infos)
    header += b"\0" * ((-len(header)) % 32)
    tmp = out_path + ".header"
    with open(tmp, "wb") as f:
        f.write(header)
    try:
        fill(tmp, out_path, fixed)
    finally:
        import os

        os.remove(tmp)


def main(argv):
    if len(argv) >= 5 and argv[1] == "named":
        opts = {"--type": "q4_0", "--embedding": "q8_0"}
        rest = argv[5:]
        while rest:
            if rest[0] not in opts or len(rest) < 2:
                raise SystemExit(__doc__)
            opts[rest[0]] = rest[1].lower()
            rest = rest[2:]
        named(argv[2], argv[3], argv[4], opts["--type"], opts["--embedding"])
        return
    if len(argv) != 4 or argv[1] not in ("header", "fill", "like"):
        raise SystemExit(__doc__)
    cmd, src, dst = argv[1:]
    if cmd == "header":
        header, tensors, _ = parse(src)
        for name, dims, tt, _ in tensors:
            nbytes(name, dims, tt)
        with open(dst, "wb") as f:
            f.write(header)
        print(f"{dst}: {len(header)} bytes, {len(tensors)} tensors")
    else:  # fill reads a header file, like a whole GGUF: the same header either way
        fill(src, dst)


if __name__ == "__main__":
    main(sys.argv)
