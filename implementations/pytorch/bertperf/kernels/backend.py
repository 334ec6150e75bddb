"""Which implementation a kernel function runs: the Triton kernels (bertperf.kernels.triton) for
CUDA tensors when Triton is installed, plain PyTorch everywhere else. Triton itself is imported
only when a kernel first runs."""

from __future__ import annotations

import functools
import importlib.util

import torch


@functools.cache
def triton_installed() -> bool:
    """Whether `import triton` would work (found without importing it)."""
    return importlib.util.find_spec("triton") is not None


_selected: bool | None = None


def select(setting: bool | None) -> None:
    """The run's FUSED_KERNELS (set once per run, train.loop.build_step): None (auto) or True,
    the Triton path where use_triton allows it; False, plain PyTorch everywhere."""
    global _selected
    _selected = setting


def use_triton(x: torch.Tensor) -> bool:
    """Whether the kernel functions take the Triton path for tensors like x: CUDA tensors with
    Triton installed, unless FUSED_KERNELS=0 selected plain PyTorch."""
    return _selected is not False and x.is_cuda and triton_installed()


def activation_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype activations have where x (a parameter) enters the model: autocast's dtype
    while autocast is on for x's device, else x's own."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
