#!/usr/bin/env python3
"""The saved fuzz corpora, one zip archive per target (fuzz/corpus/<target>_seed_corpus.zip, the
OSS-Fuzz convention), and the folders libFuzzer reads them from (fuzz/corpus/<target>/, not
committed). Standard library only.

  python3 fuzz/corpus_archive.py unpack [TARGET...]   archives -> folders (what is there stays)
  python3 fuzz/corpus_archive.py pack [TARGET...]     folders -> archives (each folder's files)
  python3 fuzz/corpus_archive.py merge TARGET DIR     DIR's files added to TARGET's archive

Without targets, every archive (unpack) or every folder (pack). Archives are written
deterministically: entries in name order, a fixed timestamp, deflate level 9, so packing the
same files twice gives the same bytes. `tests/formats/fuzz_replay.rs` reads the archives.
"""

import os
import sys
import zipfile

ROOT = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(ROOT, "corpus")
SUFFIX = "_seed_corpus.zip"
STAMP = (2026, 1, 1, 0, 0, 0)


def archive(target):
    return os.path.join(CORPUS, target + SUFFIX)


def folder(target):
    return os.path.join(CORPUS, target)


def archived_targets():
    return sorted(n[: -len(SUFFIX)] for n in os.listdir(CORPUS) if n.endswith(SUFFIX))


def folder_targets():
    return sorted(n for n in os.listdir(CORPUS) if os.path.isdir(folder(n)))


def read_archive(target):
    """{name: bytes} of a target's archive (empty when there is none)."""
    path = archive(target)
    if not os.path.exists(path):
        return {}
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist() if not i.is_dir()}


def write_archive(target, files):
    tmp = archive(target) + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=STAMP)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, files[name], compresslevel=9)
    os.replace(tmp, archive(target))


def files_in(directory):
    out = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out[name] = f.read()
    return out


def unpack(targets):
    for t in targets or archived_targets():
        os.makedirs(folder(t), exist_ok=True)
        files = read_archive(t)
        for name, data in files.items():
            if "/" in name or name in (".", ".."):
                raise SystemExit(f"{archive(t)}: entry `{name}` is not a plain file name")
            with open(os.path.join(folder(t), name), "wb") as f:
                f.write(data)
        print(f"{t}: {len(files)} inputs unpacked into {os.path.relpath(folder(t))}/")


def pack(targets):
    for t in targets or folder_targets():
        files = files_in(folder(t))
        write_archive(t, files)
        print(f"{t}: {len(files)} inputs packed into {os.path.relpath(archive(t))}")


def merge(target, directory):
    files = read_archive(target)
    new = {n: d for n, d in files_in(directory).items() if n not in files}
    files.update(new)
    write_archive(target, files)
    print(f"{target}: {len(new)} inputs added ({len(files)} in all)")


def main(argv):
    if not argv or argv[0] not in ("pack", "unpack", "merge"):
        raise SystemExit(__doc__)
    if argv[0] == "merge":
        if len(argv) != 3:
            raise SystemExit("usage: corpus_archive.py merge TARGET DIR")
        merge(argv[1], argv[2])
    elif argv[0] == "pack":
        pack(argv[1:])
    else:
        unpack(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
