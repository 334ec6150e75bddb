"""The launch scripts for real: `sbatch run.sub` on a local Slurm cluster
(tests/support/slurm_cluster.py), `run_and_time.sh` starting its ranks with torchrun, with mpirun
and with srun from a batch script, every config through `run_and_time.sh --check`, and the early
one-line errors. Every run uses config_CPU_1x2x32x1.sh (2 ranks, gloo) with its data and length
swapped for the copy task (tests/support/launch.py), so a run takes seconds; the logs must pass the
MLPerf compliance checker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.copy_task import make_dataset, packed_copy
from tests.support.launch import CAPPED, assert_compliant, data, job_env  # noqa: F401
from tests.support.mlperf_logs import events
from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.scripts import LAUNCH_VARS, config_env, run_and_time
from tests.support.slurm_cluster import SlurmCluster


# ---- Slurm --------------------------------------------------------------------------------------

def test_sbatch_run_sub_runs_nexp_compliant_runs(slurm_cluster: SlurmCluster, data, tmp_path):
    logdir = tmp_path / "results"
    env = job_env(data, logdir, NEXP="2", MASTER_PORT=str(free_port()), CLEAR_CACHES="1",
                  DATESTAMP="test", **CAPPED)
    job = slurm_cluster.sbatch(ROOT / "run.sub", "--nodes=1", "--ntasks-per-node=2",
                               f"--output={tmp_path / 'slurm.out'}", env=env, cwd=ROOT)
    result = slurm_cluster.wait(job, timeout=300)
    out = (tmp_path / "slurm.out").read_text()
    assert (result.state, result.exit_code) == ("COMPLETED", 0), out[-4000:]
    assert "train --check: OK: global batch 16 (2 ranks" in out
    for i in (1, 2):  # run i has seed SEED + i - 1 on both ranks
        assert_compliant(logdir / f"result_test_{i}.txt", "aborted")
        seeds = [e["value"] for e in events(logdir / f"result_test_{i}.txt") if e["key"] == "seed"]
        assert seeds == [i - 1]
        console = (logdir / f"test_{i}.log").read_text()
        assert "STARTING TIMING RUN" in console and f"RESULT,bert,{i - 1}," in console, \
            console[-3000:]
    # the page cache is dropped where the node allows it; either way the log says which
    clear = [e["value"] for e in events(logdir / "result_test_1.txt") if e["key"] == "cache_clear"]
    assert clear == ["cannot drop the page cache" not in out]


def test_run_sub_refuses_bad_config_before_any_run(slurm_cluster: SlurmCluster, data, tmp_path):
    logdir = tmp_path / "results"
    env = job_env(data, logdir, NEXP="2", BERT_CONFIG="large", BATCHSIZE="16384",
                  MASTER_PORT=str(free_port()))
    job = slurm_cluster.sbatch(ROOT / "run.sub", "--nodes=1", "--ntasks-per-node=2",
                               f"--output={tmp_path / 'slurm.out'}", env=env, cwd=ROOT)
    result = slurm_cluster.wait(job, timeout=120)
    out = (tmp_path / "slurm.out").read_text()
    assert result.state == "FAILED", out
    assert "above the largest BERT RCP" in out and "no run started" in out
    assert not list(logdir.glob("result_*.txt"))


def test_run_and_time_starts_srun_ranks_from_a_batch_script(slurm_cluster: SlurmCluster, data,
                                                             tmp_path):
    """LAUNCHER=srun from a batch script: the batch step's own SLURM_PROCID=0/SLURM_NTASKS=2 are
    no rank's, so the script starts both ranks with srun (instead of running one as rank 0)."""
    logdir = tmp_path / "results"
    script = tmp_path / "job.sh"
    script.write_text(f'#!/bin/bash\nexec bash "{ROOT / "run_and_time.sh"}"\n')
    env = job_env(data, logdir, LAUNCHER="srun", MASTER_PORT=str(free_port()), CLEAR_CACHES="0",
                  **CAPPED)
    job = slurm_cluster.sbatch(script, "--nodes=1", "--ntasks-per-node=2",
                               f"--output={tmp_path / 'slurm.out'}", env=env, cwd=tmp_path)
    result = slurm_cluster.wait(job, timeout=300)
    out = (tmp_path / "slurm.out").read_text()
    assert (result.state, result.exit_code) == ("COMPLETED", 0), out[-4000:]
    assert "RESULT,bert,0," in out
    assert_compliant(logdir / "result_0.txt", "aborted")


def test_run_sub_names_missing_data_and_image(slurm_cluster: SlurmCluster, data, tmp_path):
    for extra, message in (({"DATADIR_PHASE2": str(tmp_path / "nope")}, "no such folder"),
                           ({"CONT": str(tmp_path / "image.sqsh")}, "image.sqsh: no such file")):
        env = job_env(data, tmp_path / "results", NEXP="1", **extra)
        out_file = tmp_path / f"slurm-{len(message)}.out"
        job = slurm_cluster.sbatch(ROOT / "run.sub", "--nodes=1", "--ntasks-per-node=2",
                                   f"--output={out_file}", env=env, cwd=ROOT)
        assert slurm_cluster.wait(job, timeout=60).state == "FAILED"
        assert "run.sub: error: " in out_file.read_text() and message in out_file.read_text()


# ---- torchrun and mpirun ------------------------------------------------------------------------

def test_run_and_time_started_by_mpirun_or_starting_it(data, tmp_path):
    """The same run two ways: run_and_time.sh starting mpirun, and started per rank by `mpirun
    -np 2 ./run_and_time.sh` (rank and world from OpenMPI's variables). Its torchrun launch is
    the demo's (tests/e2e/test_demo.py), and test_train_ddp.py finds torchrun's and mpirun's
    two ranks each equal to one rank."""
    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun (OpenMPI) installed: `make setup` as root installs it")
    results = {}
    for how in ("mpirun", "mpirun -np 2 run_and_time.sh"):
        logdir = tmp_path / how.replace(" ", "_")
        env = job_env(data, logdir, LAUNCHER=how.split()[0], MASTER_PORT=str(free_port()),
                      MASTER_ADDR="127.0.0.1", CLEAR_CACHES="0",
                      MPIRUN_ARGS="--allow-run-as-root --oversubscribe", **CAPPED)
        if how.endswith("run_and_time.sh"):
            run = subprocess.run(["mpirun", "-np", "2", "--allow-run-as-root", "--oversubscribe",
                                  "bash", str(ROOT / "run_and_time.sh")], env=env, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=300)
        else:
            run = run_and_time(env, tmp_path)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        assert [l for l in run.stdout.splitlines() if l.startswith("RESULT,bert,0,")], how
        results[how] = assert_compliant(logdir / "result_0.txt", "aborted")
    assert results["mpirun"] == results["mpirun -np 2 run_and_time.sh"]


def test_run_and_time_missing_variable(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    run = run_and_time(env, tmp_path)
    assert run.returncode != 0 and "BATCHSIZE" in run.stderr and len(run.stderr.splitlines()) == 1


def test_every_config_passes_check(tmp_path):
    """Each config file passes `run_and_time.sh --check` run by hand (paths replaced by real
    ones), which validates the whole job: DGXNNODES x DGXNGPU ranks."""
    data = make_dataset(tmp_path / "data", n_train=16)
    packed = packed_copy(data, tmp_path / "packed")

    def check(path: Path) -> None:
        env = {**{k: v for k, v in os.environ.items() if k not in LAUNCH_VARS},
               **config_env(path)}
        world = int(env["DGXNNODES"]) * int(env["DGXNGPU"])
        rows = env.get("LAYOUT") == "packed"
        env.update(DATADIR_PHASE2=(packed if rows else data)["DATADIR_PHASE2"],
                   EVAL_FILE=data["EVAL_FILE"], PYTHON=sys.executable)
        env.pop("INIT_CHECKPOINT", None)
        gbs = round(world * int(env["BATCHSIZE"]) * int(env["GRADIENT_STEPS"])
                    * (float(env["PACKING_FACTOR"]) if rows else 1))
        run = run_and_time(env, tmp_path, "--check")
        assert run.returncode == 0, f"{path.name}: {run.stderr}"
        assert f"global batch {gbs} ({world} ranks" in run.stdout, path.name

    with ThreadPoolExecutor(max_workers=2) as pool:  # one process a core
        list(pool.map(check, sorted(ROOT.glob("config_*x*.sh"))))


def test_plan_configs_pass_check(tmp_path):
    """`plan --write` configs (closed, and open with LAYERWISE; FP8) pass `run_and_time.sh
    --check` as the checkout's own configs do: the whole job of its ranks."""
    from bertperf.__main__ import main

    data = make_dataset(tmp_path / "data", n_train=16)
    packed = packed_copy(data, tmp_path / "packed")
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "config_common.sh").write_text((ROOT / "config_common.sh").read_text())
    assert main(["plan", "--gpu", "A100 80GB SXM", "--gpus", "64", "--write", str(folder)]) == 0
    assert main(["plan", "--gpu", "H100 80GB SXM", "--gpus", "16", "--network", "dgx-h100",
                 "--precision", "fp8", "--division", "closed", "--write", str(folder)]) == 0
    written = sorted(folder.glob("config_*x*.sh"))
    assert len(written) == 3
    assert sum("LAYERWISE=" in p.read_text() for p in written) == 1  # the fastest open: MSLT
    for path in written:
        env = {**{k: v for k, v in os.environ.items() if k not in LAUNCH_VARS},
               **config_env(path)}
        rows = env.get("LAYOUT") == "packed"
        env.update(DATADIR_PHASE2=(packed if rows else data)["DATADIR_PHASE2"],
                   EVAL_FILE=data["EVAL_FILE"], PYTHON=sys.executable)
        env.pop("INIT_CHECKPOINT", None)
        if env.get("FP8") == "1":  # FP8=1 needs an sm_89+ GPU: the CPU's emulation checks the rest
            env["FP8"] = "emulate"
        run = run_and_time(env, tmp_path, "--check")
        assert run.returncode == 0, f"{path.name}: {run.stderr}"
        world = int(env["DGXNNODES"]) * int(env["DGXNGPU"])
        assert f"({world} ranks" in run.stdout, path.name


def test_cluster_configs_use_their_rcp_row():
    """Hyperparameters of every config_DGX*.sh = the ruleset 5.0.0 RCP row of its global batch
    (the eval cadence is the trainer's default, MLPerf's formula: tests/unit/test_scripts.py)."""
    from bertperf.mlperf.rcp import point_for
    configs = sorted(ROOT.glob("config_DGX*x*.sh"))
    assert {p.name.split("_")[2].split("x")[0] for p in configs if "A100" in p.name} >= \
        {"1", "8", "16", "32", "64", "128"}
    for path in configs:
        env = config_env(path)
        gbs = round(int(env["DGXNNODES"]) * int(env["DGXNGPU"]) * int(env["BATCHSIZE"])
                    * int(env["GRADIENT_STEPS"])
                    * (float(env["PACKING_FACTOR"]) if env.get("LAYOUT") == "packed" else 1))
        row = point_for(gbs)
        assert row is not None, f"{path.name}: global batch {gbs} is not an RCP row"
        got = tuple(float(env[k]) for k in ("LR", "MAX_STEPS", "WARMUP_STEPS",
                                            "START_WARMUP_STEP", "OPT_LAMB_BETA_1",
                                            "OPT_LAMB_BETA_2", "WEIGHT_DECAY_RATE"))
        want = (row.lr, row.max_steps, row.warmup_steps, row.start_warmup_step, row.beta1,
                row.beta2, row.weight_decay)
        assert got == want, f"{path.name}: {got} != RCP {want}"
        assert int(env["WALLTIME"]) > 0 and int(env["MAX_SAMPLES_TERMINATION"]) > \
            max(row.samples_to_converge), path.name
