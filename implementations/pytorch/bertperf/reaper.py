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


def tagged(variable: str, tag: str) -> list[Leftover]:
    """The live processes (zombies have no environment left) whose environment holds
    variable=tag,
    but the helpers Python's multiprocessing starts for the calling process itself (its resource
    tracker), which live as long as that process by design."""
    needle = f"{variable}={tag}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{entry.name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
            continue
        if parent == os.getpid() and " -c from multiprocessing." in command:
            continue
        found.append(Leftover(int(entry.name), command))
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
