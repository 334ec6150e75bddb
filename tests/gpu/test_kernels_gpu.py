"""CUDA paths of bertperf.kernels and the model on CUDA, against the float32 references
(skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertperf.kernels import (flash_supported, varlen_attention, varlen_attention_flash,
                              varlen_attention_reference, varlen_attention_sdpa)
from bertperf.model import BertConfig, BertForPreTraining, PaddedBertForPreTraining, unpad
from tests.unit.test_model import padded_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

LENGTHS = [512, 1, 37, 128, 5, 300]
H, D = 16, 64
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def qkv(dtype: torch.dtype, lengths=LENGTHS, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = sum(lengths)
    q, k, v = (torch.randn(t, H, D, device="cuda", generator=g, dtype=dtype).requires_grad_()
               for _ in range(3))
    cu = F.pad(torch.tensor(lengths, device="cuda").cumsum(0), (1, 0)).to(torch.int32)
    return [q, k, v], cu, max(lengths)


def check_against_reference(fn, dtype: torch.dtype) -> None:
    inputs, cu, m = qkv(dtype)
    ref_inputs = [x.detach().float().requires_grad_() for x in inputs]
    out = fn(*inputs, cu, m)
    expected = varlen_attention_reference(*ref_inputs, cu, m)
    torch.testing.assert_close(out.float(), expected, rtol=TOL[dtype], atol=TOL[dtype])
    grad = torch.randn_like(expected)
    got = torch.autograd.grad(out, inputs, grad.to(dtype))
    want = torch.autograd.grad(expected, ref_inputs, grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b, rtol=TOL[dtype], atol=TOL[dtype] * 5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_matches_reference(dtype):
    if not flash_supported(qkv(dtype)[0][0]):
        pytest.skip("torch.nn.attention.varlen.varlen_attn unavailable here")
    check_against_reference(varlen_attention_flash, dtype)
    inputs, cu, m = qkv(dtype)
    assert torch.equal(varlen_attention(*inputs, cu, m), varlen_attention_flash(*inputs, cu, m))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sdpa_matches_reference(dtype):
    check_against_reference(varlen_attention_sdpa, dtype)


def test_sdpa_dropout_is_seeded_and_unbiased():
    (q, k, v), cu, m = qkv(torch.float32, lengths=[64, 17])
    torch.manual_seed(0)
    a = varlen_attention(q, k, v, cu, m, dropout_p=0.1)
    torch.manual_seed(0)
    assert torch.equal(a, varlen_attention(q, k, v, cu, m, dropout_p=0.1))
    plain = varlen_attention_reference(q, k, v, cu, m)
    assert not torch.allclose(a, plain)
    mean = sum(varlen_attention(q, k, v, cu, m, dropout_p=0.1) for _ in range(400)) / 400
    torch.testing.assert_close(mean, plain, rtol=0, atol=0.1)


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
