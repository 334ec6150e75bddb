"""BERT for pretraining (masked LM + next-sentence prediction) on unpadded or packed batches.

The encoder runs on the tokens of all sequences concatenated (cu_seqlens marks the boundaries;
attention never crosses them; position ids restart at every sequence), the MLM head only on the
masked tokens (NVIDIA's dense_seq_output), the NSP head on each sequence's first token. A packed
batch is the same with its rows flattened: padding tails are segments of their own and padding
slots of the MLM and NSP heads weigh 0 in the loss. The loss is computed here, once
(pretraining_output), in float32 or wider, the MLM loss with kernels.cross_entropy_sum;
forward_loss is a training micro-step's forward and loss, the part torch.compile compiles
(compiled_forward_loss). The model is written for one device; parallelism is applied around it.
Which implementation of bertperf.kernels it runs is the `Kernels` value `use_kernels` gives it
(train.parallel.parallelize: FUSED_KERNELS; default auto).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from bertperf.kernels import Kernels, cross_entropy_sum
from bertperf.model.bert_config import BertConfig
from bertperf.model.layers import (BertEmbeddings, BertEncoder, BertPooler, BertPreTrainingHeads,
                                   UsesKernels)


@dataclass
class PreTrainingOutput:
    """Logits of one batch, and its losses when labels were given."""

    mlm_logits: torch.Tensor
    """[M, vocab_size] at the masked tokens (or slots), in the order of masked_lm_positions."""
    nsp_logits: torch.Tensor
    """[S, 2] per sequence (or slot; class 1 = segment B is a random sentence)."""
    mlm_loss: torch.Tensor | None = None
    """Cross-entropy summed over the masked tokens (padding slots weigh 0) and divided by
    loss_divisors[0]: by default their number, i.e. the mean (NaN when there is none)."""
    nsp_loss: torch.Tensor | None = None
    """Cross-entropy summed over the sequences and divided by loss_divisors[1] (default: the
    mean)."""
    loss: torch.Tensor | None = None
    """mlm_loss + nsp_loss, the pretraining objective."""


def summed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor,
                         weights: torch.Tensor | None) -> torch.Tensor:
    """sum_i weights_i * CE(logits_i, labels_i), in float32 for lower-precision logits: ATen's
    cross-entropy (the NSP loss, and the padded reference's MLM loss)."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if weights is None:
        return F.cross_entropy(logits, labels.long(), reduction="sum")
    return (F.cross_entropy(logits, labels.long(), reduction="none") * weights).sum()


def masked_lm_cross_entropy(logits: torch.Tensor, labels: torch.Tensor,
                            weights: torch.Tensor | None,
                            kernels: Kernels = Kernels()) -> torch.Tensor:
    """summed_cross_entropy over the vocabulary with kernels.cross_entropy_sum: on its Triton
    path it reads the (bf16) logits in their own dtype, with no float32 copy of them. weights
    None: all count."""
    if weights is None:
        weights = logits.new_ones(logits.shape[0], dtype=torch.float32)
    return cross_entropy_sum(logits, labels, weights, kernels=kernels)


def pretraining_output(mlm_logits: torch.Tensor, nsp_logits: torch.Tensor,
                       masked_lm_ids: torch.Tensor | None,
                       next_sentence_labels: torch.Tensor | None,
                       masked_lm_weights: torch.Tensor | None = None,
                       next_sentence_weights: torch.Tensor | None = None,
                       loss_divisors: torch.Tensor | None = None,
                       mlm_cross_entropy: Callable[..., torch.Tensor] = masked_lm_cross_entropy,
                       ) -> PreTrainingOutput:
    """The output with losses when both label tensors are given (shared with the padded
    reference, so both define the loss identically; the reference passes
    mlm_cross_entropy=summed_cross_entropy). Weights: 0 for padding slots (None: all count).
    loss_divisors: [2] (masked tokens, sequences) to divide the summed cross-entropies by (in
    the losses' dtype: float32, or float64 for a float64 model); None: the batch's own counts
    (weight sums), i.e. means."""
    if masked_lm_ids is None or next_sentence_labels is None:
        return PreTrainingOutput(mlm_logits, nsp_logits)
    mlm = mlm_cross_entropy(mlm_logits, masked_lm_ids, masked_lm_weights)
    nsp = summed_cross_entropy(nsp_logits, next_sentence_labels, next_sentence_weights)
    if loss_divisors is None:
        loss_divisors = torch.stack([
            masked_lm_weights.sum() if masked_lm_weights is not None
            else mlm.new_tensor(masked_lm_ids.numel()),
            next_sentence_weights.sum() if next_sentence_weights is not None
            else nsp.new_tensor(next_sentence_labels.numel())])
    loss_divisors = loss_divisors.to(mlm.dtype)
    mlm_loss, nsp_loss = mlm / loss_divisors[0], nsp / loss_divisors[1]
    return PreTrainingOutput(mlm_logits, nsp_logits, mlm_loss, nsp_loss, mlm_loss + nsp_loss)


def forward_loss(model: nn.Module, inputs: Mapping, divisors: torch.Tensor) -> torch.Tensor:
    """A micro-batch's share of a training step's loss: the model's summed cross-entropies over
    the step's divisors ([2]: masked tokens, sequences; bertperf.train.loop.train_step). What
    compiled_forward_loss compiles."""
    return model(**inputs, loss_divisors=divisors).loss


def compiled_forward_loss(backend: str = "none", cuda_graphs: bool = False,
                          fullgraph: bool = True) -> Callable[..., torch.Tensor]:
    """forward_loss, torch.compile'd with `backend` ("none": not compiled, unless cuda_graphs)
    for static shapes (packed batches); cuda_graphs: inductor's mode="reduce-overhead", which
    replays the forward and the backward as CUDA graphs, each call a new iteration of them.
    fullgraph: fail on a graph break."""
    if backend == "none" and not cuda_graphs:
        return forward_loss
    step = torch.compile(forward_loss, backend="inductor" if backend == "none" else backend,
                         dynamic=False, fullgraph=fullgraph,
                         mode="reduce-overhead" if cuda_graphs else None)
    if not cuda_graphs:
        return step

    def replayed(*args) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return step(*args)
    return replayed


class BertModel(nn.Module):
    """Embeddings, encoder and pooler (HF's `bert.` prefix)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config)


class BertForPreTraining(UsesKernels):
    """BERT with its MLM and NSP heads, on unpadded batches (inputs: bertperf.model.batch)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.reset_parameters()

    def use_kernels(self, kernels: Kernels) -> None:
        """Run bertperf.kernels as `kernels` says in every module of the model that calls them
        (those in the model now: call it again after adding layers)."""
        for m in self.modules():
            if isinstance(m, UsesKernels):
                m.kernels = kernels

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
                next_sentence_labels: torch.Tensor | None = None,
                cls_positions: torch.Tensor | None = None,
                masked_lm_weights: torch.Tensor | None = None,
                next_sentence_weights: torch.Tensor | None = None,
                loss_divisors: torch.Tensor | None = None) -> PreTrainingOutput:
        """input_ids, segment_ids, position_ids: [T] (int32 or int64); cu_seqlens: [S+1] int32;
        max_seqlen: the longest segment (int); masked_lm_positions: [M] indices into the T
        tokens; masked_lm_ids: [M] label ids; next_sentence_labels: [S']; cls_positions: [S']
        the tokens the NSP head pools (None: every segment's first token, cu_seqlens[:-1]);
        weights and loss_divisors: pretraining_output. An UnpaddedBatch's or PackedBatch's
        inputs() are these arguments. Losses are computed when both label tensors are given."""
        word_embeddings = self.bert.embeddings.word_embeddings.weight
        x = self.bert.embeddings(input_ids, segment_ids, position_ids)
        x = self.bert.encoder(x, cu_seqlens, max_seqlen)
        mlm_logits = self.cls.predictions(x.index_select(0, masked_lm_positions), word_embeddings)
        pooled = self.bert.pooler(x, cu_seqlens[:-1] if cls_positions is None else cls_positions)
        nsp_logits = self.cls.seq_relationship(pooled)
        return pretraining_output(mlm_logits, nsp_logits, masked_lm_ids, next_sentence_labels,
                                  masked_lm_weights, next_sentence_weights, loss_divisors,
                                  functools.partial(masked_lm_cross_entropy,
                                                    kernels=self.kernels))
