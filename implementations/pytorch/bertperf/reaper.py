"""No process outlives the work that started it (a test, a step of `make gpu-check`). The work
runs with its own tag in an environment variable; every process it starts inherits it, whatever
it becomes: a trainer rank in its own session under torch's launcher, an mpirun child, a Slurm
job step (sbatch exports the submitter's environment), which a process-group kill would miss.
After the work, `reap` finds the processes that still carry the tag in /proc/<pid>/environ and
kills them (Linux)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Leftover:
    pid: int
    command: str


PF_KTHREAD = 0x00200000
"""The flag in /proc/<pid>/stat of a kernel thread (no environment, ever)."""


def _read(pid: str, name: str) -> bytes:
    with open(f"/proc/{pid}/{name}", "rb") as f:
        return f.read()


def _process(pid: str, needle: bytes) -> tuple[bytes, str, int] | None:
    """Environment, command line and parent of the live user process `pid` if its environment
    holds `needle` or reads empty; None for any other, one gone, a zombie (no environment left),
    a kernel thread, or one not ours to read. Inside execve the environment reads empty, or the
    read fails with ESRCH, for a moment: it is given as empty."""
    try:
        try:
            environ = _read(pid, "environ")
        except ProcessLookupError:
            environ = b""
        if environ and needle not in environ.split(b"\0"):
            return None
        stat = _read(pid, "stat").rsplit(b")", 1)[1].split()
        if stat[0] in (b"Z", b"X") or int(stat[6]) & PF_KTHREAD:
            return None
        command = _read(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
        return environ, command, int(stat[1])
    except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
        return None


def tagged(variable: str, tag: str) -> list[Leftover]:
    """The live processes whose environment holds variable=tag, but the helpers Python's
    multiprocessing starts for the calling process itself (its resource tracker), which live as
    long as that process by design. A process whose environment reads empty is read again 5 ms
    later, until it reads the same command line twice with no environment (a program started
    with none) or has one (it was inside execve); for 0.2 s at most."""
    needle = f"{variable}={tag}".encode()
    pending = {e.name: None for e in os.scandir("/proc")
               if e.name.isdigit() and int(e.name) != os.getpid()}
    found = []
    for _ in range(40):
        again = {}
        for pid, before in pending.items():
            if (process := _process(pid, needle)) is None:
                continue
            environ, command, parent = process
            if not environ:
                if command != before or not command:
                    again[pid] = command
            elif not (parent == os.getpid() and " -c from multiprocessing." in command):
                found.append(Leftover(int(pid), command))
        if not again:
            break
        pending = again
        time.sleep(0.005)
    return found


def reap(variable: str, tag: str, grace: float = 3.0) -> list[Leftover]:
    """Kill every process tagged variable=tag that is still alive after `grace` seconds (a
    process told to stop at the end of its work may still be on its way out); the ones it had to
    kill."""
    deadline = time.monotonic() + grace
    while (left := tagged(variable, tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for _ in range(50):  # a process may start another while its siblings are killed
        for leftover in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(leftover.pid, signal.SIGKILL)
        time.sleep(0.05)
        if not (again := tagged(variable, tag)):
            break
        left = [*left, *(p for p in again if p not in left)]
    return list(dict.fromkeys(left))
