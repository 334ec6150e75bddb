"""bertperf.kernels.varlen_attention: every path against varlen_attention_reference, forward and
backward (float64 on CPU; the numeric comparisons of the CUDA-only paths are in
tests/gpu/test_kernels_gpu.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertperf.kernels import (varlen_attention, varlen_attention_padded,
                              varlen_attention_reference, varlen_attention_sdpa)

F64 = dict(dtype=torch.float64)
LENGTHS = [1, 7, 3, 16, 2]
H, D = 3, 8


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


def offsets(lengths: list[int]) -> torch.Tensor:
    return F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).to(torch.int32)


def qkv_for(lengths: list[int], seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor, int]:
    return leaves(*[(sum(lengths), H, D)] * 3, seed=seed), offsets(lengths), max(lengths)


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


# ---- empty sequences and a fixed max_seqlen ----------------------------------------------------

WITH_EMPTY = [0, 7, 0, 0, 3, 16, 0, 2, 1, 0]  # LENGTHS' tokens, empty sequences around them


@pytest.mark.parametrize("path", [varlen_attention_reference, varlen_attention_padded,
                                  varlen_attention], ids=lambda f: f.__name__)
@pytest.mark.parametrize("max_seqlen", [16, 512])
def test_empty_sequences_and_a_larger_max_seqlen_change_nothing(path, max_seqlen):
    """Empty sequences (repeated offsets) anywhere in cu_seqlens and a max_seqlen above the
    longest length give the outputs and gradients of the same tokens without them."""
    real = [n for n in WITH_EMPTY if n]
    (q, k, v), cu, m = qkv_for(real)
    assert_same_fwd_bwd(lambda *a: path(*a, offsets(WITH_EMPTY), max_seqlen, scale=0.3),
                        lambda *a: varlen_attention_reference(*a, cu, m, scale=0.3), [q, k, v])


def test_only_empty_sequences():
    (q, k, v) = leaves(*[(0, H, D)] * 3)
    for path in (varlen_attention_reference, varlen_attention_padded):
        out = path(q, k, v, offsets([0, 0, 0]), 512)
        assert out.shape == (0, H, D)
        assert all(g.shape == (0, H, D) for g in torch.autograd.grad(out.sum(), (q, k, v),
                                                                     allow_unused=True)
                   if g is not None)


# ---- dropout -----------------------------------------------------------------------------------

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
