"""bertperf.reaper, the guard that no process outlives its test: a process tree that escapes
its process group and session (as torch's launcher starts its ranks) and one that outlives its
parent are both found by the tag they inherited and killed; untagged processes are left alone; and a
test that leaves one behind fails."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bertperf import reaper

from tests.support.paths import ROOT
from tests.support.reaper import TAG


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_reap_kills_a_tree_that_left_its_session_and_parent(monkeypatch):
    tag = f"reaper-test-{os.getpid()}"
    monkeypatch.setenv(TAG, tag)
    # a shell in its own session starts two sleepers and exits: they are orphans
    subprocess.run(["setsid", "bash", "-c", "sleep 300 & sleep 301 &"], check=True)
    untagged = subprocess.Popen(["sleep", "302"], env={"PATH": os.environ["PATH"]})
    try:
        deadline = time.monotonic() + 5  # until both children have exec'd sleep
        while True:
            found = reaper.tagged(TAG, tag)
            commands = sorted(p.command for p in found)
            if commands == ["sleep 300", "sleep 301"] or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert commands == ["sleep 300", "sleep 301"]
        killed = reaper.reap(TAG, tag, grace=0.2)
        assert sorted(p.command for p in killed) == ["sleep 300", "sleep 301"]
        assert not any(alive(p.pid) for p in found) and not reaper.tagged(TAG, tag)
        assert alive(untagged.pid)
    finally:
        reaper.reap(TAG, tag, grace=0)
        untagged.kill()
        untagged.wait()


def test_a_process_that_ends_within_the_grace_is_not_reported(monkeypatch):
    monkeypatch.setenv(TAG, "reaper-grace")
    subprocess.Popen(["sleep", "0.3"])
    assert reaper.reap(TAG, "reaper-grace", grace=3.0) == []


def test_multiprocessing_helpers_of_the_test_process_are_not_leftovers(monkeypatch):
    """The resource tracker that a first multiprocessing pool starts lives as long as the test
    process, by design; it is neither reported nor killed."""
    import multiprocessing
    from multiprocessing import resource_tracker

    monkeypatch.setenv(TAG, "reaper-helpers")
    resource_tracker.ensure_running()
    tracker = resource_tracker._resource_tracker._pid
    if tracker is None:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            pool.map(abs, [1])
    assert reaper.reap(TAG, "reaper-helpers", grace=0.2) == []


def test_a_test_that_leaves_a_process_behind_fails(tmp_path):
    """The conftest guard, run by pytest on a test file of its own: the passing test that leaves
    a sleeper fails with its command named, and the sleeper is gone."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F401,F403\n")
    (tmp_path / "test_leak.py").write_text(textwrap.dedent("""
        import subprocess

        def test_leaks():
            subprocess.Popen(["sleep", "303"], start_new_session=True)

        def test_clean():
            subprocess.run(["true"], check=True)
    """))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--rootdir", str(tmp_path), str(tmp_path)],
                         check=False, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 1, run.stdout
    assert "2 passed, 1 error" in run.stdout and "ERROR at teardown of test_leaks" in run.stdout
    assert "process(es) outlived the test and were killed: pid" in run.stdout
    assert "sleep 303" in run.stdout
    assert not [p for p in reaper.tagged(TAG, os.environ[TAG]) if "303" in p.command]


def test_a_process_inside_execve_is_still_found(monkeypatch, tmp_path):
    """A process reads an empty environment while it execs its next program: a shell that
    exec's itself a thousand times is found by every scan that it outlives."""
    monkeypatch.setenv(TAG, "reaper-exec")
    chain = tmp_path / "chain.sh"
    chain.write_text('n=$1; if [ "$n" -gt 0 ]; then exec sh "$0" $((n - 1)); fi; exec sleep 0.2\n')
    proc = subprocess.Popen(["sh", str(chain), "1000"])
    scans, missed = 0, []
    while True:
        found = reaper.tagged(TAG, "reaper-exec")
        if proc.poll() is not None:  # it lived through the whole scan
            break
        scans += 1
        if [p.pid for p in found] != [proc.pid]:
            missed.append(found)
    assert scans > 20 and missed == []


def test_a_program_started_without_an_environment_is_not_waited_for(monkeypatch):
    """Its environment reads empty as one inside execve does, but its command line stays the
    same: one look again, not 0.2 s of them."""
    monkeypatch.setenv(TAG, "reaper-empty")
    bare = subprocess.Popen(["env", "-i", "sleep", "30"])
    cmdline = Path(f"/proc/{bare.pid}/cmdline")
    pauses, pause = [], time.sleep
    try:
        while cmdline.read_bytes() != b"sleep\x0030\x00":  # until env has exec'd sleep
            pause(0.01)
        monkeypatch.setattr(time, "sleep", lambda s: (pauses.append(s), pause(s)))
        assert reaper.tagged(TAG, "reaper-empty") == []
        monkeypatch.undo()
        assert 1 <= len(pauses) < 10
    finally:
        bare.kill()
        bare.wait()
