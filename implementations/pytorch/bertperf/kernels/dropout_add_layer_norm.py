"""The end of every BERT sub-layer (post-LN): LayerNorm(dropout(x + dense bias) + residual)
(NVIDIA: `--fused_dropout_add` plus apex's FastLayerNorm)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bertperf.kernels.backend import Kernels
from bertperf.kernels.layer_norm import layer_norm_reference, layer_norm_triton, new_seed


def dropout_add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           bias: torch.Tensor, p: float, eps: float,
                           dense_bias: torch.Tensor | None = None, *,
                           kernels: Kernels = Kernels()) -> torch.Tensor:
    """LayerNorm (weight, bias, eps) over the last dimension of dropout(x + dense_bias, p) +
    residual, in x's dtype. dense_bias: the bias of the GEMM that made x, or None (x has it
    already). p = 0 means no dropout (pass 0 in eval mode); kept elements are scaled by
    1 / (1 - p). Where kernels.use_triton(x): one Triton kernel each way (`layer_norm_triton`,
    keep mask from a seed, fp32 statistics); elsewhere ATen's dropout and layer_norm."""
    if kernels.use_triton(x):
        seed = new_seed(x.device) if p > 0 else None
        return layer_norm_triton(x, dense_bias, residual, weight, bias, seed, p, eps, False)
    if dense_bias is not None:
        x = x + dense_bias.to(x.dtype)
    h = F.dropout(x, p, training=True) + residual if p > 0 else x + residual
    return F.layer_norm(h, (h.shape[-1],), weight, bias, eps).to(x.dtype)


def dropout_add_layer_norm_reference(x: torch.Tensor, residual: torch.Tensor,
                                     weight: torch.Tensor, bias: torch.Tensor, p: float,
                                     eps: float, keep: torch.Tensor | None = None,
                                     dense_bias: torch.Tensor | None = None) -> torch.Tensor:
    """The definition, written out: h = (x + dense_bias) * keep / (1 - p) + residual (keep:
    boolean mask of x's shape, required when p > 0), then layer_norm_reference(h)."""
    if dense_bias is not None:
        x = x + dense_bias
    if p > 0:
        if keep is None:
            raise ValueError("the reference needs the keep mask when p > 0")
        x = x * keep.to(x.dtype) / (1.0 - p)
    return layer_norm_reference(x + residual, weight, bias, eps)
