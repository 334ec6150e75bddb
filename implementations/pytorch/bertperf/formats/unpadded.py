"""Unpadded shard files: bertperf's flat layout.

bertperf-unpadded/1 (HDF5, no compression, contiguous so a reader can memory-map it):
  attrs     format="bertperf-unpadded/1", max_seq_length, max_predictions_per_seq
  input_ids       [T] uint16 (int32 if the vocab needs it)   all samples' tokens, concatenated
  offsets         [N+1] int64                                 sample i = input_ids[offsets[i]:offsets[i+1]]
  b_starts        [N] uint16                                  segment B starts here
  mlm_positions   [M] uint16                                  ascending within each sample
  mlm_ids         [M] uint16
  mlm_offsets     [N+1] int64
  nsp             [N] uint8                                   1 = random next
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from bertperf.errors import UserError
from bertperf.formats import detect
from bertperf.formats.hdf5 import new_file, read_datasets
from bertperf.formats.samples import Samples

FORMAT = "bertperf-unpadded/1"
FIELDS = ("input_ids", "offsets", "b_starts", "mlm_positions", "mlm_ids", "mlm_offsets", "nsp")


def write_shard(path: str | os.PathLike, samples: Samples, max_seq_length: int,
                max_pred: int) -> None:
    """Write `samples` to a new file at `path` (callers pass an atomic_output temporary)."""
    compact = samples.astype_compact()
    with new_file(path) as f:
        f.attrs["format"] = FORMAT
        f.attrs["max_seq_length"] = max_seq_length
        f.attrs["max_predictions_per_seq"] = max_pred
        for name in FIELDS:
            f.create_dataset(name, data=getattr(compact, name))


def shard_meta(path: str | os.PathLike) -> dict:
    """Format attributes and sample count, without reading the data."""
    path = Path(path)
    detect.require(path, detect.UNPADDED)
    try:
        with h5py.File(path, "r") as f:
            return {"max_seq_length": int(f.attrs["max_seq_length"]),
                    "max_predictions_per_seq": int(f.attrs["max_predictions_per_seq"]),
                    "samples": int(f["nsp"].shape[0]), "tokens": int(f["input_ids"].shape[0])}
    except UserError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise UserError(f"{path}: truncated or corrupt shard ({exc})") from None


def read_shard(path: str | os.PathLike) -> tuple[Samples, dict]:
    """Read and check a whole shard; any inconsistency is a UserError naming the file."""
    path = Path(path)
    meta = shard_meta(path)
    samples = Samples(**read_datasets(path, FIELDS, f"a {FORMAT} shard"))
    check(path, samples, meta["max_seq_length"], meta["max_predictions_per_seq"])
    return samples, meta


def check(path: Path, s: Samples, max_seq_length: int | None, max_pred: int | None) -> None:
    """Structural checks: offsets consistent with the arrays, lengths within the limits (a limit
    of None: no limit), segment B inside its sample, masked positions inside theirs."""
    n = len(s.nsp)
    for name, offsets, data in (("offsets", s.offsets, s.input_ids),
                                ("mlm_offsets", s.mlm_offsets, s.mlm_positions)):
        if len(offsets) != n + 1 or (n + 1 and offsets[0] != 0):
            raise UserError(f"{path}: {name} has {len(offsets)} entries for {n} samples")
        if np.any(np.diff(offsets) < 0):
            bad = int(np.argmax(np.diff(offsets) < 0))
            raise UserError(f"{path}: {name} decrease at sample {bad}")
        if offsets[-1] != len(data):
            raise UserError(f"{path}: {name} run to {int(offsets[-1])} but the array holds "
                            f"{len(data)} (sample {int(np.searchsorted(offsets, len(data)))})")
    if len(s.mlm_ids) != len(s.mlm_positions) or len(s.b_starts) != n:
        raise UserError(f"{path}: datasets disagree on their sizes")
    lengths, counts = s.lengths, s.mlm_counts
    for what, values, limit in (("tokens", lengths, max_seq_length), ("masks", counts, max_pred)):
        if n and limit is not None and values.max() > limit:
            i = int(np.argmax(values > limit))
            raise UserError(f"{path}: sample {i} has {int(values[i])} {what}, more than {limit}")
    if n and np.any((s.b_starts < 2) | (s.b_starts > lengths)):
        i = int(np.argmax((s.b_starts < 2) | (s.b_starts > lengths)))
        raise UserError(f"{path}: sample {i}: segment B starts at {int(s.b_starts[i])}, outside "
                        f"its {int(lengths[i])} tokens")
    if len(s.mlm_positions):
        owner = np.repeat(np.arange(n), counts)
        if np.any(s.mlm_positions >= lengths[owner]):
            i = int(owner[np.argmax(s.mlm_positions >= lengths[owner])])
            raise UserError(f"{path}: sample {i}: a masked position lies past its tokens")
