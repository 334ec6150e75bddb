"""`python -m bertperf launch --nproc-per-node N train`: start this node's N ranks of a bertperf
command through torch.distributed's elastic launcher, as `torchrun --standalone` does, and when the
job fails, end with one line naming the rank whose failure started it.

When a rank dies, the others fail after it (a collective breaks, or the launcher stops them with
SIGTERM) and each says so, naming itself; torchrun then prints a report of many lines. Here the
launcher's report becomes the last line, e.g. `rank 1 (local rank 1, pid 4242) died: SIGKILL`, with
exit status 1. A rank that fails with a one-line error also writes it to the error file the
launcher gives each rank (TORCHELASTIC_ERROR_FILE, through torch's ErrorHandler), so the line can
quote it, and so that the failures that only follow another's (train.dist.FollowOnError) are told
apart from the one that caused them. The launcher's own log lines are silenced: the rank's lines
and this one say what happened.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator, Mapping

from bertperf.errors import PREEMPTED, PREEMPTION_SIGNAL, UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                   help="ranks to start on this node, one per GPU (default 1)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="when a rank fails, start every rank again up to N times, resuming from "
                        "the newest checkpoint in CHECKPOINT_DIR (RESUME_FROM=auto; none: from "
                        "the start); a failure with no newer checkpoint than the last one's "
                        "stops the job (default 0)")
    p.add_argument("command", choices=("train",), help="the bertperf command every rank runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its flags")


def _reported(failure) -> str:
    """What the rank wrote to its error file ("<Type>: <message>" in torch's ErrorHandler
    format); "" when it wrote none (the launcher then makes up a message string of its own)."""
    message = failure.message
    return message.get("message", "") if isinstance(message, dict) else ""


FOLLOWER_GRACE_S = 2.0
"""How long a rank whose failure only follows another's waits before it exits under a launcher,
so that the launcher hears first from the rank that caused it (the launcher stops every other
rank, with SIGTERM, as soon as one exits)."""


def _blame(failure) -> int:
    """0: the failure's own cause (its own error, or death by a signal other than the launcher's
    SIGTERM); 1: stopped by the launcher's SIGTERM before it said anything; 2: a FollowOnError."""
    from bertperf.train.dist import FollowOnError

    said = _reported(failure)
    if said.startswith(f"{FollowOnError.__name__}: "):
        return 2
    return 1 if not said and failure.exitcode == -signal.SIGTERM else 0


def _first(failures: Mapping[int, object]) -> tuple[int, object]:
    """(global rank, ProcessFailure) of the failure that caused the others: a rank's own error
    or death first, then ranks the launcher stopped, then the FollowOnErrors; within each, the
    launcher's order (earliest first)."""
    return min(failures.items(), key=lambda item: (_blame(item[1]), item[1].timestamp))


def failure_line(failures: Mapping[int, object]) -> str:
    """One line on the failure that caused the others among `failures` ({global rank: torch's
    ProcessFailure}), as _first orders them."""
    rank, failure = _first(failures)
    who = f"rank {rank} (local rank {failure.local_rank}, pid {failure.pid})"
    said = _reported(failure).split(": ", 1)[-1]
    if failure.exitcode >= 0:
        return f"{who} exited with status {failure.exitcode}" + (f": {said}" if said else "")
    if said:
        return f"{who} failed: {said} (then {failure.signal_name()})"
    return f"{who} died: {failure.signal_name()}"


@contextlib.contextmanager
def reported_to_launcher(under_launcher: bool) -> Iterator[None]:
    """On a rank: a one-line error raised inside also goes to the error file the launcher gave
    this rank, if any (nothing is written outside `launch` and torchrun). Under a launcher, a
    rank whose failure only follows another's (FollowOnError) waits FOLLOWER_GRACE_S first."""
    from bertperf.train.dist import FollowOnError

    try:
        yield
    except (UserError, OSError) as exc:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler
        get_error_handler().record_exception(exc)
        if under_launcher and isinstance(exc, FollowOnError):
            time.sleep(FOLLOWER_GRACE_S)
        raise


def children(pid: int) -> list[int]:
    """The processes `pid` started (Linux's /proc/PID/task/*/children)."""
    found = []
    for tasks in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found += [int(child) for child in tasks.read_text().split()]
    return found


def forward_warning(signum, frame) -> None:
    """The preemption warning (errors.PREEMPTION_SIGNAL), to every rank this launcher
    started: each acts on it at a step (the launcher itself carries on)."""
    for child in children(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)


def run(args: argparse.Namespace) -> int:
    signal.signal(PREEMPTION_SIGNAL, forward_warning)
    if args.nproc_per_node < 1:
        raise UserError(f"--nproc-per-node must be at least 1, got {args.nproc_per_node}")
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if args.nproc_per_node > 1:  # as torchrun: one thread per rank unless told otherwise
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    quiet = logging.getLogger("torch.distributed.elastic")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    if args.max_restarts < 0:
        raise UserError(f"--max-restarts must be at least 0, got {args.max_restarts}")
    last: object = NEVER  # the newest checkpoint when a rank last failed
    for attempt in range(args.max_restarts + 1):
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=args.nproc_per_node,
                              run_id=str(uuid.uuid4()), rdzv_backend="c10d",
                              rdzv_endpoint="localhost:0", max_restarts=0)
        try:
            elastic_launch(config, sys.executable)("-u", "-m", "bertperf", args.command,
                                                   *args.args)
            return 0
        except ChildFailedError as exc:
            if _first(exc.failures)[1].exitcode == PREEMPTED:  # every rank saved and stopped
                print(f"launch: the ranks stopped at the preemption warning, their checkpoint "
                      f"saved (exit status {PREEMPTED})", file=sys.stderr)
                return PREEMPTED
            line = failure_line(exc.failures)
            if attempt == args.max_restarts:
                raise UserError(line) from None
            folder, newest = restart_point()
            if newest == last:
                raise UserError(f"{line}, again with no checkpoint newer than "
                                f"{newest or 'the start'}: not restarting")
            last = newest
            print(f"launch: {line}; starting every rank again from {newest or 'the start'} "
                  f"(restart {attempt + 1} of {args.max_restarts})", file=sys.stderr)
            if folder is not None:
                os.environ["RESUME_FROM"] = "auto"  # the ranks' environment
        except SignalException as exc:
            raise UserError(f"launch: stopped by {exc.sigval.name}; the ranks were stopped "
                            "too") from None
    return 0


NEVER = object()
"""`run`'s newest checkpoint at the last failure, before any failure."""


def restart_point() -> tuple[Path | None, Path | None]:
    """(CHECKPOINT_DIR, or None; its newest checkpoint, or None) as the ranks read them."""
    from bertperf import config
    from bertperf.train.checkpoint import newest_first

    folder = config.load(dict(os.environ)).checkpoint.checkpoint_dir
    found = newest_first(folder) if folder is not None and folder.is_dir() else []
    return folder, found[0] if found else None
