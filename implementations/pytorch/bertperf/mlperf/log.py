"""MLPerf-compliant logging (training ruleset 5.0.0, closed BERT) through `mlperf_logging.mllog`.

The one place the trainer talks to mllog. Only rank 0 writes, and only rank 0 touches the file;
other ranks get a logger whose calls do nothing. A run starts a fresh log: an earlier log at the
same path (the same MLLOG_FILE run twice) is kept as <path>.1, .2, ... rather than appended to,
since two runs in one file fail the compliance checker. Each event's metadata `file`/`lineno`
names the caller of event/start/end (the trainer's line for the seed), because the package
checker's seed check keys on it. Values must be JSON-serialisable: mllog drops a line it cannot
encode and only prints a warning, so tensors and numpy scalars are converted here.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import itertools
import logging
import numbers
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any, Callable

from mlperf_logging import mllog
from mlperf_logging.mllog import constants as C  # noqa: N812 (MLPerf's own constant names)

from bertperf.benchmark import BENCHMARK
from bertperf.errors import UserError
from bertperf.formats.files import write_failure

_LOGGER_PREFIX = "bertperf.mllog."
_logger_numbers = itertools.count()

RESUMED = "resumed"
"""Our extra key (the checkers skip unknown keys): value = the checkpoint a resumed run starts
from; metadata step and samples_count, where it goes on. Logged during init."""

LAYERWISE_STAGE = "layerwise_stage"
"""Our extra key, as RESUMED (the checkers skip unknown keys): value = the stage a LAYERWISE run
trains in from here (1 = the first); metadata samples_count and step (where it begins), layers
(the encoder's depth) and trained ("all" or "new"). Logged when a stage begins."""

GRAD_COMM_BYTES = "grad_comm_bytes"
"""Our extra key, as RESUMED: value = the bytes a rank handed to collectives over all ranks per
optimizer step, averaged over the run (bertperf.train.comm.Traffic); metadata grad_comm (the
setting), reduction (what ran: none on one rank), world_bytes, node_bytes (within a node only)
and steps. Logged at the end of a run, before run_stop."""


def keep_previous(path: Path) -> Path | None:
    """Move an earlier log at `path` to <path>.N, N one above the highest kept already (so no
    kept log is ever overwritten); the new name, or None when there is no earlier (non-empty) log."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    numbered = re.compile(re.escape(path.name) + r"\.(\d+)")
    taken = [int(m.group(1)) for p in path.parent.iterdir() if (m := numbered.fullmatch(p.name))]
    kept = path.with_name(f"{path.name}.{max(taken, default=0) + 1}")
    path.rename(kept)
    return kept


def _plain(value: Any) -> Any:
    """JSON-ready: tensors and numpy scalars to Python numbers; lists/dicts recursively."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, bool, numbers.Number)):
        return value
    raise TypeError(f"MLPerf log value {value!r} of type {type(value).__name__} is not JSON-ready")


class _Passthrough(BaseException):
    """Carries an exception raised inside a write (SIGTERM's handler raising FollowOnError
    mid-flush) past logging's and mllog's `except Exception` clauses, which would print it or
    log it into the MLPerf log and go on; MLPerfLogger raises it again."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(exc)
        self.exc = exc


class _StrictFileHandler(logging.FileHandler):
    """A FileHandler that remembers a failed write (a full disk) instead of printing logging's
    "--- Logging error ---" and going on; the logger then stops the run. Any other exception
    raised while writing goes on up (_Passthrough)."""

    failed: OSError | None = None

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            self.failed = self.failed or exc
        elif isinstance(exc, Exception):
            raise _Passthrough(exc) from None
        else:
            super().handleError(record)


class LogLock:
    """An exclusive lock on a log's path for as long as this process writes it: a hidden
    `.<name>.lock` file beside it, holding "<pid> <host>", locked with flock (which the kernel
    releases when the process ends, however it ends) and removed at a normal exit."""

    def __init__(self, path: Path) -> None:
        self.file = path.with_name(f".{path.name}.lock")
        while True:
            fd = os.open(self.file, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode(errors="replace").split()
                os.close(fd)
                who = f"pid {holder[0]} on {holder[1]}" if len(holder) == 2 else "another process"
                raise UserError(f"MLPerf log {path} is being written by another run ({who}; "
                                f"lock {self.file}): give this run its own LOGDIR or MLLOG_FILE, "
                                "or let that run end") from None
            try:  # the holder before us may have removed the file between our open and flock
                if os.stat(self.file).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self.fd: int | None = fd
        atexit.register(self.release)

    def release(self) -> None:
        """Remove the lock file and unlock (in that order: a run waiting for it then finds the
        file gone and makes its own)."""
        if self.fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.file)
            os.close(self.fd)
            self.fd = None


_held: list[LogLock] = []  # the lock of the newest MLPerfLogger of this process


class MLPerfLogger:
    """Rank-0 MLPerf logger writing `:::MLLOG {...}` lines to `path` (and to stderr with `echo`).
    mllog has one logger per process: the newest MLPerfLogger is the one that writes, and making
    one closes the file (and releases the lock) of the one before. A log another live process
    writes is refused (LogLock); a write that fails (a full disk) raises a one-line UserError
    and nothing more is logged."""

    def __init__(self, path: str | Path | None, rank: int = 0, root_dir: str | None = None,
                 echo: bool = True) -> None:
        self.enabled = rank == 0
        self.path = None if path is None else Path(path)
        self.kept: Path | None = None
        """Where an earlier log at `path` was moved (keep_previous); None when there was none."""
        self._file: _StrictFileHandler | None = None
        if not self.enabled:
            return
        previous = mllog.get_mllogger().logger
        if previous.name.startswith(_LOGGER_PREFIX):
            for handler in list(previous.handlers):
                previous.removeHandler(handler)
                handler.close()
        while _held:
            _held.pop().release()
        logger = logging.getLogger(f"{_LOGGER_PREFIX}{next(_logger_numbers)}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        if echo:
            logger.addHandler(logging.StreamHandler())
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                _held.append(LogLock(self.path))
                self.kept = keep_previous(self.path)
                self._file = _StrictFileHandler(str(self.path), mode="w")
            except OSError as exc:
                raise UserError(f"MLPerf log {self.path}: cannot write: "
                                f"{write_failure(exc) or exc}") from None
            logger.addHandler(self._file)
        # stack offset 2: the frame that called event/start/end on this object
        mllog.config(logger=logger, default_stack_offset=2, root_dir=root_dir)
        self._mllogger = mllog.get_mllogger()

    def _log(self, kind: str, key: str, value: Any, metadata: dict | None) -> None:
        if not self.enabled:
            return
        try:
            getattr(self._mllogger, kind)(key=key, value=_plain(value),
                                          metadata=_plain(metadata or {}), stack_offset=3)
        except _Passthrough as passed:
            raise passed.exc from None
        if self._file is not None and self._file.failed is not None:
            self.enabled = False  # the run_stop of the error's way out cannot be written either
            raise UserError(f"MLPerf log {self.path}: cannot write: "
                            f"{write_failure(self._file.failed)}; the run stops")

    def event(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        self._log("event", key, value, metadata)

    def start(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        self._log("start", key, value, metadata)

    def end(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        self._log("end", key, value, metadata)

    # ---- the fixed parts of a BERT run ---------------------------------------------------------

    def submission(self, org: str, platform: str, division: str = C.CLOSED,
                   status: str = C.ONPREM) -> None:
        """The submission_* keys; call between init_start and init_stop (division before init_stop)."""
        self.event(C.SUBMISSION_BENCHMARK, BENCHMARK)
        self.event(C.SUBMISSION_ORG, org)
        self.event(C.SUBMISSION_PLATFORM, platform)
        self.event(C.SUBMISSION_DIVISION, division)
        self.event(C.SUBMISSION_STATUS, status)

    def hyperparameters(self, values: dict[str, Any]) -> None:
        """One event per hyperparameter key (names as in mllog.constants)."""
        for key, value in values.items():
            self.event(key, value)

    def resumed(self, checkpoint: str | Path, step: int, samples: int) -> None:
        """The RESUMED event: this run goes on from `checkpoint`, after `step` optimizer steps and
        `samples` samples. Call during init."""
        self.event(RESUMED, str(checkpoint), metadata={"step": step, "samples_count": samples})

    def layerwise_stage(self, stage: int, layers: int, trained: str, step: int,
                        samples: int) -> None:
        """The LAYERWISE_STAGE event: stage `stage` (1-based) of `layers` encoder layers, which
        trains `trained` ("all" or "new") of them, begins after `step` steps and `samples`
        samples."""
        self.event(LAYERWISE_STAGE, stage, metadata={"layers": layers, "trained": trained,
                                                     "step": step, "samples_count": samples})

    def grad_comm_bytes(self, grad_comm: str, reduction: str, per_step: float, world: int,
                        node: int, steps: int) -> None:
        """The GRAD_COMM_BYTES event (call before run_stop)."""
        self.event(GRAD_COMM_BYTES, round(per_step, 1),
                   metadata={"grad_comm": grad_comm, "reduction": reduction,
                             "world_bytes": world, "node_bytes": node, "steps": steps})


class Blocks:
    """The block and eval events of a BERT run, with their metadata, in the order the checkers
    expect: training happens inside blocks (block_start at the samples trained so far); an eval
    closes the open block (block_stop) and is logged as eval_start, eval_accuracy, eval_stop with
    epoch_num = samples trained; training after it opens a new block; the end of the run closes
    the block an eval has not closed."""

    def __init__(self, log: MLPerfLogger) -> None:
        self.log = log
        self.open = False

    def start(self, samples: int) -> None:
        """Open a block at `samples` (nothing when one is open)."""
        if not self.open:
            self.log.start(C.BLOCK_START, metadata={C.FIRST_EPOCH_NUM: 0, C.EPOCH_COUNT: 1,
                                                    "samples_count": samples})
            self.open = True

    def stop(self, samples: int) -> None:
        """Close the open block at `samples` (nothing when none is open)."""
        if self.open:
            self.log.end(C.BLOCK_STOP, metadata={C.FIRST_EPOCH_NUM: 0, "samples_count": samples})
            self.open = False

    def evaluate(self, samples: int, evaluate: Callable[[], float]) -> float:
        """Close the block, run `evaluate` between eval_start and eval_stop, log its accuracy."""
        self.stop(samples)
        self.log.start(C.EVAL_START, metadata={C.EPOCH_NUM: samples})
        accuracy = evaluate()
        self.log.event(C.EVAL_ACCURACY, accuracy, metadata={C.EPOCH_NUM: samples})
        self.log.end(C.EVAL_STOP, metadata={C.EPOCH_NUM: samples})
        return accuracy
