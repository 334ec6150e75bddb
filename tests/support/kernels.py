"""Checking a kernel against its reference in float64: random leaf inputs, and the same forward
output and the same gradients into every input (assert_same_fwd_bwd), for the plain PyTorch
kernels (test_kernels.py) and attention (test_attention.py)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

F64 = dict(dtype=torch.float64)


class CustomOps(TorchDispatchMode):
    """Records the bertperf custom ops dispatched (`names`: "bertperf::op", backward ops with
    their "_backward" suffix): which implementation ran."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "bertperf":
            self.names.add(func._schema.name)
        return func(*args, **(kwargs or {}))


def leaves(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, **F64).requires_grad_() for s in shapes]


def grads(out: torch.Tensor, inputs: list[torch.Tensor], seed: int = 1) -> list[torch.Tensor]:
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), **F64)
    return list(torch.autograd.grad(out, inputs, g))


def assert_same_fwd_bwd(fast, ref, inputs: list[torch.Tensor], rtol=1e-12, atol=1e-12) -> None:
    out, expected = fast(*inputs), ref(*inputs)
    torch.testing.assert_close(out, expected, rtol=rtol, atol=atol)
    for a, b in zip(grads(out, inputs), grads(expected, inputs)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
