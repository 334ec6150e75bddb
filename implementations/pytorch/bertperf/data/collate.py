"""A batch of samples as the arrays a trainer takes: padded, unpadded (varlen) or, for packed
shards, fixed-size rows (formats.packed.Packed.batch made fixed-shape by collate_packed); and those
arrays as torch tensors.

The varlen and packed batches carry their sizes as host scalars (num_masked, num_sequences,
num_tokens: this batch's real masked tokens, sequences and tokens), so a trainer never reads them
back from a device."""

from __future__ import annotations

import numpy as np

from bertperf.errors import UserError
from bertperf.formats.samples import Samples, ranges

def collate_padded(s: Samples, max_seq_length: int, max_pred: int) -> dict[str, np.ndarray]:
    """The reference's padded arrays (Samples.to_padded): input_ids/input_mask/segment_ids [B, L],
    masked_lm_positions/masked_lm_ids [B, P] (0 = padding), next_sentence_labels [B]."""
    return s.to_padded(max_seq_length, max_pred)


def collate_varlen(s: Samples) -> dict[str, np.ndarray]:
    """Unpadded arrays for a variable-length (cu_seqlens) trainer, T = total tokens, M = masks:
    input_ids/segment_ids/position_ids [T]; cu_seqlens [B+1] int32 (sample i = tokens
    cu_seqlens[i]:cu_seqlens[i+1]); max_seqlen [] int32; masked_lm_positions [M] int64 indexes
    the flat token array; masked_lm_ids [M]; cu_masked [B+1] (sample i's masks);
    next_sentence_labels [B]; and the counts."""
    lengths = s.lengths
    counts = s.mlm_counts
    within = ranges(np.zeros(len(s), dtype=np.int64), lengths)  # position inside its sample
    seg = within >= np.repeat(s.b_starts.astype(np.int64), lengths)
    flat_pos = s.mlm_positions.astype(np.int64) + np.repeat(s.offsets[:-1], counts)
    return {
        "input_ids": s.input_ids.astype(np.int32),
        "segment_ids": seg.astype(np.int8),
        "position_ids": within.astype(np.int32),
        "cu_seqlens": s.offsets.astype(np.int32),
        "max_seqlen": np.int32(lengths.max() if len(s) else 0),
        "masked_lm_positions": flat_pos,
        "masked_lm_ids": s.mlm_ids.astype(np.int32),
        "cu_masked": s.mlm_offsets.astype(np.int32),
        "next_sentence_labels": s.nsp.astype(np.int8),
        **host_counts(int(s.mlm_offsets[-1] - s.mlm_offsets[0]), len(s), int(lengths.sum())),
    }


def host_counts(masked: int, sequences: int, tokens: int) -> dict[str, np.int64]:
    """The host scalars a varlen or packed batch carries (module docstring)."""
    return {"num_masked": np.int64(masked), "num_sequences": np.int64(sequences),
            "num_tokens": np.int64(tokens)}


def max_masks_per_row(max_seq_length: int, max_seqs_per_row: int, max_pred: int,
                      masked_lm_prob: float) -> int:
    """The most masked tokens a packed row can hold when every sequence was masked by the
    reference's rule (create_pretraining_data.py, `prep create`): a sequence of n tokens gets
    min(max_pred, max(1, round(n * masked_lm_prob))) masks (round half to even). The maximum
    over every way of filling a row with up to max_seqs_per_row sequences of total length <=
    max_seq_length, by dynamic programming; never above max_seqs_per_row * max_pred. MLPerf's
    512 tokens, 3 sequences, 76 predictions and 0.15 give 78; the demo's 128, 3, 20: 21."""
    n = np.arange(1, max_seq_length + 1)
    per_seq = np.minimum(max_pred, np.maximum(1, np.round(n * masked_lm_prob))).astype(np.int64)
    best = np.zeros(max_seq_length + 1, dtype=np.int64)  # best[t]: rows of total length <= t
    for _ in range(max_seqs_per_row):
        more = best.copy()
        for t in range(1, max_seq_length + 1):  # one more sequence of length 1..t
            more[t] = max(more[t], int((best[t - n[:t]] + per_seq[:t]).max()))
        best = more
    return int(min(best[-1], max_seqs_per_row * max_pred))


def collate_packed(rows: dict[str, np.ndarray], masks_per_row: int) -> dict[str, np.ndarray]:
    """Packed.batch arrays of R rows (L tokens, up to K sequences each) as the fixed-shape arrays
    of a packed trainer (bertperf.model.PackedBatch documents each field): ids int32 [R, L];
    cu_seqlens [R*(K+1)+1] int32 (each row: its K sequence slots, 0 long where the row has
    fewer, then its padding tail as one more segment); masked positions padded to
    `masks_per_row` per row, as indices into the R*L tokens, with weights; [CLS] positions, NSP
    labels and weights per sequence slot; and the counts. A row with more than masks_per_row
    masked tokens is a ValueError naming the row."""
    if over := rows_over(rows, masks_per_row):
        raise ValueError(f"row {over[0]} holds {over[1]} masked tokens, more than the "
                         f"{masks_per_row} a packed batch has room for")
    ids = rows["input_ids"]
    R, L = ids.shape
    weights = rows["masked_lm_weights"]
    keep = slice(0, masks_per_row)
    row_base = (np.arange(R, dtype=np.int64) * L)[:, None]
    lengths = rows["seq_lengths"].astype(np.int64)
    tail = L - rows["input_mask"].sum(1, dtype=np.int64)
    segments = np.concatenate([lengths, tail[:, None]], axis=1).reshape(-1)
    present = lengths > 0
    nsp = rows["next_sentence_labels"]
    return {
        "input_ids": ids.astype(np.int32),
        "segment_ids": rows["segment_ids"].astype(np.int32),
        "position_ids": rows["position_ids"].astype(np.int32),
        "cu_seqlens": np.concatenate([[0], np.cumsum(segments)]).astype(np.int32),
        "max_seqlen": np.int32(L),
        "masked_lm_positions": (row_base + rows["masked_lm_positions"][:, keep]).astype(np.int32),
        "masked_lm_ids": rows["masked_lm_ids"][:, keep].astype(np.int32),
        "masked_lm_weights": weights[:, keep].astype(np.float32),
        "cls_positions": (row_base + rows["seq_starts"]).astype(np.int32),
        "next_sentence_labels": np.where(present, nsp, 0).astype(np.int32),
        "next_sentence_weights": present.astype(np.float32),
        **host_counts(int(weights.sum()), int(present.sum()), int(lengths.sum())),
    }


def rows_over(rows: dict[str, np.ndarray], masks_per_row: int) -> tuple[int, int] | None:
    """(row, its masked tokens) of the first of Packed.batch's rows that holds more than
    masks_per_row masked tokens; None when every row fits."""
    per_row = rows["masked_lm_weights"].sum(1)
    if len(per_row) and per_row.max() > masks_per_row:
        r = int(np.argmax(per_row > masks_per_row))
        return r, int(per_row[r])
    return None


def to_torch(batch: dict[str, np.ndarray], device=None, pin_memory: bool = False) -> dict:
    """The batch as torch tensors (torch is optional: imported only here)."""
    try:
        import torch
    except ImportError:
        raise UserError("to_torch needs PyTorch (pip install torch)") from None
    out = {}
    for k, v in batch.items():
        t = torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) \
            else torch.tensor(v)
        if pin_memory:
            t = t.pin_memory()
        out[k] = t.to(device, non_blocking=pin_memory) if device is not None else t
    return out
