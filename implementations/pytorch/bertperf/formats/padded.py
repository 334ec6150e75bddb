"""The padded HDF5 sample layout that `create` and `eval` write (NVIDIA's MLPerf PyTorch layout).

Six datasets, N rows, no compression (docs/data_format.md):
  input_ids [N, L] int16, input_mask [N, L] int8, segment_ids [N, L] int8,
  masked_lm_positions [N, P] int16, masked_lm_ids [N, P] int16, next_sentence_labels [N] int8.
Padding is 0 everywhere (position 0 is [CLS], never masked, so it is a safe sentinel).
Ids are stored as int32 when the vocabulary does not fit int16.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from bertperf.errors import UserError
from bertperf.formats.hdf5 import new_file, read_datasets
from bertperf.formats.samples import PADDED_FIELDS as DATASETS
from bertperf.formats.samples import Samples
from bertperf.formats.unpadded import check as check_unpadded

_CHUNK = 8192
CHECK_ROWS = 8192  # padded rows checked at a time (~30 MB at 512 tokens)


def dtypes(vocab_size: int, max_seq_length: int) -> dict[str, np.dtype]:
    ids = np.int16 if vocab_size <= np.iinfo(np.int16).max + 1 else np.int32
    pos = np.int16 if max_seq_length <= np.iinfo(np.int16).max + 1 else np.int32
    return {"input_ids": ids, "input_mask": np.int8, "segment_ids": np.int8,
            "masked_lm_positions": pos, "masked_lm_ids": ids, "next_sentence_labels": np.int8}


def write_samples(path: str | os.PathLike, samples: Samples, rows: np.ndarray,
                  max_seq_length: int, max_pred: int, vocab_size: int) -> None:
    """Write samples `rows` (in that order), padded, to a new HDF5 file at `path` (a temporary name)."""
    types = dtypes(vocab_size, max_seq_length)
    n = len(rows)
    shapes = {"input_ids": (n, max_seq_length), "input_mask": (n, max_seq_length),
              "segment_ids": (n, max_seq_length), "masked_lm_positions": (n, max_pred),
              "masked_lm_ids": (n, max_pred), "next_sentence_labels": (n,)}
    with new_file(path) as f:
        sets = {k: f.create_dataset(k, shape=shapes[k], dtype=types[k]) for k in DATASETS}
        for start in range(0, n, _CHUNK):
            block = samples.to_padded(max_seq_length, max_pred, rows[start:start + _CHUNK])
            for k in DATASETS:
                sets[k][start:start + len(block[k])] = block[k]


def write_arrays(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> None:
    with new_file(path) as f:
        for k in DATASETS:
            f.create_dataset(k, data=arrays[k])


def read_samples(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read and check a padded sample file; any damage is a UserError naming the file."""
    path = Path(path)
    arrays = read_datasets(path, DATASETS, "a padded sample file")
    check_samples(path, arrays)
    return arrays


def check_samples(path: Path, a: dict[str, np.ndarray]) -> None:
    n = len(a["next_sentence_labels"])
    if a["next_sentence_labels"].ndim != 1 or any(len(a[k]) != n for k in DATASETS):
        raise UserError(f"{path}: datasets disagree on the number of samples")
    seq = {a[k].shape[1:] for k in ("input_ids", "input_mask", "segment_ids")}
    pred = {a[k].shape[1:] for k in ("masked_lm_positions", "masked_lm_ids")}
    if len(seq) != 1 or len(pred) != 1 or len(next(iter(seq))) != 1 or len(next(iter(pred))) != 1:
        raise UserError(f"{path}: datasets have inconsistent row lengths")


def read_checked(path: str | os.PathLike, chunk: int = CHECK_ROWS) -> tuple[Samples, int, int]:
    """A padded file as Samples (compact dtypes), max_seq_length and max_predictions_per_seq.

    Reads CHECK_ROWS rows at a time and checks that each row round-trips exactly: a row that the
    unpadded layout cannot represent (mask not a prefix, non-zero padding, segment 1 before
    segment 0) is a UserError naming the file and sample.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    parts: list[Samples] = []
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in DATASETS if k not in f]
            if missing:
                raise UserError(f"{path}: not a padded sample file, missing "
                                f"{', '.join(missing)}")
            d = {k: f[k] for k in DATASETS}
            n = d["next_sentence_labels"].shape[0] if d["next_sentence_labels"].ndim == 1 else -1
            if n < 0 or any(d[k].ndim != 2 or d[k].shape[0] != n for k in DATASETS[:5]):
                raise UserError(f"{path}: datasets disagree on the number of samples or rows")
            length, preds = d["input_ids"].shape[1], d["masked_lm_positions"].shape[1]
            if d["input_mask"].shape[1] != length or d["segment_ids"].shape[1] != length or \
                    d["masked_lm_ids"].shape[1] != preds:
                raise UserError(f"{path}: datasets have inconsistent row lengths")
            for start in range(0, max(n, 1), chunk):
                arrays = {k: d[k][start:start + chunk] for k in DATASETS}
                s = Samples.from_padded(arrays)
                back = s.to_padded(length, preds)
                for k in DATASETS:
                    if not np.array_equal(back[k], arrays[k]):
                        diff = back[k] != arrays[k]
                        row = start + int(np.argmax(diff.reshape(len(diff), -1).any(axis=1)))
                        raise UserError(f"{path}: sample {row}: {k} is not in the padded layout "
                                        "(mask not a prefix, non-zero padding or segments out of "
                                        "order), so it would not round-trip")
                parts.append(s.astype_compact())
    except UserError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise UserError(f"{path}: truncated or corrupt HDF5 file ({exc})") from None
    samples = parts[0] if len(parts) == 1 else Samples.concat(parts).astype_compact()
    check_unpadded(path, samples, length, preds)
    return samples, length, preds
