#!/usr/bin/env python3
"""Writes a GGUF file again as a split set, with gguf-py's own writer (the one llama.cpp's
convert_hf_to_gguf.py splits with): `NAME-0000k-of-0000n.gguf`, the metadata in the first part,
`split.no`, `split.count` and `split.tensors.count` in every part, the tensors dealt out in file
order, at most `--max-tensors` per part. `--small-first` puts no tensor in the first part (as
`gguf-split --no-tensor-first-split` and `small_first_shard` do).

The split fixtures in tests/fixtures/split/ were written with gguf 0.17.1 from PyPI:

    python3 -m venv /tmp/gv && /tmp/gv/bin/pip install gguf==0.17.1
    /tmp/gv/bin/python tools/make_split_fixture.py tests/fixtures/tiny-llama-q4_1.gguf \
        tests/fixtures/split/tiny-llama-q4_1.gguf --max-tensors 8
    /tmp/gv/bin/python tools/make_split_fixture.py tests/fixtures/tiny-llama-q4_1.gguf \
        tests/fixtures/split/tiny-llama-q4_1-small-first.gguf --max-tensors 12 --small-first

The output name's stem becomes the parts' prefix (`tiny-llama-q4_1-00001-of-00003.gguf`, ...).
"""

import argparse
import logging
from pathlib import Path

import gguf
from gguf.scripts.gguf_new_metadata import copy_with_new_metadata


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", type=Path, help="a whole GGUF file")
    ap.add_argument("output", type=Path, help="NAME.gguf: the parts are NAME-0000k-of-0000n.gguf")
    ap.add_argument("--max-tensors", type=int, required=True, help="most tensors in one part")
    ap.add_argument("--small-first", action="store_true", help="no tensor in the first part")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    reader = gguf.GGUFReader(args.input, "r")
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(
        args.output,
        arch=arch,
        endianess=reader.endianess,
        split_max_tensors=args.max_tensors,
        small_first_shard=args.small_first,
    )
    copy_with_new_metadata(reader, writer, {}, [])
    for name in writer.format_shard_names(args.output):
        print(name)


if __name__ == "__main__":
    main()
