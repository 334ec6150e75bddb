"""The image for real, with podman and runc (`make container-test`; root only): container/build.sh
makes the plain Debian base and builds the Dockerfile on it (both cached), then the CPU job runs
inside the image through run_with_docker.sh, driven by podman's own CLI (NEXP=2) and by the docker
client talking to `podman system service`, and through `sbatch run.sub` with
CONTAINER_RUNTIME=podman on the local Slurm cluster (tests/support/slurm_cluster.py). The MLPerf
logs the runs write to the host must pass the compliance checker. A missing image, a results folder
that cannot be written and a missing data folder each stop a launch with one line and no result
file. On a base that behaves as NGC's PyTorch images do for pip (tests/support/ngc_base.py: a
pre-release torch, a constraints file pinning it and its neighbours) the Dockerfile builds, leaves
torch's files, torch's and numpy's versions and the constraints byte for byte as they were, and
the CPU job runs in it; on a base whose torch is of an unsupported line, the build stops in one
line naming it.

The job is config_CPU_1x2x32x1.sh (2 ranks, gloo) with its data and length swapped for the copy
task (tests/support/copy_task.py), as in tests/e2e/test_launch.py: a config file sourcing it and
exporting the shorter run (run_with_docker.sh sources the config, so its values win over the
environment's)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import ngc_base
from tests.support.launch import assert_compliant, data, job_env  # noqa: F401
from tests.support.mlperf_logs import events
from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.scripts import CONFIG, LAUNCH_VARS
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

CONTAINERS_CONF = ROOT / "container" / "containers.conf"
IMAGE = "localhost/bertperf:cpu"
# the copy task's model config, from the eval folder's mount (make_dataset writes it beside the
# eval file); the rest as tests/support/launch.py's job_env shortens config_CPU's run
BERT_CONFIG = "/workspace/evaldata/bert_config.json"
SHORT_RUN = {"BATCHSIZE": "8", "LR": "0.02", "MAX_STEPS": "300", "WARMUP_STEPS": "0",
             "EVAL_ITER_START_SAMPLES": "320", "EVAL_ITER_SAMPLES": "320",
             "MAX_SAMPLES_TERMINATION": "20000", "TARGET_MLM_ACCURACY": "0.72",
             "EVAL_BATCHSIZE": "64", "LOG_FREQ": "20", "DIST_TIMEOUT": "60",
             "BERT_CONFIG": BERT_CONFIG}


def podman_env(**extra: str) -> dict:
    """This process's environment without launcher variables, podman set up for this machine."""
    return {**{k: v for k, v in os.environ.items() if k not in LAUNCH_VARS},
            "CONTAINERS_CONF": str(CONTAINERS_CONF), **extra}


@pytest.fixture(scope="session")
def image() -> str:
    """The image, built by container/build.sh (cached: seconds when nothing changed)."""
    if os.getuid() != 0:
        pytest.skip("podman's image store and debootstrap need root (make container-test as root)")
    missing = [tool for tool in ("podman", "runc", "debootstrap")
               if shutil.which(tool, path=f"{os.environ['PATH']}:/usr/sbin:/sbin") is None]
    if missing:
        pytest.skip(f"not installed: {' '.join(missing)} (`make setup` as root installs them)")
    build = subprocess.run(["bash", str(ROOT / "container" / "build.sh")], cwd=ROOT,
                           env=podman_env(CONT=IMAGE, PYTHON=sys.executable),
                           capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return IMAGE


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "config_CPU_test.sh"
    path.write_text(f'source "{CONFIG}"\n'
                    + "".join(f"export {k}={v}\n" for k, v in SHORT_RUN.items()))
    return path


@pytest.fixture(scope="module")
def docker_host(image, tmp_path_factory):
    """`podman system service` on a private socket: DOCKER_HOST for the docker client."""
    if shutil.which("docker") is None:
        pytest.skip("no docker client installed")
    sock = tmp_path_factory.mktemp("podman") / "podman.sock"
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"],
                               env=podman_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    host = f"unix://{sock}"
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["docker", "version"], env={**os.environ, "DOCKER_HOST": host},
                             capture_output=True).returncode != 0:
            assert service.poll() is None and time.monotonic() < deadline, \
                "podman system service did not start"
            time.sleep(0.2)
        yield host
    finally:
        service.terminate()
        service.wait(timeout=30)


def run_with_docker(config: Path, data: dict, logdir: Path, **extra: str):
    env = podman_env(**{"CONT": IMAGE, "DGXSYSTEM": "CPU_1x2x32x1", "CONFIG_FILE": str(config),
                        "NEXP": "1", "LOGDIR": str(logdir), "DATESTAMP": "t", "CLEAR_CACHES": "0",
                        "SEED": "0", "DATADIR_PHASE2": data["DATADIR_PHASE2"],
                        "EVAL_FILE": data["EVAL_FILE"], **extra})
    return subprocess.run(["bash", str(ROOT / "run_with_docker.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def assert_runs_logged(logdir: Path, nexp: int, seed: int = 0) -> None:
    """Run i: its console log ends with its RESULT line, its MLPerf log (seed SEED + i - 1)
    passes the compliance checker."""
    for i in range(1, nexp + 1):
        console = (logdir / f"t_{i}.log").read_text()
        assert "STARTING TIMING RUN" in console and f"RESULT,bert,{seed + i - 1}," in console, \
            console[-3000:]
        log = logdir / f"result_t_{i}.txt"
        assert_compliant(log)
        assert [e["value"] for e in events(log) if e["key"] == "seed"] == [seed + i - 1]


def test_run_with_docker_podman_cli(image, config, data, tmp_path):
    logdir = tmp_path / "results"
    run = run_with_docker(config, data, logdir, DOCKER="podman", NEXP="2")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert_runs_logged(logdir, 2)
    left = subprocess.run(["podman", "ps", "-a", "--filter", "name=bertperf_t", "-q"],
                          env=podman_env(), capture_output=True, text=True)
    assert left.stdout == ""   # the container is removed after the last run


def test_run_with_docker_docker_client(docker_host, config, data, tmp_path):
    logdir = tmp_path / "results"
    run = run_with_docker(config, data, logdir, DOCKER_HOST=docker_host)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert_runs_logged(logdir, 1)


def sbatch_env(data: dict, logdir: Path, **extra: str) -> dict:
    """test_launch's job for run.sub, in the image: the task's environment goes into the
    container as pyxis passes it, so nothing in it may name this checkout's Python."""
    env = {**job_env(data, logdir, NEXP="1", MASTER_PORT=str(free_port()), CLEAR_CACHES="0",
                     DATESTAMP="t", CONT=IMAGE, CONTAINER_RUNTIME="podman",
                     BERT_CONFIG=BERT_CONFIG, CONTAINERS_CONF=str(CONTAINERS_CONF)), **extra}
    env.pop("PYTHON")
    return env


def test_sbatch_run_sub_in_podman(image, slurm_cluster: SlurmCluster, data, tmp_path):
    logdir = tmp_path / "results"
    job = slurm_cluster.sbatch(ROOT / "run.sub", "--nodes=1", "--ntasks-per-node=2",
                               f"--output={tmp_path / 'slurm.out'}",
                               env=sbatch_env(data, logdir), cwd=ROOT)
    result = slurm_cluster.wait(job, timeout=300)
    out = (tmp_path / "slurm.out").read_text()
    assert (result.state, result.exit_code) == ("COMPLETED", 0), out[-4000:]
    assert "train --check: OK: global batch 16 (2 ranks" in out
    assert_runs_logged(logdir, 1)


FAULTS = {"image": ({"CONT": "localhost/bertperf:nosuch"},
                   "container image localhost/bertperf:nosuch: not found"),
          "results": ({}, "results: not writable"),
          "data": ({"DATADIR_PHASE2": "/nonexistent/data"},
                   "DATADIR_PHASE2 /nonexistent/data: no such folder")}


@contextlib.contextmanager
def results_folder(tmp_path: Path, fault: str):
    """An empty results folder; for the "results" fault, a read-only mount (root may write
    wherever the mode says no)."""
    logdir = tmp_path / "results"
    logdir.mkdir()
    if fault == "results":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(logdir)],
                       check=True)
    try:
        yield logdir
    finally:
        if fault == "results":
            subprocess.run(["umount", str(logdir)], check=True)


@pytest.mark.parametrize("fault", FAULTS)
def test_run_with_docker_fails_in_one_line(image, config, data, tmp_path, fault):
    change, message = FAULTS[fault]
    with results_folder(tmp_path, fault) as logdir:
        run = run_with_docker(config, data, logdir, DOCKER="podman", **change)
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run_with_docker.sh: error: ") \
        and message in lines[0], run.stderr
    assert not list(logdir.iterdir())


@pytest.mark.parametrize("fault", FAULTS)
def test_run_sub_podman_fails_in_one_line(image, slurm_cluster: SlurmCluster, data, tmp_path,
                                          fault):
    change, message = FAULTS[fault]
    if fault == "image":
        message += " by podman on every node"
    with results_folder(tmp_path, fault) as logdir:
        job = slurm_cluster.sbatch(ROOT / "run.sub", "--nodes=1", "--ntasks-per-node=2",
                                   f"--output={tmp_path / 'slurm.out'}",
                                   env=sbatch_env(data, logdir, **change), cwd=ROOT)
        assert slurm_cluster.wait(job, timeout=60).state == "FAILED"
    lines = (tmp_path / "slurm.out").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run.sub: error: ") \
        and message in lines[0], lines
    assert not list(logdir.iterdir())


NGC_LIKE_BASE = "localhost/bertperf-ngclike:base"
NGC_LIKE_IMAGE = "localhost/bertperf:ngclike"


@pytest.fixture(scope="module")
def ngc_like(image, tmp_path_factory) -> tuple[dict, dict]:
    """The Dockerfile built on the NGC-like base: the base's fingerprint and the image's."""
    env = podman_env()
    ngc_base.ngc_like(env, NGC_LIKE_BASE, tmp_path_factory.mktemp("ngc_like"))
    before = json.loads(ngc_base.fingerprint(env, NGC_LIKE_BASE))
    build = ngc_base.build_project(env, NGC_LIKE_IMAGE, NGC_LIKE_BASE)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return before, json.loads(ngc_base.fingerprint(env, NGC_LIKE_IMAGE))


def test_the_image_leaves_an_ngc_bases_torch_as_it_was(ngc_like):
    before, after = ngc_like
    assert (before["torch"], before["numpy"]) == (ngc_base.PRERELEASE, ngc_base.NUMPY)
    assert f"torch=={ngc_base.PRERELEASE}" in before["constraints"]
    assert after == before
    # what was installed is what the base lacked: torchao of torch 2.13's line among it
    added = ngc_base.versions(podman_env(), NGC_LIKE_IMAGE, "torchao", "mlperf-logging")
    assert added["torchao"] == "0.18.0" and added["mlperf-logging"] is not None, added


def test_the_cpu_job_runs_in_the_ngc_like_image(ngc_like, config, data, tmp_path):
    logdir = tmp_path / "results"
    run = run_with_docker(config, data, logdir, DOCKER="podman", CONT=NGC_LIKE_IMAGE)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert_runs_logged(logdir, 1)


def test_a_base_of_an_unsupported_torch_fails_the_build_in_one_line(image, tmp_path):
    env = podman_env()
    base = "localhost/bertperf-outofrange:base"
    ngc_base.out_of_range(env, base, tmp_path / "base")
    build = ngc_base.build_project(env, "localhost/bertperf:outofrange", base)
    assert build.returncode != 0
    said = [line for line in (build.stdout + build.stderr).splitlines()
            if "container/requirements.py: error: " in line]
    assert said == [f"container/requirements.py: error: the base image's torch "
                    f"{ngc_base.OUT_OF_RANGE} is outside bertperf's supported torch lines, 2.10 to "
                    "2.13 (NGC's pre-releases of those lines included)"], build.stderr[-3000:]
