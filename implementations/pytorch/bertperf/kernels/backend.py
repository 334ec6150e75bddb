"""Which implementation a kernel function runs: the Triton kernels (bertperf.kernels.triton) for
CUDA tensors when Triton is installed, plain PyTorch everywhere else, as the `Kernels` value the
caller passes says (the model and FlatLamb carry theirs; train.parallel.parallelize sets it from
FUSED_KERNELS). Triton itself is imported only when a kernel first runs."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch


_TRITON_FOUND = importlib.util.find_spec("triton") is not None
"""Whether `import triton` would work, found once without importing it (torch.compile refuses to
trace importlib's find_spec, so the step never calls it)."""


def triton_installed() -> bool:
    """Whether `import triton` would work (found without importing it)."""
    return _TRITON_FOUND


@dataclass(frozen=True)
class Kernels:
    """How the kernel functions run. fused: FUSED_KERNELS (None: auto, True: the Triton path
    where `use_triton` allows it; False: plain PyTorch everywhere). assume_cuda: take every
    tensor for a CUDA tensor with Triton installed (to trace CUDA's step on CPU or fake tensors,
    the performance model, or to interpret the kernels on the CPU in the tests). launchers: stand-ins
    by name for the launchers of bertperf.kernels.triton that call their kernels outside ATen
    ("lamb.step": triton/lamb.py's step), for tracing; the real ones where not given."""

    fused: bool | None = None
    assume_cuda: bool = False
    launchers: Mapping[str, Callable] = field(default_factory=dict, hash=False)

    def use_triton(self, x: torch.Tensor) -> bool:
        """Whether the kernel functions take the Triton path for tensors like x: CUDA tensors
        with Triton installed (or assume_cuda), unless fused is False."""
        return (self.fused is not False and (x.is_cuda or self.assume_cuda)
                and (self.assume_cuda or triton_installed()))


def activation_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype activations have where x (a parameter) enters the model: autocast's dtype
    while autocast is on for x's device, else x's own."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
