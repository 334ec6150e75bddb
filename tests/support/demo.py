"""The demo's data for the tests that train on it: data_prep/prepare_demo.sh as `make demo` runs
it (FOLDOC through the reference chain, 128-token samples), and its shards packed; and a demo run
through run_and_time.sh to its target (the GPU convergence test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from tests.support.mlperf_logs import events
from tests.support.paths import PYTHONPATH, ROOT
from tests.support.scripts import CONFIG, LAUNCH_VARS, config_env


def prepare_demo(out: Path) -> subprocess.CompletedProcess:
    """data_prep/prepare_demo.sh into `out`, as `make demo` runs it (skips where FOLDOC or the
    vocab cannot be had)."""
    from bertperf.errors import UserError
    from bertperf.resources import find_vocab
    try:
        vocab = find_vocab()
    except UserError as exc:
        pytest.skip(f"MLPerf vocab not found ({exc}); `make demo` installs it")
    env = {**os.environ, "OUT_DIR": str(out), "PYTHON": sys.executable, "PYTHONPATH": PYTHONPATH,
           "VOCAB": str(vocab)}
    prep = subprocess.run(["bash", str(ROOT / "data_prep" / "prepare_demo.sh")], env=env,
                          capture_output=True, text=True, timeout=600)
    if prep.returncode != 0 and "cannot fetch dict-foldoc" in prep.stderr:
        pytest.skip("dict-foldoc is neither installed nor downloadable here (apt-get download)")
    assert prep.returncode == 0, prep.stderr[-3000:]
    return prep


def pack(demo: Path) -> Path:
    """The demo's unpadded shards packed into 128-token rows, in demo/packed (made once, by
    whichever worker asks first)."""
    with FileLock(f"{demo / 'packed'}.lock"):
        if not (demo / "packed" / "MANIFEST.json").is_file():
            run = subprocess.run([sys.executable, "-m", "bertperf", "prep", "pack", "--input",
                                  str(demo / "unpadded"), "--output", str(demo / "packed"),
                                  "--max_seq_length", "128"],
                                 env={**os.environ, "PYTHONPATH": PYTHONPATH},
                                 capture_output=True, text=True)
            assert run.returncode == 0, run.stderr[-3000:]
    return demo / "packed"


def demo_env(demo: Path, logdir: Path, **extra: str) -> dict:
    """The environment of run_and_time.sh for the demo's job (config_CPU_1x2x32x1.sh, seed 1) on
    the demo's data in `demo`, its logs into `logdir`, `extra` on top."""
    return {**{k: v for k, v in os.environ.items() if k not in LAUNCH_VARS},
            **config_env(CONFIG), "PYTHON": sys.executable, "PYTHONPATH": PYTHONPATH,
            "DATADIR_PHASE2": str(demo / "unpadded"),
            "EVAL_FILE": str(demo / "hdf5" / "eval" / "eval_10k.hdf5"), "LOGDIR": str(logdir),
            "SEED": "1", "CLEAR_CACHES": "0", **extra}


def samples_to_target(demo: Path, out: Path, timeout: float = 600,
                      **extra: str) -> tuple[int, list[float]]:
    """One demo run through run_and_time.sh to its target: (train_samples, the eval curve)."""
    out.mkdir(parents=True)
    env = demo_env(demo, out, **extra)
    run = subprocess.run(["bash", str(ROOT / "run_and_time.sh")], env=env, cwd=out.parent,
                         capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    log = events(out / "result_1.txt")
    stop = next(e for e in log if e["key"] == "run_stop")
    assert stop["metadata"]["status"] == "success", run.stderr[-3000:]
    accuracies = [round(e["value"], 4) for e in log if e["key"] == "eval_accuracy"]
    return next(e["value"] for e in log if e["key"] == "train_samples"), accuracies
