"""NVIDIA's HDF5 layouts (their MLPerf BERT `input_preprocessing/`), read into and written from
bertperf's types; docs/data_format.md, "NVIDIA's layouts", lists their datasets. Variable-length
files (convert_fixed2variable.py, and their eval file `eval_varlength/part_eval_10k.hdf5`) hold
one vlen entry per sample and no input_mask; packed training files (create_packed_trainset.py,
`part_XXXXX` without a suffix) hold one entry per row of up to 3 sequences, masked positions
relative to the row: bertperf-packed/1's model (formats.packed.Packed) without its attributes.
Neither layout records max_seq_length or max_predictions_per_seq; readers check against the
limits given (MLPerf's 512 and 76 by default)."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from bertperf.benchmark import MAX_PREDICTIONS, MAX_SEQ_LENGTH
from bertperf.errors import UserError
from bertperf.formats import packed as packed_format
from bertperf.formats.hdf5 import new_file, read_datasets
from bertperf.formats.packed import Packed
from bertperf.formats.samples import Samples, offsets_from_lengths, ranges
from bertperf.formats.unpadded import check

FIELDS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids",
          "next_sentence_labels")
PACKED_FIELDS = ("input_ids", "segment_ids", "packed_input_len", "masked_lm_positions",
                 "masked_lm_ids", "packed_masked_lm_len", "next_sentence_labels")
MAX_SEQS_PER_ROW = 3
"""Sequences per row of NVIDIA's packed files (their packing strategies use at most 3)."""


# ---- reading -------------------------------------------------------------------------------------

def _read(path: Path, fields: tuple[str, ...], layout: str) -> dict[str, np.ndarray]:
    """The datasets `fields` of an NVIDIA file, as read by h5py (vlen ones: object arrays)."""
    data = read_datasets(path, fields, f"an NVIDIA {layout} file")
    counts = {len(np.atleast_1d(v)) for v in data.values()}
    if len(counts) != 1:
        raise UserError(f"{path}: datasets disagree on the number of "
                        f"{'rows' if layout == 'packed' else 'samples'}")
    return data


def _flat(path: Path, data: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A vlen dataset as (all entries back to back, each entry's length)."""
    if data.dtype != object:
        raise UserError(f"{path}: {name} is not a variable-length dataset")
    lengths = np.fromiter((len(x) for x in data), dtype=np.int64, count=len(data))
    flat = np.concatenate([np.asarray(x).reshape(-1) for x in data]) if len(data) \
        else np.zeros(0, np.int64)
    return flat.astype(np.int64), lengths


def _b_starts(seg: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, int | None]:
    """Where segment B (the first 1) starts in each unit offsets[i]:offsets[i+1] of the flat
    segment ids (the unit's length if it has none), and the first unit whose ids are not 0s then
    1s (None when all are)."""
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    starts = lengths.copy()
    ones = np.flatnonzero(seg)
    owner = np.searchsorted(offsets, ones, side="right") - 1
    units, first = np.unique(owner, return_index=True)
    starts[units] = ones[first] - offsets[units]
    expect = ranges(np.zeros(n, dtype=np.int64), lengths) >= np.repeat(starts, lengths)
    bad = np.flatnonzero(seg != expect)
    if len(bad):
        return starts, int(np.searchsorted(offsets, bad[0], side="right") - 1)
    return starts, None


_SEGMENTS = "segment_ids are not 0s then 1s (segment A, then segment B)"


def read_varlen(path: str | os.PathLike, max_seq_length: int | None = None,
                max_pred: int | None = None) -> Samples:
    """A variable-length file as Samples, checked like an unpadded shard (formats.unpadded.check:
    lengths and masks within the limits given, none when not given) and every sample's
    segment_ids 0s then 1s; a bad sample is a UserError naming the file and the sample."""
    path = Path(path)
    data = _read(path, FIELDS, "variable-length")
    ids, lengths = _flat(path, data["input_ids"], "input_ids")
    seg, seg_lengths = _flat(path, data["segment_ids"], "segment_ids")
    pos, counts = _flat(path, data["masked_lm_positions"], "masked_lm_positions")
    mids, mid_counts = _flat(path, data["masked_lm_ids"], "masked_lm_ids")
    nsp = np.asarray(data["next_sentence_labels"]).reshape(-1)
    for name, got, want in (("segment_ids", seg_lengths, lengths),
                            ("masked_lm_ids", mid_counts, counts)):
        if np.any(got != want):
            i = int(np.argmax(got != want))
            raise UserError(f"{path}: sample {i}: {name} holds {int(got[i])} entries, not "
                            f"{int(want[i])}")
    offsets = offsets_from_lengths(lengths)
    b_starts, bad = _b_starts(seg, offsets)
    if bad is not None:
        raise UserError(f"{path}: sample {bad}: {_SEGMENTS}")
    samples = Samples(ids, offsets, b_starts, pos, mids, offsets_from_lengths(counts), nsp)
    check(path, samples, max_seq_length, max_pred)
    return samples.astype_compact()


def read_packed(path: str | os.PathLike, max_seq_length: int = MAX_SEQ_LENGTH,
                max_pred: int = MAX_PREDICTIONS,
                max_seqs_per_row: int = MAX_SEQS_PER_ROW) -> Packed:
    """A packed file as Packed rows, checked like a bertperf-packed/1 file (formats.packed.check)
    and every sequence's segment_ids 0s then 1s; a bad row is a UserError naming file and row."""
    path = Path(path)
    data = _read(path, PACKED_FIELDS, "packed")
    flat = {k: _flat(path, data[k], k) for k in PACKED_FIELDS}
    ids, row_len = flat["input_ids"]
    seq_len, seqs_per_row = flat["packed_input_len"]
    mcount, _ = flat["packed_masked_lm_len"]

    def entries(name: str, want: np.ndarray, what: str) -> None:
        per_row = flat[name][1]
        if np.any(per_row != want):
            r = int(np.argmax(per_row != want))
            raise UserError(f"{path}: row {r}: {name} holds {int(per_row[r])} entries for its "
                            f"{int(want[r])} {what}")

    entries("segment_ids", row_len, "tokens")
    entries("next_sentence_labels", seqs_per_row, "sequences")
    entries("packed_masked_lm_len", seqs_per_row, "sequences")
    seq_row = np.repeat(np.arange(len(row_len)), seqs_per_row)
    if len(seq_len) and (seq_len.min() < 1 or mcount.min() < 0):
        i = int(np.argmax((seq_len < 1) | (mcount < 0)))
        raise UserError(f"{path}: row {int(seq_row[i])}: a sequence of {int(seq_len[i])} "
                        f"tokens and {int(mcount[i])} masks")
    entries("masked_lm_positions", _row_sums(mcount, seqs_per_row), "masks")
    entries("masked_lm_ids", _row_sums(mcount, seqs_per_row), "masks")
    sums = _row_sums(seq_len, seqs_per_row)
    if np.any(sums != row_len):
        r = int(np.argmax(sums != row_len))
        raise UserError(f"{path}: row {r}: packed_input_len adds up to {int(sums[r])}, not its "
                        f"{int(row_len[r])} tokens")
    b_starts, bad = _b_starts(flat["segment_ids"][0], offsets_from_lengths(seq_len))
    if bad is not None:
        raise UserError(f"{path}: row {int(seq_row[bad])}: {_SEGMENTS} in one of its sequences")
    rows = Packed(ids, offsets_from_lengths(row_len), seq_len,
                  offsets_from_lengths(seqs_per_row), b_starts, flat["masked_lm_positions"][0],
                  flat["masked_lm_ids"][0], offsets_from_lengths(mcount),
                  flat["next_sentence_labels"][0])
    packed_format.check(path, rows, {"max_seq_length": max_seq_length,
                                     "max_predictions_per_seq": max_pred,
                                     "max_seqs_per_row": max_seqs_per_row})
    return rows.astype_compact()


def packed_sequences(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sequences of a packed file without its token data: their lengths, mask counts and NSP
    labels, in row order (what a length histogram needs; read_packed checks the rest)."""
    path = Path(path)
    fields = ("packed_input_len", "packed_masked_lm_len", "next_sentence_labels")
    data = _read(path, fields, "packed")
    (lengths, per_row), *rest = (_flat(path, data[k], k) for k in fields)
    for name, (_, got) in zip(fields[1:], rest):
        if np.any(got != per_row):
            r = int(np.argmax(got != per_row))
            raise UserError(f"{path}: row {r}: {name} holds {int(got[r])} entries for its "
                            f"{int(per_row[r])} sequences")
    return lengths, rest[0][0], rest[1][0]


def _row_sums(values: np.ndarray, per_row: np.ndarray) -> np.ndarray:
    """Per row, the sum of its per_row[r] consecutive entries of `values`."""
    cum, bounds = offsets_from_lengths(values), offsets_from_lengths(per_row)
    return cum[bounds[1:]] - cum[bounds[:-1]]


# ---- writing -------------------------------------------------------------------------------------

def _write_vlen(f: h5py.File, name: str, flat: np.ndarray, offsets: np.ndarray,
                dtype: type) -> None:
    entries = np.empty(len(offsets) - 1, dtype=object)  # filled one by one: never 2-D
    for i in range(len(entries)):
        entries[i] = flat[offsets[i]:offsets[i + 1]].astype(dtype)
    f.create_dataset(name, data=entries, dtype=h5py.vlen_dtype(np.dtype(dtype)))


def _segment_ids(lengths: np.ndarray, b_starts: np.ndarray) -> np.ndarray:
    """Flat segment ids of units of `lengths`: 0 before each unit's b_start, 1 from there on."""
    cols = ranges(np.zeros(len(lengths), dtype=np.int64), lengths)
    return (cols >= np.repeat(b_starts.astype(np.int64), lengths)).astype(np.int8)


def write_varlen(path: str | os.PathLike, samples: Samples) -> None:
    """`samples` as a new variable-length file at `path` (callers pass an atomic_output
    temporary)."""
    with new_file(path) as f:
        _write_vlen(f, "input_ids", samples.input_ids, samples.offsets, np.int16)
        _write_vlen(f, "segment_ids", _segment_ids(samples.lengths, samples.b_starts),
                    samples.offsets, np.int8)
        _write_vlen(f, "masked_lm_positions", samples.mlm_positions, samples.mlm_offsets,
                    np.int16)
        _write_vlen(f, "masked_lm_ids", samples.mlm_ids, samples.mlm_offsets, np.int16)
        f.create_dataset("next_sentence_labels", data=samples.nsp.astype(np.int8))


def write_packed(path: str | os.PathLike, rows: Packed) -> None:
    """`rows` as a new packed file at `path`, in the layout of NVIDIA's create_packed_trainset.py
    (what their packed training data looks like)."""
    seqs = rows.row_seq_offsets
    masks = rows.mlm_offsets[seqs]  # each row's first and last mask
    with new_file(path) as f:
        _write_vlen(f, "input_ids", rows.input_ids, rows.row_offsets, np.int16)
        _write_vlen(f, "segment_ids", _segment_ids(rows.seq_lengths.astype(np.int64),
                                                   rows.b_starts), rows.row_offsets, np.int8)
        _write_vlen(f, "packed_input_len", rows.seq_lengths, seqs, np.int16)
        _write_vlen(f, "masked_lm_positions", rows.mlm_positions, masks, np.int16)
        _write_vlen(f, "masked_lm_ids", rows.mlm_ids, masks, np.int16)
        _write_vlen(f, "packed_masked_lm_len", np.diff(rows.mlm_offsets), seqs, np.int16)
        _write_vlen(f, "next_sentence_labels", rows.nsp, seqs, np.int8)
