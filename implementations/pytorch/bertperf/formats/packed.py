"""Packed shards, bertperf-packed/1 (made by `prep pack`; datasets and attributes in
docs/data_format.md): up to max_seqs_per_row pretraining sequences per row of at most
max_seq_length tokens, back to back without padding; per sequence its length, where segment B
starts (relative to the sequence), its masks (positions relative to the ROW) and NSP label. Each
sequence's tokens are [CLS] A [SEP] B [SEP] as in the unpadded sample, so `unpack` gives back the
samples (`Samples`) bit for bit. `Packed.batch(rows)` gives the training arrays (rows padded to
max_seq_length, position ids restarting per sequence; listed in its docstring)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from bertperf.errors import UserError
from bertperf.formats import detect
from bertperf.formats.hdf5 import new_file, read_datasets
from bertperf.formats.samples import Samples, id_dtype, offsets_from_lengths, ranges, same_arrays

FORMAT = "bertperf-packed/1"
FIELDS = ("input_ids", "row_offsets", "seq_lengths", "row_seq_offsets", "b_starts",
          "mlm_positions", "mlm_ids", "mlm_offsets", "nsp")
# enough to check the structure and count, without the token data (about 1/6 of the file)
INDEX_FIELDS = ("row_offsets", "seq_lengths", "row_seq_offsets", "mlm_positions", "mlm_offsets",
                "nsp")


@dataclass
class Packed:
    """Rows of packed sequences (the datasets of the format, same names)."""

    input_ids: np.ndarray
    row_offsets: np.ndarray
    seq_lengths: np.ndarray
    row_seq_offsets: np.ndarray
    b_starts: np.ndarray
    mlm_positions: np.ndarray
    mlm_ids: np.ndarray
    mlm_offsets: np.ndarray
    nsp: np.ndarray

    def __len__(self) -> int:
        return len(self.row_offsets) - 1

    @property
    def num_sequences(self) -> int:
        return len(self.seq_lengths)

    @property
    def row_lengths(self) -> np.ndarray:
        return np.diff(self.row_offsets)

    @property
    def seqs_per_row(self) -> np.ndarray:
        return np.diff(self.row_seq_offsets)

    def seq_row(self) -> np.ndarray:
        """The row of each sequence."""
        return np.repeat(np.arange(len(self)), self.seqs_per_row)

    def seq_starts(self) -> np.ndarray:
        """Each sequence's start, relative to its row."""
        flat = offsets_from_lengths(self.seq_lengths.astype(np.int64))[:-1]
        return flat - self.row_offsets[self.seq_row()]

    def efficiency(self, max_seq_length: int) -> float:
        return int(self.row_offsets[-1]) / (len(self) * max_seq_length) if len(self) else 1.0

    @staticmethod
    def from_samples(samples: Samples, order: np.ndarray, sizes: np.ndarray) -> Packed:
        """Rows made of samples `order` (row by row, in place order), sizes[r] sequences each."""
        sub = samples.take(np.asarray(order, dtype=np.int64))
        sizes = np.asarray(sizes, dtype=np.int64)
        row_seq_offsets = offsets_from_lengths(sizes)
        row_offsets = sub.offsets[row_seq_offsets]
        seq_row = np.repeat(np.arange(len(sizes)), sizes)
        start_in_row = sub.offsets[:-1] - row_offsets[seq_row]
        shift = np.repeat(start_in_row, sub.mlm_counts)
        return Packed(sub.input_ids, row_offsets, sub.lengths, row_seq_offsets, sub.b_starts,
                      sub.mlm_positions.astype(np.int64) + shift, sub.mlm_ids, sub.mlm_offsets,
                      sub.nsp)

    def to_samples(self) -> Samples:
        """The sequences as unpadded samples, in row order (masked positions back to the sample)."""
        shift = np.repeat(self.seq_starts(), np.diff(self.mlm_offsets))
        return Samples(self.input_ids, offsets_from_lengths(self.seq_lengths.astype(np.int64)),
                       self.b_starts, self.mlm_positions.astype(np.int64) - shift, self.mlm_ids,
                       self.mlm_offsets, self.nsp)

    def take(self, rows: np.ndarray) -> Packed:
        """Rows `rows`, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        seqs = ranges(self.row_seq_offsets[rows], self.seqs_per_row[rows])
        return Packed.from_samples(self.to_samples(), seqs, self.seqs_per_row[rows])

    def astype_compact(self) -> Packed:
        return Packed(self.input_ids.astype(id_dtype(self.input_ids), copy=False),
                      self.row_offsets.astype(np.int64, copy=False),
                      self.seq_lengths.astype(np.uint16, copy=False),
                      self.row_seq_offsets.astype(np.int64, copy=False),
                      self.b_starts.astype(np.uint16, copy=False),
                      self.mlm_positions.astype(np.uint16, copy=False),
                      self.mlm_ids.astype(id_dtype(self.mlm_ids), copy=False),
                      self.mlm_offsets.astype(np.int64, copy=False),
                      self.nsp.astype(np.uint8, copy=False))

    def equals(self, other: Packed) -> bool:
        return same_arrays(self, other)

    # ---- training batches ----------------------------------------------------------------------

    def batch(self, rows: np.ndarray | None = None, max_seq_length: int = 512,
              max_seqs_per_row: int = 3, max_pred: int = 76) -> dict[str, np.ndarray]:
        """Padded arrays for rows `rows` (all by default); R rows, L = max_seq_length,
        K = max_seqs_per_row, P = K * max_pred:

          input_ids           [R, L] int64  the rows' tokens, 0 after the row's end
          input_mask          [R, L] int8   1 on real tokens
          segment_ids         [R, L] int8   0/1 within each sequence (A / B), 0 on padding
          position_ids        [R, L] int64  0, 1, ... restarting at every sequence; 0 on padding
          sequence_index      [R, L] int8   1..K: the sequence a token belongs to, 0 on padding;
                                            a token may attend only to tokens of equal index
          seq_lengths         [R, K] int32  the sequences' lengths, 0 for missing ones; the
                                            per-row cu_seqlens are [0, cumsum(seq_lengths)]
          seq_starts          [R, K] int32  each sequence's first position (its [CLS]: pool NSP there)
          masked_lm_positions [R, P] int64  masked positions relative to the ROW, 0-padded
          masked_lm_ids       [R, P] int64  the original ids there, 0-padded
          masked_lm_weights   [R, P] float32 1.0 for real entries
          next_sentence_labels [R, K] int64 one per sequence, -1 where there is none
        """
        rows = np.arange(len(self)) if rows is None else np.asarray(rows, dtype=np.int64)
        R, L, K, P = len(rows), int(max_seq_length), int(max_seqs_per_row), \
            int(max_seqs_per_row) * int(max_pred)
        # only the rows asked for are touched (the arrays may be memory-mapped)
        row_start = np.asarray(self.row_offsets[rows], dtype=np.int64)
        row_len = np.asarray(self.row_offsets[rows + 1], dtype=np.int64) - row_start
        first_seq = np.asarray(self.row_seq_offsets[rows], dtype=np.int64)
        nseq = np.asarray(self.row_seq_offsets[rows + 1], dtype=np.int64) - first_seq
        if R and (row_len.max() > L or nseq.max() > K):
            raise ValueError("rows longer than max_seq_length or with more than max_seqs_per_row")
        cols = np.arange(L)
        real = cols[None, :] < row_len[:, None]
        input_ids = np.zeros((R, L), dtype=np.int64)
        input_ids[real] = self.input_ids[ranges(row_start, row_len)]
        # per sequence: which row, which place, where it starts
        seqs = ranges(first_seq, nseq)
        seq_r = np.repeat(np.arange(R), nseq)
        place = ranges(np.zeros(R, dtype=np.int64), nseq)
        lens = self.seq_lengths[seqs].astype(np.int64)
        starts = np.zeros(len(seqs), dtype=np.int64)
        if len(seqs):
            cum = np.cumsum(lens) - lens
            starts = cum - np.repeat(cum[offsets_from_lengths(nseq)[:-1]], nseq)
        seq_lengths = np.zeros((R, K), dtype=np.int32)
        seq_starts = np.zeros((R, K), dtype=np.int32)
        seq_lengths[seq_r, place] = lens
        seq_starts[seq_r, place] = starts
        # per token (real tokens, row-major = sequence order)
        tok_seq = np.repeat(np.arange(len(seqs)), lens)
        pos_in_seq = ranges(np.zeros(len(seqs), dtype=np.int64), lens)
        position_ids = np.zeros((R, L), dtype=np.int64)
        position_ids[real] = pos_in_seq
        sequence_index = np.zeros((R, L), dtype=np.int8)
        sequence_index[real] = place[tok_seq] + 1
        segment_ids = np.zeros((R, L), dtype=np.int8)
        segment_ids[real] = pos_in_seq >= self.b_starts[seqs].astype(np.int64)[tok_seq]
        # masks: a row's masks are those of its sequences, consecutive in the file
        m_first = np.asarray(self.mlm_offsets[first_seq], dtype=np.int64)
        m_count = np.asarray(self.mlm_offsets[first_seq + nseq], dtype=np.int64) - m_first
        if R and m_count.max() > P:
            raise ValueError(f"a row has {int(m_count.max())} masked tokens, more than {P}")
        mreal = np.arange(P)[None, :] < m_count[:, None]
        src = ranges(m_first, m_count)
        masked_lm_positions = np.zeros((R, P), dtype=np.int64)
        masked_lm_ids = np.zeros((R, P), dtype=np.int64)
        masked_lm_positions[mreal] = self.mlm_positions[src]
        masked_lm_ids[mreal] = self.mlm_ids[src]
        nsp = np.full((R, K), -1, dtype=np.int64)
        nsp[seq_r, place] = self.nsp[seqs]
        return {
            "input_ids": input_ids,
            "input_mask": real.astype(np.int8),
            "segment_ids": segment_ids,
            "position_ids": position_ids,
            "sequence_index": sequence_index,
            "seq_lengths": seq_lengths,
            "seq_starts": seq_starts,
            "masked_lm_positions": masked_lm_positions,
            "masked_lm_ids": masked_lm_ids,
            "masked_lm_weights": mreal.astype(np.float32),
            "next_sentence_labels": nsp,
        }


# ---- files ---------------------------------------------------------------------------------------

def write_packed(path: str | os.PathLike, packed: Packed, max_seq_length: int, max_pred: int,
                 max_seqs_per_row: int) -> None:
    """Write `packed` to a new file at `path` (callers pass an atomic_output temporary)."""
    with PackedWriter(path, len(packed), packed.num_sequences, len(packed.input_ids),
                      len(packed.mlm_ids), max_seq_length, max_pred, max_seqs_per_row,
                      _wide(packed.input_ids), _wide(packed.mlm_ids)) as w:
        w.append(packed)


def _wide(ids: np.ndarray) -> bool:
    return ids.size > 0 and int(ids.max()) >= 1 << 16


class PackedWriter:
    """Write a packed file piece by piece: contiguous datasets of known total sizes, filled by
    append(Packed) in row order (memory: one piece, not the file)."""

    def __init__(self, path: str | os.PathLike, rows: int, sequences: int, tokens: int, masks: int,
                 max_seq_length: int, max_pred: int, max_seqs_per_row: int,
                 wide_ids: bool = False, wide_mlm_ids: bool = False) -> None:
        self.totals = (rows, sequences, tokens, masks)
        self.done = [0, 0, 0, 0]
        self.stack = contextlib.ExitStack()
        self.f = self.stack.enter_context(new_file(path))
        self.f.attrs["format"] = FORMAT
        self.f.attrs["max_seq_length"] = int(max_seq_length)
        self.f.attrs["max_predictions_per_seq"] = int(max_pred)
        self.f.attrs["max_seqs_per_row"] = int(max_seqs_per_row)
        shapes = {"input_ids": (tokens, np.int32 if wide_ids else np.uint16),
                  "row_offsets": (rows + 1, np.int64), "seq_lengths": (sequences, np.uint16),
                  "row_seq_offsets": (rows + 1, np.int64), "b_starts": (sequences, np.uint16),
                  "mlm_positions": (masks, np.uint16),
                  "mlm_ids": (masks, np.int32 if wide_mlm_ids else np.uint16),
                  "mlm_offsets": (sequences + 1, np.int64), "nsp": (sequences, np.uint8)}
        self.d = {k: self.f.create_dataset(k, shape=(n,), dtype=t) for k, (n, t) in shapes.items()}
        for k in ("row_offsets", "row_seq_offsets", "mlm_offsets"):
            self.d[k][0] = 0

    def append(self, p: Packed) -> None:
        r, s, t, m = self.done
        nr, ns, nt, nm = len(p), p.num_sequences, int(p.row_offsets[-1]), len(p.mlm_ids)
        if r + nr > self.totals[0] or s + ns > self.totals[1] or t + nt > self.totals[2] \
                or m + nm > self.totals[3]:
            raise ValueError("more data than the file was made for")
        d = self.d
        for name, start, data in (("input_ids", t, p.input_ids), ("seq_lengths", s, p.seq_lengths),
                                  ("b_starts", s, p.b_starts), ("mlm_positions", m, p.mlm_positions),
                                  ("mlm_ids", m, p.mlm_ids), ("nsp", s, p.nsp),
                                  ("row_offsets", r + 1, p.row_offsets[1:] + t),
                                  ("row_seq_offsets", r + 1, p.row_seq_offsets[1:] + s),
                                  ("mlm_offsets", s + 1, p.mlm_offsets[1:] + m)):
            if len(data):
                d[name][start:start + len(data)] = data
        self.done = [r + nr, s + ns, t + nt, m + nm]

    def close(self) -> None:
        done = self.done
        self.stack.close()
        if list(self.totals) != done:
            raise ValueError(f"packed file written incompletely ({done} of {self.totals})")

    def __enter__(self) -> PackedWriter:
        return self

    def __exit__(self, exc_type, *rest) -> None:
        if exc_type is None:
            self.close()
        else:
            self.stack.close()


def packed_meta(path: str | os.PathLike) -> dict:
    """Format attributes and row/sequence counts, without reading the data."""
    path = Path(path)
    detect.require(path, detect.PACKED)
    try:
        with h5py.File(path, "r") as f:
            return {"max_seq_length": int(f.attrs["max_seq_length"]),
                    "max_predictions_per_seq": int(f.attrs["max_predictions_per_seq"]),
                    "max_seqs_per_row": int(f.attrs["max_seqs_per_row"]),
                    "rows": int(f["row_offsets"].shape[0]) - 1,
                    "sequences": int(f["seq_lengths"].shape[0]),
                    "tokens": int(f["input_ids"].shape[0])}
    except UserError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise UserError(f"{path}: truncated or corrupt packed file ({exc})") from None


def read_packed(path: str | os.PathLike, datasets: tuple[str, ...] = FIELDS) -> tuple[Packed, dict]:
    """Read and check a packed file; any inconsistency is a UserError naming the file (and row).

    `datasets` may leave out input_ids, b_starts, mlm_ids and nsp (empty arrays stand in, and the
    checks that need them are skipped): `stats` reads only what it counts."""
    path = Path(path)
    meta = packed_meta(path)
    packed = Packed(**read_datasets(path, FIELDS, f"a {FORMAT} shard", only=datasets))
    check(path, packed, meta, full=set(FIELDS) <= set(datasets), tokens=meta["tokens"])
    return packed, meta


def check(path: Path, p: Packed, meta: dict, full: bool = True, tokens: int | None = None) -> None:
    """Structural checks: offsets consistent, rows and masks within the limits."""
    L, K, P = meta["max_seq_length"], meta["max_seqs_per_row"], meta["max_predictions_per_seq"]
    n_tok = len(p.input_ids) if tokens is None else tokens
    R, S = len(p), p.num_sequences
    for name, offsets, size, what in (("row_offsets", p.row_offsets, n_tok, "tokens"),
                                      ("row_seq_offsets", p.row_seq_offsets, S, "sequences")):
        if len(offsets) < 1 or offsets[0] != 0:
            raise UserError(f"{path}: {name} must start at 0")
        if np.any(np.diff(offsets) < 0):
            raise UserError(f"{path}: {name} decrease at row {int(np.argmax(np.diff(offsets) < 0))}")
        if offsets[-1] != size:
            raise UserError(f"{path}: {name} run to {int(offsets[-1])} but the file holds {size} "
                            f"{what}")
    if len(p.row_seq_offsets) != R + 1:
        raise UserError(f"{path}: row_offsets and row_seq_offsets disagree on the number of rows")
    lengths = p.row_lengths
    if R and lengths.max() > L:
        r = int(np.argmax(lengths > L))
        raise UserError(f"{path}: row {r} holds {int(lengths[r])} tokens, more than {L}")
    nseq = p.seqs_per_row
    if R and (nseq.min() < 1 or nseq.max() > K):
        r = int(np.argmax((nseq < 1) | (nseq > K)))
        raise UserError(f"{path}: row {r} holds {int(nseq[r])} sequences, not 1..{K}")
    seq_len = p.seq_lengths.astype(np.int64)
    if S and seq_len.min() < 1:
        raise UserError(f"{path}: sequence {int(np.argmax(seq_len < 1))} is empty")
    sums = np.add.reduceat(seq_len, p.row_seq_offsets[:-1]) if R else np.zeros(0, np.int64)
    if np.any(sums != lengths):
        r = int(np.argmax(sums != lengths))
        raise UserError(f"{path}: row {r}: its sequences' lengths add up to {int(sums[r])}, "
                        f"not its {int(lengths[r])} tokens")
    mo = p.mlm_offsets
    if len(mo) != S + 1 or mo[0] != 0 or np.any(np.diff(mo) < 0) or mo[-1] != len(p.mlm_positions):
        raise UserError(f"{path}: mlm_offsets inconsistent with {S} sequences and "
                        f"{len(p.mlm_positions)} masked positions")
    counts = np.diff(mo)
    if S and counts.max() > P:
        i = int(np.argmax(counts > P))
        raise UserError(f"{path}: sequence {i} has {int(counts[i])} masks, more than {P}")
    if len(p.mlm_positions):
        owner = np.repeat(np.arange(S), counts)
        starts = p.seq_starts()
        pos = p.mlm_positions.astype(np.int64)
        bad = (pos < starts[owner]) | (pos >= starts[owner] + seq_len[owner])
        if bad.any():
            i = int(owner[np.argmax(bad)])
            raise UserError(f"{path}: row {int(p.seq_row()[i])}: a masked position lies outside "
                            f"its sequence {i}")
    if full:
        if len(p.mlm_ids) != len(p.mlm_positions) or len(p.b_starts) != S or len(p.nsp) != S:
            raise UserError(f"{path}: datasets disagree on their sizes")
        b = p.b_starts.astype(np.int64)
        if S and np.any((b < 2) | (b > seq_len)):
            i = int(np.argmax((b < 2) | (b > seq_len)))
            raise UserError(f"{path}: sequence {i}: segment B starts at {int(b[i])}, outside its "
                            f"{int(seq_len[i])} tokens")


def unpack(path: str | os.PathLike) -> tuple[Samples, dict]:
    """The samples of a packed file (row order), and its attributes."""
    packed, meta = read_packed(path)
    return packed.to_samples(), meta
