"""Data parallel training through torch.distributed (gloo on CPU): a 2-rank run equals a 1-rank
run over the same global batch, whichever launcher started the ranks (torchrun, `bertperf launch`,
plain RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT as Slurm's srun scripts set them, or OpenMPI's
mpirun), with FLAT_LAMB=1 (DDP reducing into FlatLamb's flat gradient buffer) and with BALANCE=1
(the same global batches, their samples placed on the ranks by length) too; and LAYOUT=stratified
trains from a `prep stratify` output on 2 ranks.

The training data is the copy task of tests/unit/test_train.py with 1 to 4 masked tokens per
sample (unequal counts per rank and per micro-batch), so the test also checks the loss
normalisation by the step's global masked-token count (bertperf/train/loop.py). Every launch runs
in its own session with a wall-clock limit and DIST_TIMEOUT bounds each collective, so a stuck
rendezvous fails the test instead of hanging it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertperf.formats.samples import Samples, offsets_from_lengths
from bertperf.formats.unpadded import write_shard
from tests.unit.test_train import MAX_PRED, MSL, copy_task, make_dataset

ROOT = Path(__file__).resolve().parents[2]
PYTHONPATH = os.pathsep.join([str(ROOT / "implementations" / "pytorch"), str(ROOT)])
LAUNCH_TIMEOUT = 180
GLOBAL_BATCH, GA, STEPS = 16, 2, 96
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
              "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")


def uneven_masks(s: Samples) -> Samples:
    """s with sample i keeping only its first 1 + (i*7 % 4) masks (the others un-masked)."""
    ids = s.input_ids.copy()
    keep = 1 + (np.arange(len(s)) * 7) % 4
    pos, lab = [], []
    for i in range(len(s)):
        p = s.mlm_positions[s.mlm_offsets[i]:s.mlm_offsets[i + 1]]
        y = s.mlm_ids[s.mlm_offsets[i]:s.mlm_offsets[i + 1]]
        ids[s.offsets[i] + p[keep[i]:]] = y[keep[i]:]
        pos.append(p[:keep[i]])
        lab.append(y[:keep[i]])
    return Samples(ids, s.offsets, s.b_starts, np.concatenate(pos), np.concatenate(lab),
                   offsets_from_lengths(keep), s.nsp)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("ddp")
    env = make_dataset(root / "data", n_train=512, shards=2)
    train = Path(env["DATADIR_PHASE2"])
    shutil.rmtree(train)
    train.mkdir()
    s = uneven_masks(copy_task(512, seed=1))
    for i in range(2):
        write_shard(train / f"part_{i}.h5", s.take(np.arange(i * 256, (i + 1) * 256)), MSL,
                    MAX_PRED)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_env(data: dict, out: Path, world: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    return {**env, **data, "PYTHONPATH": PYTHONPATH, "BATCHSIZE": str(GLOBAL_BATCH // GA // world),
            "GRADIENT_STEPS": str(GA), "LR": "0.02", "MAX_STEPS": str(STEPS),
            "EVAL_ITER_SAMPLES": "256", "SEED": "0", "LOG_FREQ": "1", "PREFETCH": "1",
            "MLLOG_FILE": str(out / "result_0.txt"), "LOGDIR": str(out),
            "CHECKPOINT_DIR": str(out / "ckpt"), "DIST_TIMEOUT": "60", "OMP_NUM_THREADS": "1"}


def launch(cmds: list[tuple[list[str], dict]], cwd: Path) -> list[tuple[int, str]]:
    """Start every command in its own session; wait for all within LAUNCH_TIMEOUT seconds, then
    kill what is left (the whole process group: torchrun's and mpirun's children too)."""
    procs = [subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for cmd, env in cmds]
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=LAUNCH_TIMEOUT)
            results.append((p.returncode, out))
    except subprocess.TimeoutExpired:
        pytest.fail(f"launch {[c for c, _ in cmds]} still running after {LAUNCH_TIMEOUT} s")
    finally:
        for p in procs:  # SIGTERM first: torchrun and mpirun pass it on to their ranks
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    return results


def outcome(out: Path, results: list[tuple[int, str]]) -> dict:
    for rc, text in results:
        assert rc == 0, text[-4000:]
    events = [json.loads(l.split(":::MLLOG ", 1)[1])
              for l in (out / "result_0.txt").read_text().splitlines() if ":::MLLOG " in l]
    text = "".join(t for _, t in results)
    state = torch.load(out / "ckpt" / f"ckpt_{STEPS}.pt" if (out / "ckpt" / f"ckpt_{STEPS}.pt")
                       .exists() else next((out / "ckpt").iterdir()), weights_only=True)
    return {"acc": [e["value"] for e in events if e["key"] == "eval_accuracy"],
            "gbs": [e["value"] for e in events if e["key"] == "global_batch_size"],
            "loss": [float(x) for x in re.findall(r"step \d+ samples \d+ loss (\S+)", text)],
            "model": state["model"]}


def run_variant(data: dict, tmp: Path, how: str) -> dict:
    out = tmp / how
    out.mkdir()
    train = [sys.executable, "-m", "bertperf", "train"]
    port = str(free_port())
    if how == "single":
        cmds = [(train, base_env(data, out, 1))]
    elif how == "torchrun":
        cmds = [([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                  "--master_addr", "127.0.0.1", "--master_port", port,
                  "-m", "bertperf", "train"], base_env(data, out, 2))]
    elif how == "launch":
        cmds = [([sys.executable, "-m", "bertperf", "launch", "--nproc-per-node", "2", "train"],
                 base_env(data, out, 2))]
    elif how in ("env", "flat_lamb", "balance"):  # what an srun script sets: ranks, world size,
        # rendezvous; FLAT_LAMB: LAMB over one flat buffer; BALANCE: samples placed by length
        flat = {"flat_lamb": {"FLAT_LAMB": "1"}, "balance": {"BALANCE": "1"}}.get(how, {})
        cmds = [(train, {**base_env(data, out, 2), "RANK": str(r), "WORLD_SIZE": "2",
                         "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                         **flat})
                for r in range(2)]
    else:  # mpirun: OMPI_COMM_WORLD_* from OpenMPI itself
        env = {**base_env(data, out, 2), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        exports = [a for k in ("PYTHONPATH", "BATCHSIZE", "GRADIENT_STEPS", "LR", "MAX_STEPS",
                               "EVAL_ITER_SAMPLES", "SEED", "LOG_FREQ", "PREFETCH", "MLLOG_FILE",
                               "LOGDIR", "CHECKPOINT_DIR", "DIST_TIMEOUT", "OMP_NUM_THREADS",
                               "MASTER_ADDR", "MASTER_PORT", *data) for a in ("-x", k)]
        cmds = [(["mpirun", "-np", "2", "--allow-run-as-root", "--oversubscribe", *exports,
                  *train], env)]
    return outcome(out, launch(cmds, out))


@pytest.fixture(scope="module")
def single(data, tmp_path_factory) -> dict:
    return run_variant(data, tmp_path_factory.mktemp("single"), "single")


def assert_same(a: dict, b: dict) -> None:
    assert a["gbs"] == b["gbs"] == [GLOBAL_BATCH]
    assert len(a["acc"]) == len(b["acc"]) == STEPS * GLOBAL_BATCH // 256
    assert a["acc"] == b["acc"]  # counts of correct argmaxes: exact
    assert len(a["loss"]) == len(b["loss"]) == STEPS
    np.testing.assert_allclose(a["loss"], b["loss"], atol=2e-4)  # printed with 4 decimals
    worst = max(float((a["model"][k] - b["model"][k]).abs().max()) for k in a["model"])
    assert worst < 1e-5, f"final parameters differ by up to {worst:.3g}"
    print(f"max |param difference| {worst:.3g}; eval accuracies {a['acc']}")


@pytest.mark.parametrize("how", ["torchrun", "launch", "env", "mpirun", "flat_lamb", "balance"])
def test_two_ranks_equal_one_rank(data, single, tmp_path, how):
    if how == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("no mpirun (OpenMPI) installed")
    assert_same(run_variant(data, tmp_path, how), single)


def test_two_ranks_train_stratified_data(data, tmp_path):
    """LAYOUT=stratified (unset: read from the folder) with BALANCE=1 on 2 ranks: the run ends
    by its step cap with the same global batch size, every step's loss finite."""
    from bertperf.__main__ import main
    strat = tmp_path / "strat"
    assert main(["prep", "stratify", "--input", data["DATADIR_PHASE2"], "--output", str(strat),
                 "--bins", "12,14,16", "--shards_per_bin", "2", "--workers", "1"]) == 0
    out = tmp_path / "run"
    out.mkdir()
    env = {**base_env({**data, "DATADIR_PHASE2": str(strat)}, out, 2), "BALANCE": "1",
           "MAX_STEPS": "24", "EVAL_ITER_SAMPLES": "128", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    got = outcome(out, launch([([sys.executable, "-m", "bertperf", "train"],
                                {**env, "RANK": str(r), "LOCAL_RANK": str(r)})
                               for r in range(2)], out))
    assert got["gbs"] == [GLOBAL_BATCH] and len(got["loss"]) == 24
    assert np.isfinite(got["loss"]).all()
