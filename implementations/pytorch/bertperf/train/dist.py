"""The process group: one process per device, DDP applied around the single-device model."""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
import torch.distributed as tdist

from bertperf.config import DistConfig
from bertperf.errors import PREEMPTION_SIGNAL, UserError


@dataclass
class Dist:
    """This process's rank and world size, and the sum over ranks (identity when alone)."""

    rank: int
    world_size: int

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """values summed over ranks (a new tensor; float64 keeps integer counts exact)."""
        out = values.clone()
        if self.active:
            tdist.all_reduce(out)
        return out

    def any(self, flag: bool, device: torch.device) -> bool:
        """Whether `flag` holds on any rank: every rank calls it at the same point (one
        all-reduce and one host sync; none with one rank)."""
        if not self.active:
            return flag
        return bool(self.sum(torch.tensor([float(flag)], device=device)).item())

    def from_rank0(self, value: int, device: torch.device) -> int:
        """Rank 0's value of an integer, on every rank."""
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=device)
        tdist.broadcast(t, src=0)
        return int(t.item())

    def close(self) -> None:
        """Leave the group (any group this process is in, one rank's included): a barrier, so
        that every rank's collectives are done; on gloo, then, the GIL free, until its worker
        threads are idle (threads_idle); then destroy it. The one way out of a group, for the
        trainer, its benchmarks and the tests (docs/design.md, "Leaving the process group")."""
        _heartbeat.stop.set()
        if tdist.is_initialized():
            tdist.barrier()
            if tdist.get_backend() == "gloo":
                threads_idle(native_threads)
            tdist.destroy_process_group()


def native_threads() -> list[int]:
    """This process's threads that Python did not start (thread ids): gloo's workers (named
    pt_gloo_runloop from torch 2.11, unnamed on 2.10), its transport loop, the intra-op pool."""
    python = {t.native_id for t in threading.enumerate()}
    return [tid for tid in map(int, os.listdir("/proc/self/task")) if tid not in python]


def threads_idle(tids: Callable[[], Iterable[int]], timeout: float = 2.0, looks: int = 3) -> bool:
    """Wait, sleeping (so the GIL is free), until the threads `tids` lists have been asleep on
    `looks` looks 5 ms apart. For gloo's workers that means done with their last collective,
    including freeing its tensors, which on torch 2.10-2.12 takes the GIL: a worker still asking
    for it when the interpreter shuts down is ended by CPython with pthread_exit, whose unwinding
    through the work's destructor aborts the process. False after `timeout` seconds, or where
    /proc/self/task cannot be read (after the same wait)."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < looks:
        if time.monotonic() > deadline:
            return False
        try:
            states = [_state(tid) for tid in tids()]
        except OSError:
            time.sleep(timeout)
            return False
        quiet = quiet + 1 if all(s in ("S", None) for s in states) else 0
        time.sleep(0.005)
    return True


def _state(tid: int) -> str | None:
    """A thread's state letter (R running or runnable, S asleep, D in I/O, ...); None when it
    has ended."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def init(cfg: DistConfig, device: torch.device) -> Dist:
    """Join the job described by cfg (no process group for a single process)."""
    if cfg.world_size > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # torchrun: its agent serves the store on MASTER_ADDR:MASTER_PORT, join it (env://);
        # srun / mpirun / hand-set RANK+WORLD_SIZE: rank 0 opens the store there (tcp://).
        init_method = "env://" if cfg.launcher_store else \
            f"tcp://{cfg.master_addr}:{cfg.master_port}"
        tdist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo", init_method=init_method,
            rank=cfg.rank, world_size=cfg.world_size,
            timeout=datetime.timedelta(seconds=cfg.dist_timeout))
        _heartbeat.start(cfg.rank, cfg.world_size, every=min(5.0, cfg.dist_timeout / 8))
    return Dist(cfg.rank, cfg.world_size)


class Heartbeat:
    """Every rank writes "<time> <host>" to the process group's store every `every` seconds (a
    daemon thread), so that when a collective fails the ranks that can still reach the store can
    name the ranks that went silent: a dead host or a cut link shows as ranks no longer heard
    from, where the collective itself only says that it timed out."""

    KEY = "bertperf/alive/{}"

    def __init__(self) -> None:
        self.every = 5.0
        self.rank = self.world_size = 0
        self.stop = threading.Event()

    def start(self, rank: int, world_size: int, every: float, store=None) -> None:
        """Beat for `rank` of `world_size` into `store` (default: the default group's)."""
        self.rank, self.world_size, self.every = rank, world_size, every
        self.stop.clear()
        self.store = store or tdist.distributed_c10d._get_default_store()
        self.beat()
        threading.Thread(target=self.run, name="bertperf-heartbeat", daemon=True).start()

    def beat(self) -> None:
        self.store.set(self.KEY.format(self.rank), f"{time.time():.3f} {socket.gethostname()}")

    def run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                self.beat()
            except Exception:  # the store is gone: the collective that waits on it will say so
                return

    def silent(self) -> str:
        """Which ranks have not been heard from for 3 heartbeats (and on which hosts), or why
        that cannot be told; "" when every rank is alive or there is no group."""
        if not self.world_size:
            return ""
        self.stop.set()
        try:
            self.store.set_timeout(datetime.timedelta(seconds=5))
            beats = [self.store.get(self.KEY.format(r)).decode().split(" ", 1)
                     for r in range(self.world_size)]
        except Exception:
            return "the rendezvous store cannot be reached either: this rank lost the others"
        now = time.time()
        lost = [(r, host, now - float(t)) for r, (t, host) in enumerate(beats)
                if now - float(t) > 3 * self.every]
        if not lost:
            return ""
        hosts = sorted({host for _, host, _ in lost})
        return (f"rank{'s' if len(lost) > 1 else ''} {', '.join(str(r) for r, _, _ in lost)} "
                f"(on {', '.join(hosts)}) silent for {min(a for _, _, a in lost):.0f} s: lost")


_heartbeat = Heartbeat()


class FollowOnError(UserError):
    """A rank's failure that follows another's: a collective broken by a peer that died, or the
    launcher stopping the job. `launch` names the rank whose failure was not one of these."""


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


_terminated: list[str] = []  # the SIGTERM message, once the signal came (handlers are per process)
_warned = threading.Event()  # the preemption warning (SIGUSR1) came to this process

_grace: list[Callable[[], bool]] = []  # whether a SIGTERM may wait for a checkpoint (grace_by)


def grace_by(fits: Callable[[], bool]) -> None:
    """From now on a SIGTERM for which `fits()` holds is taken as the preemption warning rather
    than ending the run (CHECKPOINT_GRACE: checkpoint.Checkpointer)."""
    _grace[:] = [fits]


def warned() -> bool:
    """Whether the preemption warning reached this process (failures_as_errors' handler)."""
    return _warned.is_set()


def raise_if_terminated() -> None:
    """Raise SIGTERM's FollowOnError again, at a step boundary. The handler raises where the main
    thread happens to be, and that can be where an exception is swallowed: a finalizer run by the
    garbage collector, a library's broad except clause. The run then stops here instead."""
    if _terminated:
        raise FollowOnError(_terminated[0])


@contextlib.contextmanager
def failures_as_errors(rank: int) -> Iterator[None]:
    """Turn the ways a job dies around this rank into one-line FollowOnErrors naming the rank:
    SIGTERM (torchrun, mpirun or Slurm stopping the job, e.g. after another rank failed or at the
    time limit; raised at once, and again by raise_if_terminated) and a failed collective (a peer
    that died; gloo notices at once, NCCL and a silent peer after DIST_TIMEOUT). The preemption
    warning (PREEMPTION_SIGNAL) only sets a flag (`warned`): the loop acts on it at a step."""
    def on_sigterm(signum, frame):
        if _grace and _grace[0]():  # a checkpoint fits before the kill: as the warning
            _warned.set()
            return
        _terminated[:] = [f"rank {rank}: stopped by SIGTERM (the launcher or Slurm ended the job)"]
        raise FollowOnError(_terminated[0])

    def forget() -> None:  # a signal is this run's: none reaches another run of the process
        _terminated.clear()
        _warned.clear()
        _grace.clear()

    forget()
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    previous_warning = signal.signal(PREEMPTION_SIGNAL, lambda signum, frame: _warned.set())
    try:
        yield
    except RuntimeError as exc:  # DistBackendError and the other torch.distributed errors
        if isinstance(exc, tdist.DistError) or any(
                word in str(exc) for word in ("gloo", "Gloo", "NCCL", "Connection closed")):
            lost = _heartbeat.silent()
            raise FollowOnError(f"rank {rank}: a collective failed ({_first_line(exc)}); "
                                + (lost or "did another rank die?")) from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(PREEMPTION_SIGNAL, previous_warning)
        forget()
