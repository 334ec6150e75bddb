"""bertperf.kernels, the plain PyTorch paths (what CPU runs): each against its reference forward
and backward in float64, the model's own modules, and the activation dtype under bf16 autocast.
The Triton kernels are tested in test_triton_kernels.py, attention in test_attention.py."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from bertperf.kernels import (Kernels, backend, LambLayout, bias_gelu, bias_gelu_layer_norm,
                              bias_gelu_layer_norm_reference, bias_gelu_reference,
                              cross_entropy_sum, cross_entropy_sum_reference,
                              dropout_add_layer_norm, dropout_add_layer_norm_reference,
                              embedding_layer_norm, embedding_layer_norm_reference, lamb_step,
                              lamb_step_reference)
from bertperf.model import BertConfig, BertForPreTraining
from bertperf.model.layers import BertEmbeddings
from bertperf.optim import Lamb
from tests.support.kernels import F64, CustomOps, assert_same_fwd_bwd, leaves
from tests.support.lamb import flat_setup
from tests.support.models import TINY, packed_batch, samples, tiny_bert


def bf16_linear(rows: int, features: int) -> torch.Tensor:
    """A GEMM output as the model makes it under CPU bf16 autocast (call inside autocast)."""
    out = F.linear(torch.randn(rows, 8), torch.randn(features, 8))
    assert out.dtype == torch.bfloat16
    return out


def test_importing_kernels_loads_no_triton():
    code = "import sys, bertperf.kernels; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- bias + GeLU -------------------------------------------------------------------------------

def test_the_triton_question_compiles_in_one_graph():
    """A CUDA step asks triton_installed inside torch.compile (use_triton, on a CUDA tensor
    without assume_cuda): it traces without a graph break (dynamo refuses importlib's find_spec)."""
    step = torch.compile(lambda x: x * 2 if backend.triton_installed() else x, backend="eager",
                         fullgraph=True)
    expected = 2 if backend.triton_installed() else 1
    torch.testing.assert_close(step(torch.ones(2)), torch.full((2,), float(expected)))


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


def test_bias_gelu_keeps_the_activation_dtype_under_autocast():
    """The fp32 bias must not turn the bf16 [T, 4096] intermediate into fp32."""
    bias = torch.randn(48)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = bf16_linear(6, 48)
        assert bias_gelu(x, bias).dtype == torch.bfloat16
        assert bias_gelu_layer_norm(x, bias, torch.ones(48), torch.zeros(48), 1e-5).dtype \
            == torch.bfloat16


# ---- dropout + residual + LayerNorm ------------------------------------------------------------

def test_dropout_add_layer_norm_matches_reference_without_dropout():
    x, r, w, b, db = leaves((6, 32), (6, 32), (32,), (32,), (32,))
    assert_same_fwd_bwd(lambda *a: dropout_add_layer_norm(*a, 0.0, 1e-12),
                        lambda *a: dropout_add_layer_norm_reference(*a, 0.0, 1e-12), [x, r, w, b])
    assert_same_fwd_bwd(lambda *a: dropout_add_layer_norm(*a[:4], 0.0, 1e-12, dense_bias=a[4]),
                        lambda *a: dropout_add_layer_norm_reference(*a[:4], 0.0, 1e-12,
                                                                    dense_bias=a[4]),
                        [x, r, w, b, db])


@pytest.mark.parametrize("with_bias", [False, True])
def test_dropout_add_layer_norm_matches_reference_with_dropout(with_bias):
    p = 0.25
    x, r, w, b, db = leaves((64, 32), (64, 32), (32,), (32,), (32,))
    dense_bias = db if with_bias else None
    torch.manual_seed(7)  # the same draws as F.dropout(x): bernoulli over x's shape
    keep = F.dropout(torch.ones_like(x), p, training=True) != 0
    assert 0.6 < keep.double().mean() < 0.9

    def fast(*a):
        torch.manual_seed(7)
        return dropout_add_layer_norm(*a[:4], p, 1e-5, dense_bias=dense_bias)

    assert_same_fwd_bwd(fast, lambda *a: dropout_add_layer_norm_reference(
        *a[:4], p, 1e-5, keep, dense_bias=dense_bias), [x, r, w, b, db] if with_bias else
        [x, r, w, b])
    with pytest.raises(ValueError):
        dropout_add_layer_norm_reference(x, r, w, b, p, 1e-5)


def test_dropout_add_layer_norm_output_in_the_activation_dtype():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = bf16_linear(6, 32)
        out = dropout_add_layer_norm(x, x.detach().clone(), torch.ones(32), torch.zeros(32), 0.1,
                                     1e-5, dense_bias=torch.randn(32))
    assert out.dtype == torch.bfloat16


# ---- MLM head transform ------------------------------------------------------------------------

def test_bias_gelu_layer_norm_matches_reference():
    x, b, w, lb = leaves((9, 24), (24,), (24,), (24,))
    assert_same_fwd_bwd(lambda *a: bias_gelu_layer_norm(*a, 1e-12),
                        lambda *a: bias_gelu_layer_norm_reference(*a, 1e-12), [x, b, w, lb])


# ---- embeddings + LayerNorm --------------------------------------------------------------------

CONFIG = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=12, hidden_dropout_prob=0.1)


def embedding_inputs(tokens: int = 40, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, CONFIG.vocab_size, (tokens,), generator=g),
            torch.randint(0, CONFIG.type_vocab_size, (tokens,), generator=g),
            torch.randint(0, CONFIG.max_position_embeddings, (tokens,), generator=g))


def test_embedding_layer_norm_matches_reference():
    ids = embedding_inputs()
    tables = leaves((CONFIG.vocab_size, 16), (12, 16), (2, 16), (16,), (16,))
    assert_same_fwd_bwd(lambda *t: embedding_layer_norm(*ids, *t, 1e-12),
                        lambda *t: embedding_layer_norm_reference(*ids, *t, 1e-12), tables)
    torch.manual_seed(3)
    keep = F.dropout(torch.ones(len(ids[0]), 16, **F64), 0.1, training=True) != 0

    def fast(*t):
        torch.manual_seed(3)
        return embedding_layer_norm(*ids, *t, 1e-12, 0.1)

    assert_same_fwd_bwd(fast, lambda *t: embedding_layer_norm_reference(*ids, *t, 1e-12, 0.1,
                                                                        keep), tables)


@pytest.mark.parametrize("training", [False, True])
def test_embedding_layer_norm_is_bert_embeddings(training):
    """The same arguments as the model's BertEmbeddings (word + position + token type,
    LayerNorm, dropout), bit for bit, dropout's draws included."""
    torch.manual_seed(0)
    module = BertEmbeddings(CONFIG).train(training)
    with torch.no_grad():
        for param in module.parameters():
            param.normal_()
    ids, segments, positions = embedding_inputs()
    torch.manual_seed(5)
    expected = module(ids, segments, positions)
    torch.manual_seed(5)
    out = embedding_layer_norm(ids, segments, positions, module.word_embeddings.weight,
                               module.position_embeddings.weight,
                               module.token_type_embeddings.weight, module.LayerNorm.weight,
                               module.LayerNorm.bias, module.LayerNorm.eps,
                               CONFIG.hidden_dropout_prob if training else 0.0)
    assert torch.equal(out, expected)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert embedding_layer_norm(ids, segments, positions, module.word_embeddings.weight,
                                    module.position_embeddings.weight,
                                    module.token_type_embeddings.weight, module.LayerNorm.weight,
                                    module.LayerNorm.bias, 1e-12).dtype == torch.bfloat16


# ---- cross-entropy over the vocabulary ---------------------------------------------------------

def ce_inputs(rows: int = 12, vocab: int = 50, padded: int = 56, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    full = (3 * torch.randn(rows, padded, generator=g, **F64)).requires_grad_()
    labels = torch.randint(0, vocab, (rows,), generator=g)
    weights = torch.rand(rows, generator=g, **F64)
    weights[[1, 7]] = 0.0
    return full, labels, weights


def test_cross_entropy_sum_matches_reference_and_aten():
    full, labels, weights = ce_inputs()
    assert_same_fwd_bwd(lambda f: cross_entropy_sum(f[:, :50], labels, weights),
                        lambda f: cross_entropy_sum_reference(f[:, :50], labels, weights), [full],
                        rtol=1e-6, atol=1e-6)  # the plain path computes in fp32
    ones = torch.ones_like(weights)
    torch.testing.assert_close(cross_entropy_sum_reference(full[:, :50], labels, ones),
                               F.cross_entropy(full[:, :50], labels, reduction="sum"))


def test_cross_entropy_padding_slots_count_as_nothing():
    full, labels, weights = ce_inputs()
    other = full.detach().clone()
    other[[1, 7]] = float("inf")
    for fn in (cross_entropy_sum, cross_entropy_sum_reference):
        assert fn(other[:, :50], labels, weights).item() == pytest.approx(
            fn(full[:, :50], labels, weights).item(), rel=1e-6)
        grad, = torch.autograd.grad(fn(full[:, :50], labels, weights), [full])
        assert not grad[[1, 7]].any() and not grad[:, 50:].any()


# ---- LAMB over flat buffers --------------------------------------------------------------------

@pytest.mark.parametrize("options", [dict(), dict(bias_correction=False),
                                     dict(grad_averaging=False), dict(tensor_lr=True),
                                     dict(skip_second=True)])
def test_lamb_step_is_lamb(options):
    """Step by step on a small BERT's parameters (decayed and adapted, and bias/LayerNorm
    groups): the flat step gives Lamb's weights and moments bit for bit on CPU, a step skipped
    on the device (ok False, the count as a tensor) included."""
    options = dict(options)
    tensor_lr, skip_second = options.pop("tensor_lr", False), options.pop("skip_second", False)
    model = tiny_bert()
    groups, params, layout, (flat, m, v) = flat_setup(model)
    lr = torch.tensor(3e-3) if tensor_lr else 3e-3
    opt = Lamb(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6, **options)
    g = torch.Generator().manual_seed(1)
    count = torch.zeros((), dtype=torch.float64)
    for step in range(1, 4):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        ok = torch.tensor(step != 2) if skip_second else None
        opt.step(ok=ok)
        count += 1 if ok is None else ok.double()
        grads = torch.cat([p.grad.reshape(-1) for p in params])
        lamb_step(layout, flat, grads, m, v, lr=lr, betas=(0.9, 0.999), eps=1e-6,
                  step=count if skip_second else step, ok=ok, **options)
        assert torch.equal(flat, torch.cat([p.detach().reshape(-1) for p in params]))
        assert torch.equal(m, torch.cat([opt.state[p]["exp_avg"].reshape(-1) for p in params]))
        assert torch.equal(v, torch.cat([opt.state[p]["exp_avg_sq"].reshape(-1)
                                         for p in params]))


def test_lamb_layout_tables():
    layout = LambLayout([5, 0, 9], [0.01, 0.0, 0.0], [True, False, False], "cpu", block=4)
    assert layout.numel == 14
    assert layout.offsets.tolist() == [0, 5, 5, 14]
    assert layout.tensor_chunks.tolist() == [0, 2, 2, 5]
    assert layout.chunk_tensor.tolist() == [0, 0, 2, 2, 2]
    with pytest.raises(ValueError):
        LambLayout([5], [0.0, 0.0], [True], "cpu")


def test_lamb_reference_is_the_cpu_path():
    model = tiny_bert()
    _, params, layout, bufs = flat_setup(model)
    other = [b.clone() for b in bufs]
    grads = torch.randn(layout.numel, generator=torch.Generator().manual_seed(2))
    hyper = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, step=1)
    lamb_step(layout, bufs[0], grads, *bufs[1:], **hyper)
    lamb_step_reference(layout, other[0], grads, *other[1:], **hyper)
    assert all(torch.equal(a, b) for a, b in zip(bufs, other))


# ---- which implementation runs -------------------------------------------------------------------

@pytest.mark.parametrize("cuda_first", [True, False])
def test_two_models_take_their_own_kernels_in_either_order(cuda_first):
    """Two models in one process, one set to Kernels that assume CUDA (traced on fake tensors:
    the Triton kernels' fake implementations run), one left at the default (auto: plain PyTorch
    on these CPU tensors): each runs its own path, forward and backward, whichever goes first."""
    torch.manual_seed(0)
    batch = packed_batch(samples([20, 9, 14, 5], seed=3), [3, 1], row_len=48,
                         masks_per_row=8).inputs()
    with FakeTensorMode() as mode:
        cuda, plain = BertForPreTraining(TINY), BertForPreTraining(TINY)
        cuda.use_kernels(Kernels(assume_cuda=True))
        inputs = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                  for k, v in batch.items()}
        ran = {}
        for model in (cuda, plain) if cuda_first else (plain, cuda):
            with CustomOps() as ops:
                model(**inputs).loss.backward()
            ran[model] = {name.removesuffix("_backward") for name in ops.names}
    assert ran[cuda] == {f"bertperf::{op}" for op in ("embedding_layer_norm", "layer_norm",
                                                      "bias_gelu", "cross_entropy_sum")}
    assert ran[plain] == set()
