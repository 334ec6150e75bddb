"""MLPerf-compliant logging (training ruleset 5.0.0, closed BERT) through `mlperf_logging.mllog`.

The one place the trainer talks to mllog. Only rank 0 writes; other ranks get a logger whose calls
do nothing. Each event's metadata `file`/`lineno` names the trainer's call site (not this module),
because the package checker's seed check keys on it. Values must be JSON-serialisable: mllog drops a
line it cannot encode and only prints a warning, so tensors and numpy scalars are converted here.
Facts on what the checkers demand: ../shared/docs/mlperf_logging.md.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

from mlperf_logging import mllog
from mlperf_logging.mllog import constants as C  # noqa: N812 (MLPerf's own constant names)

from bertperf.benchmark import BENCHMARK



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


class MLPerfLogger:
    """Rank-0 MLPerf logger writing `:::MLLOG {...}` lines to `path` (and stdout, as mllog does)."""

    def __init__(self, path: str | Path | None, rank: int = 0, root_dir: str | None = None,
                 echo: bool = True) -> None:
        self.enabled = rank == 0
        if not self.enabled:
            return
        import logging

        logger = logging.getLogger(f"bertperf.mllog.{id(self)}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        if echo:
            logger.addHandler(logging.StreamHandler())
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            logger.addHandler(logging.FileHandler(str(path)))
        # stack offset 2: the frame that called event/start/end on this object
        mllog.config(logger=logger, default_stack_offset=2, root_dir=root_dir)
        self._mllogger = mllog.get_mllogger()

    def _log(self, kind: str, key: str, value: Any, metadata: dict | None) -> None:
        if self.enabled:
            getattr(self._mllogger, kind)(key=key, value=_plain(value),
                                          metadata=_plain(metadata or {}), stack_offset=3)

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
