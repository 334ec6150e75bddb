"""The MLPerf BERT learning-rate schedule as NVIDIA's LinearWarmupPolyDecayScheduler computes it:
linear warm-up, then polynomial decay to end_lr measured from step 0 (`lr_at`; docs/design.md,
"The optimizer against its sources", states the formula and how it differs from the TF
reference's, `tf_reference_lr_at`); `resolve_warmup` derives (warmup, start) as NVIDIA's trainer
does. A run's schedule from its settings is `run_schedule`, the step its warm-up ends
`warmup_end`: the trainer, its layerwise stages and GRAD_COMM's start read them.
LinearWarmupPolyDecay follows torch's convention, not NVIDIA's call order: construct it (the
first step's LR is set then) and call `step(ok)` after every optimizer step; a skipped step
does not count. Its completed-step count k lives on the device, and each group's "lr" is a 0-d
float64 tensor there, rewritten in place with lr_at(k + 1) by device ops: no host sync,
capturable in a CUDA graph. `last_epoch` reads k."""

from __future__ import annotations

import warnings
from typing import Any

import torch

WARMUP_DENOM_EPS = 1e-6  # NVIDIA: mod_step / (num_warmup_updates + 1e-6)


def lr_at(
    step: int,
    base_lr: float,
    warmup_steps: float,
    total_steps: int,
    start_warmup_step: int = 0,
    end_lr: float = 0.0,
    power: float = 1.0,
) -> float:
    """NVIDIA's LinearWarmupPolyDecayScheduler LR for scheduler step `step` (= completed + 1)."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0, got {total_steps}")
    offset = 1 if start_warmup_step == 0 else 0
    mod_step = step - offset - start_warmup_step
    if mod_step < warmup_steps:
        return base_lr * mod_step / (warmup_steps + WARMUP_DENOM_EPS)
    progress = min((step - offset) / total_steps, 1.0)
    return (base_lr - end_lr) * (1.0 - progress) ** power + end_lr


def tf_reference_lr_at(
    global_step: int,
    base_lr: float,
    warmup_steps: int,
    total_steps: int,
    start_warmup_step: int = 0,
    end_lr: float = 0.0,
    power: float = 1.0,
) -> float:
    """The MLPerf TF reference's LR at `global_step` (= completed optimizer steps), for comparison.

    tf.train.polynomial_decay(cycle=False): (base - end) * (1 - min(step, T)/T)**power + end;
    warm-up (only when warmup_steps != 0): base * (step - start) / warmup while step - start < warmup.
    """
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0, got {total_steps}")
    lr = (base_lr - end_lr) * (1.0 - min(global_step, total_steps) / total_steps) ** power + end_lr
    if warmup_steps and global_step - start_warmup_step < warmup_steps:
        lr = base_lr * (global_step - start_warmup_step) / warmup_steps
    return lr


def resolve_warmup(warmup_steps: float, start_warmup_step: float, max_steps: int,
                   warmup_proportion: float = 0.0) -> tuple[int, int]:
    """(warmup_steps, start_warmup_step) as NVIDIA's trainer derives them from its flags.

    WARMUP_STEPS == 0 -> (int(MAX_STEPS * WARMUP_PROPORTION), 0); else (WARMUP_STEPS,
    START_WARMUP_STEP). The env values are floats in run_and_time.sh ("0.0"); argparse makes the
    step counts ints there, so do we (a non-integral value is an error).
    """
    def as_int(x: float, what: str) -> int:
        if float(x) != int(float(x)):
            raise ValueError(f"{what} must be a whole number, got {x!r}")
        return int(float(x))

    if float(warmup_steps) == 0.0:
        return int(max_steps * warmup_proportion), 0
    return as_int(warmup_steps, "warmup_steps"), as_int(start_warmup_step, "start_warmup_step")


def _warmup(o: Any) -> tuple[int, int]:
    """resolve_warmup of these optimizer settings (config.OptimConfig)."""
    return resolve_warmup(o.warmup_steps, o.start_warmup_step, o.max_steps, o.warmup_proportion)


def warmup_end(o: Any) -> int:
    """The optimizer step at which the LR warm-up of a run with these optimizer settings
    (config.OptimConfig) ends: WARMUP_STEPS + START_WARMUP_STEP, or MAX_STEPS x
    WARMUP_PROPORTION."""
    warmup, start = _warmup(o)
    return max(0, warmup + start)


def run_schedule(optimizer: torch.optim.Optimizer, o: Any,
                 total_steps: int | None = None) -> LinearWarmupPolyDecay:
    """The LR schedule of a run with these optimizer settings (config.OptimConfig), its decay
    over `total_steps` (default MAX_STEPS; a layerwise stage that restarts the schedule: the
    steps left)."""
    warmup, start = _warmup(o)
    return LinearWarmupPolyDecay(optimizer, warmup,
                                 o.max_steps if total_steps is None else total_steps, start)


class LinearWarmupPolyDecay:
    """NVIDIA's schedule (lr_at) on the device: sets every group's lr, a 0-d float64 tensor on
    the parameters' device, to lr_at(completed + 1, the group's base lr).

    Args:
        optimizer: the optimizer; each group's initial "lr" (a float) is its base_lr (NVIDIA uses
            one base lr for all groups; bertperf's groups all start at the same lr).
        warmup_steps, total_steps, start_warmup_step, end_lr, power: as lr_at.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_steps: int,
        total_steps: int,
        start_warmup_step: int = 0,
        end_lr: float = 0.0,
        power: float = 1.0,
    ) -> None:
        if total_steps <= 0:
            raise ValueError(f"total_steps must be > 0, got {total_steps}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if start_warmup_step > 0:
            warnings.warn(
                f"start_warmup_step={start_warmup_step} > 0: the reference schedule gives a negative "
                f"learning rate before step {start_warmup_step}", stacklevel=2)
        self.optimizer = optimizer
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.start_warmup_step = start_warmup_step
        self.end_lr = end_lr
        self.power = power
        self.base_lrs = [float(g.setdefault("initial_lr", g["lr"])) for g in optimizer.param_groups]
        self.device = optimizer.param_groups[0]["params"][0].device
        self.completed = torch.zeros((), dtype=torch.float64, device=self.device)
        self._install()

    def lr_tensor(self, step: torch.Tensor, base_lr: float) -> torch.Tensor:
        """lr_at(step, base_lr, ...) with `step` a float64 tensor (device ops only)."""
        offset = 1 if self.start_warmup_step == 0 else 0
        mod_step = step - offset - self.start_warmup_step
        warm = base_lr * mod_step / (self.warmup_steps + WARMUP_DENOM_EPS)
        progress = torch.clamp((step - offset) / self.total_steps, max=1.0)
        decay = (base_lr - self.end_lr) * (1.0 - progress) ** self.power + self.end_lr
        return torch.where(mod_step < self.warmup_steps, warm, decay)

    def _install(self) -> None:
        """Give every group an LR tensor of its own on the device, and write the LRs."""
        for group in self.optimizer.param_groups:
            group["lr"] = torch.zeros((), dtype=torch.float64, device=self.device)
        self._write()

    def _write(self) -> None:
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"].copy_(self.lr_tensor(self.completed + 1, base))

    def step(self, ok: torch.Tensor | None = None) -> None:
        """After an optimizer step: count it if it was taken (`ok`, a 0-d bool tensor; None:
        taken) and set the LR of the next one."""
        self.completed.add_(1 if ok is None else ok.to(self.completed.dtype))
        self._write()

    @property
    def last_epoch(self) -> int:
        """Completed optimizer steps (read from the device)."""
        return int(self.completed.item())

    def state_dict(self) -> dict[str, Any]:
        return {"completed": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state_dict(). After the optimizer's own load_state_dict, whose groups hold the
        checkpoint's LR tensors (on the CPU: written there, every step would wait for the
        device), so the groups get device tensors again."""
        self.base_lrs = [float(x) for x in state["base_lrs"]]
        self.completed.fill_(int(state["completed"]))
        self._install()

    def mlperf_hparams(self) -> dict[str, Any]:
        """The schedule's MLPerf log keys (NVIDIA logs num_warmup_updates for both warm-up keys)."""
        return {
            "opt_base_learning_rate": float(self.base_lrs[0]),
            "opt_learning_rate_training_steps": self.total_steps,
            "opt_learning_rate_warmup_steps": self.warmup_steps,
            "num_warmup_steps": self.warmup_steps,
            "start_warmup_step": self.start_warmup_step,
            "opt_lamb_learning_rate_decay_poly_power": self.power,
        }
