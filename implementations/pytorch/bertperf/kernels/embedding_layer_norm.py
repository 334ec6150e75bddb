"""BERT's embedding layer: dropout(LayerNorm(word + position + token type embeddings)), as
model/layers.py's BertEmbeddings computes it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from bertperf.kernels.backend import Kernels, activation_dtype
from bertperf.kernels.layer_norm import layer_norm_reference, new_seed


def embedding_layer_norm(input_ids: Tensor, segment_ids: Tensor, position_ids: Tensor,
                         word: Tensor, position: Tensor, token_type: Tensor, weight: Tensor,
                         bias: Tensor, eps: float, p: float = 0.0, *,
                         kernels: Kernels = Kernels()) -> Tensor:
    """dropout(LayerNorm(word[input_ids] + position[position_ids] + token_type[segment_ids]), p)
    with LayerNorm (weight, bias, eps) over the hidden dimension; ids of any shape, output
    [*ids.shape, hidden] in the activation dtype (autocast's when on, else the tables'). p = 0
    means no dropout. Where kernels.use_triton(word): one Triton kernel each way
    (`embedding_layer_norm_triton`: the dropout is fused, its keep mask drawn from a seed; the
    table gradients are scatter-added); elsewhere ATen's embedding, layer_norm and dropout, each
    lookup cast to the activation dtype at once (under autocast the sum is not an fp32
    activation)."""
    dtype = activation_dtype(word)
    if kernels.use_triton(word):
        seed = new_seed(word.device) if p > 0 else None
        out = embedding_layer_norm_triton(input_ids.reshape(-1), segment_ids.reshape(-1),
                                          position_ids.reshape(-1), word, position, token_type,
                                          weight, bias, seed, p, eps, dtype)
        return out.view(*input_ids.shape, word.shape[1])
    h = (F.embedding(input_ids, word).to(dtype) + F.embedding(position_ids, position).to(dtype)
         + F.embedding(segment_ids, token_type).to(dtype))
    out = F.layer_norm(h, (h.shape[-1],), weight, bias, eps).to(dtype)
    return F.dropout(out, p, training=True) if p > 0 else out


def embedding_layer_norm_reference(input_ids: Tensor, segment_ids: Tensor, position_ids: Tensor,
                                   word: Tensor, position: Tensor, token_type: Tensor,
                                   weight: Tensor, bias: Tensor, eps: float, p: float = 0.0,
                                   keep: Tensor | None = None) -> Tensor:
    """The definition: rows of the tables added, layer_norm_reference, then * keep / (1 - p)
    (keep: boolean mask of the output's shape, required when p > 0)."""
    h = word[input_ids] + position[position_ids] + token_type[segment_ids]
    out = layer_norm_reference(h, weight, bias, eps)
    if p > 0:
        if keep is None:
            raise ValueError("the reference needs the keep mask when p > 0")
        out = out * keep.to(out.dtype) / (1.0 - p)
    return out


@torch.library.custom_op("bertperf::embedding_layer_norm", mutates_args=())
def embedding_layer_norm_triton(input_ids: Tensor, segment_ids: Tensor, position_ids: Tensor,
                                word: Tensor, position: Tensor, token_type: Tensor,
                                weight: Tensor, bias: Tensor, seed: Tensor | None, p: float,
                                eps: float, dtype: torch.dtype) -> Tensor:
    """The Triton kernel for T tokens (ids: [T], int32 or int64): [T, hidden] in `dtype`,
    dropout p with the keep mask of `seed` (None: no dropout; dropout_keep_mask gives the
    mask). Its backward kernel recomputes the sum, the statistics and the mask."""
    from bertperf.kernels.triton import embedding as kernels
    return kernels.forward(input_ids, segment_ids, position_ids, word, position, token_type,
                           weight, bias, seed, p, eps, dtype)


@torch.library.custom_op("bertperf::embedding_layer_norm_backward", mutates_args=())
def _embedding_layer_norm_backward(grad: Tensor, input_ids: Tensor, segment_ids: Tensor,
                                   position_ids: Tensor, word: Tensor, position: Tensor,
                                   token_type: Tensor, weight: Tensor, seed: Tensor | None,
                                   p: float, eps: float) -> list[Tensor]:
    from bertperf.kernels.triton import embedding as kernels
    return kernels.backward(grad, input_ids, segment_ids, position_ids, word, position,
                            token_type, weight, seed, p, eps)


@embedding_layer_norm_triton.register_fake
def _(input_ids, segment_ids, position_ids, word, position, token_type, weight, bias, seed, p,
      eps, dtype):
    return word.new_empty(input_ids.shape[0], word.shape[1], dtype=dtype)


@_embedding_layer_norm_backward.register_fake
def _(grad, input_ids, segment_ids, position_ids, word, position, token_type, weight, seed, p,
      eps):
    return [torch.empty_like(t) for t in (word, position, token_type, weight, weight)]


def _setup_context(ctx, inputs, output) -> None:
    ids, seg, pos, word, position, token_type, weight, _, seed, p, eps, _ = inputs
    ctx.save_for_backward(ids, seg, pos, word, position, token_type, weight, seed)
    ctx.p, ctx.eps = p, eps


def _backward(ctx, grad: Tensor):
    grads = _embedding_layer_norm_backward(grad, *ctx.saved_tensors, ctx.p, ctx.eps)
    return (None, None, None, *grads, None, None, None, None)


embedding_layer_norm_triton.register_autograd(_backward, setup_context=_setup_context)
