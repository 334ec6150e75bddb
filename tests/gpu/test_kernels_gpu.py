"""CUDA paths of bertperf.kernels and the model on CUDA, against the float32 references
(skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from bertperf.kernels import (flash_supported, varlen_attention, varlen_attention_flash,
                              varlen_attention_padded, varlen_attention_reference)
from bertperf.model import BertConfig, BertForPreTraining, PaddedBertForPreTraining, unpad
from tests.support.attention import keep_mask_of, offsets
from tests.support.models import padded_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# ---- variable-length attention: the model's packed [T, 3, H, D] projection, empty sequences,
# the fixed max_seqlen of fixed-shape batches ---------------------------------------------------

LENGTHS = [512, 1, 0, 37, 128, 5, 0, 300]
DROP_LENGTHS = [64, 1, 0, 37, 5, 0, 64, 50]  # <= D: keep_mask_of reads the masks
MAX_SEQLEN = 512
H, D = 16, 64
P = 0.1
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def projection(dtype: torch.dtype, lengths: list[int], seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(sum(lengths), 3, H, D, device="cuda", generator=g, dtype=dtype)
    return qkv.requires_grad_(), offsets(lengths).cuda()


def check_against_reference(run, dtype: torch.dtype, lengths: list[int] = LENGTHS,
                            dropout_mask: torch.Tensor | None = None) -> None:
    """run(qkv, cu_seqlens) in dtype against the float32 reference (applying dropout_mask if
    given), forward and backward into the projection."""
    qkv, cu = projection(dtype, lengths)
    ref_qkv = qkv.detach().float().requires_grad_()
    out = run(qkv, cu)
    p = 0.0 if dropout_mask is None else P
    expected = varlen_attention_reference(ref_qkv, cu, MAX_SEQLEN, p,
                                          dropout_mask=dropout_mask)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, rtol=TOL[dtype], atol=TOL[dtype])
    grad = torch.randn_like(expected)
    (got,) = torch.autograd.grad(out, qkv, grad.to(dtype))
    (want,) = torch.autograd.grad(expected, ref_qkv, grad)
    torch.testing.assert_close(got.float(), want, rtol=TOL[dtype], atol=TOL[dtype] * 5)


def needs_flash(dtype: torch.dtype = torch.bfloat16) -> None:
    if not flash_supported(torch.empty(1, H, D, device="cuda", dtype=dtype)):
        pytest.skip("the flash kernels need sm80 or newer")


def seeded(path, seed: int = 7, p: float = P):
    def run(qkv, cu):
        torch.manual_seed(seed)
        return path(qkv, cu, MAX_SEQLEN, p)
    return run


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_matches_reference(dtype):
    needs_flash(dtype)
    check_against_reference(lambda *a: varlen_attention_flash(*a, MAX_SEQLEN), dtype)
    qkv, cu = projection(dtype, LENGTHS)
    assert torch.equal(varlen_attention(qkv, cu, MAX_SEQLEN),
                       varlen_attention_flash(qkv, cu, MAX_SEQLEN))


def test_flash_under_autocast():
    """fp32 q, k, v under bf16 autocast take the flash path in bf16 (the op has no autocast
    rule; varlen_attention_flash casts)."""
    needs_flash()
    qkv, cu = projection(torch.float32, LENGTHS)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert flash_supported(qkv)
        out = varlen_attention(qkv, cu, MAX_SEQLEN)
    assert out.dtype == torch.bfloat16
    expected = varlen_attention_reference(qkv, cu, MAX_SEQLEN)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
    out.float().sum().backward()
    assert qkv.grad.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_dropout_is_the_reference_with_its_mask(dtype):
    """With dropout, flash's forward and its backward (which regenerates the mask from the
    forward's rng_state) equal the reference applying the mask flash drew."""
    needs_flash(dtype)
    qkv, cu = projection(dtype, DROP_LENGTHS)
    mask = keep_mask_of(varlen_attention_flash, qkv, cu, MAX_SEQLEN, P, seed=7)
    check_against_reference(seeded(varlen_attention_flash), dtype, DROP_LENGTHS, mask)
    check_against_reference(seeded(varlen_attention), dtype, DROP_LENGTHS, mask)


def test_flash_dropout_keep_rate():
    """About 1 - p kept (n = 193,000: 5 standard deviations = 0.0035; the kernel's 8-bit
    threshold keeps (floor(0.9 * 255) + 1) / 256 = 0.8984), a mask per sequence and head, and
    a new one per call."""
    needs_flash()
    qkv, cu = projection(torch.bfloat16, DROP_LENGTHS)
    mask = keep_mask_of(varlen_attention_flash, qkv, cu, MAX_SEQLEN, P, seed=3)
    real = torch.zeros_like(mask)
    for i, n in enumerate(DROP_LENGTHS):
        real[i, :, :n, :n] = True
    assert abs(mask[real].double().mean().item() - (1 - P)) < 0.005
    assert not torch.equal(mask[0], mask[6]) and not torch.equal(mask[0, 0], mask[0, 1])
    assert not torch.equal(mask, keep_mask_of(varlen_attention_flash, qkv, cu, MAX_SEQLEN, P,
                                              seed=4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_padded_on_cuda_matches_reference(dtype):
    """The CUDA fallback (fp32 outside autocast, GPUs before sm80)."""
    check_against_reference(lambda *a: varlen_attention_padded(*a, MAX_SEQLEN), dtype)
    qkv, cu = projection(torch.float32, DROP_LENGTHS)
    mask = keep_mask_of(varlen_attention_padded, qkv, cu, MAX_SEQLEN, P, seed=7)
    check_against_reference(seeded(varlen_attention_padded), torch.float32, DROP_LENGTHS, mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_does_not_sync(dtype):
    """Forward and backward with dropout, by the path varlen_attention takes, with CUDA's
    sync debug mode set to error."""
    qkv, cu = projection(dtype, LENGTHS)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        varlen_attention(qkv, cu, MAX_SEQLEN, P).float().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert qkv.grad is not None


def test_flash_replays_in_a_cuda_graph():
    """Forward and backward captured once: replays equal eager without dropout and draw a new
    mask each time with it."""
    needs_flash()
    qkv, cu = projection(torch.bfloat16, LENGTHS)
    grad = torch.randn(qkv.shape[0], H, D, device="cuda", dtype=torch.bfloat16)

    def step(p):
        out = varlen_attention_flash(qkv, cu, MAX_SEQLEN, p)
        return (out, *torch.autograd.grad(out, qkv, grad))

    for p in (0.0, P):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step(p)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = step(p)
        graph.replay()
        first = [t.clone() for t in static]
        graph.replay()
        if p == 0.0:
            eager = step(p)
            assert torch.equal(first[0], static[0]) and torch.equal(static[0], eager[0])
            torch.testing.assert_close(static[1], eager[1], rtol=TOL[torch.bfloat16],
                                       atol=TOL[torch.bfloat16])
        else:
            assert not torch.equal(first[0], static[0])


# ---- the model ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_on_cuda_matches_padded_reference(dtype):
    config = BertConfig(vocab_size=99, hidden_size=128, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=256, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    ref = PaddedBertForPreTraining(config).cuda()
    model = BertForPreTraining(config).cuda().to(dtype)
    model.load_state_dict(ref.state_dict())
    padded = padded_batch([512, 7, 200, 3, 64], seed=1)
    padded = type(padded)(**{k: v.cuda() for k, v in padded.inputs().items()})
    out = model(**unpad(padded).inputs())
    expected = ref(**padded.inputs())
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(out.loss.float(), expected.loss, rtol=tol, atol=tol)
    torch.testing.assert_close(out.mlm_logits.float(), expected.mlm_logits, rtol=tol, atol=tol * 4)
