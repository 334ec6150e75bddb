"""A batch of samples as the arrays a trainer takes: padded, unpadded (varlen) or, for packed
shards, fixed-size rows (formats.packed.Packed.batch); and those arrays as torch tensors."""

from __future__ import annotations

import numpy as np

from bertperf.errors import UserError
from bertperf.formats.samples import Samples, ranges

LAYOUTS = ("padded", "varlen", "packed")


def collate_padded(s: Samples, max_seq_length: int, max_pred: int) -> dict[str, np.ndarray]:
    """The reference's padded arrays (Samples.to_padded): input_ids/input_mask/segment_ids [B, L],
    masked_lm_positions/masked_lm_ids [B, P] (0 = padding), next_sentence_labels [B]."""
    return s.to_padded(max_seq_length, max_pred)


def collate_varlen(s: Samples) -> dict[str, np.ndarray]:
    """Unpadded arrays for a variable-length (cu_seqlens) trainer, T = total tokens, M = masks:
    input_ids/segment_ids/position_ids [T]; cu_seqlens [B+1] int32 (sample i = tokens
    cu_seqlens[i]:cu_seqlens[i+1]); max_seqlen [] int32; masked_lm_positions [M] int64 indexes
    the flat token array; masked_lm_ids [M]; cu_masked [B+1] (sample i's masks);
    next_sentence_labels [B]."""
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
    }


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
