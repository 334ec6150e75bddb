"""Unpadded shard files: our flat layout, and NVIDIA's variable-length layout.

bertperf-unpadded/1 (HDF5, no compression, contiguous so a reader can memory-map it):
  attrs     format="bertperf-unpadded/1", max_seq_length, max_predictions_per_seq
  input_ids       [T] uint16 (int32 if the vocab needs it)   all samples' tokens, concatenated
  offsets         [N+1] int64                                 sample i = input_ids[offsets[i]:offsets[i+1]]
  b_starts        [N] uint16                                  segment B starts here
  mlm_positions   [M] uint16                                  ascending within each sample
  mlm_ids         [M] uint16
  mlm_offsets     [N+1] int64
  nsp             [N] uint8                                   1 = random next

NVIDIA (convert_fixed2variable.py; ../shared/docs/nvidia_mlperf_bert_facts.md §4.8): vlen datasets
input_ids (int16), segment_ids (int8), masked_lm_positions (int16), masked_lm_ids (int16), and
next_sentence_labels int8 [N]; no input_mask.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from bertperf.data.samples import Samples, offsets_from_lengths, ranges
from bertperf.errors import UserError

FORMAT = "bertperf-unpadded/1"
FIELDS = ("input_ids", "offsets", "b_starts", "mlm_positions", "mlm_ids", "mlm_offsets", "nsp")
NVIDIA_FIELDS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                 "next_sentence_labels")


def write_shard(path: str | os.PathLike, samples: Samples, max_seq_length: int,
                max_pred: int) -> None:
    """Write `samples` to a new file at `path` (callers pass an atomic_output temporary)."""
    compact = samples.astype_compact()
    with h5py.File(path, "w") as f:
        f.attrs["format"] = FORMAT
        f.attrs["max_seq_length"] = max_seq_length
        f.attrs["max_predictions_per_seq"] = max_pred
        for name in FIELDS:
            f.create_dataset(name, data=getattr(compact, name))


def shard_meta(path: str | os.PathLike) -> dict:
    """Format attributes and sample count, without reading the data."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                raise UserError(f"{path}: not a {FORMAT} shard (format={f.attrs.get('format')!r})")
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
    if not path.is_file():
        raise UserError(f"{path}: no such shard")
    meta = shard_meta(path)
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in FIELDS if k not in f]
            if missing:
                raise UserError(f"{path}: missing dataset(s) {', '.join(missing)}")
            samples = Samples(*(f[k][()] for k in FIELDS))
    except UserError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise UserError(f"{path}: truncated or corrupt shard ({exc})") from None
    check(path, samples, meta["max_seq_length"], meta["max_predictions_per_seq"])
    return samples, meta


def check(path: Path, s: Samples, max_seq_length: int, max_pred: int) -> None:
    """Structural checks: offsets consistent with the arrays, lengths within the limits."""
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
        if n and values.max() > limit:
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


# ---- NVIDIA's variable-length layout -------------------------------------------------------------

def read_nvidia(path: str | os.PathLike) -> Samples:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in NVIDIA_FIELDS if k not in f]
            if missing:
                raise UserError(f"{path}: not an NVIDIA variable-length file, missing "
                                f"{', '.join(missing)}")
            ids, seg, pos, mids = (f[k][()] for k in NVIDIA_FIELDS[:4])
            nsp = np.asarray(f["next_sentence_labels"][()]).reshape(-1)
    except UserError:
        raise
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise UserError(f"{path}: truncated or corrupt HDF5 file ({exc})") from None
    n = len(nsp)
    if not (len(ids) == len(seg) == len(pos) == len(mids) == n):
        raise UserError(f"{path}: datasets disagree on the number of samples")
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=n)
    if any(len(s) != l for s, l in zip(seg, lengths)):
        raise UserError(f"{path}: segment_ids and input_ids lengths differ")
    counts = np.fromiter((len(x) for x in pos), dtype=np.int64, count=n)
    flat_seg = np.concatenate(seg) if n else np.zeros(0, np.int8)
    offsets = offsets_from_lengths(lengths)
    # B starts at the first segment-1 token of each sample (its length if none)
    first_b = np.full(n, -1, dtype=np.int64)
    where = np.flatnonzero(flat_seg)
    owner = np.searchsorted(offsets, where, side="right") - 1
    uniq, first = np.unique(owner, return_index=True)
    first_b[uniq] = where[first] - offsets[uniq]
    b_starts = np.where(first_b < 0, lengths, first_b)
    return Samples(np.concatenate(ids).astype(np.int32) if n else np.zeros(0, np.int32), offsets,
                   b_starts, np.concatenate(pos).astype(np.int32) if n else np.zeros(0, np.int32),
                   np.concatenate(mids).astype(np.int32) if n else np.zeros(0, np.int32),
                   offsets_from_lengths(counts), nsp.astype(np.int8))


def write_nvidia(path: str | os.PathLike, samples: Samples) -> None:
    n = len(samples)
    lengths = samples.lengths
    seg_flat = np.zeros(len(samples.input_ids), dtype=np.int8)
    cols = ranges(np.zeros(n, dtype=np.int64), lengths)  # position within the sample
    seg_flat[cols >= np.repeat(samples.b_starts.astype(np.int64), lengths)] = 1
    with h5py.File(path, "w") as f:
        for name, flat, offsets, dtype in (
                ("input_ids", samples.input_ids, samples.offsets, np.int16),
                ("segment_ids", seg_flat, samples.offsets, np.int8),
                ("masked_lm_positions", samples.mlm_positions, samples.mlm_offsets, np.int16),
                ("masked_lm_ids", samples.mlm_ids, samples.mlm_offsets, np.int16)):
            d = f.create_dataset(name, (n,), dtype=h5py.vlen_dtype(np.dtype(dtype)))
            d[...] = np.array([flat[offsets[i]:offsets[i + 1]].astype(dtype) for i in range(n)]
                              + [None], dtype=object)[:-1]
        f.create_dataset("next_sentence_labels", data=samples.nsp.astype(np.int8))
