"""Reading the datasets of a sample file whole, with one-line errors: the one place the layouts'
readers open a file for its data (formats.detect reads headers); and `new_file`, through which
every writer makes an HDF5 file, so that a full disk is an OSError like any other file's."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Iterable, Iterator

import h5py
import numpy as np

from bertperf.errors import UserError


def read_datasets(path: str | os.PathLike, names: Iterable[str], what: str,
                  only: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """{name: array} of the datasets `names` of the HDF5 file `path`; those not in `only` (when
    given) as empty arrays of their dtype, unread. A missing file, a missing dataset or a damaged
    file is a UserError naming the file; `what` says what it should have been ("a padded sample
    file")."""
    path = Path(path)
    names = tuple(names)
    wanted = set(names if only is None else only)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in names if k not in f]
            if missing:
                raise UserError(f"{path}: not {what}, missing dataset(s) {', '.join(missing)}")
            return {k: f[k][()] if k in wanted else np.zeros(0, dtype=f[k].dtype) for k in names}
    except UserError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise UserError(f"{path}: truncated or corrupt HDF5 file ({exc})") from None


class _KeepGoing(io.FileIO):
    """An HDF5 file under h5py's file-object driver whose first failed write (a full disk) is
    remembered, and whose later writes are dropped, so that HDF5 itself never sees one fail
    (docs/design.md, "Errors")."""

    failed: OSError | None = None

    def write(self, data) -> int:
        if self.failed is None:
            try:
                return super().write(data)
            except OSError as exc:
                self.failed = exc
        return len(data)

    def truncate(self, size: int | None = None) -> int:
        if self.failed is None:
            try:
                return super().truncate(size)
            except OSError as exc:
                self.failed = exc
        return self.tell() if size is None else size


@contextlib.contextmanager
def new_file(path: str | os.PathLike, mode: str = "w") -> Iterator[h5py.File]:
    """h5py.File(path, mode) for writing ("w": a new file, "a": add to one): a write that failed
    on the way is raised as an OSError naming `path` once the file is closed."""
    raw = _KeepGoing(path, "r+" if mode == "a" else "w+")
    try:
        with h5py.File(raw, mode) as f:
            yield f
    except Exception:
        if raw.failed is None:
            raise
    finally:
        raw.close()
    if raw.failed is not None:
        raise OSError(raw.failed.errno, raw.failed.strerror, str(path))
