"""The end of every BERT sub-layer (post-LN): LayerNorm(dropout(x) + residual)
(NVIDIA: `--fused_dropout_add` plus apex's FastLayerNorm)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dropout_add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           bias: torch.Tensor, p: float, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension of dropout(x, p) + residual. p = 0 means no dropout
    (pass 0 in eval mode); kept elements are scaled by 1 / (1 - p)."""
    h = F.dropout(x, p, training=True) + residual if p > 0 else x + residual
    return F.layer_norm(h, (h.shape[-1],), weight, bias, eps)


def dropout_add_layer_norm_reference(x: torch.Tensor, residual: torch.Tensor,
                                     weight: torch.Tensor, bias: torch.Tensor, p: float,
                                     eps: float, keep: torch.Tensor | None = None) -> torch.Tensor:
    """The definition, written out: h = x * keep / (1 - p) + residual (keep: boolean mask of x's
    shape, required when p > 0), then (h - mean) / sqrt(biased var + eps) * weight + bias."""
    if p > 0:
        if keep is None:
            raise ValueError("the reference needs the keep mask when p > 0")
        x = x * keep.to(x.dtype) / (1.0 - p)
    h = x + residual
    mean = h.mean(dim=-1, keepdim=True)
    var = ((h - mean) ** 2).mean(dim=-1, keepdim=True)
    return (h - mean) / torch.sqrt(var + eps) * weight + bias
