"""NVIDIA's HDF5 layouts (their MLPerf BERT `input_preprocessing/`), read into and written from
bertperf's types.

NVIDIA (convert_fixed2variable.py; ../shared/docs/nvidia_mlperf_bert_facts.md §4.8): vlen datasets
input_ids (int16), segment_ids (int8), masked_lm_positions (int16), masked_lm_ids (int16), and
next_sentence_labels int8 [N]; no input_mask.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from bertperf.errors import UserError
from bertperf.formats.samples import Samples, offsets_from_lengths, ranges
from bertperf.formats.unpadded import check

FIELDS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids",
          "next_sentence_labels")


def read_varlen(path: str | os.PathLike, max_seq_length: int | None = None,
                max_pred: int | None = None) -> Samples:
    """A variable-length file as Samples; with the limits given (the file does not record them),
    checked like an unpadded shard (formats.unpadded.check)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in FIELDS if k not in f]
            if missing:
                raise UserError(f"{path}: not an NVIDIA variable-length file, missing "
                                f"{', '.join(missing)}")
            ids, seg, pos, mids = (f[k][()] for k in FIELDS[:4])
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
    samples = Samples(
        np.concatenate(ids).astype(np.int32) if n else np.zeros(0, np.int32), offsets, b_starts,
        np.concatenate(pos).astype(np.int32) if n else np.zeros(0, np.int32),
        np.concatenate(mids).astype(np.int32) if n else np.zeros(0, np.int32),
        offsets_from_lengths(counts), nsp.astype(np.int8))
    if max_seq_length is not None and max_pred is not None:
        check(path, samples, max_seq_length, max_pred)
    return samples


def write_varlen(path: str | os.PathLike, samples: Samples) -> None:
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
