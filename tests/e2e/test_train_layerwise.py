"""Layerwise training (LAYERWISE, MSLT with the moments copied) on 2 gloo ranks: through DDP, and
with SHARDED_LAMB=1 (reduce-scatter), the run equals a 1-rank run over the same global batches,
stage boundaries included (the plan rebuilt on every rank at the same step); the log marks the
stages and passes the compliance checker. The data is test_train_ddp's (tests/support/ddp.py),
with a 4-layer model."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.ddp import data  # noqa: F401
from tests.support.mlperf_logs import checker, events
from tests.support.net import free_port
from tests.support.runs import GLOBAL_BATCH, base_env, launch

STEPS = 24
STAGES = "2:128,3:64,4"  # boundaries after steps 8 and 12 (16 samples a step)


@pytest.fixture(scope="module")
def deep(data, tmp_path_factory) -> dict:  # noqa: F811
    config = json.loads(Path(data["BERT_CONFIG"]).read_text())
    path = tmp_path_factory.mktemp("deep") / "bert_config.json"
    path.write_text(json.dumps({**config, "num_hidden_layers": 4}))
    return {**data, "BERT_CONFIG": str(path)}


def ranks(files: dict, out: Path, world: int, **extra: str) -> tuple[list[float], dict]:
    """A LAYERWISE run of `world` ranks (RANK/WORLD_SIZE as srun sets them): its losses and the
    model of its last checkpoint."""
    out.mkdir()
    port = str(free_port())
    common = {"MAX_STEPS": str(STEPS), "LAYERWISE": STAGES, "LAYERWISE_TRAIN": "new",
              "LAYERWISE_OPTIMIZER": "copy", "SUBMISSION_DIVISION": "open",
              "TARGET_MLM_ACCURACY": "0.999", "FLAT_LAMB": "1", **extra}
    job = {"WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port} \
        if world > 1 else {}
    cmds = [([sys.executable, "-m", "bertperf", "train"],
             {**base_env(files, out, world), **common, **job,
              **({"RANK": str(r), "LOCAL_RANK": str(r)} if world > 1 else {})})
            for r in range(world)]
    results = launch(cmds, out)
    for rc, text in results:
        assert rc == 0, text[-4000:]
    text = "".join(t for _, t in results)
    log = events(out / "result_0.txt")
    assert [(e["value"], e["metadata"]["layers"], e["metadata"]["step"])
            for e in log if e["key"] == "layerwise_stage"] == [(1, 2, 0), (2, 3, 8), (3, 4, 12)]
    assert "SUCCESS" in checker(out / "result_0.txt").stderr
    state = torch.load(out / "ckpt" / f"ckpt_{STEPS:08d}.pt", weights_only=True)
    assert state["layerwise"]["stage"] == 2
    return [float(x) for x in re.findall(r"step \d+ samples \d+ loss (\S+)", text)], state["model"]


@pytest.fixture(scope="module")
def one_rank(deep, tmp_path_factory) -> tuple[list[float], dict]:
    return ranks(deep, tmp_path_factory.mktemp("lw") / "single", 1)


@pytest.mark.parametrize("extra", [{}, {"SHARDED_LAMB": "1"}], ids=["ddp", "sharded_lamb"])
def test_two_ranks_train_the_stages_as_one_rank(deep, one_rank, tmp_path, extra):
    losses, model = ranks(deep, tmp_path / "two", 2, **extra)
    single_losses, single_model = one_rank
    assert len(losses) == len(single_losses) == STEPS and GLOBAL_BATCH == 16
    np.testing.assert_allclose(losses, single_losses, atol=2e-4)  # printed with 4 decimals
    assert model.keys() == single_model.keys()
    worst = max(float((model[k] - single_model[k]).abs().max()) for k in model)
    assert worst < 1e-5, f"final parameters differ by up to {worst:.3g}"


def test_bench_layerwise_times_the_runs_on_the_demo(demo_data, tmp_path):
    """`bench layerwise` on the demo's data in a vocabulary of 2,000 tokens, shrunk: normal,
    stacking and MSLT with fresh layers train in one process on the CPU clock and print both
    tables, a row per stage."""
    demo, prep = demo_data
    assert prep.returncode == 0, prep.stdout[-2000:]
    out = subprocess.run(
        [sys.executable, "-m", "bertperf", "bench", "layerwise", "--demo", str(demo),
         "--layers", "3", "--hidden", "32", "--vocab", "2000", "--batch", "16", "--samples",
         "1024", "--stage",
         "256", "--eval-every", "256", "--eval-samples", "64", "--runs",
         "normal,stacking,mslt_fresh", "--clock", "cpu", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "cpu clock" in out.stdout
    stages = re.findall(r"^\| (normal|stacking|mslt_fresh) \| (\d) \| (\d) \((\d)\) \| (\d+) \|",
                        out.stdout, re.M)
    assert [(n, int(i), int(d), int(f), int(s)) for n, i, d, f, s in stages] == [
        ("normal", 1, 3, 0, 64), ("stacking", 1, 1, 0, 16), ("stacking", 2, 3, 0, 48),
        ("mslt_fresh", 1, 1, 0, 16), ("mslt_fresh", 2, 2, 1, 16), ("mslt_fresh", 3, 3, 0, 32)]
    assert "vocabulary 2000" in out.stdout and (tmp_path / "unpadded_vocab2000").is_dir()
    for name in ("normal", "stacking", "mslt_fresh"):
        assert (tmp_path / f"{name}.txt").is_file()
    # one normal seed: no spread to judge the final accuracy against, and the verdict says so
    verdicts = [line for line in out.stdout.splitlines() if "x normal's time to" in line]
    assert all("the goal not judged" in line for line in verdicts), verdicts
    assert "against normal's" not in out.stdout
