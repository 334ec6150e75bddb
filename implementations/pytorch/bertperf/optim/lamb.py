"""LAMB as the MLPerf BERT reference and NVIDIA's submissions compute it, as multi-tensor ops.

The update, per parameter tensor w with gradient g (g already clipped, see bertperf.optim.clip),
at step t = 1, 2, ... (t counts the steps this group has taken, the first one is t = 1):

    m  <- beta1 * m + beta3 * g                 beta3 = 1 - beta1   (grad_averaging=True, default)
                                                beta3 = 1           (grad_averaging=False)
    v  <- beta2 * v + (1 - beta2) * g * g
    m^ =  m / (1 - beta1**t)                    bias correction (bias_correction=True, default);
    v^ =  v / (1 - beta2**t)                    with bias_correction=False: m^ = m, v^ = v
    u  =  m^ / (sqrt(v^) + eps)  +  wd * w      eps OUTSIDE the square root; decoupled decay
                                                added to the update (wd = the group's weight_decay)
    r  =  ||w|| / ||u||   if ||w|| > 0 and ||u|| > 0
          1.0             otherwise             (the trust ratio; ||.|| = L2 norm of the tensor)
          1.0             for groups without layer adaptation (bias, LayerNorm)
    w  <- w - lr * r * u

Sources, rule by rule (all three agree on every rule above):

* MLPerf TF reference, mlcommons/training@d6b13890c52c6a93332e377e3c78acf59c4c6a29
  language_model/tensorflow/bert/lamb_optimizer_v1.py `LAMBOptimizer._resource_apply_dense`:
  moments (`m_t = m*beta1 + grad*(1-beta1)`, `v_t = v*beta2 + grad*grad*(1-beta2)`), bias
  correction with `beta1_power`/`beta2_power` (created as beta1/beta2 and multiplied by beta in
  `_finish` after every step, so the first step divides by 1-beta1), `update = m_t_hat /
  (sqrt(v_t_hat) + epsilon)`, `update += weight_decay_rate * var` unless the name matches
  `exclude_from_weight_decay`, trust ratio `where(w_norm > 0, where(g_norm > 0, w_norm/g_norm,
  1.0), 1.0)` where g_norm is the norm of the update INCLUDING the decay term, applied only
  where `_do_layer_adaptation` (exclude_from_layer_adaptation defaults to the weight-decay
  exclusions: ["LayerNorm", "layer_norm", "bias"], passed by optimization.py:create_optimizer),
  then `var -= ratio * lr * update`. eps = 10**log_epsilon = 1e-6 there.
* NVIDIA apex `csrc/multi_tensor_lamb.cu` (FusedLAMB, the non-distributed path of NVIDIA's
  run_pretraining.py) and `apex/contrib/csrc/optimizers/multi_tensor_distopt_lamb_kernel.cu`
  (DistributedFusedLAMB, what the submissions run): stage 1 MOMENT_MODE_1 (adam_w_mode):
  `m = m*beta1 + beta3*g` with beta3 = 1-beta1 when grad_averaging, `v = v*beta2 +
  (1-beta2)*g*g`, `denom = sqrtf(v/beta2_correction) + epsilon`, `update = (m/beta1_correction)
  / denom + decay*p`; stage 2: `ratio = lr * (param_norm/update_norm)` when both norms are
  non-zero, else `lr`, and only when `use_nvlamb || decay != 0` (NVIDIA passes use_nvlamb=False).
  apex's group step is incremented before the update (first step t = 1); DistributedFusedLAMB
  does not advance its step on a non-finite gradient norm (here: the step is not called, see
  bertperf.optim.clip.clipped_step).

Layer adaptation is a per-group flag, ``layer_adaptation``: True/False, or None (the default)
for apex's rule "adapt when weight_decay != 0". The two sources differ only when a group has
decay 0 but is not a bias/LayerNorm group (e.g. WEIGHT_DECAY_RATE=0): TF still adapts it, apex
does not. bertperf.optim.groups.param_groups sets the flag explicitly to the TF reference's rule
(adapt exactly the tensors that are not excluded by name).

Gradient clipping is not done here: the TF reference clips with tf.clip_by_global_norm(grads,
1.0) before apply_gradients, and NVIDIA's optimizer scales the gradient by the clip coefficient
first thing in stage 1; both are equivalent to clipping the grads and then running this step.

Implementation: per group, the lists of params/grads/moments are built once per step; every
arithmetic op is one torch._foreach_* call over the whole list; per-tensor norms come from
torch._foreach_norm and the trust ratios are computed for all tensors at once on the device (no
host sync unless ratios_on_host=True, see Lamb). The number of torch ops per step does not depend
on the number of parameters. State: state[p]["exp_avg"], state[p]["exp_avg_sq"] (dtype of p); the
step count is group["step"], a float64 0-d tensor on the parameters' device, so that a step
skipped on the device (`step(ok=...)`, bertperf.optim.clip.clipped_step) does not count and the
bias corrections need no host value. Sparse gradients are rejected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor


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
