"""`model step`: the model traces the trainer's own step (train.loop.build_step and train_step,
nothing of the package replaced) and prints its table of predictions for the A100 and the H100."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace

import pytest

from bertperf.__main__ import main
from bertperf.model import BertConfig
from bertperf.perfmodel import roofline
from tests.support.spy import spy

TRITON = importlib.util.find_spec("triton") is not None


def package_functions() -> dict:
    """Every loaded bertperf module (by name) and every callable in it (by module and name)."""
    out = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("bertperf"):
            out[name] = module
            out.update({(name, attr): v for attr, v in vars(module).items() if callable(v)})
    return out


@pytest.mark.parametrize("triton", [False, pytest.param(True, marks=pytest.mark.skipif(
    not TRITON, reason="the kernels' Triton path needs Triton installed"))],
    ids=["plain", "triton"])
def test_the_model_traces_the_trainers_step(triton, monkeypatch):
    """The model traces the trainer's own step (train.loop.build_step with FUSED_KERNELS=0 or 1,
    and train_step), built with Kernels that assume CUDA: so the kernels' Triton custom ops
    (or none), the LAMB the trainer takes with the kernels' Triton path off (Lamb, foreach ops)
    or on (FlatLamb: its three launches and one norm of the flat gradient buffer), and every
    parameter's gradient added into .grad as the trainer's later micro-steps do. No function or
    module of the package is replaced while it steps, nor after."""
    import numpy as np
    from bertperf.kernels import Kernels
    from bertperf.model import BertForPreTraining
    from bertperf.perfmodel import step as model_step
    from bertperf.train import loop

    built, stepped = spy(monkeypatch, loop, "build_step"), []
    real_step = loop.train_step
    monkeypatch.setattr(loop, "train_step",
                        lambda *args: stepped.append(package_functions()) or real_step(*args))
    config = replace(BertConfig.named("tiny"), num_hidden_layers=1)
    batch = model_step.samples_of_lengths(np.array([5, 9]))
    before = package_functions()
    trace, segments, name = model_step.trace_step(config, batch, triton)
    for seen in [*stepped, package_functions()]:
        assert all(seen[key] is value for key, value in before.items())
        assert all(module.__file__ for key, module in seen.items() if isinstance(key, str))
    ((cfg, _, _, _), kwargs), = built
    assert kwargs == {"kernels": Kernels(triton, assume_cuda=True, launchers=roofline.STAND_INS)}
    assert (cfg.train.fused_kernels, cfg.train.precision, cfg.data.layout) == \
        (triton, "bf16", "varlen")
    custom = {op.name.removesuffix("_backward") for op in trace.ops if roofline.is_custom_op(op)}
    assert custom == ({f"bertperf::{op}" for op in ("embedding_layer_norm", "layer_norm",
                                                    "bias_gelu", "cross_entropy_sum")}
                      if triton else set())
    assert len(stepped) == 2  # once to create the lazy state, once traced
    assert name == ("FlatLamb" if triton else "Lamb") and list(segments) == [5, 9]
    assert trace.syncs == 0
    params = len(list(BertForPreTraining(config).parameters()))
    assert sum(op.phase == "accumulate" for op in trace.ops) == params
    optimizer = [op for op in trace.ops if op.phase == "optimizer"]
    launches = [op.name for op in optimizer if op.name.startswith("lamb_")]
    norms = [op for op in optimizer
             if "norm" in op.name and op.region == "optim.clip.global_grad_norm"]
    if triton:
        assert launches == ["lamb_moments", "lamb_ratios", "lamb_apply"]
        assert [op.name for op in norms] == ["linalg_vector_norm"]
        assert not any(op.name.startswith("_foreach_") and op.region.startswith("optim.lamb")
                       for op in optimizer)
    else:
        assert launches == []
        assert any(op.name.startswith("_foreach_") and op.region.startswith("optim.lamb")
                   for op in optimizer)
        assert norms[0].name.startswith("_foreach_norm")


@pytest.mark.slow
@pytest.mark.skipif(not TRITON, reason="the model traces the kernels' Triton path")
def test_the_command_prints_the_model_table(capsys, monkeypatch):
    """A100 and H100 rows of 8 cells each (the H100, the last, alone with each kernel; FP8 on
    the GPUs that have it), the table marked as a model, the calibration line pointing at model
    scale; a throwaway GPU entry of perfmodel/gpus.py priced beside them (one entry, nothing
    else changed)."""
    from bertperf.perfmodel import gpus
    from tests.unit.test_model_cluster import NEW_GPU

    monkeypatch.setitem(gpus.GPUS, NEW_GPU.name, NEW_GPU)
    assert main(["model", "step", "--gpu",
                 f"A100 80GB SXM,{NEW_GPU.name},H100 80GB SXM"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("model step, ")
    model = lines.index(next(line for line in lines if line.startswith("step-time MODEL")))
    assert "a model, not a measurement" in lines[model]
    rows = [line for line in lines[model:] if line.startswith(("| A100", "| H100"))]
    assert len(rows) >= 2 * 4 and all(len(r.strip("|").split("|")) == 8 for r in rows)
    assert any("encoder GEMMs in FP8" in r for r in rows if r.startswith("| H100"))
    assert not any("FP8" in r for r in rows if r.startswith("| A100"))
    assert not any(" in one kernel" in r for r in rows if r.startswith("| A100"))
    new = [line for line in lines[model:] if line.startswith(f"| {NEW_GPU.name} |")]
    assert len(new) >= 4 and any("encoder GEMMs in FP8" in r for r in new)
    assert any(line.startswith("calibration checked on the A100 by `python -m bertperf model "
                               "scale`") for line in lines[model:])
