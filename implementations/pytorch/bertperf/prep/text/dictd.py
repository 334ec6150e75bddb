"""Turn a dictd database (a Debian `dict-*` package) into WikiExtractor-format text, so that the
reference chain (clean, segment, split, create) runs on a real English corpus that any Debian or
Ubuntu machine can install offline; the demo uses FOLDOC (`dict-foldoc`, GFDL: 15,254 index
entries of encyclopedic computing articles). Each entry of NAME.index / NAME.dict.dz (dictzip,
readable as gzip) becomes one article, its headword the title and one line per paragraph, written
in index order as `<doc>` blocks into --output/AA/wiki_NN files of about --file_mb MiB and recorded
in --output/MANIFEST.json (which `prep clean` skips); docs/data_format.md, "Text stages", gives
the rules. A rerun leaves exactly its own files: wiki_NN files an earlier run wrote and this one
does not are deleted, and a file this run would overwrite that `prep dictd` did not write is an
error.

example:
  python -m bertperf prep dictd --dict /usr/share/dictd/foldoc.dict.dz --output foldoc_text/"""

from __future__ import annotations

import argparse
import gzip
import html
import re
from pathlib import Path
from typing import Iterator

from bertperf.errors import UserError
from bertperf.formats import manifest
from bertperf.formats.files import atomic_output

STAGE = "dictd"
FOLDER = "AA"  # WikiExtractor's first folder name

_DIGITS = {c: i for i, c in enumerate(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}
_DATE_LINE = re.compile(r"^\(\d{4}-\d{2}-\d{2}\)$")
_DOMAIN = re.compile(r"<[^<>]*>")
_XREF = re.compile(r"\{([^{}]*)\}")
_SPACES = re.compile(r"\s+")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dict", required=True, type=Path,
                   help="NAME.dict.dz (or NAME.dict); NAME.index must be beside it")
    p.add_argument("--output", required=True, type=Path, help="folder for AA/wiki_NN files")
    p.add_argument("--file_mb", type=float, default=1.0, help="MiB of text per output file")


def decode_number(text: str, index: Path, line_no: int) -> int:
    """A dictd base-64 number."""
    value = 0
    for c in text:
        if c not in _DIGITS:
            raise UserError(f"{index}:{line_no}: {text!r} is not a dictd base-64 number")
        value = value * 64 + _DIGITS[c]
    return value


def read_index(index: Path) -> list[tuple[str, int, int]]:
    """(headword, offset, length) per line of a dictd index."""
    entries = []
    try:
        lines = index.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise UserError(f"{index}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    for line_no, line in enumerate(lines, 1):
        parts = line.split("\t")
        if len(parts) < 3:
            raise UserError(f"{index}:{line_no}: expected 'headword TAB offset TAB length'")
        entries.append((parts[0], decode_number(parts[1], index, line_no),
                        decode_number(parts[2], index, line_no)))
    return entries


def read_dict(path: Path) -> bytes:
    """The uncompressed database text (dictzip is gzip with an extra header field)."""
    try:
        return gzip.decompress(path.read_bytes()) if path.suffix == ".dz" else path.read_bytes()
    except (gzip.BadGzipFile, EOFError) as exc:
        raise UserError(f"{path}: not a dictzip/gzip file ({exc})") from None


def article_text(body: str) -> tuple[str, list[str]]:
    """(title, paragraphs) of one entry's text."""
    lines = body.splitlines()
    title = lines[0].strip() if lines else ""
    paragraphs, current = [], []
    for line in lines[1:] + [""]:
        stripped = line.strip()
        if not stripped or _DATE_LINE.match(stripped):
            if current:
                text = _XREF.sub(r"\1", _DOMAIN.sub("", " ".join(current)))
                text = _SPACES.sub(" ", text).strip()
                if text:
                    paragraphs.append(text)
            current = []
            continue
        current.append(stripped)
    return title, paragraphs


def articles(dict_path: Path, index: Path) -> Iterator[tuple[str, list[str]]]:
    """(title, paragraphs) of every article, in index order, aliases and metadata skipped."""
    data = read_dict(dict_path)
    seen: set[tuple[int, int]] = set()
    for line_no, (word, offset, length) in enumerate(read_index(index), 1):
        if word.startswith("00-database") or (offset, length) in seen:
            continue
        seen.add((offset, length))
        if offset + length > len(data):
            raise UserError(f"{index}:{line_no}: entry {word!r} ends at byte {offset + length}, "
                            f"past the end of {dict_path} ({len(data)} bytes)")
        try:
            body = data[offset:offset + length].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{dict_path}: entry {word!r} (index line {line_no}) is not UTF-8 "
                            f"({exc.reason})") from None
        title, paragraphs = article_text(body)
        if paragraphs:
            yield title, paragraphs


def run(args: argparse.Namespace) -> int:
    dict_path: Path = args.dict
    index = dict_path.with_name(dict_path.name.removesuffix(".dz").removesuffix(".dict") + ".index")
    for path in (dict_path, index):
        if not path.is_file():
            raise UserError(f"{path}: no such file")
    name = index.stem
    limit = int(args.file_mb * 2**20)
    # every article is read (and so every entry checked) before the first file is written
    files: list[list[str]] = [[]]
    size = count = 0
    for count, (title, paragraphs) in enumerate(articles(dict_path, index), 1):
        block = (f'<doc id="{count}" url="dictd:{name}" title="{html.escape(title)}">\n'
                 f"{title}\n\n" + "\n".join(paragraphs) + "\n</doc>\n")
        if size >= limit:
            files.append([])
            size = 0
        files[-1].append(block)
        size += len(block.encode("utf-8"))
    files = [f for f in files if f]
    out: Path = args.output
    names = [f"{FOLDER}/wiki_{i:02d}" for i in range(len(files))]
    earlier = manifest.own_outputs(out, STAGE, names)
    key = manifest.task_key(STAGE, {"file_mb": args.file_mb}, [dict_path, index])
    with manifest.stage_outputs([out, out / FOLDER]):
        for file_name, blocks in zip(names, files):
            with atomic_output(out / file_name) as tmp:
                tmp.write_text("".join(blocks), encoding="utf-8")
            manifest.record(out, file_name,
                            manifest.entry_for(out / file_name, STAGE, key, len(blocks)))
        manifest.forget(out, earlier - set(names))  # an earlier run's files beyond this one's
        manifest.finalize(out)
    print(f"prep dictd: {count} articles from {dict_path} in {len(files)} files under {out}")
    return 0
