"""Bias add followed by BERT's exact (erf) GeLU: the activation after the feed-forward's first
GEMM and in the MLM head's transform (NVIDIA: `--fused_gelu_bias` / `--fused_gemm_gelu`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from bertperf.kernels.backend import Kernels


def bias_gelu(x: Tensor, bias: Tensor, *, kernels: Kernels = Kernels()) -> Tensor:
    """gelu(x + bias), bias broadcast over the last dimension, in x's dtype (under autocast an
    fp32 bias does not widen the bf16 activation). Where kernels.use_triton(x): one Triton kernel
    each way (`bias_gelu_triton`); elsewhere ATen's exact GeLU."""
    if kernels.use_triton(x):
        return bias_gelu_triton(x, bias)
    return F.gelu(x + bias.to(x.dtype), approximate="none")


def bias_gelu_reference(x: Tensor, bias: Tensor) -> Tensor:
    """BERT's definition: y * 0.5 * (1 + erf(y / sqrt(2))), y = x + bias."""
    y = x + bias
    return y * 0.5 * (1.0 + torch.erf(y / math.sqrt(2.0)))


@torch.library.custom_op("bertperf::bias_gelu", mutates_args=())
def bias_gelu_triton(x: Tensor, bias: Tensor) -> Tensor:
    """The Triton kernel: reads x (any float dtype) and bias, computes in fp32, writes x's
    dtype. Its backward kernel recomputes x + bias and gives dx and the bias gradient."""
    from bertperf.kernels.triton import bias_gelu as kernels
    return kernels.forward(x, bias)


@torch.library.custom_op("bertperf::bias_gelu_backward", mutates_args=())
def _bias_gelu_backward(grad: Tensor, x: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    from bertperf.kernels.triton import bias_gelu as kernels
    return kernels.backward(grad, x, bias)


@bias_gelu_triton.register_fake
def _(x: Tensor, bias: Tensor) -> Tensor:
    return torch.empty_like(x)


@_bias_gelu_backward.register_fake
def _(grad: Tensor, x: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(bias)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:
    return _bias_gelu_backward(grad, *ctx.saved_tensors)


bias_gelu_triton.register_autograd(_backward, setup_context=_setup_context)
