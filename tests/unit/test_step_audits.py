"""The packed training step audited on the CPU for what a GPU needs: no host synchronisation and no
data-dependent shape inside the real loop's steps, bf16 activations under bf16 autocast except where
fp32 is meant, and one compiled graph for the whole run (no graph break, no recompile). The data are
real packed shards (bertperf-packed/1 files, written by bench.loader's helpers:
tests/support/packed.py)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from tests.support.packed import packed_env, tiny_config, trainer_for  # noqa: F401

SYNCS = ("item", "tolist", "__bool__", "__float__", "__int__", "nonzero")


# ---- (a) no host sync, no data-dependent shape ---------------------------------------------------

def data_dependent(func, args, kwargs) -> bool:
    """An op whose output shape depends on tensor values (a host sync on CUDA), or a host read."""
    name = func.overloadpacket.__name__
    if name in ("_local_scalar_dense", "item", "nonzero", "nonzero_static", "masked_select",
                "argwhere", "unique_dim", "_unique", "_unique2", "unique_consecutive"):
        return True
    if name == "repeat_interleave" and isinstance(args[0], torch.Tensor) and \
            kwargs.get("output_size") is None and len(args) < 4:
        return True
    if name in ("index", "index_put", "index_put_"):  # boolean-mask indexing
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
    return False


@pytest.mark.parametrize("flat_lamb", ["0", "1"], ids=["lamb", "flat_lamb"])
def test_no_host_sync_inside_training_steps(packed_env, tmp_path, monkeypatch, flat_lamb):
    """12 steps of the real loop (run_loop) on packed shards, a report every 4: the only host
    reads are the three reports' (Interval.read); no Tensor.item/tolist/__bool__/__float__/
    __int__/nonzero or torch.nonzero anywhere else, and no op with a data-dependent shape
    (boolean-mask indexing, nonzero, unique, repeat_interleave without output_size) or a scalar
    read (aten._local_scalar_dense) among the ops the steps dispatch, forward and backward.
    With either LAMB (FLAT_LAMB)."""
    from bertperf.optim import FlatLamb
    from bertperf.train import loop
    trainer = trainer_for(packed_env, tmp_path, LOG_FREQ="4", MAX_STEPS="12",
                          FLAT_LAMB=flat_lamb)
    assert isinstance(trainer.plan.optimizer, FlatLamb) == (flat_lamb == "1")
    reporting, reports, syncs, ops = [False], [], [], []
    real_read = loop.Interval.read

    def read(self, *args):
        reporting[0] = True
        try:
            reports.append(real_read(self, *args))
            return reports[-1]
        finally:
            reporting[0] = False

    monkeypatch.setattr(loop.Interval, "read", read)
    for name in SYNCS:
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            if not reporting[0]:
                syncs.append(_name)
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    real_nonzero = torch.nonzero
    monkeypatch.setattr(torch, "nonzero", lambda *a, **k: syncs.append("torch.nonzero")
                        or real_nonzero(*a, **k))

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not reporting[0] and data_dependent(func, args, kwargs):
                ops.append(str(func))
            return func(*args, **kwargs)

    with Ops():
        stop = loop.run_loop(trainer, report=lambda line: None)
    assert (stop.status, len(reports)) == ("aborted", 3)  # MAX_STEPS; reports at 4, 8, 12
    assert all(np.isfinite(loss) for loss, _, _ in reports)
    assert syncs == [] and ops == []


def test_the_audit_sees_syncs_and_masks():
    """The checks above catch what they look for."""
    x = torch.arange(6.0)
    seen = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            seen.append(data_dependent(func, args, kwargs))
            return func(*args, **kwargs)

    with Ops():
        x[x > 2].sum()
        float(x.sum())
        torch.repeat_interleave(x.long())
        torch.repeat_interleave(torch.ones(2), x[:2].long(), output_size=1)
        x.index_select(0, torch.tensor([1, 2])) * 2
    assert seen.count(True) == 3 and seen[-1] is False


# ---- (b) bf16 activations ----------------------------------------------------------------------

MEANT_FP32 = {
    "embedding": "lookups of the fp32 tables, cast to bf16 at once (the tables' gradients "
                 "accumulate in fp32)",
}
"""Activations outside the loss that are fp32 on purpose. The loss itself (pretraining_output:
logits upcast, cross-entropy, weighting, sums) is fp32 by design; LayerNorm's statistics are fp32
inside layer_norm (checked at the op level below); the optimizer keeps fp32 weights and state."""


def test_bf16_autocast_keeps_activations_bf16(packed_env, tmp_path):
    """A packed forward and backward under CPU bf16 autocast (dropout on): every activation,
    i.e. every floating tensor a torch function makes from the batch's token ids, is bf16 outside
    the loss except MEANT_FP32; their gradients too; LayerNorm returns bf16 with fp32 statistics;
    the loss is fp32; weights, gradients and LAMB's moments are fp32."""
    from bertperf.model import bert
    from bertperf.optim import clipped_step
    trainer = trainer_for(packed_env, tmp_path, PRECISION="bf16", PREFETCH="0")
    model = trainer.plan.core
    micro = next(trainer.batches)
    loss_code = bert.pretraining_output.__code__
    tainted: dict[int, torch.Tensor] = {}  # id -> activation (kept alive: ids stay unique)
    fp32, grads, in_loss_dtypes = [], [], set()
    for name in ("input_ids", "segment_ids", "position_ids"):
        tainted[id(micro.inputs[name])] = micro.inputs[name]

    def inside_loss() -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code is loss_code:
                return True
            frame = frame.f_back
        return False

    def flat(x):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            for y in x:
                yield from flat(y)
        elif isinstance(x, dict):
            for y in x.values():
                yield from flat(y)

    class Activations(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if not any(id(t) in tainted for t in flat((args, kwargs))):
                return out
            name = getattr(func, "__name__", str(func))
            loss = inside_loss()
            for t in flat(out):
                tainted[id(t)] = t
                if not t.is_floating_point():
                    continue
                if loss:
                    in_loss_dtypes.add(t.dtype)
                elif t.dtype != torch.bfloat16:
                    fp32.append(name)
                if t.requires_grad and not loss:
                    t.register_hook(lambda g, n=name: grads.append((n, g.dtype)))
            return out

    class Statistics(TorchDispatchMode):
        layer_norms: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ == "native_layer_norm":
                self.layer_norms.append(tuple(t.dtype for t in out))
            return out

    with Activations(), Statistics():
        with trainer.autocast():
            out = model(**micro.inputs, loss_divisors=micro.counts)
        out.loss.backward()
    assert set(fp32) == set(MEANT_FP32), fp32
    assert in_loss_dtypes == {torch.float32} and out.loss.dtype != torch.bfloat16
    assert grads and {d for n, d in grads if n not in MEANT_FP32} == {torch.bfloat16}
    assert set(Statistics.layer_norms) == {(torch.bfloat16, torch.float32, torch.float32)}
    assert len(Statistics.layer_norms) == 2 * 2 + 2  # 2 per layer, embeddings, MLM head
    clipped_step(trainer.plan.optimizer, 1.0)
    for p in model.parameters():
        state = trainer.plan.optimizer.state[p]
        assert p.dtype == p.grad.dtype == state["exp_avg"].dtype == state["exp_avg_sq"].dtype \
            == torch.float32


# ---- (c) one compiled graph for the run --------------------------------------------------------

@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_packed_step_has_one_graph_for_the_run(packed_env, tmp_path, backend):
    """COMPILE=<backend>: 20 steps of the real loop on packed shards (2 micro-batches a step,
    so 40 calls of the compiled micro-step: forward, loss, and backward through it) compile one
    graph with fullgraph=True: no graph break, no recompile (a recompile would raise), and the
    losses equal the uncompiled run's (dropout off)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from bertperf.train import loop
    env = {**packed_env, "BERT_CONFIG": str(tiny_config(tmp_path / "no_dropout.json", 0.0)),
           "MAX_STEPS": "20", "LOG_FREQ": "1", "SEED": "5"}
    losses = {}
    for compile_with in ("none", backend):
        torch._dynamo.reset()
        counters.clear()
        trainer = trainer_for(env, tmp_path, COMPILE=compile_with)
        lines = []
        with torch._dynamo.config.patch(error_on_recompile=True):
            loop.run_loop(trainer, report=lines.append)
        losses[compile_with] = [float(line.split(" loss ")[1].split()[0]) for line in lines]
        if compile_with != "none":
            assert dict(counters["graph_break"]) == {}
            assert counters["stats"]["unique_graphs"] == 1
    assert len(losses["none"]) == 20
    np.testing.assert_allclose(losses[backend], losses["none"], rtol=1e-4)
