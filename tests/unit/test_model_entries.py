"""One fact in one place: a GPU is one entry of perfmodel/gpus.py and a GRAD_COMM mode one
train/comm.py Mode entry and its name in config; a throwaway entry of each works in every
command with nothing else changed (model step's: tests/unit/test_model_step.py). Every GPU plan
offers prices at every precision it offers, and NVIDIA's Eos run's configuration lands within
the model's tolerance of its published time."""

from __future__ import annotations

import dataclasses
import types

import pytest

from bertperf.__main__ import main
from bertperf.perfmodel import TOLERANCE, bert, commodity, gpus, network, plan, validate
from tests.support.paths import ROOT

NEW_GPU = gpus.Gpu("Z100 64GB PCIe", 500e12, 40e12, 2.5e12, 64, gpus.PCIE5_X16,
                   "a throwaway entry of the tests", fp8_flops=1000e12, kernels_like=gpus.H100)


@pytest.fixture
def given_compute(monkeypatch):
    """model commodity's A100 step given (nothing traced for it), run in the checkout's root."""
    monkeypatch.setattr(commodity, "modelled", lambda batch, packed: bert.Compute(
        0.003 * batch, 0.002 * batch, 0.0126, "given"))
    monkeypatch.chdir(ROOT)


@pytest.fixture
def new_gpu(monkeypatch, given_compute):
    monkeypatch.setitem(gpus.GPUS, NEW_GPU.name, NEW_GPU)
    return NEW_GPU.name


@pytest.mark.slow
def test_a_new_gpu_is_one_entry(new_gpu, capsys):
    """plan at both precisions (its rate: a calibrated GPU's times roofline's speedup, said so)
    and model commodity (a PCIe card: roofline's ratio to the A100, said so)."""
    argv = ["plan", "--gpu", new_gpu, "--gpus", "16", "--network", "pcie-25gbe",
            "--layerwise", "none", "--division", "closed", "--top", "3"]
    for precision in ("bf16", "fp8"):
        assert main([*argv, "--precision", precision]) == 0
        out = capsys.readouterr().out
        (rate,) = [line for line in out.splitlines() if line.startswith("rate: ")]
        assert "(roofline, " in rate and "fastest closed" in out
    assert new_gpu in plan.fp8_gpus()
    assert main(["model", "commodity", "--gpu", new_gpu, "--grad-comm", "allreduce,bf16"]) == 0
    out = capsys.readouterr().out
    assert f"compute on a {new_gpu}: the A100's" in out and "derived: no published" in out
    assert f"4 x 8 {new_gpu}, 10 Gb/s Ethernet" in out


@pytest.mark.slow
@pytest.mark.parametrize("gpu", list(gpus.GPUS))
def test_every_gpu_prices_at_every_precision_it_has(gpu):
    """Every --gpu at bf16 and, where it has FP8 tensor cores, at fp8: a rate from a calibration
    (its own, or another's times roofline's speedup); fp8 on a GPU without FP8 is one line."""
    _, calibrations, over = validate.fitted()
    for precision in plan.PRECISIONS:
        if precision == "fp8" and not gpus.GPUS[gpu].fp8_flops:
            with pytest.raises(Exception, match="no FP8 tensor cores"):
                plan.rate(gpu, precision, calibrations, over)
            continue
        rate, source = plan.rate(gpu, precision, calibrations, over)
        assert 50 < rate < 5000, (gpu, precision, rate, source)


@pytest.mark.slow
def test_eos_is_priced_within_the_tolerance():
    """NVIDIA's Eos run (v3.1, 3,472 H100, global batch 13,888: 0.1193 min published): plan's
    fastest closed candidate at that batch, trained for the RCP checker's reference there."""
    _, calibrations, over = validate.fitted()
    rate, _ = plan.rate("H100 80GB SXM", "bf16", calibrations, over)
    found = plan.candidates("H100 80GB SXM", 434, network.FABRICS["dgx-h100"], rate, over,
                            ("closed",), global_batch=13888)
    assert found[0].seconds / (0.1193 * 60) == pytest.approx(1, abs=TOLERANCE)
    assert found[0].grad_comm == "bf16"  # the closed division's half-precision all-reduce


@pytest.fixture
def new_mode(monkeypatch):
    """A throwaway GRAD_COMM mode: bf16's hook, 1.1x the samples, open division only; its Mode
    entry and its name in config (GRAD_COMMS and the setting's choices)."""
    import torch

    from bertperf import config
    from bertperf.train import comm

    name = "half_again"
    monkeypatch.setitem(comm.MODES, name, comm.Mode(comm.Compress, {"dtype": torch.bfloat16},
                                                     element_bytes=2, samples_factor=1.1))
    monkeypatch.setattr(config, "GRAD_COMMS", (*config.GRAD_COMMS, name))
    f = next(f for f in dataclasses.fields(config.OptimConfig) if f.name == "grad_comm")
    monkeypatch.setattr(f, "metadata", types.MappingProxyType(
        {**f.metadata, "choices": config.GRAD_COMMS}))
    return name


@pytest.mark.slow
def test_a_new_grad_comm_mode_is_one_entry(new_mode, monkeypatch, tmp_path, capsys,
                                           given_compute):
    """The trainer refuses it in the closed division and reduces through its hook in the open
    one; model commodity and plan price it from its facts."""
    from bertperf.config import load
    from bertperf.errors import UserError
    from bertperf.mlperf.rcp import reference_for
    from bertperf.train import parallel
    from bertperf.train.checks import prepare
    from tests.support.copy_task import env_for

    env = env_for(tmp_path, GRAD_COMM=new_mode)
    with pytest.raises(UserError, match=f"GRAD_COMM={new_mode} is an open-division method"):
        prepare(load(env))
    cfg = load({**env, "SUBMISSION_DIVISION": "open"})
    prepare(cfg)
    assert parallel.reduction_for(cfg, 2) == parallel.hooked(new_mode)
    trains_through_its_hook(monkeypatch, tmp_path, {**env, "SUBMISSION_DIVISION": "open",
                                                    "MAX_STEPS": "6"})
    assert main(["model", "commodity", "--gpu", "V100 32GB", "--grad-comm",
                 f"allreduce,{new_mode}"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if f"| {new_mode} |" in line]
    assert len(rows) == 2 and all("(x 1.1)" in row for row in rows)
    _, calibrations, over = validate.fitted()
    rate, _ = plan.rate("A100 80GB SXM", "bf16", calibrations, over)
    found = plan.candidates("A100 80GB SXM", 8, network.FABRICS["dgx-a100"], rate, over,
                            ("closed", "open"), global_batch=3072)
    mine = [c for c in found if c.grad_comm == new_mode]
    assert mine and all(c.division == "open" for c in mine)
    assert all(c.samples == pytest.approx(1.1 * reference_for(3072).mean) for c in mine)


def trains_through_its_hook(monkeypatch, tmp_path, env: dict) -> None:
    """The trainer (loop.main, in this process) on a one-process gloo group with DDP forced as
    on two ranks: every step's gradients go through the mode's hook, 2 bytes an element."""
    import torch.distributed as tdist

    from bertperf import config
    from bertperf.train import comm, loop, parallel
    from bertperf.train.dist import Dist

    real_reduction, real_step = parallel.reduction_for, loop.train_step
    seen = []

    def step(trainer, micro):
        result = real_step(trainer, micro)
        plan = trainer.plan
        seen.append((type(plan.comm), plan.traffic.world, plan.traffic.steps))
        return result

    with monkeypatch.context() as m:
        m.setattr(parallel, "reduction_for", lambda cfg, world: real_reduction(cfg, 2))
        m.setattr(loop, "train_step", step)
        tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                                 world_size=1)
        try:
            assert loop.main(config.load(env)) == 0
        finally:
            if tdist.is_initialized():  # loop.main closes it when it ends
                Dist(0, 1).close()
    assert seen and all(kind is comm.Compress for kind, _, _ in seen)
    numel = sum(p.numel() for p in trainer_parameters(env))
    assert seen[-1][1] == 2 * numel * len(seen)  # bf16: 2 bytes an element, every step


def trainer_parameters(env: dict):
    """The trained parameters of the copy task's model (the config's BERT_CONFIG)."""
    from bertperf import config
    from bertperf.model import BertConfig, BertForPreTraining

    cfg = config.load(env)
    return [p for p in BertForPreTraining(BertConfig.named(cfg.model.bert_config)).parameters()
            if p.requires_grad]
