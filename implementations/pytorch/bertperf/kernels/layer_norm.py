"""The Triton LayerNorm that ends a sub-layer, as a PyTorch op with autograd: LayerNorm(x
(+ bias) (GeLU) (dropout) (+ residual)). dropout_add_layer_norm and bias_gelu_layer_norm run it
on CUDA. Dropout draws its keep mask from a seed tensor (Philox): the backward pass draws the
same mask again instead of storing it, and `dropout_keep_mask` returns it for the tests."""

from __future__ import annotations

import torch
from torch import Tensor


def layer_norm_reference(h: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """LayerNorm over the last dimension, written out: (h - mean) / sqrt(biased var + eps) *
    weight + bias."""
    mean = h.mean(dim=-1, keepdim=True)
    var = ((h - mean) ** 2).mean(dim=-1, keepdim=True)
    return (h - mean) / torch.sqrt(var + eps) * weight + bias


def new_seed(device: torch.device) -> Tensor:
    """A fresh dropout seed on `device`, drawn from PyTorch's generator there (no host sync;
    CUDA-graph safe)."""
    return torch.randint(0, 2**62, (1,), device=device, dtype=torch.int64)


def dropout_keep_mask(seed: Tensor, shape: tuple[int, ...], p: float) -> Tensor:
    """The boolean keep mask that layer_norm_triton (and embedding_layer_norm_triton) use for an
    activation of `shape` with dropout p and this seed."""
    from bertperf.kernels.triton import layer_norm as kernels
    return kernels.keep(seed, tuple(shape), p)


@torch.library.custom_op("bertperf::layer_norm", mutates_args=())
def layer_norm_triton(x: Tensor, bias: Tensor | None, residual: Tensor | None, weight: Tensor,
                      ln_bias: Tensor, seed: Tensor | None, p: float, eps: float,
                      gelu: bool) -> Tensor:
    """LayerNorm over the last dimension (weight, ln_bias, eps) of h = x (+ bias) (exact GeLU)
    (dropout p with the keep mask of `seed`; None: no dropout) (+ residual); fp32 statistics,
    output in x's dtype. One Triton kernel each way."""
    from bertperf.kernels.triton import layer_norm as kernels
    return kernels.forward(x, bias, residual, weight, ln_bias, seed, p, eps, gelu)


@torch.library.custom_op("bertperf::layer_norm_backward", mutates_args=())
def _layer_norm_backward(grad: Tensor, x: Tensor, bias: Tensor | None, residual: Tensor | None,
                         weight: Tensor, seed: Tensor | None, p: float, eps: float,
                         gelu: bool) -> list[Tensor]:
    from bertperf.kernels.triton import layer_norm as kernels
    return kernels.backward(grad, x, bias, residual, weight, seed, p, eps, gelu)


@layer_norm_triton.register_fake
def _(x, bias, residual, weight, ln_bias, seed, p, eps, gelu):
    return torch.empty_like(x)


@_layer_norm_backward.register_fake
def _(grad, x, bias, residual, weight, seed, p, eps, gelu):
    def like(t):
        return torch.empty_like(t) if t is not None else x.new_empty(0)
    return [torch.empty_like(x), like(residual), torch.empty_like(weight),
            torch.empty_like(weight), like(bias)]


def _setup_context(ctx, inputs, output) -> None:
    x, bias, residual, weight, _, seed, p, eps, gelu = inputs
    ctx.save_for_backward(x, bias, residual, weight, seed)
    ctx.p, ctx.eps, ctx.gelu = p, eps, gelu


def _backward(ctx, grad: Tensor):
    x, bias, residual, weight, seed = ctx.saved_tensors
    dx, dres, dw, dlb, dbias = _layer_norm_backward(grad, x, bias, residual, weight, seed,
                                                    ctx.p, ctx.eps, ctx.gelu)
    return (dx, dbias if bias is not None else None, dres if residual is not None else None,
            dw, dlb, None, None, None, None)


layer_norm_triton.register_autograd(_backward, setup_context=_setup_context)
