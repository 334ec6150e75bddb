"""The Triton kernels of bertperf.kernels on CPU: numerics under Triton's interpreter (forward
and backward against the references, dropout with the very keep mask the kernels draw), the
ops under torch.compile with no graph break, and ahead-of-time compilation of every kernel to
cubin for sm_80 and sm_90 at BERT-large shapes within the shared memory of A100/H100, without
register spills, and with every grid sized to the SMs resident in one wave.

The interpreter computes bf16 arithmetic wrongly (the kernels convert to fp32 after loading) and
truncates fp32 -> bf16 on store instead of rounding, so numerics are compared in fp32, and bf16
runs are checked for dtype and to within 2 bf16 ulps."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")  # interpreted: tests/conftest.py sets TRITON_INTERPRET=1 first

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from bertperf.kernels import (LambLayout, aot, bias_gelu,  # noqa: E402
                              bias_gelu_layer_norm, bias_gelu_layer_norm_reference,
                              bias_gelu_reference,
                              cross_entropy_sum, cross_entropy_sum_reference,
                              dropout_add_layer_norm, dropout_add_layer_norm_reference,
                              dropout_keep_mask, embedding_layer_norm,
                              embedding_layer_norm_reference, lamb_step)
from bertperf.kernels.bias_gelu import bias_gelu_triton  # noqa: E402
from bertperf.kernels.cross_entropy import cross_entropy_sum_triton  # noqa: E402
from bertperf.kernels.embedding_layer_norm import embedding_layer_norm_triton  # noqa: E402
from bertperf.kernels.lamb import lamb_step_triton  # noqa: E402
from bertperf.kernels.layer_norm import layer_norm_triton  # noqa: E402
from bertperf.kernels.triton import (bias_gelu as tk_bias_gelu,  # noqa: E402
                                     cross_entropy as tk_cross_entropy, embedding as tk_embedding,
                                     common, lamb as tk_lamb, layer_norm as tk_layer_norm)
from bertperf.model import BertConfig, BertForPreTraining  # noqa: E402
from bertperf.optim import Lamb  # noqa: E402
from tests.support.kernels import CustomOps  # noqa: E402
from tests.support.lamb import flat_setup  # noqa: E402
from tests.support.models import packed_batch, samples, tiny_bert  # noqa: E402

MODULES = (tk_bias_gelu, tk_layer_norm, tk_embedding, tk_cross_entropy, tk_lamb)
TOL = dict(rtol=1e-5, atol=1e-5)  # fp32 kernels against the float64 references
BF16_TOL = dict(rtol=2 ** -6, atol=2 ** -6)
SEED = 20240607


@pytest.fixture(autouse=True)
def interpreted():
    if not isinstance(tk_bias_gelu.bias_gelu_fwd, InterpretedFunction):
        pytest.fail("Triton was imported before TRITON_INTERPRET=1 was set (tests/conftest.py)")


def randn(*shape, seed=0, dtype=torch.float32, scale=1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(dtype).requires_grad_()


def seed_tensor(value: int = SEED) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.int64)


def check_fwd_bwd(fast, ref, inputs: list[torch.Tensor], tol=TOL, seed: int = 1) -> None:
    """fast(*inputs) against ref(*inputs in float64), output and every input's gradient."""
    wide = [t.detach().double().requires_grad_() for t in inputs]
    out, expected = fast(*inputs), ref(*wide)
    torch.testing.assert_close(out.double(), expected, **tol)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    got = torch.autograd.grad(out, inputs, g.to(out.dtype))
    want = torch.autograd.grad(expected, wide, g)
    for a, b, t in zip(got, want, inputs):
        assert a.dtype == t.dtype
        torch.testing.assert_close(a.double(), b, **tol)


def compiles_to_one_graph(fn, *args) -> torch.Tensor:
    """fn under torch.compile(fullgraph=True, aot_eager): one graph, the eager result, and a
    backward through it."""
    counter = CompileCounterWithBackend("aot_eager")
    out = torch.compile(fn, backend=counter, fullgraph=True)(*args)
    assert counter.frame_count == 1
    torch.testing.assert_close(out, fn(*args), rtol=0, atol=0)
    out.float().sum().backward()
    return out


# ---- bias + GeLU -------------------------------------------------------------------------------

def test_bias_gelu_kernel(triton_interpreter):
    """Two column blocks (the second partly masked), rows in several row blocks per program."""
    check_fwd_bwd(bias_gelu_triton, bias_gelu_reference, [randn(5, 9, 520), randn(520, seed=1)])


def test_bias_gelu_kernel_bf16_and_dispatch(triton_path):
    x, b = randn(9, 24, dtype=torch.bfloat16), randn(24, seed=1)

    def fused(*t):
        return bias_gelu(*t, kernels=triton_path)

    check_fwd_bwd(fused, bias_gelu_reference, [x, b], tol=BF16_TOL)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused(F.linear(torch.randn(5, 8), torch.randn(24, 8)), b).dtype == torch.bfloat16
    compiles_to_one_graph(fused, x, b)


# ---- bias + dropout + residual + LayerNorm -----------------------------------------------------

def sublayer_inputs(rows: int = 21, n: int = 48):
    return [randn(rows, n), randn(rows, n, seed=1), randn(n, seed=2), randn(n, seed=3),
            randn(n, seed=4)]


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_dropout_add_layer_norm_kernel(p, triton_interpreter):
    """Against the reference with the same keep mask (drawn again from the seed)."""
    x, r, w, b, db = sublayer_inputs()
    seed = seed_tensor() if p else None
    keep = dropout_keep_mask(seed, x.shape, p) if p else None
    check_fwd_bwd(lambda *a: layer_norm_triton(a[0], a[4], a[1], a[2], a[3], seed, p, 1e-5,
                                               False),
                  lambda *a: dropout_add_layer_norm_reference(*a[:4], p, 1e-5, keep,
                                                              dense_bias=a[4]),
                  [x, r, w, b, db])
    check_fwd_bwd(lambda *a: layer_norm_triton(a[0], None, a[1], a[2], a[3], seed, p, 1e-5,
                                               False),
                  lambda *a: dropout_add_layer_norm_reference(*a, p, 1e-5, keep), [x, r, w, b])


def test_dropout_keep_mask_statistics():
    """Keep rate 1 - p; the same seed gives the same mask, another seed another; rows differ."""
    p = 0.1
    keep = dropout_keep_mask(seed_tensor(), (64, 1024), p)
    assert keep.dtype == torch.bool
    rate, sigma = keep.double().mean().item(), (p * (1 - p) / keep.numel()) ** 0.5
    assert abs(rate - (1 - p)) < 5 * sigma
    assert torch.equal(keep[:8], dropout_keep_mask(seed_tensor(), (8, 1024), p))
    assert (keep[:8] != dropout_keep_mask(seed_tensor(SEED + 1), (8, 1024), p)).double().mean() \
        > 0.1
    assert not torch.equal(keep[0], keep[1])
    assert dropout_keep_mask(seed_tensor(), (4, 64), 0.5).double().mean() < 0.75


def test_dropout_add_layer_norm_dispatch(triton_path):
    """The model's call: a fresh seed per call (so two calls differ), output in x's dtype."""
    x, r, w, b, db = sublayer_inputs()

    def fused(*t, **kw):
        return dropout_add_layer_norm(*t, **kw, kernels=triton_path)

    a = fused(x, r, w, b, 0.1, 1e-5, dense_bias=db)
    assert not torch.equal(a, fused(x, r, w, b, 0.1, 1e-5, dense_bias=db))
    torch.testing.assert_close(fused(x, r, w, b, 0.0, 1e-5),
                               dropout_add_layer_norm_reference(x, r, w, b, 0.0, 1e-5), **TOL)
    xb, rb = x.detach().bfloat16(), r.detach().bfloat16()
    assert fused(xb, rb, w, b, 0.1, 1e-5, dense_bias=db).dtype == torch.bfloat16
    torch.manual_seed(0)
    compiles_to_one_graph(lambda *t: fused(*t[:4], 0.0, 1e-5, dense_bias=t[4]), x, r, w, b, db)
    counter = CompileCounterWithBackend("aot_eager")
    out = torch.compile(lambda *t: fused(*t[:4], 0.1, 1e-5, dense_bias=t[4]),
                        backend=counter, fullgraph=True)(x, r, w, b, db)
    assert counter.frame_count == 1
    out.sum().backward()


# ---- MLM head transform: bias + GeLU + LayerNorm -----------------------------------------------

def test_bias_gelu_layer_norm_kernel(triton_path):
    x, b, w, lb = randn(13, 40), randn(40, seed=1), randn(40, seed=2), randn(40, seed=3)

    def fused(*a):
        return bias_gelu_layer_norm(*a, 1e-5, kernels=triton_path)

    check_fwd_bwd(fused, lambda *a: bias_gelu_layer_norm_reference(*a, 1e-5), [x, b, w, lb])
    assert fused(x.detach().bfloat16(), b, w, lb).dtype == torch.bfloat16
    compiles_to_one_graph(fused, x, b, w, lb)


# ---- embeddings + LayerNorm --------------------------------------------------------------------

def embedding_case(tokens=29, hidden=40, vocab=11, positions=9, id_dtype=torch.int32):
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, vocab, (tokens,), generator=g).to(id_dtype),  # repeats: scatter-add
           torch.randint(0, 2, (tokens,), generator=g).to(id_dtype),
           torch.randint(0, positions, (tokens,), generator=g).to(id_dtype)]
    tables = [randn(vocab, hidden), randn(positions, hidden, seed=1), randn(2, hidden, seed=2),
              randn(hidden, seed=3), randn(hidden, seed=4)]
    return ids, tables


@pytest.mark.parametrize("id_dtype,p", [(torch.int32, 0.1), (torch.int64, 0.0)])
def test_embedding_layer_norm_kernel(id_dtype, p, triton_interpreter):
    ids, tables = embedding_case(id_dtype=id_dtype)
    seed = seed_tensor() if p else None
    keep = dropout_keep_mask(seed, (len(ids[0]), 40), p) if p else None
    long_ids = [i.long() for i in ids]
    check_fwd_bwd(lambda *t: embedding_layer_norm_triton(*ids, *t, seed, p, 1e-12,
                                                         torch.float32),
                  lambda *t: embedding_layer_norm_reference(*long_ids, *t, 1e-12, p, keep),
                  tables)


def test_embedding_layer_norm_dispatch(triton_path):
    """Ids of any shape; output in autocast's dtype when on, else the tables'."""
    ids, tables = embedding_case()

    def fused(*t):
        return embedding_layer_norm(*t, kernels=triton_path)

    out = fused(*(i.view(29, 1) for i in ids), *tables, 1e-12)
    assert out.shape == (29, 1, 40) and out.dtype == torch.float32
    torch.testing.assert_close(out[:, 0], embedding_layer_norm_reference(
        *(i.long() for i in ids), *tables, 1e-12), **TOL)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused(*ids, *tables, 1e-12, 0.1).dtype == torch.bfloat16
    compiles_to_one_graph(lambda *t: fused(*ids, *t, 1e-12, 0.0), *tables)


# ---- cross-entropy over the vocabulary ---------------------------------------------------------

@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_kernel(dtype, triton_path):
    """Logits a column slice of wider (padded-vocabulary) logits, over two vocabulary blocks;
    weight-0 rows add nothing; the gradient in the logits' dtype and strides."""
    rows, vocab, padded = 6, 4500, 4512
    full = randn(rows, padded, dtype=dtype, scale=3.0)
    labels = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(1),
                           dtype=torch.int32)
    weights = torch.rand(rows, generator=torch.Generator().manual_seed(2))
    weights[[0, 4]] = 0.0
    tol = TOL if dtype == torch.float32 else BF16_TOL

    def fused(logits, labels=labels):
        return cross_entropy_sum(logits[:, :vocab], labels, weights, kernels=triton_path)

    check_fwd_bwd(lambda f: fused(f) * 1.5,
                  lambda f: cross_entropy_sum_reference(f[:, :vocab], labels, weights) * 1.5,
                  [full], tol=tol)
    grad, = torch.autograd.grad(fused(full), [full])
    assert not grad[[0, 4]].any() and not grad[:, vocab:].any()
    other = full.detach().clone()
    other[[0, 4]] = float("inf")
    assert fused(other).item() == pytest.approx(fused(full).item(), rel=1e-6)
    if dtype == torch.float32:
        compiles_to_one_graph(lambda f: fused(f, labels.long()), full)


def test_cross_entropy_op_returns_the_row_log_sum_exp(triton_interpreter):
    logits = randn(5, 33)
    loss, lse = cross_entropy_sum_triton(logits, torch.zeros(5, dtype=torch.int64),
                                         torch.ones(5))
    torch.testing.assert_close(lse, torch.logsumexp(logits.detach(), 1), **TOL)
    assert loss.shape == () and loss.dtype == torch.float32


# ---- LAMB --------------------------------------------------------------------------------------

@pytest.mark.parametrize("options", [dict(), dict(bias_correction=False, tensor_lr=True),
                                     dict(skip_second=True)])
def test_lamb_kernels_are_lamb(options, triton_interpreter):
    """Step by step against bertperf.optim.lamb.Lamb on a small BERT's parameters, with chunks of
    64 elements so that tensors span several programs; a step skipped on the device (ok False,
    the count as a tensor) leaves everything as Lamb does."""
    options = dict(options)
    tensor_lr, skip_second = options.pop("tensor_lr", False), options.pop("skip_second", False)
    groups, params, layout, (flat, m, v) = flat_setup(tiny_bert(), block=64)
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
        lamb_step_triton(layout, flat, torch.cat([p.grad.reshape(-1) for p in params]), m, v,
                         lr=lr, betas=(0.9, 0.999), eps=1e-6,
                         step=count if skip_second else step, ok=ok, **options)
        torch.testing.assert_close(flat, torch.cat([p.detach().reshape(-1) for p in params]),
                                   rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(m, torch.cat([opt.state[p]["exp_avg"].reshape(-1)
                                                 for p in params]), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(v, torch.cat([opt.state[p]["exp_avg_sq"].reshape(-1)
                                                 for p in params]), rtol=1e-6, atol=1e-9)


def test_lamb_dispatch_and_trust_ratio_edge_cases(triton_path):
    """A zero tensor (||w|| = 0) and a tensor with zero gradient and no decay (||u|| = 0) take
    ratio 1, as in Lamb; the dispatch runs the kernels."""
    layout = LambLayout([70, 3, 5], [0.01, 0.0, 0.01], [True, True, True], "cpu", block=64)
    w = torch.cat([torch.randn(70), torch.randn(3), torch.zeros(5)])
    grads = torch.cat([torch.randn(70), torch.zeros(3), torch.randn(5)])
    params = [torch.nn.Parameter(w[:70].clone()), torch.nn.Parameter(w[70:73].clone()),
              torch.nn.Parameter(w[73:].clone())]
    for p, part in zip(params, grads.split([70, 3, 5])):
        p.grad = part.clone()
    Lamb([{"params": [params[0], params[2]], "weight_decay": 0.01},
          {"params": [params[1]], "weight_decay": 0.0, "layer_adaptation": True}],
         lr=0.1, eps=1e-6).step()
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    lamb_step(layout, w, grads, m, v, lr=0.1, betas=(0.9, 0.999), eps=1e-6, step=1,
              kernels=triton_path)
    torch.testing.assert_close(w, torch.cat([p.detach() for p in params]), rtol=1e-6, atol=1e-7)


# ---- the model on the Triton path ---------------------------------------------------------------

def test_model_on_the_triton_path_equals_the_plain_path(triton_path):
    """A 2-layer BertForPreTraining (fp32, dropout 0) on a packed batch: with every kernel
    function on its Triton path (interpreted) the loss and every gradient equal the plain path's,
    and each fused op the model calls ran its Triton kernels, forward and backward."""
    config = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=128, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, max_position_embeddings=64)
    torch.manual_seed(0)
    model = BertForPreTraining(config).train()
    batch = packed_batch(samples([20, 9, 14, 5], seed=3, vocab=config.vocab_size), [3, 1],
                         row_len=48, masks_per_row=8)

    def loss_and_grads() -> list[torch.Tensor]:
        model.zero_grad()
        loss = model(**batch.inputs()).loss
        loss.backward()
        return [loss.detach(), *(p.grad for p in model.parameters())]

    plain = loss_and_grads()
    model.use_kernels(triton_path)
    with CustomOps() as ops:
        fused = loss_and_grads()
    assert ops.names == {f"bertperf::{op}{end}" for end in ("", "_backward") for op in (
        "embedding_layer_norm", "layer_norm", "bias_gelu", "cross_entropy_sum")}
    for name, a, b in zip(["loss", *(n for n, _ in model.named_parameters())], fused, plain):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


# ---- ahead-of-time compilation -----------------------------------------------------------------

@pytest.fixture(scope="module")
def aot_report() -> list[dict]:
    """`python -m bertperf.kernels.aot` in a process without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "bertperf.kernels.aot"], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_every_kernel_is_compiled_ahead_of_time(aot_report):
    kernels = {name for module in MODULES for name, obj in vars(module).items()
               if isinstance(obj, InterpretedFunction) and not name.startswith("_")
               and obj.fn.__module__ == module.__name__}
    compiled = {case.kernel.__name__ for case in aot.all_cases()}
    assert kernels == compiled
    assert {(r["name"], r["capability"]) for r in aot_report} == {
        (case.name, cap) for case in aot.all_cases() for cap in (80, 90)}


def test_aot_shared_memory_within_the_device_limit(aot_report):
    for r in aot_report:
        assert r["shared"] <= r["shared_limit"], r


def test_aot_no_register_spills(aot_report):
    if any(r["registers"] is None for r in aot_report):
        pytest.skip("this Triton bundles no cuobjdump: registers and spills unknown")
    spills = [r for r in aot_report if r["stack"] != 0]
    assert not spills, spills


def test_aot_grids_sized_to_the_sms_fit_in_one_wave(aot_report):
    """A kernel whose launcher runs per_sm programs per SM (the backward passes' row loops with
    partial sums) must have them all resident at once, on sm_80 and sm_90."""
    if any(r["registers"] is None for r in aot_report):
        pytest.skip("this Triton bundles no cuobjdump: registers unknown")
    sized = [r for r in aot_report if r["per_sm"] is not None]
    assert {r["name"] for r in sized} >= {"embedding_layer_norm_bwd", "bias_gelu_bwd N=4096",
                                         "dropout_add_layer_norm_bwd"}
    crowded = [r for r in sized if r["per_sm"] > r["resident"]]
    assert not crowded, crowded


def test_resident_programs_counts_as_the_occupancy_calculator():
    # 100 registers x 8 warps: 3,328 registers a warp, 4 warps per 16,384-register quarter
    assert aot.resident_programs(100, 8, 4096, 90) == 2
    assert aot.resident_programs(64, 8, 0, 80) == 4
    assert aot.resident_programs(80, 8, 8192, 80) == 3
    assert aot.resident_programs(32, 4, 0, 90) == 16          # warps: 64 / 4
    assert aot.resident_programs(16, 1, 0, 90) == 32          # the block limit
    assert aot.resident_programs(32, 4, 100 * 1024, 80) == 1  # shared memory


def test_row_programs_launch_per_sm_programs_an_sm(monkeypatch):
    monkeypatch.setattr(common, "_sm_count", lambda index: 132)
    cuda = torch.device("cuda", 0)
    assert common.row_programs(cuda, 10**6, 4) == 528
    assert common.row_programs(cuda, 10**6, 3, columns=8) * 8 <= 3 * 132
    assert common.row_programs(cuda, 100, 4) == 100
    assert common.row_programs(torch.device("cpu"), 10**6, 3) == 3
