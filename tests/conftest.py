"""Shared fixtures. The MLPerf vocab is found as the demo finds it (bertperf.resources.find_vocab:
$BERTPERF_VOCAB, or the PyPI package `make setup` installs), the developers' copy in ../shared
beside the checkout being $BERTPERF_VOCAB where that is unset; the Wikipedia sample exists only
in ../shared, and the tests that need it skip without it."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bertperf import reaper as bertperf_reaper
from tests.support import reaper
from tests.support.paths import SHARED, WIKI_SAMPLE

GPU_TESTS = Path(__file__).resolve().parent / "gpu"


def pytest_configure(config):
    """Triton decides when it is imported whether kernels, its own language library included, are
    interpreted, and torch imports it early (torch._dynamo). The CPU tests interpret the kernels
    (tests/unit/test_triton_kernels.py), so the choice is made here, before any test module
    loads, for every run but one of tests/gpu alone (`make gpu-check`), which needs them compiled.
    The developers' vocab beside the checkout is $BERTPERF_VOCAB where that is unset.
    OMP_NUM_THREADS is 1 where unset, for every test process and what it starts: `make test`
    runs a worker a core, and a tiny model's CPU step on two threads beside a busy core takes
    twice the CPU time of one thread's (docs/performance.md, "Where make test's time goes")."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    if not paths or not all(path.is_relative_to(GPU_TESTS) for path in paths):
        os.environ.setdefault("TRITON_INTERPRET", "1")
    developers_vocab = SHARED / "data" / "vocab" / "vocab.txt"
    if not os.environ.get("BERTPERF_VOCAB") and developers_vocab.is_file():
        os.environ["BERTPERF_VOCAB"] = str(developers_vocab)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item (no_process_outlives_its_test reads it)."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(autouse=True)
def no_process_outlives_its_test(request, monkeypatch):
    """Every process a test starts carries its tag (bertperf.reaper); what is left of them
    after the test is killed, and fails a test that had passed."""
    tag = f"{os.getpid()}-{next(_test_numbers)}"
    monkeypatch.setenv(reaper.TAG, tag)
    yield
    killed = bertperf_reaper.reap(reaper.TAG, tag)
    call = getattr(request.node, "report_call", None)
    if killed and call is not None and call.passed:
        pytest.fail(f"{len(killed)} process(es) outlived the test and were killed: "
                    + "; ".join(f"pid {p.pid}: {p.command[:200]}" for p in killed),
                    pytrace=False)


_test_numbers = itertools.count()


@pytest.fixture
def small_disk(tmp_path):
    """small_disk(name, kib, read_only=False): a folder on a tmpfs of that size, which fills as a
    real disk does (ENOSPC), or refuses every write (EROFS); unmounted after the test. Mounting
    needs root (CI runs as root)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a small tmpfs (a disk that fills) needs root to mount")
    mounts = []

    def make(name: str, kib: int, read_only: bool = False) -> Path:
        path = tmp_path / name
        path.mkdir()
        options = f"size={kib}k" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounts.append(path)
        return path

    yield make
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def triton_interpreter():
    """For a test that runs Triton kernels on the CPU (interpreted: pytest_configure)."""
    triton = pytest.importorskip("triton")
    if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 7):
        pytest.skip(f"triton {triton.__version__}'s CPU interpreter calls int() on one-element "
                    "numpy arrays, which numpy 2 rejects (fixed in triton 3.7.1)")


@pytest.fixture
def triton_path(triton_interpreter):
    """The Kernels under which the kernel functions take their Triton path (interpreted) for
    CPU tensors."""
    from bertperf.kernels import Kernels
    return Kernels(assume_cuda=True)


@pytest.fixture(scope="session")
def vocab_file() -> Path:
    from bertperf.errors import UserError
    from bertperf.resources import find_vocab
    try:
        return find_vocab()
    except UserError as exc:
        pytest.skip(f"{exc} (make setup installs it)")


@pytest.fixture(scope="session")
def wiki_sample() -> Path:
    path = WIKI_SAMPLE
    if not path.is_dir():
        pytest.skip(f"Wikipedia sample not found at {path} (shared/ is not beside the checkout)")
    return path
