"""What a command may replace: the one rule every command that writes follows (docs/design.md,
"Outputs"), and each writer's entry in KINDS. An output is replaced only where this command
made it and can tell so (a folder holding its MARKER, or what its kind recognises), and with
--force; never one of the command's inputs, a folder that holds one, a non-empty folder or a
file it did not make."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bertperf.errors import UserError
from bertperf.formats.files import atomic_folder, unwritable

MARKER = ".bertperf-output"
"""The file in every folder a command writes: the command's kind, one line."""


def starts_with(magic: bytes) -> Callable[[Path], bool]:
    """Whether a file begins with `magic` (a format's signature)."""
    def test(path: Path) -> bool:
        try:
            with open(path, "rb") as f:
                return f.read(len(magic)) == magic
        except OSError:
            return False
    return test


def holds(*names: str) -> Callable[[Path], bool]:
    """Whether a folder holds any of `names` (an output made before folders had a MARKER)."""
    return lambda folder: any((folder / name).exists() for name in names)


def has_line(prefix: bytes) -> Callable[[Path], bool]:
    """Whether one of a text file's first ten lines begins with `prefix` (its writer's stamp)."""
    def test(path: Path) -> bool:
        try:
            with open(path, "rb") as f:
                return any(f.readline().startswith(prefix) for _ in range(10))
        except OSError:
            return False
    return test


def json_with(*keys: str) -> Callable[[Path], bool]:
    """Whether a file is a JSON object holding `keys` (a report of the writer's)."""
    def test(path: Path) -> bool:
        import json
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            return False
        return isinstance(doc, dict) and all(key in doc for key in keys)
    return test


def staged(stage: str) -> Callable[[Path], bool]:
    """Whether the prep stage `stage` wrote a file (its folder's MANIFEST.json says so)."""
    from bertperf.formats import manifest
    return lambda path: path.name in manifest.written_by(path.parent, stage)


PNG = starts_with(b"\x89PNG\r\n\x1a\n")
ZIP = starts_with(b"PK\x03\x04")  # torch.save's format


@dataclass(frozen=True)
class Kind:
    """One writer's outputs."""

    folder: bool
    """A folder (written whole, with MARKER) rather than a file."""
    own: Callable[[Path], bool] | None = None
    """Recognises this writer's earlier output (for a folder: besides its MARKER)."""
    reused: bool = False
    """The writer adds to or redoes its own output on every run, as a pipeline reruns it (a
    working folder, a prep stage's file): no --force to go on."""


KINDS: dict[str, Kind] = {
    "bench comm": Kind(folder=True, own=holds("allreduce.py"), reused=True),
    "bench layerwise": Kind(folder=True, own=holds("bert_config.json"), reused=True),
    "export": Kind(folder=True),
    "gpu-bundle": Kind(folder=True, own=holds("bundle.json")),
    "gpu-check": Kind(folder=True, own=holds("notes", "site", "foldoc_512"), reused=True),
    "gpu-check report": Kind(folder=False, own=starts_with(b"# make gpu-check")),
    "mlperf log": Kind(folder=False, own=lambda path: path.stat().st_size == 0
                       or starts_with(b":::MLLOG")(path), reused=True),
    "plan": Kind(folder=False, own=has_line(b"# Written by `python -m bertperf")),
    "plot": Kind(folder=False, own=PNG),
    "tensorboard": Kind(folder=True, reused=True),
    "submission": Kind(folder=True, own=holds("systems", "results", "benchmarks"), reused=True),
    "model validate": Kind(folder=False, own=PNG),
    "convert-ckpt": Kind(folder=False, own=ZIP),
    "prep create": Kind(folder=False, own=staged("create"), reused=True),
    "prep eval": Kind(folder=False, own=staged("eval"), reused=True),
    "prep unpack": Kind(folder=False, own=staged("unpack"), reused=True),
    "prep stats": Kind(folder=False, own=lambda path: PNG(path)
                       or json_with("folder", "samples", "max_seq_length")(path), reused=True),
    "prep stratify": Kind(folder=True, own=holds("stratify.json"), reused=True),
}
"""Every command that writes a path its user names, by the name its refusals give it."""


def made_by(folder: Path) -> str | None:
    """The kind of command that wrote `folder` (its MARKER), or None."""
    try:
        return (folder / MARKER).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def claim(flag: str, path: str | os.PathLike, kind: str, *,
          inputs: Iterable[tuple[str, str | os.PathLike | None]] = (),
          force: bool = False) -> Path:
    """`path` (the value of `flag`) as an output of the command `kind`, or one UserError line
    saying why writing it would lose something: it is one of `inputs` ((flag, path) pairs) or
    holds one; it cannot be written (files.folder_problem); it exists and this command did not
    make it; it is this command's own but --force was not given. A missing path, or an empty
    folder, is free."""
    spec, given = KINDS[kind], Path(path)
    where = given.resolve()
    for input_flag, value in inputs:
        if value is None:
            continue
        source = Path(value).resolve()
        if source == where:
            raise UserError(f"{flag} {given}: is {input_flag}, an input of this command: name "
                            "another output")
        if where in source.parents:
            raise UserError(f"{flag} {given}: holds {input_flag} {value}, an input of this "
                            "command: name another output")
    if why := unwritable(given if spec.folder else given.parent):
        raise UserError(f"{flag} {given}: cannot be written: {why}")
    if not where.exists():
        return given
    if spec.folder:
        if not where.is_dir():
            raise UserError(f"{flag} {given}: is a file, not a folder {kind} wrote: name "
                            "another output")
        if not any(where.iterdir()):
            return given
        if made_by(where) != kind and not (spec.own is not None and spec.own(where)):
            raise UserError(f"{flag} {given}: is a folder {kind} did not write (it holds other "
                            "files): name a new or empty folder")
        if spec.reused:
            return given
    elif where.is_dir():
        raise UserError(f"{flag} {given}: is a folder, expected the name of a file to write")
    elif spec.own is None or not spec.own(where):
        raise UserError(f"{flag} {given}: exists and is not a file {kind} wrote: name another "
                        "output")
    elif spec.reused:
        return given
    if not force:
        raise UserError(f"{flag} {given}: exists, an earlier {kind} output (--force replaces "
                        "it)")
    return given


@contextlib.contextmanager
def output_folder(path: str | os.PathLike, kind: str) -> Iterator[Path]:
    """files.atomic_folder for a folder `claim` allowed: the temporary folder it yields holds
    this command's MARKER, so a later run knows the folder for its own."""
    with atomic_folder(path) as tmp:
        (tmp / MARKER).write_text(kind + "\n")
        yield tmp


def mark(folder: Path, kind: str) -> None:
    """Make `folder` (a working folder of `kind`) and put its MARKER in it."""
    folder.mkdir(parents=True, exist_ok=True)
    if made_by(folder) != kind:
        (folder / MARKER).write_text(kind + "\n")
