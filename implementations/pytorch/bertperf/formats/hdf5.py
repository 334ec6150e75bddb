"""Reading the datasets of a sample file whole, with one-line errors: the one place the layouts'
readers open a file for its data (formats.detect reads headers)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

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
