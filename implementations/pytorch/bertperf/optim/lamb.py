"""LAMB as the MLPerf BERT reference (TF `lamb_optimizer_v1.py`) and NVIDIA's apex FusedLAMB /
DistributedFusedLAMB compute it, as multi-tensor ops (docs/design.md, "The optimizer against
its sources", gives the sources rule by rule). Per tensor w with gradient g (already clipped,
bertperf.optim.clip), at the group's step t = 1, 2, ...:

    m <- beta1 m + beta3 g      (beta3 = 1 - beta1; 1 with grad_averaging=False)
    v <- beta2 v + (1 - beta2) g g
    u  = (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps) + wd w
                                (bias_correction=False: m and v as they are)
    w <- w - lr r u,   r = ||w|| / ||u|| where both are > 0 and the group adapts, else 1

Every op is one torch._foreach_* call per group, the trust ratios computed on the device. State:
exp_avg and exp_avg_sq per parameter; the step count group["step"] is a float64 0-d tensor on
the parameters' device, so a step skipped there (`step(ok=...)`) does not count. Sparse gradients
are rejected."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor


def _undecorated(fn: Callable) -> Callable:
    """A torch.optim.Optimizer method without its torch._disable_dynamo wrapper (the same function
    where a torch line does not wrap it)."""
    return getattr(fn, "__wrapped__", fn)


def _row_blocks(t: Tensor, n: int) -> tuple[Tensor, ...]:
    """t as n equal blocks along dim 0 (views of t; an error when its rows do not split)."""
    return t.unflatten(0, (n, -1)).unbind(0) if n != 1 else (t,)


def _stacked_norms(tensors: list[Tensor]) -> Tensor:
    """Per-tensor L2 norms as one 1-D tensor (float32 for fp32/fp16/bf16 tensors, else native)."""
    low = all(t.dtype in (torch.float32, torch.float16, torch.bfloat16) for t in tensors)
    return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32 if low else None))


class Lamb(torch.optim.Optimizer):
    """LAMB (Layer-wise Adaptive Moments for Batch training), MLPerf-reference semantics.

    Args:
        params: tensors or param-group dicts (see bertperf.optim.groups.param_groups).
        lr: learning rate (a float, or a 0-d tensor on the params' device).
        betas: (beta1, beta2), each in [0, 1).
        eps: added to sqrt(v^), outside the square root. MLPerf BERT: 1e-6.
        weight_decay: decoupled decay added to the update. Default 0.0 (so plain
            ``model.parameters()`` never decays biases/LayerNorm); use param_groups for BERT.
        bias_correction: divide the moments by (1 - beta**t).
        grad_averaging: beta3 = 1 - beta1 (True) or 1 (False) in the first-moment update.
        layer_adaptation: trust ratio on/off; None = on iff the group's weight_decay != 0 (apex).
        ratios_on_host: apply the per-tensor factors lr*r as a list of host floats (one
            device->host copy per adapted group per step; torch._foreach_mul_ with a scalar list
            takes the fused multi-tensor path on CUDA). False (default): keep them on the device
            as 0-d tensors, no sync (CUDA-graph friendly), but torch's CUDA foreach kernels take
            their per-tensor fallback for a list of 0-d tensors (one small launch per tensor,
            from C++). Same numbers either way.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        *,
        bias_correction: bool = True,
        grad_averaging: bool = True,
        layer_adaptation: bool | None = None,
        ratios_on_host: bool = False,
    ) -> None:
        if isinstance(lr, Tensor):
            if lr.numel() != 1:
                raise ValueError(f"Lamb: a tensor lr must have one element, got shape {tuple(lr.shape)}")
        elif not lr >= 0.0:
            raise ValueError(f"Lamb: invalid learning rate {lr!r}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Lamb: betas must be in [0, 1), got {betas!r}")
        if not eps >= 0.0:
            raise ValueError(f"Lamb: invalid eps {eps!r}")
        if not weight_decay >= 0.0:
            raise ValueError(f"Lamb: invalid weight_decay {weight_decay!r}")
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            grad_averaging=grad_averaging,
            layer_adaptation=layer_adaptation,
        )
        super().__init__(params, defaults)
        self.ratios_on_host = bool(ratios_on_host)

    # torch.optim.Optimizer wraps these in torch._disable_dynamo, whose first call imports
    # torch._dynamo (2 CPU-seconds, most of a short run's start-up) though nothing compiles them:
    # the trainer compiles the model's forward and loss, never the optimizer (docs/design.md).
    add_param_group = _undecorated(torch.optim.Optimizer.add_param_group)
    zero_grad = _undecorated(torch.optim.Optimizer.zero_grad)
    state_dict = _undecorated(torch.optim.Optimizer.state_dict)
    load_state_dict = _undecorated(torch.optim.Optimizer.load_state_dict)

    @staticmethod
    def adapts(group: dict[str, Any]) -> bool:
        """Whether the trust ratio applies to this group (explicit flag, else apex's decay != 0)."""
        flag = group.get("layer_adaptation")
        if flag is None:
            return group["weight_decay"] != 0.0
        return bool(flag)

    def _group_lists(self, group: dict[str, Any]) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]]:
        """The params with a gradient, their grads and moments (moments created on first use).
        A parameter marked `lamb_row_blocks = n` (BERT's fused q/k/v) enters as its n row blocks
        (views, so the in-place updates land in it), each with its own norms and trust ratio."""
        params: list[Tensor] = []
        grads: list[Tensor] = []
        exp_avgs: list[Tensor] = []
        exp_avg_sqs: list[Tensor] = []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("Lamb does not support sparse gradients")
            state = self.state[p]
            if not state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            n = getattr(p, "lamb_row_blocks", 1)
            params.extend(_row_blocks(p, n))
            grads.extend(_row_blocks(p.grad, n))
            exp_avgs.extend(_row_blocks(state["exp_avg"], n))
            exp_avg_sqs.extend(_row_blocks(state["exp_avg_sq"], n))
        return params, grads, exp_avgs, exp_avg_sqs

    @staticmethod
    def step_count(group: dict[str, Any], device: torch.device) -> Tensor:
        """The group's step count (module docstring), made on first use; a checkpoint's count
        is moved to `device` once."""
        step = group.get("step")
        if step is None:  # made on the device: no copy from the host inside a step
            group["step"] = torch.zeros((), dtype=torch.float64, device=device)
        elif not isinstance(step, Tensor) or step.device != device:
            group["step"] = torch.as_tensor(step, dtype=torch.float64).to(device)
        return group["step"]

    def step_grads(self) -> list[Tensor]:
        """The gradients a step reads (bertperf.optim.clip.ClippedOptimizer): every parameter's
        .grad."""
        return [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]

    def norm_over_ranks(self, norm: Tensor) -> Tensor:
        """The global norm (ClippedOptimizer): the norm of step_grads(), whole tensors."""
        return norm

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, *,  # type: ignore[override]
             ok: Tensor | None = None) -> float | None:
        """One LAMB update of every parameter that has a gradient (formula: module docstring).

        ok: a 0-d bool tensor on the parameters' device; where it is False the update is
        skipped on the device (weights, moments and step counts stay as they were; the grads
        must then be finite, as clipped_step leaves them). None: always update."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if not group["params"]:
                continue
            t = self.step_count(group, group["params"][0].device)
            t.add_(1 if ok is None else ok.to(t.dtype))
            params, grads, exp_avgs, exp_avg_sqs = self._group_lists(group)
            if not params:
                continue
            self._update_group(group, params, grads, exp_avgs, exp_avg_sqs, t, ok)
        return loss

    def _update_group(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        exp_avgs: list[Tensor],
        exp_avg_sqs: list[Tensor],
        t: Tensor,
        ok: Tensor | None,
    ) -> None:
        beta1, beta2 = group["betas"]
        beta3 = 1.0 - beta1 if group["grad_averaging"] else 1.0
        if group["bias_correction"]:
            t = t.clamp(min=1.0)  # a skip before the first step: no 0/0
            bc1, bc2 = 1.0 - beta1**t, 1.0 - beta2**t
        else:
            bc1 = bc2 = 1.0
        wd = float(group["weight_decay"])
        lr = group["lr"]
        decay1, decay2 = beta1, beta2
        if ok is not None:  # a skipped step keeps the moments (its grads are 0) and the weights
            okf = ok.to(torch.float64)
            decay1, decay2 = 1.0 + okf * (beta1 - 1.0), 1.0 + okf * (beta2 - 1.0)
            lr = lr * okf

        # Moments (TF reference: m_t = m*beta1 + g*(1-beta1); v_t = v*beta2 + g*g*(1-beta2)).
        torch._foreach_mul_(exp_avgs, decay1)
        torch._foreach_add_(exp_avgs, grads, alpha=beta3)
        torch._foreach_mul_(exp_avg_sqs, decay2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)

        # u = (m / bc1) / (sqrt(v / bc2) + eps) + wd * w   (apex stage 1, MOMENT_MODE_1),
        # evaluated as m * (1 / (sqrt(v / bc2) + eps)) / bc1 to stay in place (same to ~1 ulp).
        update = torch._foreach_div(exp_avg_sqs, bc2)
        torch._foreach_sqrt_(update)
        torch._foreach_add_(update, group["eps"])
        torch._foreach_reciprocal_(update)
        torch._foreach_mul_(update, exp_avgs)
        if group["bias_correction"]:
            torch._foreach_div_(update, bc1)
        if wd != 0.0:
            torch._foreach_add_(update, params, alpha=wd)

        if self.adapts(group):
            # r = ||w|| / ||u|| when both are > 0, else 1 (TF reference and apex stage 2).
            w_norm = _stacked_norms(params)
            u_norm = _stacked_norms(update)
            ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
            scale = ratio * (-lr)
            factors = scale.tolist() if self.ratios_on_host else list(scale.unbind(0))
            torch._foreach_mul_(update, factors)
            torch._foreach_add_(params, update)
        elif isinstance(lr, Tensor):
            torch._foreach_mul_(update, -lr)
            torch._foreach_add_(params, update)
        else:
            torch._foreach_add_(params, update, alpha=-float(lr))
