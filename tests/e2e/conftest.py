"""Fixtures shared by the end-to-end tests: one local Slurm cluster per session, and the demo's
data (prepare_demo.sh, about 25 s) made once per pytest run, whichever worker asks first, for
the tests that train on it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.demo import prepare_demo
from tests.support.once import made_once, run_folder
from tests.support.slurm_cluster import slurm_cluster  # noqa: F401


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """(the folder prepare_demo.sh filled, its process) for the tests that train on the demo's
    data; they add to it (packed shards) but change nothing it holds."""
    out = run_folder(tmp_path_factory) / "demo"
    return out, made_once(out, prepare_demo)
