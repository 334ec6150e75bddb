"""bertperf.kernels: each implementation against its plain reference, forward and backward
(float64 on CPU; the CUDA-only paths are in tests/gpu/test_kernels_gpu.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertperf.kernels import (bias_gelu, bias_gelu_reference, dropout_add_layer_norm,
                              dropout_add_layer_norm_reference, varlen_attention,
                              varlen_attention_padded, varlen_attention_reference,
                              varlen_attention_sdpa)

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


# ---- variable-length attention -----------------------------------------------------------------

LENGTHS = [1, 7, 3, 16, 2]
H, D = 3, 8


def qkv_for(lengths: list[int], seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor, int]:
    cu = F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).to(torch.int32)
    return leaves(*[(sum(lengths), H, D)] * 3, seed=seed), cu, max(lengths)


def block_diagonal_attention(q, k, v, cu, scale):
    """An independent formulation: all T tokens at once, scores outside a token's own
    sequence masked out."""
    seq = torch.repeat_interleave(torch.arange(len(cu) - 1), (cu[1:] - cu[:-1]).long())
    scores = torch.einsum("thd,shd->hts", q, k) * scale
    scores = scores.masked_fill(seq[:, None] != seq[None, :], float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(scores, -1), v)


def test_varlen_reference_is_block_diagonal_attention():
    (q, k, v), cu, _ = qkv_for(LENGTHS)
    assert_same_fwd_bwd(lambda *a: varlen_attention_reference(*a, cu, 16, scale=0.3),
                        lambda *a: block_diagonal_attention(*a, cu, 0.3), [q, k, v])
    out = varlen_attention_reference(q, k, v, cu, 16)
    torch.testing.assert_close(out, block_diagonal_attention(q, k, v, cu, D ** -0.5))


def test_varlen_sequences_are_independent():
    (q, k, v), cu, m = qkv_for(LENGTHS)
    out = varlen_attention_reference(q, k, v, cu, m)
    bounds = cu.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        one = torch.tensor([0, e - s], dtype=torch.int32)
        torch.testing.assert_close(out[s:e], varlen_attention_reference(q[s:e], k[s:e], v[s:e],
                                                                        one, e - s))


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("lengths", [LENGTHS, [16, 16], [1, 1, 1]])
def test_varlen_sdpa_matches_reference(lengths):
    (q, k, v), cu, m = qkv_for(lengths, seed=len(lengths))
    assert_same_fwd_bwd(lambda *a: varlen_attention_sdpa(*a, cu, m),
                        lambda *a: varlen_attention_reference(*a, cu, m), [q, k, v])


@pytest.mark.parametrize("lengths", [LENGTHS, [16, 16], [1, 1, 1], [5]])
def test_varlen_padded_matches_reference(lengths):
    (q, k, v), cu, m = qkv_for(lengths, seed=len(lengths))
    assert_same_fwd_bwd(lambda *a: varlen_attention_padded(*a, cu, m, scale=0.3),
                        lambda *a: varlen_attention_reference(*a, cu, m, scale=0.3), [q, k, v])


def test_varlen_attention_on_cpu_is_the_padded_path():
    (q, k, v), cu, m = qkv_for(LENGTHS)
    assert torch.equal(varlen_attention(q, k, v, cu, m), varlen_attention_padded(q, k, v, cu, m))


def test_varlen_padded_dropout_keeps_sequences_apart():
    """With dropout the padded path still mixes only a sequence's own tokens, and dropout acts
    (the same seed gives the same output)."""
    (q, k, v), cu, m = qkv_for([40, 24])
    torch.manual_seed(3)
    a = varlen_attention_padded(q, k, v, cu, m, dropout_p=0.5)
    torch.manual_seed(3)
    assert torch.equal(a, varlen_attention_padded(q, k, v, cu, m, dropout_p=0.5))
    assert not torch.allclose(a, varlen_attention_padded(q, k, v, cu, m))
    v2 = v.detach().clone()
    v2[40:] += 1.0  # the second sequence's values must not reach the first's outputs
    torch.manual_seed(3)
    torch.testing.assert_close(varlen_attention_padded(q, k, v2, cu, m, dropout_p=0.5)[:40], a[:40])


def test_varlen_reference_dropout():
    (q, k, v), cu, m = qkv_for([40, 24])
    torch.manual_seed(3)
    a = varlen_attention_reference(q, k, v, cu, m, dropout_p=0.5)
    torch.manual_seed(3)
    b = varlen_attention_reference(q, k, v, cu, m, dropout_p=0.5)
    assert torch.equal(a, b)
    assert not torch.allclose(a, varlen_attention_reference(q, k, v, cu, m))
