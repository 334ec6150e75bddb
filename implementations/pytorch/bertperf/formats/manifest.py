"""Checksum manifests: every stage records md5, size and sample count of each file it writes.

A folder's `MANIFEST.json` is the merged record. Workers (other processes, other MPI ranks) append
one JSON line per finished file to a private fragment `.manifest-<host>-<pid>.jsonl`, fsynced right
after the file's atomic rename, so an interrupted stage keeps its finished files: the next run finds
them, verifies them and skips them. `finalize` folds the fragments into `MANIFEST.json`; a stage
that fails (`stage_outputs`) does the same before it exits, so it leaves no fragment behind.
The record also tells a stage which files it wrote itself (`written_by`, `own_outputs`): a rerun
replaces or removes only those (`forget`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

from bertperf.errors import UserError
from bertperf.formats.files import atomic_output, md5_file, missing_folders, remove_empty

MANIFEST_NAME = "MANIFEST.json"
FORMAT = "bertperf-manifest/1"


@dataclass
class Entry:
    """What a stage recorded for one output file."""

    md5: str
    bytes: int
    samples: int | None
    stage: str
    key: str  # hash of the stage, its parameters and its inputs' md5s: a changed input reruns the file


def task_key(stage: str, params: dict, inputs: Sequence[str | os.PathLike | tuple[str, str]]) -> str:
    """The resume key of a task: a hash of its stage, its parameters and its inputs, each input
    identified by name and content (a path, hashed here, or a (name, md5) pair already known).
    A stage skips an output whose recorded key equals this key and whose md5 still verifies."""
    named = [tuple(i) if isinstance(i, tuple) else (Path(i).name, md5_file(i)) for i in inputs]
    doc = {"stage": stage, "params": params, "inputs": [[n, m] for n, m in named]}
    return hashlib.md5(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def entry_for(path: Path, stage: str, key: str, samples: int | None = None) -> Entry:
    return Entry(md5=md5_file(path), bytes=path.stat().st_size, samples=samples, stage=stage, key=key)


def _fragments(folder: Path) -> list[Path]:
    return sorted(folder.glob(".manifest-*.jsonl"))


def load(folder: str | os.PathLike) -> dict[str, Entry]:
    """The merged record of a folder: MANIFEST.json plus any fragments an unfinished run left."""
    folder = Path(folder)
    entries: dict[str, Entry] = {}
    path = folder / MANIFEST_NAME
    if path.exists():
        try:
            doc = json.loads(path.read_text())
            if doc.get("format") != FORMAT:
                raise ValueError(f"unknown format {doc.get('format')!r}")
            for name, e in doc["files"].items():
                entries[name] = Entry(**e)
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}: corrupt manifest ({exc})") from None
    for frag in _fragments(folder):
        for line in frag.read_text().splitlines():
            try:
                rec = json.loads(line)
                entries[rec["name"]] = Entry(**rec["entry"])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash: that file is simply redone
    return entries


def record(folder: str | os.PathLike, name: str, entry: Entry) -> None:
    """Append one finished file to this process's fragment (safe across processes and hosts)."""
    folder = Path(folder)
    frag = folder / f".manifest-{socket.gethostname()}-{os.getpid()}.jsonl"
    with open(frag, "a") as f:
        f.write(json.dumps({"name": name, "entry": asdict(entry)}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _write(folder: Path, entries: dict[str, Entry]) -> Path:
    """MANIFEST.json of `entries` (atomically), the folder's fragments deleted."""
    doc = {"format": FORMAT, "files": {k: asdict(entries[k]) for k in sorted(entries)}}
    path = folder / MANIFEST_NAME
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
    for frag in _fragments(folder):
        frag.unlink(missing_ok=True)
    return path


def finalize(folder: str | os.PathLike) -> Path:
    """Merge fragments into MANIFEST.json (atomically) and delete them. Only one process calls this."""
    folder = Path(folder)
    return _write(folder, load(folder))


def merge_fragments(folder: str | os.PathLike) -> None:
    """finalize(folder) when a run left fragments there; nothing otherwise."""
    if _fragments(Path(folder)):
        finalize(folder)


def written_by(folder: str | os.PathLike, stage: str) -> set[str]:
    """The files of `folder` that its record says `stage` wrote."""
    return {name for name, e in load(folder).items() if e.stage == stage}


def own_outputs(folder: str | os.PathLike, stage: str, names: Sequence[str]) -> set[str]:
    """The files `stage` wrote into `folder` earlier (its rerun may replace or forget them); a
    UserError when one of `names` exists there but was not written by `stage`."""
    folder = Path(folder)
    earlier = written_by(folder, stage)
    clash = [name for name in names if (folder / name).exists() and name not in earlier]
    if clash:
        raise UserError(f"{folder / clash[0]}: exists and was not written by prep {stage}; "
                        "choose another --output or remove the file")
    return earlier


def forget(folder: str | os.PathLike, names: set[str]) -> None:
    """Delete the files `names` of `folder` (earlier outputs a stage replaces) and their entries."""
    if not names:
        return
    folder = Path(folder)
    for name in names:
        (folder / name).unlink(missing_ok=True)
    _write(folder, {k: v for k, v in load(folder).items() if k not in names})


@contextlib.contextmanager
def stage_outputs(folders: Sequence[str | os.PathLike],
                  coordinator: bool = True) -> Iterator[None]:
    """Around a stage's work on its output folders, however it ends (a failed file, an interrupt):
    the files it finished stay recorded (fragments merged into MANIFEST.json, so a rerun skips
    them) and the folders it created that hold nothing are removed again. Only the coordinator
    (rank 0) tidies up; the others just run the work."""
    created = missing_folders(folders)
    done = False
    try:
        yield
        done = True
    finally:
        if coordinator:
            try:
                for folder in folders:
                    merge_fragments(folder)
            except (UserError, OSError):
                if done:  # else the stage's own error is the one to report
                    raise
            remove_empty(created)


def is_done(folder: str | os.PathLike, name: str, key: str, entries: dict[str, Entry]) -> bool:
    """True when `name` exists, was made from the same inputs and parameters, and still verifies."""
    e = entries.get(name)
    path = Path(folder) / name
    if e is None or e.key != key or not path.is_file():
        return False
    return path.stat().st_size == e.bytes and md5_file(path) == e.md5


def check_file(path: Path, e: Entry, md5: bool = True) -> str | None:
    """Why `path` does not match its entry, or None when it does (md5=False: size only)."""
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != e.bytes:
        return f"size {size} != {e.bytes} recorded (truncated or replaced)"
    if md5 and md5_file(path) != e.md5:
        return "md5 differs from manifest (corrupt or replaced)"
    return None


# ---- inputs checked against the manifest of their folder -------------------------------------------

_CACHE: dict[tuple, dict[str, Entry]] = {}


def folder_entries(folder: str | os.PathLike) -> dict[str, Entry]:
    """`load(folder)`, or {} when the folder has no manifest; cached per process while the
    manifest and its fragments are unchanged (a stage asks once per input file)."""
    folder = Path(folder)
    stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                  for p in _fragments(folder) + [folder / MANIFEST_NAME] if p.exists())
    key = (str(folder.resolve()), stamp)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = load(folder) if stamp else {}
    return _CACHE[key]


def verified_md5(path: str | os.PathLike) -> str:
    """The md5 of input `path`, hashed now; a UserError naming the file when its folder's
    manifest records another size or md5 (a truncated, corrupt or replaced input)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such input file")
    entry = folder_entries(path.parent).get(path.name)
    where = path.parent / MANIFEST_NAME
    if entry is not None and (size := path.stat().st_size) != entry.bytes:
        raise UserError(f"{path}: {size} bytes but {where} records {entry.bytes} "
                        "(truncated or replaced)")
    md5 = md5_file(path)
    if entry is not None and md5 != entry.md5:
        raise UserError(f"{path}: md5 {md5} differs from {entry.md5} recorded in {where} "
                        "(corrupt or replaced)")
    return md5


def recorded_md5(path: str | os.PathLike) -> str:
    """The md5 of `path` as its folder's manifest records it when the size still matches (no
    hashing), else hashed now: a cheap identity for resume keys of whole-folder stages."""
    path = Path(path)
    entry = folder_entries(path.parent).get(path.name)
    if entry is not None and path.stat().st_size == entry.bytes:
        return entry.md5
    return md5_file(path)


def sample_counts(files: Sequence[Path]) -> list[int | None]:
    """Sample counts that the files' folder manifests record (None where not recorded)."""
    return [getattr(folder_entries(p.parent).get(p.name), "samples", None) for p in files]
