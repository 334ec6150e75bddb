"""The supported torch lines (bertperf.versions) and everything that states them: a version counts
as its line however it is written (PyPI's, a local build's, NGC's pre-releases); pyproject.toml's
range admits exactly those lines; each constraints/ file pins a supported line with its torchao;
README says the range; what a target lacks never names torch or triton; container/requirements.py
(the image's build) refuses a base of another line in one line, writing nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from bertperf import versions
from bertperf.errors import UserError
from tests.support.paths import ROOT

PROJECT = versions.load_project((ROOT / "pyproject.toml").read_text())
CONSTRAINTS = sorted((ROOT / "constraints").glob("torch*.txt"))


@pytest.mark.parametrize("version, line", [
    ("2.10.0a0+b4e4ee81d3", "2.10"), ("2.11.0a0+abcdef", "2.11"), ("2.13.0+cpu", "2.13"),
    ("2.11.0", "2.11"), ("2.12.1", "2.12"), ("2.10.0.dev20251201", "2.10"), ("2.1.0", "2.1"),
    ("10.2", "10.2"), ("none", None), ("", None)])
def test_a_version_counts_as_its_line(version, line):
    assert versions.torch_line(version) == line


@pytest.mark.parametrize("version", ["2.10.0a0+b4e4ee81d3", "2.11.0a0+abcdef", "2.11.0",
                                     "2.12.0", "2.13.0+cpu"])
def test_the_supported_lines_are_taken(version):
    assert versions.check_torch(version, "the base image's torch") == versions.torch_line(version)


@pytest.mark.parametrize("version", ["2.7.0a0+79aa17489c", "2.9.1", "2.14.0a0+abc", "2.1.0",
                                     "3.0.0"])
def test_other_lines_are_refused_in_one_line(version):
    with pytest.raises(UserError) as err:
        versions.check_torch(version, "the base image's torch")
    assert str(err.value) == (f"the base image's torch {version} is outside bertperf's "
                              "supported torch lines, 2.10 to 2.13 (NGC's pre-releases of those "
                              "lines included)")


def test_pyprojects_range_admits_exactly_the_supported_lines():
    spec = next(Requirement(r) for r in PROJECT["dependencies"]
                if versions.name_of(r) == "torch").specifier
    for line in versions.TORCHAO:
        for version in (f"{line}.0a0+b4e4ee81d3", f"{line}.0", f"{line}.1", f"{line}.0+cpu"):
            assert spec.contains(version, prereleases=True), version
    lines = sorted(tuple(map(int, line.split("."))) for line in versions.TORCHAO)
    (major, low), (_, high) = lines[0], lines[-1]
    for version in (f"{major}.{low - 1}.1", f"{major}.{low - 1}.0a0+x", f"{major}.{high + 1}.0",
                    f"{major}.{high + 1}.0a0+x"):
        assert not spec.contains(version, prereleases=True), version


def test_each_constraints_file_pins_a_supported_line_and_its_torchao():
    assert {p.stem.removeprefix("torch") for p in CONSTRAINTS} >= {"2.10", "2.11", "2.13"}
    triton = next(Requirement(r) for r in PROJECT["optional-dependencies"]["test"]
                  if versions.name_of(r) == "triton").specifier
    for path in CONSTRAINTS:
        pins = dict(re.findall(r"(?m)^([\w-]+)==(\S+)$", path.read_text()))
        line = path.stem.removeprefix("torch")
        assert versions.torch_line(pins["torch"]) == line, path
        assert pins["torchao"] == versions.TORCHAO[line], path
        assert triton.contains(pins["triton"]), path


def test_readme_states_the_range():
    assert f"torch {versions.supported_range()}" in " ".join((ROOT / "README.md").read_text()
                                                             .split())


def test_what_a_target_lacks_never_names_torch_or_triton():
    reqs = versions.requirements(PROJECT, ["mpi", "fp8", "test"], "0.16.0", lambda r: False)
    names = [versions.name_of(r) for r in reqs]
    assert "torch" not in names and "triton" not in names and len(names) == len(set(names))
    assert "torchao==0.16.0" in reqs and "mlperf-logging==4.1.68" in reqs and "mpi4py>=3.1" in reqs
    lacks = versions.requirements(PROJECT, ["mpi"], "0.16.0",
                                  lambda r: versions.name_of(r) in ("numpy", "mpi4py"))
    assert [r for r in lacks if versions.name_of(r) in ("numpy", "mpi4py", "torchao")] == []
    with pytest.raises(UserError, match="no extra named fp9 in pyproject.toml"):
        versions.requirements(PROJECT, ["fp9"], "0.16.0", lambda r: False)


def test_torchao_is_the_release_of_the_line():
    assert versions.torchao_for("2.10.0a0+b4e4ee81d3") == "0.16.0"
    assert versions.torchao_for("2.11.0a0+abcdef") == "0.17.0"
    assert versions.torchao_for("2.13.0+cpu") == "0.18.0"


def image_requirements(tmp_path: Path, torch: str) -> subprocess.CompletedProcess:
    """container/requirements.py run where torch's installed metadata reads TORCH (a dist-info
    ahead of site-packages on the path, as a base's own torch would be)."""
    fake = tmp_path / "site"
    (fake / f"torch-{torch}.dist-info").mkdir(parents=True)
    (fake / f"torch-{torch}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: torch\nVersion: {torch}\n")
    return subprocess.run([sys.executable, str(ROOT / "container" / "requirements.py"),
                           "--extras", "mpi,fp8", "--out", str(tmp_path / "out")],
                          env={"PYTHONPATH": str(fake), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)


def test_the_images_requirements_keep_an_ngc_torch(tmp_path):
    done = image_requirements(tmp_path, "2.10.0a0+b4e4ee81d3")
    assert done.returncode == 0, done.stderr
    constraints = (tmp_path / "out" / "constraints.txt").read_text().splitlines()
    assert "torch==2.10.0a0+b4e4ee81d3" in constraints
    reqs = (tmp_path / "out" / "requirements.txt").read_text().splitlines()
    assert not [r for r in reqs if versions.name_of(r) in ("torch", "triton")]


def test_the_images_requirements_refuse_another_line_in_one_line(tmp_path):
    done = image_requirements(tmp_path, "2.7.0a0+79aa17489c")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "container/requirements.py: error: the base image's torch 2.7.0a0+79aa17489c is "
        "outside bertperf's supported torch lines, 2.10 to 2.13 (NGC's pre-releases of those lines "
        "included)"]
    assert not (tmp_path / "out").exists()
