"""The demo's data for the tests that train on it: data_prep/prepare_demo.sh as `make demo` runs
it (FOLDOC through the reference chain, 128-token samples), and its shards packed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import PYTHONPATH, ROOT


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
    """The demo's unpadded shards packed into 128-token rows, in demo/packed (made once)."""
    if not (demo / "packed" / "MANIFEST.json").is_file():
        run = subprocess.run([sys.executable, "-m", "bertperf", "prep", "pack", "--input",
                              str(demo / "unpadded"), "--output", str(demo / "packed"),
                              "--max_seq_length", "128"],
                             env={**os.environ, "PYTHONPATH": PYTHONPATH}, capture_output=True,
                             text=True)
        assert run.returncode == 0, run.stderr[-3000:]
    return demo / "packed"
