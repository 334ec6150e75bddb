"""File helpers shared by every prep stage: atomic outputs (files and folders), strict UTF-8
reading, md5."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from bertperf.errors import UserError


DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
FULL = "is on a full disk"
"""folder_problem's words for a folder whose disk refuses one more byte."""


def os_error_in(exc: BaseException) -> OSError | None:
    """The OSError `exc` is or was raised while handling (libraries such as torch.save and
    h5py report a failed write as their own error, raised from or during the OSError)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def write_failure(exc: BaseException) -> str | None:
    """"no space left on device" (or another one-line reason) when `exc` comes from a failed
    write to disk; None when it does not."""
    found = os_error_in(exc)
    if found is None:
        return None
    if found.errno in DISK_FULL:
        return {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                errno.EFBIG: "file too large for this file system"}[found.errno]
    return os.strerror(found.errno).lower()


def os_error_line(exc: OSError) -> str:
    """An OSError as one line: the file it names (if any) and its reason (a full disk said so,
    not in a library's words over several lines)."""
    reason = write_failure(exc) or " ".join(str(exc).split())
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    return f"{' -> '.join(names)}: {reason}" if names and exc.errno is not None else reason


def folder_problem(folder: str | os.PathLike) -> str | None:
    """Why files cannot be written into `folder` (made first where it is missing), in a few
    words: "is a file, not a folder", "is on a read-only file system", "is on a full disk",
    "cannot be made: <the nearest existing path above it> is not writable", ...; None when they
    can."""
    folder = Path(folder)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    where = "" if existing == folder else f"cannot be made: {existing} "
    if not existing.is_dir():
        return f"{where}is a file" + ("" if where else ", not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = os.statvfs(existing).f_flag & os.ST_RDONLY
        return f"{where}is " + ("on a read-only file system" if read_only else "not writable")
    try:  # root passes os.access where the file system still refuses (/proc, some mounts);
        with tempfile.TemporaryFile(dir=existing) as probe:  # a full disk refuses a byte
            probe.write(b"\0")
            probe.flush()
    except OSError as exc:
        if exc.errno in DISK_FULL:
            return f"{where}{FULL} ({write_failure(exc)})"
        return f"{where}is not writable ({(exc.strerror or str(exc)).lower()})"
    return None


def unwritable(folder: str | os.PathLike) -> str | None:
    """folder_problem naming the path it is about ("<folder> is a file, not a folder", "cannot
    be made: <the path above> is ..."), for a line about a file to be written in `folder`."""
    why = folder_problem(folder)
    return why if why is None or why.startswith("cannot be made") else f"{folder} {why}"


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it to `path` only if the block succeeds.

    On any exception (including KeyboardInterrupt) the temporary file is removed, so a final name
    always means a complete file and nothing already at `path` is lost on failure. A full disk
    (or quota) becomes one UserError naming `path`, whatever library did the writing; so does a
    `path` that is a folder, or a folder that cannot be written (folder_problem), before the
    block runs.
    """
    path = Path(path)
    parent = path.parent
    if path.is_dir():
        raise UserError(f"{path}: is a folder, expected the name of a file to write")
    refuse_unwritable(path)
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise_if_disk_full(exc, path)
        raise


def refuse_unwritable(path: Path) -> None:
    """One UserError when `path`'s folder cannot be written (folder_problem); a full disk is
    said as raise_if_disk_full says it, found before the write or during it."""
    why = folder_problem(path.parent)
    if why is not None and why.startswith(f"{FULL} ("):
        raise UserError(disk_full_line(path, why.removeprefix(f"{FULL} (")[:-1]))
    if why is not None:
        raise UserError(f"{path.parent}: {why}")


def disk_full_line(path: Path, reason: str) -> str:
    return f"{path}: cannot write: {reason} (in {path.parent}); nothing under that name changed"


def raise_if_disk_full(exc: BaseException, path: Path) -> None:
    """One UserError naming `path` when `exc` comes from a full disk (or quota)."""
    found = os_error_in(exc)
    if found is not None and found.errno in DISK_FULL:
        raise UserError(disk_full_line(path, write_failure(exc))) from None


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike) -> Iterator[Path]:
    """atomic_output for a folder: yield an empty temporary folder beside `path`, which becomes
    `path` only if the block succeeds. A folder already at `path` (the caller decides whether
    it may go) stays whole until the new one is: it is moved aside, the new one renamed in, and
    only then removed. On any exception the temporary folder is removed; a full disk is one
    UserError naming `path`."""
    path = Path(path)
    parent = path.parent
    if path.exists() and not path.is_dir():
        raise UserError(f"{path}: is a file, expected the name of a folder to write")
    refuse_unwritable(path)
    parent.mkdir(parents=True, exist_ok=True)
    tmp, old = (parent / f".{path.name}.{kind}-{os.getpid()}" for kind in ("tmp", "old"))
    for stale in (tmp, old):  # left by a killed process of the same id
        shutil.rmtree(stale, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException as exc:
        if old.exists() and not path.exists():
            os.replace(old, path)
        shutil.rmtree(tmp, ignore_errors=True)
        raise_if_disk_full(exc, path)
        raise
    shutil.rmtree(old, ignore_errors=True)


def missing_folders(folders: Iterable[str | os.PathLike]) -> list[Path]:
    """The folders among `folders` and their parents that do not exist (yet), deepest first."""
    missing: set[Path] = set()
    for folder in folders:
        path = Path(folder).absolute()
        while not path.exists() and path != path.parent:
            missing.add(path)
            path = path.parent
    return sorted(missing, key=lambda p: len(p.parts), reverse=True)


def remove_empty(folders: Iterable[Path]) -> None:
    """Remove those of `folders` (give them deepest first) that are empty; keep the others."""
    for folder in folders:
        with contextlib.suppress(OSError):  # not empty, or already gone
            folder.rmdir()


def remove_stale_temporaries(folder: str | os.PathLike) -> None:
    """Remove temporaries that a killed run (SIGKILL, power loss) could not clean up."""
    folder = Path(folder)
    if folder.is_dir():
        for tmp in folder.glob(".*.tmp-*"):
            with contextlib.suppress(OSError):
                tmp.unlink()


def read_utf8(path: str | os.PathLike) -> str:
    """Read a whole file as strict UTF-8; a bad byte is reported with its file, line and offset."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, expected a file") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UserError(
            f"{path}:{line}: not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def md5_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
