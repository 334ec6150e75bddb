"""tools/mutants.py's mutation set stays applicable: every mutated line is in its file exactly
once, and the file with the mutation, and with the probe run's probes, still parses (Python
compiles, the shell scripts pass `bash -n`). A change to one of those lines fails here until
tools/mutation_set.json follows it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

spec = importlib.util.spec_from_file_location("mutants", ROOT / "tools" / "mutants.py")
mutants = sys.modules.setdefault("mutants", importlib.util.module_from_spec(spec))
spec.loader.exec_module(mutants)
SET = [mutants.Mutant(**m) for m in json.loads(mutants.SET.read_text())]


def parses(path: str, text: str, tmp_path) -> None:
    if path.endswith(".py"):
        compile(text, path, "exec")
    else:
        script = tmp_path / "script.sh"
        script.write_text(text)
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_the_set_names_each_mutation_once_and_covers_the_areas():
    assert len({m.name for m in SET}) == len(SET) >= 25
    assert all(m.old != m.new for m in SET)


@pytest.mark.parametrize("mutant", SET, ids=lambda m: m.name)
def test_a_mutation_applies_and_parses(mutant, tmp_path):
    text = (ROOT / mutant.path).read_text()
    mutated = mutants.apply(text, mutant)  # SystemExit unless its line is there exactly once
    assert mutated.count("\n") == text.count("\n")
    parses(mutant.path, mutated, tmp_path)


@pytest.mark.parametrize("path", sorted({m.path for m in SET}))
def test_the_probes_keep_a_file_parsing(path, tmp_path):
    text = (ROOT / path).read_text()
    here = [m for m in SET if m.path == path]
    probed = mutants.probed(text, here, sys.executable)
    assert probed.count("\n") == text.count("\n") + len(here)
    parses(path, probed, tmp_path)
