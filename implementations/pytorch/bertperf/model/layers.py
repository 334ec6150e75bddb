"""BERT's building blocks on unpadded tokens: every activation is [T, ...], T = the number of real
tokens of the batch, sequences concatenated (boundaries in cu_seqlens).

Module and parameter names are those of HuggingFace's BertForPreTraining (so state dicts map
one-to-one, bertperf.model.hf), but for query, key and value: one parameter pair, `qkv.weight`
[3·hidden, hidden] and `qkv.bias` [3·hidden], applied as one GEMM. The state dict still holds
them as HF's `query`, `key` and `value` tensors (split on save, concatenated on load), and they
are marked `lamb_row_blocks = 3`, so LAMB takes their norms and trust ratio per q/k/v block as
the TF reference, which has separate variables, does.

The encoder's four GEMMs a layer run in FP8 where bertperf.model.fp8 converted their layers
(FP8): `qkv` as a module call, the three bias-less ones through `gemm`.

Each layer calls one fused op of bertperf.kernels after its GEMM (Triton kernels on CUDA, plain
PyTorch elsewhere, as the module's `kernels` says: `UsesKernels`): embedding_layer_norm (lookups,
sum, LayerNorm, dropout), dropout_add_layer_norm with the dense bias (the end of each sub-layer),
bias_gelu (the feed-forward) and bias_gelu_layer_norm (the MLM head's transform).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertperf.kernels import (Kernels, bias_gelu, bias_gelu_layer_norm, dropout_add_layer_norm,
                              embedding_layer_norm, varlen_attention)
from bertperf.model.bert_config import BertConfig


class UsesKernels(nn.Module):
    """A module that calls bertperf.kernels' functions, with `kernels`: auto until
    BertForPreTraining.use_kernels sets the run's."""

    kernels = Kernels()


def gemm(x: torch.Tensor, dense: nn.Linear) -> torch.Tensor:
    """x @ dense.weight^T without the bias (which the next fused kernel adds): F.linear, or the
    layer's own FP8 matmul where bertperf.model.fp8 converted it (FP8)."""
    fp8 = getattr(dense, "gemm", None)
    return F.linear(x, dense.weight) if fp8 is None else fp8(x)


class BertEmbeddings(UsesKernels):
    """word + position + segment embeddings, LayerNorm, dropout, in one op
    (kernels.embedding_layer_norm). Under autocast its output, and so the residual stream, is in
    autocast's dtype (the tables' gradients still accumulate in fp32)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dropout_prob = config.hidden_dropout_prob
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor,
                position_ids: torch.Tensor) -> torch.Tensor:
        return embedding_layer_norm(input_ids, segment_ids, position_ids,
                                    self.word_embeddings.weight, self.position_embeddings.weight,
                                    self.token_type_embeddings.weight, self.LayerNorm.weight,
                                    self.LayerNorm.bias, self.LayerNorm.eps,
                                    self.dropout_prob if self.training else 0.0,
                                    kernels=self.kernels)


PROJECTIONS = ("query", "key", "value")
"""The blocks of BertSelfAttention's qkv parameters, in row order, named as in HF's state dict."""


class BertSelfAttention(nn.Module):
    """Q, K, V projections in one GEMM (`qkv`, rows: query, key, value) and variable-length
    attention on the packed [T, 3, H, D] projection (its gradient comes back as one tensor);
    returns the heads' context [T, hidden]. State dicts hold HF's query/key/value tensors
    (`_split_qkv`, `_fuse_qkv`)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.dropout_prob = config.attention_probs_dropout_prob
        self.qkv = nn.Linear(config.hidden_size, len(PROJECTIONS) * config.hidden_size)
        for param in self.qkv.parameters():
            param.lamb_row_blocks = len(PROJECTIONS)
        self.register_state_dict_post_hook(_split_qkv)
        self.register_load_state_dict_pre_hook(_fuse_qkv)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        qkv = self.qkv(x).view(x.shape[0], len(PROJECTIONS), self.num_heads, -1)
        p = self.dropout_prob if self.training else 0.0
        ctx = varlen_attention(qkv, cu_seqlens, max_seqlen, p)
        return ctx.reshape(x.shape)


def _split_qkv(module: BertSelfAttention, state_dict: dict, prefix: str, local_metadata) -> None:
    """State-dict hook: `qkv.weight`/`qkv.bias` replaced by HF's query/key/value tensors (views of
    the blocks), in HF's order."""
    blocks = {leaf: state_dict.pop(f"{prefix}qkv.{leaf}").chunk(len(PROJECTIONS))
              for leaf in ("weight", "bias")}
    for i, name in enumerate(PROJECTIONS):
        for leaf, tensors in blocks.items():
            state_dict[f"{prefix}{name}.{leaf}"] = tensors[i]


def _fuse_qkv(module: BertSelfAttention, state_dict: dict, prefix: str, *args) -> None:
    """Load pre-hook: HF's query/key/value tensors concatenated into `qkv.weight`/`qkv.bias`
    (where one of the three is missing, the others are left as they are: a strict load fails)."""
    for leaf in ("weight", "bias"):
        names = [f"{prefix}{name}.{leaf}" for name in PROJECTIONS]
        if all(name in state_dict for name in names):
            state_dict[f"{prefix}qkv.{leaf}"] = torch.cat([state_dict.pop(n) for n in names])


class BertSelfOutput(UsesKernels):
    """Output projection, dropout, residual add, LayerNorm; also BERT's BertOutput (the FFN's
    second GEMM), which differs only in the input width. The GEMM runs without its bias, which
    kernels.dropout_add_layer_norm adds with the dropout, residual and LayerNorm."""

    def __init__(self, config: BertConfig, in_features: int):
        super().__init__()
        self.dropout_prob = config.hidden_dropout_prob
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        p = self.dropout_prob if self.training else 0.0
        return dropout_add_layer_norm(gemm(h, self.dense), residual,
                                      self.LayerNorm.weight, self.LayerNorm.bias, p,
                                      self.LayerNorm.eps, dense_bias=self.dense.bias,
                                      kernels=self.kernels)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config, config.hidden_size)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        return self.output(self.self(x, cu_seqlens, max_seqlen), x)


class BertIntermediate(UsesKernels):
    """The FFN's first GEMM with bias-GeLU."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bias_gelu(gemm(x, self.dense), self.dense.bias, kernels=self.kernels)


class BertLayer(nn.Module):
    """One post-LN transformer layer."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertSelfOutput(config, config.intermediate_size)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        x = self.attention(x, cu_seqlens, max_seqlen)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, cu_seqlens, max_seqlen)
        return x


class BertPooler(nn.Module):
    """dense + tanh on each sequence's first token ([CLS], at `positions`), the NSP head's
    input."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x.index_select(0, positions)))


class BertPredictionHeadTransform(UsesKernels):
    """The MLM head before the decoder: dense, GeLU, LayerNorm (the GEMM without its bias, then
    kernels.bias_gelu_layer_norm)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bias_gelu_layer_norm(F.linear(x, self.dense.weight), self.dense.bias,
                                    self.LayerNorm.weight, self.LayerNorm.bias, self.LayerNorm.eps,
                                    kernels=self.kernels)


class BertLMPredictionHead(nn.Module):
    """Transform, then the decoder: the word-embedding matrix (tied, passed in) plus `bias`.
    Returns logits over the real vocabulary only (the padding columns are sliced off)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.vocab_size = config.vocab_size
        self.transform = BertPredictionHeadTransform(config)
        self.bias = nn.Parameter(torch.zeros(config.padded_vocab_size))

    def forward(self, x: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        logits = F.linear(self.transform(x), word_embeddings, self.bias)
        return logits[:, :self.vocab_size]


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)
