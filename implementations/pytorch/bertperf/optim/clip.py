"""Global-norm gradient clipping, fp16 dynamic loss scaling, and the clip-then-step sequence
(docs/design.md compares them with TF's and apex's). clip_grad_norm_ scales the gradients by
min(max_norm / (n + 1e-6), 1), n their global L2 norm in fp32, with foreach ops. clipped_step runs
once per step on the accumulated gradient, after DDP's all-reduce (bucket_clip clips before it):
unscale, norm, clip and step, or, on a non-finite norm (inf/NaN, or squares beyond fp32), a step
skipped on the device (the grads zeroed, Lamb.step(ok=...) keeps weights, moments and count; the
scheduler does not advance). DynamicLossScaler is GradScaler's policy with NVIDIA's settings
(scale 2**20, doubled after 2000 good steps, halved on overflow), on the device; bf16 needs none
(scaler=None). Nothing reads the device: the caller reads the norm and the skipped steps when it
reports."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

CLIP_EPS = 1e-6


def _grads_of(params_or_grads: Iterable[Tensor]) -> list[Tensor]:
    """Gradients from an iterable of parameters (tensors that require grad: their .grad, None
    skipped) or of gradient tensors (anything else: taken as is)."""
    out: list[Tensor] = []
    for t in params_or_grads:
        if isinstance(t, torch.nn.Parameter) or t.requires_grad:
            if t.grad is not None:
                out.append(t.grad)
        else:
            out.append(t)
    return out


def global_grad_norm(grads: Sequence[Tensor]) -> Tensor:
    """L2 norm of all the tensors together, as a 0-d tensor on the first tensor's device.

    float32 for fp32/fp16/bf16 grads (low-precision grads are reduced in float32), float64 for
    float64 grads.
    """
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    low = all(g.dtype in (torch.float32, torch.float16, torch.bfloat16) for g in grads)
    if len(grads) == 1:  # a flat gradient buffer (FlatLamb): one reduction
        return torch.linalg.vector_norm(grads[0], dtype=torch.float32 if low else None)
    per_tensor = torch._foreach_norm(list(grads), 2, dtype=torch.float32 if low else None)
    device = grads[0].device
    if any(n.device != device for n in per_tensor):
        per_tensor = [n.to(device) for n in per_tensor]  # multi-device (not the normal case)
    return torch.linalg.vector_norm(torch.stack(per_tensor))


def clip_coefficient(norm: Tensor, max_norm: float | None, if_nonfinite: float) -> Tensor:
    """min(max_norm / (norm + 1e-6), 1) (1 when max_norm is None), or `if_nonfinite` when the
    norm is not finite; a 0-d tensor beside the norm."""
    coef = torch.clamp(max_norm / (norm + CLIP_EPS), max=1.0) if max_norm else \
        torch.ones_like(norm)
    return torch.where(torch.isfinite(norm), coef, torch.full_like(coef, if_nonfinite))


def clip_grad_norm_(params_or_grads: Iterable[Tensor], max_norm: float | None) -> Tensor:
    """Scale the grads so their global norm is at most max_norm; return the norm before clipping.

    Accepts parameters (their .grad is used) or gradient tensors. max_norm=None only measures.
    A non-finite norm leaves the grads untouched (the caller skips the step).
    """
    grads = _grads_of(params_or_grads)
    norm = global_grad_norm(grads)
    if max_norm is None or not grads:
        return norm
    coef = clip_coefficient(norm, max_norm, if_nonfinite=1.0)
    if all(g.device == norm.device for g in grads):
        torch._foreach_mul_(grads, coef)
    else:
        for g in grads:  # multi-device fallback
            g.mul_(coef.to(g.device))
    return norm


class DynamicLossScaler:
    """fp16 dynamic loss scale, kept on the device (a power of two, so (un)scaling is exact).

    Attributes (0-d tensors on `device`): scale, growth_tracker (good steps since the last
    change), skipped_steps.
    """

    def __init__(
        self,
        init_scale: float = 2.0**20,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        min_scale: float = 1.0,
        device: torch.device | str | None = None,
    ) -> None:
        if not init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale}")
        if not (growth_factor > 1.0 and 0.0 < backoff_factor < 1.0 and growth_interval > 0):
            raise ValueError("need growth_factor > 1, 0 < backoff_factor < 1, growth_interval > 0")
        self.scale = torch.tensor(float(init_scale), dtype=torch.float32, device=device)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.growth_tracker = torch.zeros((), dtype=torch.int64, device=device)
        self.skipped_steps = torch.zeros((), dtype=torch.int64, device=device)

    def scale_loss(self, loss: Tensor) -> Tensor:
        """loss * scale: call backward() on this."""
        return loss * self.scale

    def unscale_(self, grads: Sequence[Tensor]) -> None:
        """Divide the (accumulated) grads by the scale, in place, with one foreach launch."""
        if grads:
            torch._foreach_div_(list(grads), self.scale)

    def update(self, ok: Tensor) -> None:
        """After a step (ok: 0-d bool, the grads were finite): back off on overflow (and count
        the skip), else grow every growth_interval good steps. On the device, in place."""
        grow = ok & (self.growth_tracker + 1 >= self.growth_interval)
        scale = torch.where(ok, torch.where(grow, self.scale * self.growth_factor, self.scale),
                            torch.clamp(self.scale * self.backoff_factor, min=self.min_scale))
        self.scale.copy_(scale)
        self.growth_tracker.copy_(torch.where(ok & ~grow, self.growth_tracker + 1, 0))
        self.skipped_steps.add_((~ok).long())

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state (read from the device)."""
        return {"scale": self.scale.item(), "growth_tracker": int(self.growth_tracker),
                "skipped_steps": int(self.skipped_steps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state_dict()."""
        self.scale.fill_(float(state["scale"]))
        self.growth_tracker.fill_(int(state["growth_tracker"]))
        self.skipped_steps.fill_(int(state["skipped_steps"]))


class ClippedOptimizer(Protocol):
    """What clipped_step asks of an optimizer: bertperf.optim's Lamb, FlatLamb and ShardedLamb
    have it."""

    def step_grads(self) -> list[Tensor]:
        """The gradients its step reads, which clipped_step unscales, measures, clips and cleans
        in place (with any collective that makes them: ShardedLamb's reduce-scatter)."""

    def norm_over_ranks(self, norm: Tensor) -> Tensor:
        """The global gradient norm from the norm of step_grads() on this rank."""

    def step(self, closure: Callable[[], float] | None = None, *,
             ok: Tensor | None = None) -> float | None:
        """The update, skipped on the device where `ok` is False."""


@dataclass(frozen=True)
class StepOutcome:
    """What clipped_step did, as device tensors (read them only when reporting): the global grad
    norm (unscaled, before clipping), whether the step was taken (the norm was finite), and the
    loss scale now in force (None without a scaler)."""

    grad_norm: Tensor
    ok: Tensor
    loss_scale: Tensor | None


def clipped_step(
    optimizer: ClippedOptimizer,
    max_grad_norm: float | None = 1.0,
    scaler: DynamicLossScaler | None = None,
) -> StepOutcome:
    """Unscale (fp16), compute the global norm, clip, and step, or skip on a non-finite norm,
    decided on the device (module docstring): no host sync. The optimizer says what it steps on
    (ClippedOptimizer); the caller passes outcome.ok on to the scheduler. FlatLamb's flat
    gradient buffer is unscaled, measured, clipped and cleaned as one tensor; Lamb's .grad
    tensors with foreach ops; ShardedLamb's gradients are reduce-scattered first and the norm
    summed over the ranks' shards."""
    grads = optimizer.step_grads()
    if scaler is not None:
        scaler.unscale_(grads)
    norm = optimizer.norm_over_ranks(global_grad_norm(grads))
    ok = torch.isfinite(norm)
    if grads:
        torch._foreach_mul_(grads, clip_coefficient(norm, max_grad_norm, if_nonfinite=0.0))
        for g in grads:  # a skipped step's inf * 0 and NaN * 0 entries
            torch.nan_to_num_(g, 0.0, 0.0, 0.0)
    optimizer.step(ok=ok)
    if scaler is not None:
        scaler.update(ok)
    return StepOutcome(norm, ok, scaler.scale if scaler is not None else None)
