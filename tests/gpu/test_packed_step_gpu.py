"""The packed training step on CUDA, what the CPU tests cannot show: no host synchronisation in 12
steps of the real loop outside its reports (torch.cuda.set_sync_debug_mode("error")), with either
LAMB (FLAT_LAMB), and the micro-step compiled with inductor (COMPILE=inductor) and replayed as CUDA
graphs (USE_CUDA_GRAPH=1) giving the eager step's losses. Same shards and tiny model as
tests/unit/test_step_audits.py (tests/support/packed.py). Skipped without CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.packed import (no_host_sync_outside_reports, packed_env,  # noqa: F401
                                  tiny_config, trainer_for)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("flat_lamb", ["0", "1"], ids=["lamb", "flat_lamb"])
def test_no_host_sync_on_cuda(packed_env, tmp_path, monkeypatch, flat_lamb):  # noqa: F811
    from bertperf.train import loop
    trainer = trainer_for(packed_env, tmp_path, DEVICE="cuda", PRECISION="bf16", LOG_FREQ="4",
                          MAX_STEPS="12", FLAT_LAMB=flat_lamb)
    with no_host_sync_outside_reports(monkeypatch):
        stop = loop.run_loop(trainer, report=lambda line: None)
    assert stop.status == "aborted" and not stop.nonfinite


@pytest.mark.parametrize("switches", [{"COMPILE": "inductor"}, {"USE_CUDA_GRAPH": "1"}],
                         ids=["inductor", "cuda-graphs"])
def test_compiled_and_graphed_steps_give_the_eager_losses(packed_env, tmp_path,  # noqa: F811
                                                          switches):
    import torch._dynamo

    from bertperf.train import loop
    env = {**packed_env, "BERT_CONFIG": str(tiny_config(tmp_path / "no_dropout.json", 0.0)),
           "MAX_STEPS": "20", "LOG_FREQ": "1", "SEED": "5", "DEVICE": "cuda",
           "PRECISION": "bf16"}
    losses = {}
    for name, extra in (("eager", {}), ("switched", switches)):
        torch._dynamo.reset()
        lines = []
        with torch._dynamo.config.patch(error_on_recompile=True):
            loop.run_loop(trainer_for(env, tmp_path, **extra), report=lines.append)
        losses[name] = [float(line.split(" loss ")[1].split()[0]) for line in lines]
    assert len(losses["eager"]) == 20
    np.testing.assert_allclose(losses["switched"], losses["eager"], rtol=2e-2)
