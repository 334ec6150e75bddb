"""`make gpu-check` as it runs on a GPU machine without network, here where there is no CUDA: with
this interpreter's environment as it is, a bundle made offline (a wheel this environment lacks,
the vocab, FOLDOC), the network cut (`unshare -n`, as root) and no apt or pip executable to
reach: it installs the bundle's wheel beside the environment, its steps see it, it makes its
data from the bundle's FOLDOC, collects the GPU tests and stops in one line at "no CUDA", within
60 seconds. Then the same report continued (`--from`), and a budget too small for the data."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.gpu_check import PROBE, make_bundle, probe_wheel
from tests.support.paths import ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(torch.cuda.is_available(),
                                 reason="proves the path without CUDA; with CUDA the check runs "
                                        "its GPU steps (make gpu-check)")]

STUBS = ("apt-get", "apt", "pip", "pip3")
"""Executables no step may call: each stub logs its call and fails."""


@pytest.fixture(scope="module")
def offline(tmp_path_factory, demo_data, vocab_file):
    """(the environment, the command, the report) of a check run offline on a fresh bundle."""
    tmp = tmp_path_factory.mktemp("gpu_check")
    fetched = subprocess.run(["bash", str(ROOT / "data_prep" / "fetch_foldoc.sh"),
                              str(demo_data[0] / "deb")], capture_output=True, text=True)
    if fetched.returncode != 0:
        pytest.skip("dict-foldoc is neither installed nor downloadable here (apt-get download)")
    made = make_bundle(tmp / "bundle", probe_wheel(tmp / "wheels").parent, vocab_file,
                       Path(fetched.stdout.strip()))
    assert made.returncode == 0, made.stderr
    stubs = tmp / "stubs"
    stubs.mkdir()
    for name in STUBS:
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {tmp}/stub_calls\nexit 1\n')
        (stubs / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("BERTPERF_VOCAB", "PYTHONPATH")}
    env.update(PATH=f"{stubs}:{os.environ['PATH']}", PIP_INDEX_URL="http://127.0.0.1:9/simple",
               PIP_CONFIG_FILE=os.devnull)
    cut = ["unshare", "-n"] if os.geteuid() == 0 and shutil.which("unshare") else []
    command = [*cut, sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--out",
               str(tmp / "out"), "--bundle", str(tmp / "bundle")]
    report = tmp / "report.md"
    start = time.perf_counter()
    run = subprocess.run([*command, "--report", str(report)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    return env, command, report, run, time.perf_counter() - start, tmp


def test_offline_from_a_bundle_to_no_cuda_in_one_line(offline):
    env, command, report, run, seconds, tmp = offline
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr
    assert run.stderr.splitlines() == [
        f"gpu-check: stopped: torch sees no CUDA device here; the report so far: {report}"]
    text = report.read_text()
    assert re.search(rf"installed into {tmp / 'out' / 'site'} in \d+ s: {PROBE} 1\.0;", text), text
    assert re.search(r"^- `environment`: ok", text, re.M), text  # its child saw the probe
    assert re.search(r"^- `data`: ok", text, re.M), text
    assert (tmp / "out" / "foldoc_512" / "packed" / "MANIFEST.json").is_file()
    assert re.search(r"^- tests/gpu collected: ok, .*test_kernels_gpu\.py: \d+", text, re.M), text
    assert not (tmp / "stub_calls").exists(), (tmp / "stub_calls").read_text()
    cut = "under unshare -n" if command[0] == "unshare" else "with the network up (not root)"
    print(f"offline check to 'no CUDA': {seconds:.0f} s, {cut}")
    assert seconds < 60, text


def test_from_continues_the_report_without_redoing_what_passed(offline):
    env, command, report, _, _, tmp = offline
    run = subprocess.run([*command, "--report", str(report), "--from", "kernels"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr
    text = report.read_text()
    assert text.count("\n## continued, ") == 1 and text.startswith("# make gpu-check, ")
    assert len(re.findall(r"^- `data`: ok", text, re.M)) == 1, text  # passed: not run again
    assert len(re.findall(r"^- `environment`: ok", text, re.M)) == 2, text


def test_a_step_beyond_the_budget_is_not_run_and_the_rest_go_on(offline):
    env, command, _, _, _, tmp = offline
    report = tmp / "budget.md"
    run = subprocess.run([*command, "--report", str(report), "--budget", "1"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr
    text = report.read_text()
    assert re.search(r"^- `data`: not run: budget \(30 s planned, 0 s left\)", text, re.M), text
    assert re.search(r"^- tests/gpu collected: ok", text, re.M), text
    exists = subprocess.run([*command, "--report", str(report)], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert exists.returncode == 2 and exists.stderr.splitlines() == [
        f"gpu-check: error: {report} exists: continue it with --from STEP, or name another "
        "--report"]
