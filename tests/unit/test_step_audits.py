"""The packed training step audited on the CPU for what a GPU needs: no host synchronisation and no
data-dependent shape inside the real loop's steps, bf16 activations under bf16 autocast except where
fp32 is meant, one compiled graph for the whole run (no graph break, no recompile), and every random
number of the step drawn on the device inside it. The data are real packed shards
(bertperf-packed/1 files, written by bench.loader's helpers: tests/support/packed.py)."""

from __future__ import annotations

import importlib
import random
import sys

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functional_call
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tests.support.packed import HostReads, packed_env, tiny_config, trainer_for  # noqa: F401

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
    reads, ops = HostReads(monkeypatch, SYNCS), []
    reports, syncs = reads.reports, reads.syncs
    real_nonzero = torch.nonzero
    monkeypatch.setattr(torch, "nonzero", lambda *a, **k: syncs.append("torch.nonzero")
                        or real_nonzero(*a, **k))

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not reads.reporting and data_dependent(func, args, kwargs):
                ops.append(str(func))
            return func(*args, **kwargs)

    with Ops():
        stop = loop.run_loop(trainer, report=lambda line: None)
    assert (stop.status, len(reports)) == ("aborted", 3)  # MAX_STEPS; reports at 4, 8, 12
    assert all(np.isfinite(r.loss) for r in reports)
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


# ---- (d) every random number drawn on the device, inside the step ------------------------------

HOST_RNG = ("random", "_random", "numpy.random", "torch.random", "torch.cuda.random")
"""Modules whose functions draw or seed on the host: Python's random, numpy's, torch's seeding."""

SEEDED = ("bertperf::layer_norm", "bertperf::layer_norm_backward",
          "bertperf::embedding_layer_norm", "bertperf::embedding_layer_norm_backward")
"""The Triton dropout kernels' ops: the keep mask comes from their `seed` tensor."""


def host_rng(frame, event, arg) -> str | None:
    """The host RNG a profiled call (sys.setprofile) enters, if any: a Python function of
    HOST_RNG, a C function or method of theirs, or a torch.Generator method."""
    if event == "call":
        module = frame.f_globals.get("__name__", "")
    elif event == "c_call":
        owner = getattr(arg, "__self__", None)
        if isinstance(owner, torch.Generator):
            return "torch.Generator"
        module = getattr(arg, "__module__", None) or type(owner).__module__
    else:
        return None
    return module if any(module == m or module.startswith(m + ".") for m in HOST_RNG) else None


def numpy_state() -> tuple[bytes, int]:
    _, keys, pos, *_ = np.random.get_state()
    return keys.tobytes(), pos


def traced_gpu_step(trainer, monkeypatch) -> tuple[list, list[str]]:
    """One packed micro-step (the trainer's forward_loss under its autocast, then backward) on the
    kernels a GPU runs: every kernel function on its Triton path, attention on the flash op,
    traced on fake tensors (the ops' fake implementations stand for the kernels, the CPU for the
    device). Returns the ops dispatched, (op, args, kwargs, output) in order, and the host RNG
    used meanwhile: calls host_rng sees, numpy's global generator advanced, a numpy generator
    made (numpy's Cython functions escape the profiler)."""
    from bertperf.kernels import Kernels
    monkeypatch.setattr(importlib.import_module("bertperf.kernels.varlen_attention"),
                        "flash_supported", lambda qkv: True)
    plan, micro = trainer.plan, next(trainer.batches)
    plan.core.use_kernels(Kernels(assume_cuda=True))
    mode = FakeTensorMode()
    params = {name: mode.from_tensor(p) for name, p in plan.core.named_parameters()}
    inputs = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
              for k, v in micro.inputs.items()}
    divisors = mode.from_tensor(micro.counts)
    calls, host = [], []
    make_generator = np.random.default_rng
    monkeypatch.setattr(np.random, "default_rng", lambda *args, **kwargs: host.append(
        "numpy.random.default_rng") or make_generator(*args, **kwargs))
    before = numpy_state()

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            calls.append((func, args, kwargs or {}, out))
            return out

    def profile(frame, event, arg):
        if (module := host_rng(frame, event, arg)) is not None:
            host.append(module)

    def model(**kwargs):
        return functional_call(plan.core, params, (), kwargs)

    with mode, Ops():
        sys.setprofile(profile)
        try:
            with trainer.autocast():
                loss = plan.forward_loss(model, inputs, divisors)
            loss.backward()
        finally:
            sys.setprofile(None)
    if numpy_state() != before:
        host.append("numpy.random")
    return calls, host


def seeds_and_sources(calls) -> tuple[list, list, list[str]]:
    """The seed tensors of the dropout kernels' forward and backward ops (SEEDED; None: no
    dropout, left out) and, for each forward seed, the op that made it (through aliases: a
    detached seed is its source's)."""
    made_by: dict[int, str] = {}
    forward, backward = [], []
    for func, args, _, out in calls:
        name = func.overloadpacket.__name__
        [ret, *_] = func._schema.returns or [None]
        if ret is not None and ret.alias_info is not None and not ret.alias_info.is_write:
            name = made_by.get(id(args[0]), name)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                made_by[id(t)] = name
        if func._schema.name in SEEDED:
            seed = args[[a.name for a in func._schema.arguments].index("seed")]
            if seed is not None:
                (backward if func._schema.name.endswith("_backward") else forward).append(seed)
    return forward, backward, [made_by.get(id(s), "an input of the step") for s in forward]


def test_every_random_number_is_drawn_on_the_device_inside_the_step(packed_env, tmp_path,
                                                                     monkeypatch):
    """The packed micro-step as a GPU runs it (traced_gpu_step, dropout 0.1): its only random
    ops are one `randint` per Triton dropout site (kernels.layer_norm.new_seed: the embeddings'
    and each layer's two sub-layer ends) and one flash attention op per layer, in that order,
    on the step's device and its default generator (the one CUDA graphs capture); each dropout
    kernel's seed is a fresh randint output (no tensor made from host values, none read back)
    and its backward gets the same tensor; the flash op takes no seed (its kernel draws from the
    default CUDA generator) and its backward gets the rng state its forward returned. Nothing
    calls Python's random, numpy.random or torch's seeding functions meanwhile."""
    trainer = trainer_for(packed_env, tmp_path, PRECISION="bf16", PREFETCH="0")
    calls, host = traced_gpu_step(trainer, monkeypatch)
    assert host == []
    drawn = [c for c in calls if torch.Tag.nondeterministic_seeded in c[0].tags]
    layers = trainer.plan.core.config.num_hidden_layers
    assert [func.overloadpacket.__name__ for func, *_ in drawn] == \
        ["randint"] + ["varlen_flash_attention", "randint", "randint"] * layers
    for func, args, kwargs, out in drawn:
        assert kwargs.get("generator") is None
        assert {t.device for t in tree_leaves(out) if isinstance(t, torch.Tensor)} == \
            {trainer.device}
    assert not [c for c in calls if c[0].overloadpacket.__name__ in
                ("lift_fresh", "_local_scalar_dense")]
    forward, backward, sources = seeds_and_sources(calls)
    assert sources == ["randint"] * (1 + 2 * layers)
    assert len({id(s) for s in forward}) == len(forward) == len(backward)
    assert {id(s) for s in backward} == {id(s) for s in forward}
    assert all((s.dtype, s.shape) == (torch.int64, (1,)) for s in forward)
    flash = [c for c in drawn if c[0] is torch.ops.bertperf.varlen_flash_attention.default]
    for _, (qkv, cu_seqlens, *scalars), _, _ in flash:  # no seed among them
        assert not any(isinstance(a, torch.Tensor) for a in scalars)
        assert scalars[1] == trainer.plan.core.config.attention_probs_dropout_prob
    flash_backward = [args for func, args, _, _ in calls
                      if func is torch.ops.aten._flash_attention_backward.default]
    assert {(id(a[12]), id(a[13])) for a in flash_backward} == \
        {(id(out[2]), id(out[3])) for *_, out in flash} and len(flash_backward) == layers


@pytest.mark.parametrize("draw, drawn_by", [
    (lambda: random.getrandbits(62), "random"),
    (lambda: int(np.random.randint(2**62)), "numpy.random"),
    (lambda: int(np.random.default_rng().integers(2**62)), "numpy.random.default_rng"),
], ids=["random", "numpy", "numpy-generator"])
def test_the_rng_audit_sees_host_seeds(packed_env, tmp_path, monkeypatch, draw, drawn_by):
    """The checks above catch a seed drawn on the host and made into a tensor."""
    sublayer_end = importlib.import_module("bertperf.kernels.dropout_add_layer_norm")
    monkeypatch.setattr(sublayer_end, "new_seed",
                        lambda device: torch.tensor([draw()], device=device))
    trainer = trainer_for(packed_env, tmp_path, PRECISION="bf16", PREFETCH="0")
    calls, host = traced_gpu_step(trainer, monkeypatch)
    assert drawn_by in host
    assert seeds_and_sources(calls)[2] == ["randint"] + ["lift_fresh"] * 4
