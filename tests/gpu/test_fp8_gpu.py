"""FP8=1 on CUDA, what the CPU's emulation (tests/unit/test_fp8.py) cannot show: on a GPU of sm_89
or newer, torchao's real FP8 GEMMs (torch._scaled_mm) in the packed step, eager and compiled by
inductor into one graph, with no host sync outside the reports, and losses within a few percent
of the bf16 step's (rtol 5e-2); on an older GPU, the trainer's one-line refusal instead (so
`make gpu-check` passes on an A100, where a skip would count as a failure). Same shards and
tiny model as tests/unit/test_step_audits.py (tests/support/packed.py), its widths raised to
multiples of 16 (FP8 GEMMs need them). Skipped without CUDA."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.support.packed import (no_host_sync_outside_reports, packed_env,  # noqa: F401
                                  tiny_config, trainer_for)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def fp8_gpu() -> bool:
    return torch.cuda.get_device_capability() >= (8, 9)


def env_for(packed_env, tmp_path) -> dict:  # noqa: F811
    """The packed run, dropout off, hidden 64 / FFN 256 (multiples of 16), bf16 on CUDA."""
    path = tiny_config(tmp_path / "fp8.json", 0.0)
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "hidden_size": 64, "intermediate_size": 256}))
    return {**packed_env, "BERT_CONFIG": str(path), "MAX_STEPS": "20", "LOG_FREQ": "1",
            "SEED": "5", "DEVICE": "cuda", "PRECISION": "bf16"}


def test_fp8_is_refused_below_sm89(packed_env, tmp_path):  # noqa: F811
    from bertperf.config import load
    from bertperf.errors import UserError
    from bertperf.train.checks import prepare
    cfg = load({**env_for(packed_env, tmp_path), "FP8": "1",
                "MLLOG_FILE": str(tmp_path / "log.txt")})
    if fp8_gpu():
        prepare(cfg)
    else:
        with pytest.raises(UserError, match="sm_89 or newer"):
            prepare(cfg)


@pytest.mark.parametrize("compile_with", ["none", "inductor"])
def test_fp8_step_learns_like_bf16_without_host_syncs(
        packed_env, tmp_path, monkeypatch, compile_with):  # noqa: F811
    if not fp8_gpu():
        return  # refused there: test_fp8_is_refused_below_sm89
    import torch._dynamo
    from torch._dynamo.utils import counters

    from bertperf.model import fp8
    from bertperf.train import loop
    env = env_for(packed_env, tmp_path)
    losses = {}
    for name in ("bf16", "fp8"):
        torch._dynamo.reset()
        counters.clear()
        extra = {"COMPILE": compile_with, **({"FP8": "1"} if name == "fp8" else {})}
        trainer = trainer_for(env, tmp_path, **extra)
        assert fp8.converted(trainer.plan.core) == (8 if name == "fp8" else 0)
        lines = []
        with no_host_sync_outside_reports(monkeypatch), \
                torch._dynamo.config.patch(error_on_recompile=True):
            loop.run_loop(trainer, report=lines.append)
        losses[name] = [float(line.split(" loss ")[1].split()[0]) for line in lines]
        if compile_with != "none":
            assert dict(counters["graph_break"]) == {}
            assert counters["stats"]["unique_graphs"] == 1
    assert len(losses["fp8"]) == 20
    np.testing.assert_allclose(losses["fp8"], losses["bf16"], rtol=5e-2)
