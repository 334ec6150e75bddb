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

BETWEEN_PROGRAMS = object()
"""What `_match` says of a live user process whose environment reads empty: it is inside
execve, between its old program and its new one, for a millisecond or so."""


def _match(pid: str, needle: bytes) -> Leftover | object | None:
    """The process `pid` if its environment holds `needle`, BETWEEN_PROGRAMS, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        state, parent, flags = fields[0], int(fields[1]), int(fields[6])
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
        if not environ:
            live_user = state not in "ZX" and not flags & PF_KTHREAD
            return BETWEEN_PROGRAMS if live_user else None
        if needle not in environ.split(b"\0"):
            return None
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
        return None
    if parent == os.getpid() and " -c from multiprocessing." in command:
        return None
    return Leftover(int(pid), command)


def tagged(variable: str, tag: str) -> list[Leftover]:
    """The live processes (zombies have no environment left) whose environment holds
    variable=tag,
    but the helpers Python's multiprocessing starts for the calling process itself (its resource
    tracker), which live as long as that process by design. A process caught inside execve is
    read again until its new program's environment is in place (up to 0.2 s)."""
    needle = f"{variable}={tag}".encode()
    pending = [e.name for e in os.scandir("/proc")
               if e.name.isdigit() and int(e.name) != os.getpid()]
    found = []
    for _ in range(40):
        again = []
        for pid in pending:
            match = _match(pid, needle)
            if match is BETWEEN_PROGRAMS:
                again.append(pid)
            elif match is not None:
                found.append(match)
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
