"""The MLM head's transform after its GEMM: LayerNorm(gelu(x + bias)), one pass over the
[M, hidden] activation instead of two (bias-GeLU, then LayerNorm)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bertperf.kernels.backend import Kernels
from bertperf.kernels.bias_gelu import bias_gelu, bias_gelu_reference
from bertperf.kernels.layer_norm import layer_norm_reference, layer_norm_triton


def bias_gelu_layer_norm(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor,
                         ln_bias: torch.Tensor, eps: float, *,
                         kernels: Kernels = Kernels()) -> torch.Tensor:
    """LayerNorm (weight, ln_bias, eps) over the last dimension of gelu(x + bias), exact GeLU,
    in x's dtype. Where kernels.use_triton(x): one Triton kernel each way (`layer_norm_triton`
    with gelu=True, fp32 statistics); elsewhere bias_gelu then ATen's layer_norm."""
    if kernels.use_triton(x):
        return layer_norm_triton(x, bias, None, weight, ln_bias, None, 0.0, eps, True)
    h = bias_gelu(x, bias, kernels=kernels)
    return F.layer_norm(h, (h.shape[-1],), weight, ln_bias, eps).to(x.dtype)


def bias_gelu_layer_norm_reference(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor,
                                   ln_bias: torch.Tensor, eps: float) -> torch.Tensor:
    """The definition: layer_norm_reference(bias_gelu_reference(x, bias))."""
    return layer_norm_reference(bias_gelu_reference(x, bias), weight, ln_bias, eps)
