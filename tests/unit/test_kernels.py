"""bertperf.kernels: each implementation against its plain reference, forward and backward
(float64 on CPU; the CUDA-only paths are in tests/gpu/test_kernels_gpu.py). Variable-length
attention has its own file, test_attention.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertperf.kernels import (bias_gelu, bias_gelu_reference, dropout_add_layer_norm,
                              dropout_add_layer_norm_reference)

F64 = dict(dtype=torch.float64)


def leaves(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, **F64).requires_grad_() for s in shapes]


def grads(out: torch.Tensor, inputs: list[torch.Tensor], seed: int = 1) -> list[torch.Tensor]:
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), **F64)
    return list(torch.autograd.grad(out, inputs, g))


def assert_same_fwd_bwd(fast, ref, inputs: list[torch.Tensor], rtol=1e-12, atol=1e-12) -> None:
    out, expected = fast(*inputs), ref(*inputs)
    torch.testing.assert_close(out, expected, rtol=rtol, atol=atol)
    for a, b in zip(grads(out, inputs), grads(expected, inputs)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


# ---- bias + GeLU -------------------------------------------------------------------------------

def test_bias_gelu_matches_reference():
    x, b = leaves((5, 3, 16), (16,))
    assert_same_fwd_bwd(bias_gelu, bias_gelu_reference, [x, b])


def test_bias_gelu_is_the_exact_erf_gelu():
    values = [-3.0, -1.0, 0.0, 0.5, 2.0]
    y = torch.tensor(values, **F64)
    expected = torch.tensor([t * 0.5 * (1 + math.erf(t / math.sqrt(2))) for t in values], **F64)
    torch.testing.assert_close(bias_gelu_reference(y, torch.zeros(1, **F64)), expected,
                               rtol=1e-14, atol=1e-16)
    assert not torch.allclose(bias_gelu(y, torch.zeros(1, **F64)),
                              F.gelu(y, approximate="tanh"), rtol=1e-6, atol=0)


# ---- dropout + residual + LayerNorm ------------------------------------------------------------

def test_dropout_add_layer_norm_matches_reference_without_dropout():
    x, r, w, b = leaves((6, 32), (6, 32), (32,), (32,))
    assert_same_fwd_bwd(lambda *a: dropout_add_layer_norm(*a, 0.0, 1e-12),
                        lambda *a: dropout_add_layer_norm_reference(*a, 0.0, 1e-12), [x, r, w, b])


def test_dropout_add_layer_norm_matches_reference_with_dropout():
    p = 0.25
    x, r, w, b = leaves((64, 32), (64, 32), (32,), (32,))
    torch.manual_seed(7)  # the same draws as F.dropout(x): bernoulli over x's shape
    keep = F.dropout(torch.ones_like(x), p, training=True) != 0
    assert 0.6 < keep.double().mean() < 0.9

    def fast(*a):
        torch.manual_seed(7)
        return dropout_add_layer_norm(*a, p, 1e-5)

    assert_same_fwd_bwd(fast, lambda *a: dropout_add_layer_norm_reference(*a, p, 1e-5, keep),
                        [x, r, w, b])
    with pytest.raises(ValueError):
        dropout_add_layer_norm_reference(x, r, w, b, p, 1e-5)
