"""bertperf.kernels.varlen_attention: every path against varlen_attention_reference, forward and
backward (float64 on CPU; the numeric comparisons of the CUDA-only paths are in
tests/gpu/test_kernels_gpu.py), on the packed [T, 3, H, D] projection the model passes, and the
bytes one attention layer's backward writes (one qkv gradient)."""

from __future__ import annotations

import importlib
import types

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from bertperf.kernels import (flash_supported, varlen_attention, varlen_attention_flash,
                              varlen_attention_padded, varlen_attention_reference)
from bertperf.model.bert_config import BertConfig
from bertperf.model.layers import BertSelfAttention
from tests.support.attention import keep_mask_of, offsets
from tests.support.kernels import assert_same_fwd_bwd

# the module (the package's attribute of that name is the function)
attention = importlib.import_module("bertperf.kernels.varlen_attention")

LENGTHS = [1, 7, 3, 16, 2]
H, D = 3, 8


def model_qkv(lengths: list[int], heads: int = H, dim: int = D, seed: int = 0) -> torch.Tensor:
    """The projection BertSelfAttention makes, [T, 3, H, D] (a float64 leaf here)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(sum(lengths), 3, heads, dim, generator=g,
                       dtype=torch.float64).requires_grad_()


def qkv_for(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    return model_qkv(lengths, seed=seed), offsets(lengths), max(lengths)


def block_diagonal_attention(qkv, cu, scale):
    """An independent formulation: all T tokens at once, scores outside a token's own
    sequence masked out."""
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    seq = torch.repeat_interleave(torch.arange(len(cu) - 1), (cu[1:] - cu[:-1]).long())
    scores = torch.einsum("thd,shd->hts", q, k) * scale
    scores = scores.masked_fill(seq[:, None] != seq[None, :], float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(scores, -1), v)


def test_varlen_reference_is_block_diagonal_attention():
    qkv, cu, _ = qkv_for(LENGTHS)
    assert_same_fwd_bwd(lambda x: varlen_attention_reference(x, cu, 16, scale=0.3),
                        lambda x: block_diagonal_attention(x, cu, 0.3), [qkv])
    out = varlen_attention_reference(qkv, cu, 16)
    torch.testing.assert_close(out, block_diagonal_attention(qkv, cu, D ** -0.5))


def test_varlen_sequences_are_independent():
    qkv, cu, m = qkv_for(LENGTHS)
    out = varlen_attention_reference(qkv, cu, m)
    bounds = cu.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        one = torch.tensor([0, e - s], dtype=torch.int32)
        torch.testing.assert_close(out[s:e], varlen_attention_reference(qkv[s:e], one, e - s))


@pytest.mark.parametrize("lengths", [LENGTHS, [16, 16], [1, 1, 1], [5]])
def test_varlen_padded_matches_reference(lengths):
    qkv, cu, m = qkv_for(lengths, seed=len(lengths))
    assert_same_fwd_bwd(lambda x: varlen_attention_padded(x, cu, m, scale=0.3),
                        lambda x: varlen_attention_reference(x, cu, m, scale=0.3), [qkv])


def test_varlen_attention_on_cpu_is_the_padded_path():
    qkv, cu, m = qkv_for(LENGTHS)
    assert torch.equal(varlen_attention(qkv, cu, m), varlen_attention_padded(qkv, cu, m))


# ---- empty sequences, a fixed max_seqlen ------------------------------------------------------

WITH_EMPTY = [0, 7, 0, 0, 3, 16, 0, 2, 1, 0]  # LENGTHS' tokens, empty sequences around them


@pytest.mark.parametrize("path", [varlen_attention_reference, varlen_attention_padded,
                                  varlen_attention], ids=lambda f: f.__name__)
@pytest.mark.parametrize("max_seqlen", [16, 512])
def test_empty_sequences_and_a_larger_max_seqlen_change_nothing(path, max_seqlen):
    """Empty sequences (repeated offsets) anywhere in cu_seqlens and a max_seqlen above the
    longest length give the outputs and gradients of the same tokens without them."""
    real = [n for n in WITH_EMPTY if n]
    qkv, cu, m = qkv_for(real)
    assert_same_fwd_bwd(lambda x: path(x, offsets(WITH_EMPTY), max_seqlen, scale=0.3),
                        lambda x: varlen_attention_reference(x, cu, m, scale=0.3), [qkv])


# ---- dropout -----------------------------------------------------------------------------------

DROP_LENGTHS = [16, 0, 5, 11, 0, 1, 16, 9]


@pytest.mark.parametrize("path", [varlen_attention_padded, varlen_attention_reference],
                         ids=lambda f: f.__name__)
def test_dropout_is_the_reference_with_the_mask_drawn(path):
    """A path with dropout equals, forward and backward, the reference applying the keep mask
    that path drew (same seed); with empty sequences."""
    qkv = model_qkv(DROP_LENGTHS, heads=4, dim=16)
    cu = offsets(DROP_LENGTHS)
    mask = keep_mask_of(path, qkv, cu, 32, 0.1, seed=7)

    def with_dropout(x):
        torch.manual_seed(7)
        return path(x, cu, 32, 0.1)

    assert_same_fwd_bwd(with_dropout, lambda x: varlen_attention_reference(
        x, cu, 32, 0.1, dropout_mask=mask), [qkv])
    assert not torch.allclose(with_dropout(qkv), varlen_attention_reference(qkv, cu, 32))


@pytest.mark.parametrize("path", [varlen_attention_padded, varlen_attention_reference],
                         ids=lambda f: f.__name__)
def test_dropout_keep_rate(path):
    """About 1 - p of the probabilities are kept (n = 10,000 here: 5 standard deviations =
    0.015), each sequence and head with its own mask."""
    lengths = [16, 16, 16, 16, 12, 9]
    qkv = model_qkv(lengths, heads=8, dim=16)
    cu = offsets(lengths)
    mask = keep_mask_of(path, qkv, cu, 16, 0.1, seed=3)
    real = torch.zeros_like(mask)
    for i, n in enumerate(lengths):
        real[i, :, :n, :n] = True
    assert abs(mask[real].double().mean().item() - 0.9) < 0.015
    assert not torch.equal(mask[0], mask[1]) and not torch.equal(mask[0, 0], mask[0, 1])


def test_varlen_padded_dropout_keeps_sequences_apart():
    """With dropout the padded path still mixes only a sequence's own tokens, and dropout acts
    (the same seed gives the same output)."""
    qkv, cu, m = qkv_for([40, 24])
    torch.manual_seed(3)
    a = varlen_attention_padded(qkv, cu, m, dropout_p=0.5)
    torch.manual_seed(3)
    assert torch.equal(a, varlen_attention_padded(qkv, cu, m, dropout_p=0.5))
    assert not torch.allclose(a, varlen_attention_padded(qkv, cu, m))
    qkv2 = qkv.detach().clone()
    qkv2[40:, 2] += 1.0  # the second sequence's values must not reach the first's outputs
    torch.manual_seed(3)
    torch.testing.assert_close(varlen_attention_padded(qkv2, cu, m, dropout_p=0.5)[:40], a[:40])


def test_varlen_reference_dropout():
    qkv, cu, m = qkv_for([40, 24])
    torch.manual_seed(3)
    a = varlen_attention_reference(qkv, cu, m, dropout_p=0.5)
    torch.manual_seed(3)
    b = varlen_attention_reference(qkv, cu, m, dropout_p=0.5)
    assert torch.equal(a, b)
    assert not torch.allclose(a, varlen_attention_reference(qkv, cu, m))


# ---- the flash path without a GPU: meta and fake CUDA tensors ----------------------------------
# The numbers (flash against the reference, its dropout) are in tests/gpu/test_kernels_gpu.py.

T_META, H_META, D_META = 300, 4, 64


def meta_batch(dtype: torch.dtype = torch.bfloat16, seqs: int = 8):
    qkv = torch.empty(T_META, 3, H_META, D_META, device="meta", dtype=dtype, requires_grad=True)
    return qkv, torch.empty(seqs + 1, device="meta", dtype=torch.int32)


class OpLog(TorchDispatchMode):
    """Every op that reaches dispatch, with its arguments and results."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        self.calls.append((func, args, kwargs or {}, result))
        return result

    def called(self, op):
        return [c for c in self.calls if c[0] is op]


@pytest.fixture
def no_host_reads(monkeypatch):
    """Any read of a tensor's value on the host (a device sync on CUDA) raises."""
    def refuse(*_, **__):
        raise AssertionError("a tensor's value was read on the host")
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


def test_flash_on_meta_plumbing(no_host_reads):
    """Forward + backward with dropout: the packed projection reaches the op uncopied and the
    kernels as strided views of it (q, k, v unbound), the output is [T, H, D] bf16, the backward
    is the op's, it gets the forward's rng_state, max_seqlen, dropout_p and scale, and it
    returns dq, dk, dv stacked into one [T, 3, H, D] gradient; no value is read on the host."""
    qkv, cu = meta_batch()
    with OpLog() as log:
        out = varlen_attention_flash(qkv, cu, 512, 0.1)
        assert (out.shape, out.dtype) == ((T_META, H_META, D_META), torch.bfloat16)
        assert "varlen_flash_attention" in type(out.grad_fn).__name__
        out.float().sum().backward()
    assert qkv.grad.shape == qkv.shape
    [(_, fwd_args, _, fwd_out)] = log.called(torch.ops.bertperf.varlen_flash_attention.default)
    qkv_arg, cu_arg, max_seqlen, dropout_p, scale = fwd_args
    assert qkv_arg is qkv
    assert (cu_arg.dtype, max_seqlen, dropout_p, scale) == (torch.int32, 512, 0.1, D_META ** -0.5)
    backward = torch.ops.aten._flash_attention_backward.default
    [(_, bwd_args, bwd_kwargs, grads)] = log.called(backward)
    for i, x in enumerate(bwd_args[1:4]):
        assert (x.stride(), x.storage_offset()) == (qkv[:, i].stride(), i * H_META * D_META)
    assert bwd_args[6] is cu_arg and bwd_args[7] is cu_arg
    assert bwd_args[8:12] == (512, 512, 0.1, False)
    assert bwd_args[12] is fwd_out[2] and bwd_args[13] is fwd_out[3]  # the forward's rng state
    assert bwd_kwargs["scale"] == D_META ** -0.5
    assert [g.shape for g in grads] == [(T_META, H_META, D_META)] * 3
    [(_, (stacked, dim), _, grad)] = log.called(torch.ops.aten.stack.default)
    assert all(a is b for a, b in zip(stacked, grads, strict=True)) and dim == 1
    assert grad.shape == qkv.shape
    assert not log.called(torch.ops.aten.zeros.default)  # no gradients made for lse or rng


def test_flash_takes_half_precision_only():
    qkv, cu = meta_batch(torch.float32)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        varlen_attention_flash(qkv, cu, 512)


def test_flash_op_passes_opcheck():
    qkv = torch.empty(T_META, 3, H_META, D_META, device="meta", dtype=torch.float16)
    cu = torch.empty(9, device="meta", dtype=torch.int32)
    torch.library.opcheck(attention.flash_forward, (qkv.requires_grad_(), cu, 512, 0.1, 0.125))


def test_flash_fake_matches_the_aten_op():
    """The op's fake outputs (what torch.compile traces with) have the aten op's shapes, dtypes,
    strides and devices on (fake) CUDA tensors."""
    with FakeTensorMode():
        qkv = torch.empty(T_META, 3, H_META, D_META, device="cuda", dtype=torch.bfloat16)
        cu = torch.empty(9, device="cuda", dtype=torch.int32)
        ours = attention.flash_forward(qkv, cu, 512, 0.1, 0.125)
        aten = torch.ops.aten._flash_attention_forward(*qkv.unbind(1), cu, cu, 512, 512, 0.1,
                                                      False, False, scale=0.125)[:4]
    for a, b in zip(ours, aten, strict=True):
        assert (a.shape, a.dtype, a.stride(), a.device) == (b.shape, b.dtype, b.stride(), b.device)


def bert_self_attention(x, weight, bias, cu_seqlens, max_seqlen):
    """BertSelfAttention's forward with the flash path, summed."""
    qkv = F.linear(x, weight, bias).view(x.shape[0], 3, H_META, D_META)
    ctx = varlen_attention_flash(qkv, cu_seqlens, max_seqlen, 0.1)
    return ctx.reshape(x.shape).float().sum()


def test_flash_compiles_to_one_graph():
    """torch.compile(fullgraph=True) traces the layer with the flash op as one graph, forward
    and backward; new batches of the same shapes reuse it, and only a new max_seqlen (a
    specialised int) compiles again, which is why the batches keep it fixed."""
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(bert_self_attention, backend=counter, fullgraph=True)
    hidden = H_META * D_META
    for max_seqlen in (512, 512, 512, 256):
        x, weight, bias = (torch.empty(*shape, device="meta", dtype=torch.bfloat16,
                                       requires_grad=True)
                           for shape in ((T_META, hidden), (3 * hidden, hidden), (3 * hidden,)))
        compiled(x, weight, bias, meta_batch()[1], max_seqlen).backward()
        assert x.grad.shape == x.shape and weight.grad.shape == weight.shape
    assert counter.frame_count == 2


def test_dispatch(monkeypatch):
    """varlen_attention takes the flash path for CUDA fp16/bf16 with a head size it accepts on
    sm80+, with or without dropout, and the padded path for anything else."""
    taken = []
    monkeypatch.setattr(attention, "varlen_attention_flash", lambda *a: taken.append("flash"))
    monkeypatch.setattr(attention, "varlen_attention_padded", lambda *a: taken.append("padded"))
    major = 8
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(major=major))
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    cases = [("cuda", bf16, 64, 0.1, "flash"), ("cuda", fp16, 64, 0.0, "flash"),
             ("cuda", bf16, 256, 0.1, "flash"), ("cuda", fp32, 64, 0.1, "padded"),
             ("cuda", bf16, 12, 0.1, "padded"), ("cuda", bf16, 264, 0.1, "padded"),
             ("cpu", bf16, 64, 0.1, "padded"), ("cpu", torch.float64, 64, 0.1, "padded")]
    with FakeTensorMode():
        for device, dtype, dim, p, path in cases:
            qkv = torch.empty(T_META, 3, H_META, dim, device=device, dtype=dtype)
            cu = torch.empty(9, device=device, dtype=torch.int32)
            varlen_attention(qkv, cu, 512, p)
            assert taken.pop() == path, (device, dtype, dim, p)
            assert flash_supported(qkv) == (path == "flash")
        major = 7
        varlen_attention(torch.empty(T_META, 3, H_META, 64, device="cuda", dtype=torch.float16),
                         torch.empty(9, device="cuda", dtype=torch.int32), 512)
        assert taken.pop() == "padded"


# ---- the bytes one attention layer's backward writes ------------------------------------------

class BytesWritten(TorchDispatchMode):
    """The bytes each dispatched op writes: its fresh outputs and the tensors it mutates (views
    and other aliases of its inputs write nothing)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        written = sum(t.nbytes for t, ret in zip(outs, func._schema.returns)
                      if isinstance(t, torch.Tensor)
                      and (ret.alias_info is None or ret.alias_info.is_write))
        self.ops.append((func.overloadpacket.__name__, written))
        return out

    @property
    def total(self) -> int:
        return sum(n for _, n in self.ops)


LARGE = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=1,
                   num_attention_heads=16, intermediate_size=4096)
T_LARGE = 28_672  # the H100 config's tokens per micro-batch: 56 rows of 512


def attention_backward_bytes(attend=None) -> BytesWritten:
    """The bytes written by the backward of BERT-large's BertSelfAttention (16 heads of 64, bf16,
    T_LARGE tokens, dropout) from its output's gradient to its projection's, on the meta device
    with the flash path; attend(qkv, cu_seqlens, max_seqlen, p), if given, stands for
    varlen_attention."""
    with torch.device("meta"):
        layer = BertSelfAttention(LARGE).to(torch.bfloat16)
        x = torch.empty(T_LARGE, LARGE.hidden_size, dtype=torch.bfloat16, requires_grad=True)
        cu = torch.empty(56 * 4 + 1, dtype=torch.int32)
    projections = []
    layer.qkv.register_forward_hook(lambda module, args, out: projections.append(out))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "flash_supported", lambda qkv: True)  # the meta device's
        if attend is not None:
            patch.setattr("bertperf.model.layers.varlen_attention", attend)
        out = layer(x, cu, 512)
    grad = torch.empty_like(out)
    with BytesWritten() as written:
        torch.autograd.grad(out, projections, grad)
    return written


def test_attention_backward_writes_one_qkv_gradient():
    """Cap: flash's backward writes dq, dk, dv (3 x [T, H, D]: one qkv gradient's bytes) and the
    op stacks them into the projection's [T, 3, H, D] gradient: 2 gradients, 2 x T * 3 * 16 *
    64 * 2 bytes = 352 MB at T = 28,672 (the kernel's fp32 scratch is its own, unseen here).
    Three views of the projection, as the model passed them before, add 5 more: each view's
    select_backward zero-fills a whole [T, 3, H, D] for its third and autograd adds the three
    (the model with the three-tensor op measured 6 gradients, 1.06 GB)."""
    grad = T_LARGE * 3 * LARGE.hidden_size * 2
    packed = attention_backward_bytes()
    assert [op for op, n in packed.ops if n] == ["_flash_attention_backward", "stack"]
    assert packed.total == 2 * grad

    def three_views(qkv, *args):
        return varlen_attention(torch.stack([qkv[:, 0], qkv[:, 1], qkv[:, 2]], 1), *args)

    views = attention_backward_bytes(three_views)
    assert views.total == packed.total + 5 * grad
    writers = [op for op, n in views.ops if n]
    assert writers.count("select_backward") == 3 and writers.count("add") == 2


# ---- the padded path: no host sync, one graph for every batch of the same shapes --------------

def test_padded_reads_nothing_on_the_host(no_host_reads):
    qkv, cu = meta_batch(torch.float32)
    varlen_attention_padded(qkv, cu, 512, 0.1).sum().backward()
    assert qkv.grad.shape == qkv.shape


def test_padded_compiles_once_for_batches_of_the_same_shapes():
    """A fixed max_seqlen and sequence count: batches with other lengths (cu_seqlens contents)
    reuse the graph and give the eager results."""
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(varlen_attention_padded, backend=counter, fullgraph=True)
    for lengths in ([16, 0, 5, 11], [1, 30, 0, 1], [8, 8, 8, 8]):
        qkv, cu = model_qkv(lengths), offsets(lengths)
        torch.testing.assert_close(compiled(qkv, cu, 32), varlen_attention_padded(qkv, cu, 32),
                                   rtol=1e-12, atol=1e-12)
    assert counter.frame_count == 1


def test_bench_attention_times_every_path_on_the_packed_qkv():
    """`bench attention` hands each path the packed [T, 3, H, D] projection, as the model does."""
    from bertperf.bench.attention import time_path
    from bertperf.kernels.varlen_attention import (varlen_attention_padded,
                                                   varlen_attention_reference)
    qkv, cu = torch.randn(10, 3, 2, 8), torch.tensor([0, 4, 10], dtype=torch.int32)
    for fn in (varlen_attention_reference, varlen_attention_padded):
        assert time_path(fn, qkv, cu, 6, 0.1, repeat=1) > 0
