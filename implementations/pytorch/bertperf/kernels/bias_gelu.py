"""Bias add followed by BERT's exact (erf) GeLU: the activation after the feed-forward's first
GEMM and in the MLM head's transform (NVIDIA: `--fused_gelu_bias` / `--fused_gemm_gelu`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(x + bias), bias broadcast over the last dimension. One elementwise pass under
    torch.compile; ATen's exact GeLU otherwise."""
    return F.gelu(x + bias, approximate="none")


def bias_gelu_reference(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """BERT's definition: y * 0.5 * (1 + erf(y / sqrt(2))), y = x + bias."""
    y = x + bias
    return y * 0.5 * (1.0 + torch.erf(y / math.sqrt(2.0)))
