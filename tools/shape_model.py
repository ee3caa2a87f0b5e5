#!/usr/bin/env python3
"""Shape models: a GGUF with a real model's header (metadata, tokenizer, tensor names, shapes and
types) and random weights, which loads and runs at exactly the real model's speed and memory.

    python3 tools/shape_model.py header REAL.gguf HEADER.bin   # the header alone (small)
    python3 tools/shape_model.py fill HEADER.bin OUT.gguf      # header + random weights
    python3 tools/shape_model.py like REAL.gguf OUT.gguf       # both steps in one

Weights are drawn from a fixed seed so two runs write the same bytes. Block scales stay small
and finite (no NaN or infinity reaches a kernel); norm weights are 1. Python's standard library
alone.
Types written: F32, F16, Q4_0, Q4_1, Q8_0 (others are refused by name).
"""

import struct
import sys

import random
from array import array
from math import prod

# GGML type id -> (name, elements per block, bytes per block)
TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
}
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


def parse(path):
    """(header bytes up to the data section, [(name, dims, type, offset)], alignment)."""
    with open(path, "rb") as f:
        r = Reader(f)
        if f.read(4) != b"GGUF":
            raise SystemExit(f"{path}: not a GGUF file")
        (version,) = r.read("I")
        if version < 2:
            raise SystemExit(f"{path}: GGUF version {version} is not supported")
        (n_tensors,) = r.read("Q")
        (n_kv,) = r.read("Q")
        align = 32
        for _ in range(n_kv):
            key = r.string().decode()
            (t,) = r.read("I")
            v = r.value(t)
            if key == "general.alignment":
                align = int(v)
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
    else:
        # block scale d: a positive f16 with exponent 2^-9 (d in [0.00195, 0.0039))
        buf[1::size] = bytes(0x18 | (b & 0x03) for b in buf[1::size])
        if tt == 3:
            # Q4_1's minimum m = -8 d: the same mantissa, exponent + 3, negative
            buf[2::size] = buf[0::size]
            buf[3::size] = bytes(0xA4 | (b & 0x03) for b in buf[1::size])
    return bytes(buf)


def fill(header_path, out_path):
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
            data = random_tensor(rng, name, dims, tt)
            assert len(data) == nbytes(name, dims, tt)
            out.write(data)
        pad = (-(out.tell() - base)) % align
        out.write(b"\0" * pad)
    print(f"{out_path}: {len(tensors)} tensors of random weights after {len(header)} bytes of header")


def main(argv):
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
