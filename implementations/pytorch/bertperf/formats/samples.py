"""Pretraining samples held flat (unpadded), and their padded form.

`Samples` is the one in-memory representation every layout converts to and from: the padded HDF5
files of `prep create`, the unpadded shards, NVIDIA's variable-length files and packed rows.
Nothing derivable is stored: no input_mask (it is the length), no segment_ids (segment B starts at
`b_starts`), no masked_lm_weights (the count of masked positions).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

PADDED_FIELDS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                 "next_sentence_labels")


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + l) for each (s, l), vectorised."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.repeat(starts - (ends - lengths), lengths) + np.arange(total)


def id_dtype(ids: np.ndarray) -> type:
    """Storage dtype for token ids: uint16 when every id fits, else int32."""
    return np.uint16 if ids.size == 0 or int(ids.max()) < 1 << 16 else np.int32


def same_arrays(a, b) -> bool:
    """Field-by-field array equality of two array dataclasses of the same type."""
    return type(a) is type(b) and all(
        np.array_equal(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))


def offsets_from_lengths(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


@dataclass
class Samples:
    """N samples. Sample i: tokens input_ids[offsets[i]:offsets[i+1]] ([CLS] A [SEP] B [SEP]);
    segment B (id 1) from index b_starts[i] on; masked positions (ascending, within the sample) and
    original ids mlm_positions/mlm_ids[mlm_offsets[i]:mlm_offsets[i+1]]; NSP label nsp[i]
    (1 = B is a random sentence)."""

    input_ids: np.ndarray
    offsets: np.ndarray
    b_starts: np.ndarray
    mlm_positions: np.ndarray
    mlm_ids: np.ndarray
    mlm_offsets: np.ndarray
    nsp: np.ndarray

    def __len__(self) -> int:
        return len(self.nsp)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def mlm_counts(self) -> np.ndarray:
        return np.diff(self.mlm_offsets)

    def take(self, rows: np.ndarray) -> Samples:
        """The samples `rows`, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        lengths = self.lengths[rows]
        counts = self.mlm_counts[rows]
        tok = ranges(self.offsets[rows], lengths)
        mlm = ranges(self.mlm_offsets[rows], counts)
        return Samples(self.input_ids[tok], offsets_from_lengths(lengths), self.b_starts[rows],
                       self.mlm_positions[mlm], self.mlm_ids[mlm], offsets_from_lengths(counts),
                       self.nsp[rows])

    @staticmethod
    def concat(parts: list[Samples]) -> Samples:
        if not parts:
            raise ValueError("nothing to concatenate")
        return Samples(
            np.concatenate([p.input_ids for p in parts]),
            offsets_from_lengths(np.concatenate([p.lengths for p in parts])),
            np.concatenate([p.b_starts for p in parts]),
            np.concatenate([p.mlm_positions for p in parts]),
            np.concatenate([p.mlm_ids for p in parts]),
            offsets_from_lengths(np.concatenate([p.mlm_counts for p in parts])),
            np.concatenate([p.nsp for p in parts]),
        )

    def astype_compact(self) -> Samples:
        """Storage dtypes: uint16 ids/positions when they fit, uint8 NSP, int64 offsets."""
        return Samples(self.input_ids.astype(id_dtype(self.input_ids), copy=False),
                       self.offsets.astype(np.int64, copy=False),
                       self.b_starts.astype(np.uint16, copy=False),
                       self.mlm_positions.astype(np.uint16, copy=False),
                       self.mlm_ids.astype(id_dtype(self.mlm_ids), copy=False),
                       self.mlm_offsets.astype(np.int64, copy=False),
                       self.nsp.astype(np.uint8, copy=False))

    def equals(self, other: Samples) -> bool:
        return same_arrays(self, other)

    # ---- padded form -------------------------------------------------------------------------

    def to_padded(self, max_seq_length: int, max_pred: int,
                  rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The padded arrays of samples `rows` (all by default), as the reference writes them."""
        rows = np.arange(len(self)) if rows is None else np.asarray(rows, dtype=np.int64)
        n = len(rows)
        lengths = self.lengths[rows]
        cols = np.arange(max_seq_length)
        real = cols[None, :] < lengths[:, None]
        input_ids = np.zeros((n, max_seq_length), dtype=np.int32)
        input_ids[real] = self.input_ids[ranges(self.offsets[rows], lengths)]
        segment_ids = real & (cols[None, :] >= self.b_starts[rows].astype(np.int64)[:, None])
        counts = self.mlm_counts[rows]
        mreal = np.arange(max_pred)[None, :] < counts[:, None]
        positions = np.zeros((n, max_pred), dtype=np.int32)
        labels = np.zeros((n, max_pred), dtype=np.int32)
        src = ranges(self.mlm_offsets[rows], counts)
        positions[mreal] = self.mlm_positions[src]
        labels[mreal] = self.mlm_ids[src]
        return {
            "input_ids": input_ids,
            "input_mask": real.astype(np.int8),
            "segment_ids": segment_ids.astype(np.int8),
            "masked_lm_positions": positions,
            "masked_lm_ids": labels,
            "next_sentence_labels": self.nsp[rows].astype(np.int8),
        }

    @staticmethod
    def from_padded(arrays: dict[str, np.ndarray]) -> Samples:
        """Unpad: lengths from input_mask, B's start from segment_ids, masks from positions != 0."""
        mask = arrays["input_mask"].astype(bool)
        lengths = mask.sum(axis=1)
        seg = arrays["segment_ids"].astype(bool) & mask
        has_b = seg.any(axis=1)
        b_starts = np.where(has_b, seg.argmax(axis=1), lengths)
        mpos = np.asarray(arrays["masked_lm_positions"])
        mreal = mpos != 0
        return Samples(
            np.asarray(arrays["input_ids"])[mask],
            offsets_from_lengths(lengths),
            b_starts,
            mpos[mreal],
            np.asarray(arrays["masked_lm_ids"])[mreal],
            offsets_from_lengths(mreal.sum(axis=1)),
            np.asarray(arrays["next_sentence_labels"]).reshape(-1),
        )
