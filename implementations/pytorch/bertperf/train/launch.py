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
from typing import Iterator, Mapping

from bertperf.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                   help="ranks to start on this node, one per GPU (default 1)")
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


def failure_line(failures: Mapping[int, object]) -> str:
    """One line on the failure that caused the others among `failures` ({global rank: torch's
    ProcessFailure}): a rank's own error or death first, then ranks the launcher stopped, then
    the FollowOnErrors; within each, the launcher's order (earliest first)."""
    rank, failure = min(failures.items(), key=lambda item: (_blame(item[1]), item[1].timestamp))
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


def run(args: argparse.Namespace) -> int:
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
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=args.nproc_per_node,
                          run_id=str(uuid.uuid4()), rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", max_restarts=0)
    try:
        elastic_launch(config, sys.executable)("-u", "-m", "bertperf", args.command, *args.args)
    except ChildFailedError as exc:
        raise UserError(failure_line(exc.failures)) from None
    except SignalException as exc:
        raise UserError(f"launch: stopped by {exc.sigval.name}; the ranks were stopped "
                        "too") from None
    return 0
