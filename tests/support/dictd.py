"""A dictd database written by hand (NAME.dict.dz and NAME.index, offsets and sizes in dictd's
base-64 digits), as Debian's dict-* packages ship them, and one FOLDOC-style entry, for `prep
dictd` (test_dictd.py) and its failures (test_stage_failures.py)."""

from __future__ import annotations

import gzip
from pathlib import Path

DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def b64(n: int) -> str:
    out = ""
    while True:
        out = DIGITS[n % 64] + out
        n //= 64
        if n == 0:
            return out


def make_db(folder: Path, entries: list[tuple[str, str]], aliases=()) -> Path:
    """NAME.dict.dz + NAME.index with these (headword, body) entries; aliases repeat a range."""
    data, index, ranges = b"", [], {}
    for word, body in entries:
        raw = body.encode()
        ranges[word] = (len(data), len(raw))
        index.append(f"{word}\t{b64(len(data))}\t{b64(len(raw))}")
        data += raw
    for alias, target in aliases:
        off, size = ranges[target]
        index.append(f"{alias}\t{b64(off)}\t{b64(size)}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test.dict.dz").write_bytes(gzip.compress(data))
    (folder / "test.index").write_text("\n".join(index) + "\n")
    return folder / "test.dict.dz"


ENTRY = """Lisp

   <language> A {functional
   programming language} designed by John McCarthy.

   It has {garbage collection}.

   (2003-01-02)

"""
