"""What one pytest run makes once for all its workers (pytest-xdist's, `make test` runs two):
the first worker to ask makes it in the run's shared temporary folder while holding a lock beside
it; the others wait on the lock, then read what the first recorded."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder every worker of this run shares (a worker's own base folder is in
    it; without pytest-xdist, the run's base folder)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(folder: Path, make: Callable[[Path], subprocess.CompletedProcess]
              ) -> subprocess.CompletedProcess:
    """make(folder) the first time any worker asks for `folder`; its process (or its skip) as
    every worker sees it. A make that fails records nothing, so each asker fails by itself."""
    record = folder.with_name(folder.name + ".json")
    with FileLock(f"{folder}.lock"):
        if not record.exists():
            try:
                done = make(folder)
                state = {"args": done.args, "returncode": done.returncode,
                         "stdout": done.stdout, "stderr": done.stderr}
            except pytest.skip.Exception as exc:
                state = {"skip": str(exc)}
            record.write_text(json.dumps(state))
    state = json.loads(record.read_text())
    if "skip" in state:
        pytest.skip(state["skip"])
    return subprocess.CompletedProcess(state["args"], state["returncode"], state["stdout"],
                                       state["stderr"])
