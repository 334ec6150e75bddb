"""The GPU tests need Triton compiled (bertperf.kernels, the code inductor writes); a run that also
holds the CPU tests interprets Triton (tests/conftest.py), so there they skip and say how to run
them: on their own, as `make gpu-check` does."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def compiled_triton():
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("Triton is interpreted in this run (the CPU tests'); run tests/gpu on its own: "
                    "make gpu-check, or pytest tests/gpu")
