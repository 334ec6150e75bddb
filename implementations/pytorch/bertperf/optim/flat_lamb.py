"""LAMB over one flat fp32 buffer, as apex's FusedLAMB / DistributedFusedLAMB keep it: when FlatLamb
is built its parameters are copied into one buffer and re-pointed to their slices, their .grad
become views of one flat gradient buffer (autograd accumulates into it in place; DDP, bucket views
off, copies its reduced buckets into it), and the moments are two more flat buffers. A step is one
bertperf.kernels.lamb_step (three Triton launches on CUDA, plain PyTorch elsewhere) with Lamb's
arithmetic: bit for bit on the plain path, within 1e-6 on the kernels; a parameter marked
`lamb_row_blocks = n` counts as its n row blocks. Unlike Lamb, the groups share lr (the first
group's), betas, eps, bias_correction and grad_averaging (checked); every parameter takes part in
every step (no gradient: zeros); zero_grad zeroes the buffer in place, and a .grad replaced or set
to None is copied back first. state_dict() is Lamb's: checkpoints load into either."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from bertperf.kernels import Kernels
from bertperf.kernels.lamb import LambLayout, lamb_step
from bertperf.optim.lamb import Lamb, _row_blocks

SHARED = ("lr", "betas", "eps", "bias_correction", "grad_averaging")
"""Hyper-parameters every group of a FlatLamb must share (one lamb_step for all)."""


def flat_layout(groups: list[dict[str, Any]], device: torch.device) -> LambLayout:
    """The LambLayout of the groups' parameters in order: one tensor per row block (as Lamb
    splits a parameter marked `lamb_row_blocks`), with its group's weight decay and layer
    adaptation."""
    numels, decays, adapts = [], [], []
    for group in groups:
        for p in group["params"]:
            blocks = [b.numel() for b in _row_blocks(p, getattr(p, "lamb_row_blocks", 1))]
            numels += blocks
            decays += [float(group["weight_decay"])] * len(blocks)
            adapts += [Lamb.adapts(group)] * len(blocks)
    return LambLayout(numels, decays, adapts, device)


class FlatLamb(Lamb):
    """Lamb over flat fp32 buffers (module docstring). Arguments as Lamb's (ratios_on_host has
    no effect here), and kernels: how lamb_step runs (FUSED_KERNELS; default auto); the
    parameters must be fp32 tensors on one device, and must not be moved or re-created
    afterwards (they are views of this optimizer's buffer)."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], *,
                 kernels: Kernels = Kernels(), **options: Any) -> None:
        super().__init__(params, **options)
        self.kernels = kernels
        self._params = [p for group in self.param_groups for p in group["params"]]
        self._check_groups()
        self._device = self._params[0].device
        self._layout = flat_layout(self.param_groups, self._device)
        self._weights = self._flatten_weights()
        self._grads = torch.zeros_like(self._weights)
        self._grad_views = self._views(self._grads)
        self._make_moments()
        self._reattach(keep=True)

    def _buffer_numel(self) -> int:
        """Elements of the flat weight and gradient buffers: the parameters' (ShardedLamb pads
        them to a multiple of the world size)."""
        return self._layout.numel

    def _make_moments(self) -> None:
        """The two flat moment buffers, every parameter's state their views."""
        self._exp_avg = torch.zeros_like(self._weights)
        self._exp_avg_sq = torch.zeros_like(self._weights)
        for p, m, v in zip(self._params, self._views(self._exp_avg),
                           self._views(self._exp_avg_sq)):
            self.state[p] = {"exp_avg": m, "exp_avg_sq": v}

    def _check_groups(self) -> None:
        """One lamb_step for all: fp32 dense parameters on one device, shared hyper-parameters."""
        if not self._params:
            raise ValueError("FlatLamb: no parameters")
        for p in self._params:
            if p.dtype != torch.float32 or p.device != self._params[0].device or p.is_sparse:
                raise ValueError(f"FlatLamb: parameters must be dense fp32 tensors on one "
                                 f"device; got {p.dtype} on {p.device}")
        first = self.param_groups[0]
        for key in SHARED:
            value = [float(g[key]) if isinstance(g[key], Tensor) else g[key]
                     for g in (first, *self.param_groups)]
            if any(v != value[0] for v in value[1:]):
                raise ValueError(f"FlatLamb: every group must have the same {key}")

    def _views(self, flat: Tensor) -> list[Tensor]:
        """Each parameter's slice of a flat buffer, shaped as the parameter."""
        out, start = [], 0
        for p in self._params:
            out.append(flat[start:start + p.numel()].view_as(p))
            start += p.numel()
        return out

    def _flatten_weights(self) -> Tensor:
        """The flat weight buffer, the parameters' values copied in and re-pointed to it."""
        flat = torch.zeros(self._buffer_numel(), dtype=torch.float32, device=self._device)
        for p, view in zip(self._params, self._views(flat)):
            view.copy_(p.detach())
            p.data = view
        return flat

    def _reattach(self, keep: bool) -> None:
        """Make every parameter's .grad its view of the flat gradient buffer again where it is
        not (set to None, or replaced by a new tensor): with `keep`, the values it holds are
        copied into the buffer (None: zeros). Identity checks only, on the host."""
        for p, view in zip(self._params, self._grad_views):
            if p.grad is view:
                continue
            if keep and p.grad is None:
                view.zero_()
            elif keep:
                view.copy_(p.grad)
            p.grad = view

    def flat_grads(self) -> Tensor:
        """The flat fp32 gradient buffer, every parameter's .grad a view of it (re-attached
        where something replaced it), in the parameters' order."""
        self._reattach(keep=True)
        return self._grads

    def step_grads(self) -> list[Tensor]:
        """The gradients a step reads (bertperf.optim.clip.ClippedOptimizer): the flat buffer."""
        return [self.flat_grads()]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradient buffer in place (set_to_none is ignored: the parameters'
        .grad stay its views, for autograd to accumulate into)."""
        self._grads.zero_()
        self._reattach(keep=False)

    def _begin_step(self, closure: Callable[[], float] | None,
                    ok: Tensor | None) -> tuple[float | None, list[Tensor]]:
        """The closure's loss (when given) and every group's step count, counted up (by `ok`:
        not for a step skipped on the device)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        counts = [self.step_count(g, self._device) for g in self.param_groups if g["params"]]
        for t in counts:
            t.add_(1 if ok is None else ok.to(t.dtype))
        return loss, counts

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, *,  # type: ignore[override]
             ok: Tensor | None = None) -> float | None:
        """One LAMB update of every parameter (Lamb.step; ok: a 0-d bool tensor on the
        parameters' device, False for a step skipped on the device)."""
        loss, counts = self._begin_step(closure, ok)
        first = self.param_groups[0]
        lamb_step(self._layout, self._weights, self.flat_grads(), self._exp_avg,
                  self._exp_avg_sq, lr=first["lr"], betas=first["betas"], eps=first["eps"],
                  step=counts[0], ok=ok, bias_correction=first["bias_correction"],
                  grad_averaging=first["grad_averaging"], kernels=self.kernels)
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load Lamb's or FlatLamb's state_dict: the moments are copied into the flat buffers
        (zeros for a parameter without state: Lamb makes them at its first step), the step
        counts checked to agree."""
        super().load_state_dict(state_dict)
        for p, m, v in zip(self._params, self._views(self._exp_avg),
                           self._views(self._exp_avg_sq)):
            loaded = self.state[p]
            for key, view in (("exp_avg", m), ("exp_avg_sq", v)):
                if key in loaded:
                    view.copy_(loaded[key])
                else:
                    view.zero_()
            self.state[p] = {"exp_avg": m, "exp_avg_sq": v}
        counts = {float(g.get("step", 0.0)) for g in self.param_groups if g["params"]}
        if len(counts) > 1:
            raise ValueError(f"FlatLamb: the groups' step counts differ ({sorted(counts)})")
