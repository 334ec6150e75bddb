"""The GPU tests need Triton compiled (bertperf.kernels, the code inductor writes); a run that also
holds the CPU tests interprets Triton (tests/conftest.py), so there they skip and say how to run
them: on their own, as `make gpu-check` does. Under `make gpu-check` (GPU_CHECK=1) a skipped test
is a failure, and the BERT-large data comes from it (GPU_CHECK_DATA, GPU_CHECK_EVAL); run alone,
the tests make that data themselves (FOLDOC, 512-token samples, packed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.paths import ROOT


@pytest.fixture(autouse=True, scope="session")
def inductor_compiles_in_process():
    """Inductor's pool of compile workers would serve the whole pytest process, so the test that
    first compiles would leave processes behind (tests/conftest.py fails such a test); one thread
    compiles in the test's own process instead."""
    import torch._inductor.config

    with torch._inductor.config.patch(compile_threads=1):
        yield


@pytest.fixture(autouse=True)
def compiled_triton():
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("Triton is interpreted in this run (the CPU tests'); run tests/gpu on its own: "
                    "make gpu-check, or pytest tests/gpu")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """GPU_CHECK=1: a skip is a failure (gpu-check proves what CI cannot; a skipped proof is
    none)."""
    report = yield
    if os.environ.get("GPU_CHECK") == "1" and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped under make gpu-check: {report.longrepr}"
    return report


@pytest.fixture(scope="session")
def bert_large_data() -> tuple[Path, Path]:
    """(packed shards of 512-token samples, their eval file): make gpu-check's, or FOLDOC's made
    here with the project's own chain (data_prep/prepare_demo.sh at MLPerf's 512 tokens and 76
    predictions, then prep pack; both skip what is already made)."""
    if os.environ.get("GPU_CHECK_DATA"):
        return Path(os.environ["GPU_CHECK_DATA"]), Path(os.environ["GPU_CHECK_EVAL"])
    folder = ROOT / "out" / "gpu_check" / "foldoc_512"
    env = {**os.environ, "OUT_DIR": str(folder), "PYTHON": sys.executable,
           "MAX_SEQ_LENGTH": "512", "MAX_PREDICTIONS_PER_SEQ": "76"}
    for argv in (["bash", "data_prep/prepare_demo.sh"],
                 [sys.executable, "-m", "bertperf", "prep", "pack", "--input",
                  str(folder / "unpadded"), "--output", str(folder / "packed")]):
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    return folder / "packed", folder / "hdf5" / "eval" / "eval_10k.hdf5"
