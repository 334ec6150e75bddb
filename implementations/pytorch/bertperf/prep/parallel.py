"""Run a stage's per-file tasks on N local worker processes and across MPI ranks.

Under `mpirun -np K` (detected from OpenMPI/PMI environment variables) rank r takes tasks r, r+K, ...
and the results are all-gathered, so every rank knows whether the stage failed and rank 0 can write
the manifest. A failing task never hangs the others: its error is returned as a value.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from bertperf.config import mpi_world_size
from bertperf.errors import UserError
from bertperf.formats.files import os_error_line


@dataclass
class TaskFailure:
    """A task's error, carried back to the coordinator instead of raised in the worker."""

    message: str


class World:
    """This process's place among MPI ranks (rank 0 of 1 when not launched by mpirun)."""

    def __init__(self) -> None:
        size = mpi_world_size()
        self.comm = None
        self.rank, self.size = 0, 1
        if size > 1:
            try:
                from mpi4py import MPI
            except ImportError:
                raise UserError(
                    "launched by mpirun with several ranks but mpi4py is not installed "
                    "(pip install 'bertperf[mpi]')"
                ) from None
            self.comm = MPI.COMM_WORLD
            self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def allgather(self, value: Any) -> list[Any]:
        return self.comm.allgather(value) if self.comm is not None else [value]

    def barrier(self) -> None:
        if self.comm is not None:
            self.comm.Barrier()


def _guarded(payload: tuple[Callable, Any]) -> Any:
    fn, task = payload
    try:
        return fn(task)
    except UserError as exc:
        return TaskFailure(str(exc))
    except OSError as exc:
        return TaskFailure(os_error_line(exc))
    except Exception as exc:  # a bug: keep the traceback, but one line on the console
        traceback.print_exc(file=sys.stderr)
        return TaskFailure(f"{type(exc).__name__}: {exc}")


def _progress_bar(total: int, desc: str, unit: str):
    """A progress bar on a terminal; None elsewhere (tqdm is then not even imported)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)


def run_tasks(
    fn: Callable[[Any], Any],
    tasks: Sequence[Any],
    *,
    workers: int = 1,
    desc: str = "",
    unit: str = "file",
    world: World | None = None,
) -> list[Any]:
    """Run fn(task) for every task (this rank's share), and return all ranks' results in task order.

    Raises UserError naming the first failed task (and how many others failed) on every rank.
    `fn` must be a module-level function and tasks picklable (workers are spawned processes).
    """
    world = world or World()
    mine = list(range(world.rank, len(tasks), world.size))
    results: dict[int, Any] = {}
    # progress on a terminal only, and from rank 0 only
    bar = _progress_bar(len(mine), desc, unit) if world.rank == 0 and mine else None
    if workers <= 1 or len(mine) <= 1:
        for i in mine:
            results[i] = _guarded((fn, tasks[i]))
            if bar is not None:
                bar.update()
    else:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(min(workers, len(mine))) as pool:
            it = pool.imap(_guarded, [(fn, tasks[i]) for i in mine], chunksize=1)
            for i, res in zip(mine, it):
                results[i] = res
                if bar is not None:
                    bar.update()
    if bar is not None:
        bar.close()
    merged: dict[int, Any] = {}
    for part in world.allgather(results):
        merged.update(part)
    ordered = [merged[i] for i in range(len(tasks))]
    failures = [r for r in ordered if isinstance(r, TaskFailure)]
    if failures:
        more = f" ({len(failures) - 1} more task(s) failed)" if len(failures) > 1 else ""
        raise UserError(failures[0].message + more)
    return ordered


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))
