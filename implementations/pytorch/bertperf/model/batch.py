"""The model's inputs: unpadded and packed (what BertForPreTraining takes) and padded (what the
reference PaddedBertForPreTraining takes), conversions between them and from the data side's
arrays (bertperf.data: `collate_varlen`, `collate_packed`, `Samples.to_padded`, packed rows of
`Packed.batch`), and the counts a batch carries on the host (BatchCounts)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping

import numpy as np
import torch
import torch.nn.functional as F

Array = np.ndarray | torch.Tensor


def _long(x: Array) -> torch.Tensor:
    return torch.as_tensor(x).long()


def _int(x: Array) -> torch.Tensor:
    """Ids and indices as int32 (narrow on the host; int64 values are narrowed too)."""
    return torch.as_tensor(x).to(torch.int32)


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    return F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)


class Tensors:
    """What the batch types share: their tensors moved or pinned together, the model's keyword
    arguments."""

    def inputs(self) -> dict[str, torch.Tensor | int]:
        """Keyword arguments for the model's forward (BertForPreTraining, or
        PaddedBertForPreTraining for a PaddedBatch)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to(self, device: torch.device, non_blocking: bool = False):
        """The same batch on `device` (ints stay as they are)."""
        return replace(self, **{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
                                for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})

    def pin_memory(self):
        """The same batch in page-locked host memory (CUDA copies from it run asynchronously)."""
        return replace(self, **{f.name: getattr(self, f.name).pin_memory() for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})


@dataclass(frozen=True)
class BatchCounts:
    """A micro-batch's sizes as the loader counted them on the host (bertperf.data.collate), so a
    training step never reads them back from the device."""

    masked: int
    """Real masked tokens of this rank's micro-batch (padding slots not counted)."""
    sequences: int
    """Sequences of this rank's micro-batch."""
    tokens: int
    """Real tokens of this rank's micro-batch (padding not counted)."""
    global_sequences: int
    """Sequences of the whole global micro-batch, every rank's part of it: MLPerf's samples."""

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Array]) -> BatchCounts:
        """From a varlen or packed batch of the loader (its num_masked, num_sequences,
        num_tokens and global_sequences)."""
        return cls(int(arrays["num_masked"]), int(arrays["num_sequences"]),
                   int(arrays["num_tokens"]), int(arrays["global_sequences"]))


@dataclass
class UnpaddedBatch(Tensors):
    """S sequences with T real tokens and M masked tokens in all; sequence i is tokens
    cu_seqlens[i]:cu_seqlens[i+1]."""

    input_ids: torch.Tensor
    """[T] integer (int32 from the loader): the sequences' tokens ([CLS] A [SEP] B [SEP]),
    concatenated."""
    segment_ids: torch.Tensor
    """[T] integer: 0 on segment A (with [CLS] and its [SEP]), 1 on segment B."""
    position_ids: torch.Tensor
    """[T] integer: the position inside its sequence (0 at each [CLS])."""
    cu_seqlens: torch.Tensor
    """[S+1] int32: 0, then the cumulative sequence lengths."""
    max_seqlen: int
    """The longest sequence's length."""
    masked_lm_positions: torch.Tensor
    """[M] integer: indices into the T tokens, grouped by sequence, ascending."""
    masked_lm_ids: torch.Tensor
    """[M] integer: the original token ids there (MLM labels)."""
    next_sentence_labels: torch.Tensor
    """[S] integer: 1 when segment B is a random sentence."""

    @property
    def seq_lengths(self) -> torch.Tensor:
        return self.cu_seqlens[1:] - self.cu_seqlens[:-1]

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Array]) -> UnpaddedBatch:
        """From `bertperf.data.collate.collate_varlen` output (numpy or torch, any device; every
        tensor int32; keys other than the fields are ignored)."""
        return cls(**{f.name: int(arrays[f.name]) if f.name == "max_seqlen"
                      else _int(arrays[f.name]) for f in fields(cls)})


@dataclass
class PackedBatch(Tensors):
    """B rows of L tokens, each holding up to K sequences back to back and then padding, with P
    masked-token slots per row: every tensor has the same shape in every batch of a run (B, L,
    K, P fixed), so a training step can be compiled or captured once. The model sees the rows
    flattened to B*L tokens (`inputs()`); attention is block-diagonal within each row through
    cu_seqlens, position ids restart at every sequence, and padding slots weigh 0 in the loss.
    Ids and indices are int32 (widened where an op needs it)."""

    input_ids: torch.Tensor
    """[B, L]: each row's sequences' tokens, then 0 up to L."""
    segment_ids: torch.Tensor
    """[B, L]: 0 on segment A (with [CLS] and its [SEP]), 1 on segment B, 0 on padding."""
    position_ids: torch.Tensor
    """[B, L]: the position inside its sequence (0 at each [CLS]), 0 on padding."""
    cu_seqlens: torch.Tensor
    """[B*(K+1)+1] int32: segment boundaries over the B*L tokens; each row contributes its K
    sequence slots (length 0 where it holds fewer sequences) and then its padding tail as one
    more segment (length 0 for a full row), so every row spans exactly L tokens."""
    max_seqlen: int
    """L: the longest a segment can be (the same for every batch)."""
    masked_lm_positions: torch.Tensor
    """[B, P]: the masked tokens as indices into the B*L tokens (row * L + position in the
    row), ascending per row; padding slots point at the row's first token."""
    masked_lm_ids: torch.Tensor
    """[B, P]: the original token ids there (MLM labels), 0 in padding slots."""
    masked_lm_weights: torch.Tensor
    """[B, P] float32: 1 for a real masked token, 0 for a padding slot."""
    cls_positions: torch.Tensor
    """[B, K]: each sequence slot's [CLS] as an index into the B*L tokens (NSP is pooled there);
    an empty slot points at the row's first token."""
    next_sentence_labels: torch.Tensor
    """[B, K]: 1 when the slot's segment B is a random sentence; 0 for an empty slot."""
    next_sentence_weights: torch.Tensor
    """[B, K] float32: 1 for a real sequence, 0 for an empty slot."""

    def inputs(self) -> dict[str, torch.Tensor | int]:
        """Keyword arguments for BertForPreTraining.forward: every tensor flattened (views)."""
        return {f.name: v.reshape(-1) if isinstance(v := getattr(self, f.name), torch.Tensor)
                else v for f in fields(self)}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Array]) -> PackedBatch:
        """From `bertperf.data.collate.collate_packed` output (numpy arrays are shared, not
        copied; keys other than the fields are ignored)."""
        return cls(**{f.name: int(arrays[f.name]) if f.name == "max_seqlen"
                      else torch.as_tensor(arrays[f.name]) for f in fields(cls)})


@dataclass
class PaddedBatch(Tensors):
    """B sequences, one per row, padded to L tokens (MLPerf's padded HDF5 fields, as
    `Samples.to_padded` writes them)."""

    input_ids: torch.Tensor
    """[B, L] int64: token ids, 0 after the sequence's end."""
    input_mask: torch.Tensor
    """[B, L] int64: 1 on the real tokens, which come first in the row."""
    segment_ids: torch.Tensor
    """[B, L] int64: 0/1 as in UnpaddedBatch, 0 on padding."""
    masked_lm_positions: torch.Tensor
    """[B, P] int64: masked positions in the row, ascending, then 0 (0 = no mask; [CLS] at
    position 0 is never masked)."""
    masked_lm_ids: torch.Tensor
    """[B, P] int64: the labels at those positions, 0-padded."""
    next_sentence_labels: torch.Tensor
    """[B] int64."""

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Array]) -> PaddedBatch:
        """From `Samples.to_padded` / padded HDF5 arrays (extra keys ignored)."""
        return cls(**{f.name: _long(arrays[f.name]).reshape(-1) if f.name == "next_sentence_labels"
                      else _long(arrays[f.name]) for f in fields(cls)})


def unpad(batch: PaddedBatch) -> UnpaddedBatch:
    """The same sequences, unpadded (reads max_seqlen back to the host)."""
    mask = batch.input_mask.bool()
    lengths = mask.sum(1)
    cu = _cu_seqlens(lengths)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    real = batch.masked_lm_positions != 0
    flat = cu[:-1, None].long() + batch.masked_lm_positions
    return UnpaddedBatch(batch.input_ids[mask], batch.segment_ids[mask], positions[mask], cu,
                         int(lengths.max()), flat[real], batch.masked_lm_ids[real],
                         batch.next_sentence_labels)


def pad(batch: UnpaddedBatch, max_seq_length: int, max_pred: int) -> PaddedBatch:
    """The same sequences padded to max_seq_length tokens and max_pred masks per row."""
    cu = batch.cu_seqlens.long()
    num_seqs = len(cu) - 1
    dev = cu.device
    seq = torch.repeat_interleave(torch.arange(num_seqs, device=dev), cu[1:] - cu[:-1])
    col = torch.arange(len(seq), device=dev) - cu[seq]
    input_ids = torch.zeros(num_seqs, max_seq_length, dtype=torch.long, device=dev)
    input_mask = torch.zeros_like(input_ids)
    segment_ids = torch.zeros_like(input_ids)
    input_ids[seq, col] = batch.input_ids
    input_mask[seq, col] = 1
    segment_ids[seq, col] = batch.segment_ids
    m_seq = torch.searchsorted(cu[1:], batch.masked_lm_positions, right=True)
    m_first = F.pad(torch.bincount(m_seq, minlength=num_seqs).cumsum(0), (1, 0))
    slot = torch.arange(len(m_seq), device=dev) - m_first[m_seq]
    positions = torch.zeros(num_seqs, max_pred, dtype=torch.long, device=dev)
    labels = torch.zeros_like(positions)
    positions[m_seq, slot] = batch.masked_lm_positions - cu[m_seq]
    labels[m_seq, slot] = batch.masked_lm_ids
    return PaddedBatch(input_ids, input_mask, segment_ids, positions, labels,
                       batch.next_sentence_labels)


def unpack_rows(arrays: Mapping[str, Array]) -> UnpaddedBatch:
    """The sequences of packed rows (`bertperf.formats.packed.Packed.batch`: R rows of L tokens,
    up to K sequences each) as an unpadded batch of all their sequences, in row order: the row
    grouping disappears, every sequence is attended and pooled by itself. Uses input_ids,
    input_mask, segment_ids, position_ids, seq_lengths [R, K] (0 = no sequence),
    masked_lm_positions/ids [R, P] (positions relative to the row, 0 = none) and
    next_sentence_labels [R, K]."""
    mask = torch.as_tensor(arrays["input_mask"]).bool()
    seq_lengths = _long(arrays["seq_lengths"])
    present = seq_lengths > 0
    lengths = seq_lengths[present]
    row_starts = F.pad(mask.sum(1).cumsum(0), (1, 0))[:-1]
    masked = _long(arrays["masked_lm_positions"])
    real = masked != 0
    return UnpaddedBatch(
        input_ids=_long(arrays["input_ids"])[mask],
        segment_ids=_long(arrays["segment_ids"])[mask],
        position_ids=_long(arrays["position_ids"])[mask],
        cu_seqlens=_cu_seqlens(lengths),
        max_seqlen=int(lengths.max()),
        masked_lm_positions=(row_starts[:, None] + masked)[real],
        masked_lm_ids=_long(arrays["masked_lm_ids"])[real],
        next_sentence_labels=_long(arrays["next_sentence_labels"])[present],
    )
