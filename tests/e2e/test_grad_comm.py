"""GRAD_COMM through the trainer on 2 gloo ranks (the copy task of tests/support/ddp.py):
GRAD_COMM=powersgd's checkpoint carries PowerSGD's state (the step count, Q and P, each rank's
error buffer), a run resumed from it goes on compressing with that state (its bytes: one plain
all-reduce while DDP rebuilds its buckets, then compressed steps; its first step's loss the
uninterrupted run's), the trainer counts the bytes (the grad_comm_bytes event and the console),
and both logs pass the compliance checker."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from tests.support.ddp import data  # noqa: F401
from tests.support.mlperf_logs import checker, events
from tests.support.net import free_port
from tests.support.runs import base_env, launch

STEPS, SAVE, WARMUP = 24, 12, 4


def run(data: dict, out: Path, **extra: str) -> tuple[list[float], dict, str]:  # noqa: F811
    """2 ranks of GRAD_COMM=powersgd into `out`: (every step's loss, the grad_comm_bytes
    event, the console)."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**base_env(data, out, 2), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": "2", "MAX_STEPS": str(STEPS), "WARMUP_STEPS": str(WARMUP),
           "CHECKPOINT_EVERY": str(SAVE), "GRAD_COMM": "powersgd", "POWERSGD_RANK": "2",
           "SUBMISSION_DIVISION": "open", "EVAL_ITER_SAMPLES": "192", **extra}
    results = launch([([sys.executable, "-m", "bertperf", "train"],
                       {**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(2)], out)
    for rc, text in results:
        assert rc == 0, text[-4000:]
    log = out / "result_0.txt"
    check = checker(log)
    assert "SUCCESS" in check.stderr, check.stderr[-3000:]
    comm = next(e for e in events(log) if e["key"] == "grad_comm_bytes")
    text = results[0][1]
    losses = [float(x) for x in re.findall(r"step \d+ samples \d+ loss (\S+)", text)]
    return losses, comm, text


def test_powersgd_checkpoint_resumes_its_state(data, tmp_path):  # noqa: F811
    whole, comm, text = run(data, tmp_path / "whole")
    assert len(whole) == STEPS and comm["metadata"]["reduction"] == "powersgd"
    assert "gradient exchange (powersgd)" in text
    ckpt = tmp_path / "whole" / "ckpt" / f"ckpt_{SAVE:08d}.pt"
    state = torch.load(ckpt, weights_only=True)["grad_comm"]
    assert state["iter"] == SAVE and state["q"] and len(state["errors"]) == 2
    assert all(e and all(float(t.abs().sum()) > 0 for t in e.values())
               for e in state["errors"])  # each rank's own, non-zero
    assert not torch.equal(state["errors"][0][0], state["errors"][1][0])
    # bytes: the whole run sends WARMUP plain steps (POWERSGD_START unset: the end of the
    # warm-up) and then compressed ones; the resumed run one plain step (DDP's first) and then
    # compressed ones: W = WARMUP p + (STEPS - WARMUP) c, R = p + (STEPS - SAVE - 1) c
    resumed, again, _ = run(data, tmp_path / "resumed", RESUME_FROM=str(ckpt))
    w, r = comm["metadata"]["world_bytes"], again["metadata"]["world_bytes"]
    assert again["metadata"]["steps"] == STEPS - SAVE
    c = (WARMUP * r - w) / (WARMUP * (STEPS - SAVE - 1) - (STEPS - WARMUP))
    p = r - (STEPS - SAVE - 1) * c
    grads = sum(t.numel() * 4 for t in torch.load(ckpt, weights_only=True)["model"].values())
    assert c == int(c) and 0 < c < p / 2 and p <= grads, (c, p, grads)
    # the resumed run starts where the checkpoint stands and stays close to the whole run
    assert len(resumed) == STEPS - SAVE
    assert resumed[0] == pytest.approx(whole[SAVE], abs=2e-4)
    assert resumed == pytest.approx(whole[SAVE:], rel=2e-2)
