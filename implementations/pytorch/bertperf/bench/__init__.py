"""Benchmarks: each prints a table; results are recorded in docs/performance.md."""

from __future__ import annotations

import platform
from pathlib import Path

CALIBRATION_TOLERANCE = 0.15
"""How far the step model's A100 prediction may be from NVIDIA's published MLPerf rates
(bench scale's calibration; bench train quotes it)."""


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), for a benchmark's machine line."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"
