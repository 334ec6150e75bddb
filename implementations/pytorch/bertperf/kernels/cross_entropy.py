"""The masked-LM loss: cross-entropy of each masked position's logits over the vocabulary,
weighted per position and summed."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from bertperf.kernels.backend import Kernels


def cross_entropy_sum(logits: Tensor, labels: Tensor, weights: Tensor, *,
                      kernels: Kernels = Kernels()) -> Tensor:
    """sum_i weights[i] * cross_entropy(logits[i], labels[i]) as an fp32 0-d tensor (float64
    for float64 logits off CUDA). logits [M, V] (any float dtype; a column slice of wider logits
    is fine), labels [M] (valid ids everywhere, int32 or int64), weights [M] float; a row of
    weight 0 (a padding slot) adds nothing to the loss or the gradient. Where
    kernels.use_triton(logits): Triton kernels that read the logits in their own dtype and return
    the gradient in it (`cross_entropy_sum_triton`); elsewhere ATen's cross_entropy on fp32 (or
    float64) logits."""
    if kernels.use_triton(logits):
        return cross_entropy_sum_triton(logits, labels, weights)[0]
    wide = logits if logits.dtype == torch.float64 else logits.float()
    ce = F.cross_entropy(wide, labels.long(), reduction="none")
    return torch.where(weights != 0, ce * weights, 0.0).sum()


def cross_entropy_sum_reference(logits: Tensor, labels: Tensor, weights: Tensor) -> Tensor:
    """The definition: sum over rows of weight * (logsumexp(row) - row[label]), rows of weight
    0 left out."""
    target = logits.gather(1, labels.long()[:, None])[:, 0]
    per_row = weights * (torch.logsumexp(logits, dim=1) - target)
    return torch.where(weights != 0, per_row, 0.0).sum()


@torch.library.custom_op("bertperf::cross_entropy_sum", mutates_args=())
def cross_entropy_sum_triton(logits: Tensor, labels: Tensor,
                             weights: Tensor) -> tuple[Tensor, Tensor]:
    """The Triton kernels: (the weighted sum, fp32 0-d; each row's fp32 log-sum-exp, which the
    backward pass uses)."""
    from bertperf.kernels.triton import cross_entropy as kernels
    return kernels.forward(logits if logits.stride(1) == 1 else logits.contiguous(), labels,
                           weights)


@torch.library.custom_op("bertperf::cross_entropy_sum_backward", mutates_args=())
def _cross_entropy_sum_backward(grad: Tensor, logits: Tensor, labels: Tensor, weights: Tensor,
                                lse: Tensor) -> Tensor:
    from bertperf.kernels.triton import cross_entropy as kernels
    return kernels.backward(grad, logits if logits.stride(1) == 1 else logits.contiguous(),
                            labels, weights, lse)


@cross_entropy_sum_triton.register_fake
def _(logits, labels, weights):
    f32 = dict(device=logits.device, dtype=torch.float32)
    return torch.empty((), **f32), torch.empty(logits.shape[0], **f32)


@_cross_entropy_sum_backward.register_fake
def _(grad, logits, labels, weights, lse):
    stride = logits.stride() if logits.stride(1) == 1 else logits.contiguous().stride()
    return torch.empty_strided(logits.shape, stride, device=logits.device, dtype=logits.dtype)


def _setup_context(ctx, inputs, output) -> None:
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(*inputs, output[1])


def _backward(ctx, grad: Tensor, _grad_lse: Tensor):
    return _cross_entropy_sum_backward(grad, *ctx.saved_tensors), None, None


cross_entropy_sum_triton.register_autograd(_backward, setup_context=_setup_context)
