"""BERT for pretraining (masked LM + next-sentence prediction) on unpadded batches.

The encoder runs on the T real tokens of all S sequences concatenated (cu_seqlens marks the
boundaries; attention never crosses them; position ids restart at every sequence), the MLM head
only on the M masked tokens (NVIDIA's dense_seq_output), the NSP head on each sequence's first
token. The model is written for one device; parallelism is applied around it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertperf.model.bert_config import BertConfig
from bertperf.model.layers import BertEmbeddings, BertEncoder, BertPooler, BertPreTrainingHeads


@dataclass
class PreTrainingOutput:
    """Logits of one batch, and its losses when labels were given."""

    mlm_logits: torch.Tensor
    """[M, vocab_size] at the masked tokens, in the order of masked_lm_positions."""
    nsp_logits: torch.Tensor
    """[S, 2] per sequence (class 1 = segment B is a random sentence)."""
    mlm_loss: torch.Tensor | None = None
    """Mean cross-entropy over the batch's M masked tokens (each token weighs the same; NaN
    when M = 0)."""
    nsp_loss: torch.Tensor | None = None
    """Mean cross-entropy over the batch's S sequences."""
    loss: torch.Tensor | None = None
    """mlm_loss + nsp_loss, the pretraining objective."""


def pretraining_output(mlm_logits: torch.Tensor, nsp_logits: torch.Tensor,
                       masked_lm_ids: torch.Tensor | None,
                       next_sentence_labels: torch.Tensor | None) -> PreTrainingOutput:
    """The output with losses when both label tensors are given (shared with the padded
    reference, so both define the loss identically)."""
    if masked_lm_ids is None or next_sentence_labels is None:
        return PreTrainingOutput(mlm_logits, nsp_logits)
    mlm_loss = F.cross_entropy(mlm_logits, masked_lm_ids.long())
    nsp_loss = F.cross_entropy(nsp_logits, next_sentence_labels.long())
    return PreTrainingOutput(mlm_logits, nsp_logits, mlm_loss, nsp_loss, mlm_loss + nsp_loss)


class BertModel(nn.Module):
    """Embeddings, encoder and pooler (HF's `bert.` prefix)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config)


class BertForPreTraining(nn.Module):
    """BERT with its MLM and NSP heads, on unpadded batches (inputs: bertperf.model.batch)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """BERT's initialisation: weights and embeddings N(0, initializer_range), biases 0,
        LayerNorm 1/0; the vocabulary padding rows 0."""
        std = self.config.initializer_range
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.normal_(0.0, std)
            if isinstance(m, nn.Linear):
                m.bias.zero_()
            if isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()
        self.bert.embeddings.word_embeddings.weight[self.config.vocab_size:] = 0
        self.cls.predictions.bias.zero_()

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor,
                position_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                masked_lm_positions: torch.Tensor, masked_lm_ids: torch.Tensor | None = None,
                next_sentence_labels: torch.Tensor | None = None) -> PreTrainingOutput:
        """input_ids, segment_ids, position_ids: [T] (ids: int32 or int64); cu_seqlens: [S+1]
        int32; max_seqlen: the longest sequence (int); masked_lm_positions: [M] indices into the
        T tokens; masked_lm_ids: [M] label ids; next_sentence_labels: [S]. Losses are computed
        when both label tensors are given."""
        word_embeddings = self.bert.embeddings.word_embeddings.weight
        x = self.bert.embeddings(input_ids, segment_ids, position_ids)
        x = self.bert.encoder(x, cu_seqlens, max_seqlen)
        mlm_logits = self.cls.predictions(x.index_select(0, masked_lm_positions), word_embeddings)
        nsp_logits = self.cls.seq_relationship(self.bert.pooler(x, cu_seqlens))
        return pretraining_output(mlm_logits, nsp_logits, masked_lm_ids, next_sentence_labels)
