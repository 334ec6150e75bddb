"""Build the optimizer by name and list its MLPerf log keys: "lamb" (Lamb, per tensor), "flat_lamb"
(FlatLamb: the same LAMB over one flat fp32 buffer, stepped by bertperf.kernels.lamb_step) or
"sharded_lamb" (ShardedLamb: FlatLamb's state sharded over the ranks, ZeRO-1; the trainer's
SHARDED_LAMB). use_flat_lamb says which of the first two the trainer takes (its FLAT_LAMB rule,
asked by train/parallel.py and train/allowed.py). Hyper-parameters come from the caller
(nothing here reads the environment); param groups carry their own weight_decay, which overrides
`weight_decay`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from bertperf.kernels import backend
from bertperf.optim.flat_lamb import FlatLamb
from bertperf.optim.lamb import Lamb
from bertperf.optim.sharded_lamb import ShardedLamb

OPTIMIZERS = {"lamb": Lamb, "flat_lamb": FlatLamb, "sharded_lamb": ShardedLamb}


def use_flat_lamb(setting: bool | None, fused_kernels: bool | None, cuda: bool) -> bool:
    """Whether LAMB runs over one flat buffer ("flat_lamb", FlatLamb) rather than per tensor
    ("lamb", Lamb): FLAT_LAMB's `setting` when given, else (auto) where bertperf.kernels run
    their Triton kernels: FUSED_KERNELS not 0, on CUDA (`cuda`), Triton installed."""
    if setting is not None:
        return setting
    return fused_kernels is not False and cuda and backend.triton_installed()


def make_optimizer(
    name: str,
    params: Iterable[Tensor] | Iterable[dict[str, Any]],
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    **extra: Any,
) -> torch.optim.Optimizer:
    """The optimizer `name` ("lamb", "flat_lamb" or "sharded_lamb") over `params` with these
    hyper-parameters.

    `extra` goes to the constructor (bias_correction, grad_averaging, layer_adaptation;
    ShardedLamb: group).
    """
    cls = OPTIMIZERS.get(name.strip().lower())
    if cls is None:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZERS)}")
    return cls(list(params), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **extra)


def mlperf_hparams(optimizer: torch.optim.Optimizer, scheduler: Any | None = None) -> dict[str, Any]:
    """Optimizer-related MLPerf log keys -> values (scheduler keys too when it has mlperf_hparams).

    opt_lamb_weight_decay_rate is the largest per-group decay (the real rate; NVIDIA's v2.0 code
    logged optimizer.defaults['weight_decay'], 0.0, by mistake).
    """
    g0 = optimizer.param_groups[0]
    beta1, beta2 = g0["betas"]
    out: dict[str, Any] = {
        "opt_name": "lamb" if isinstance(optimizer, Lamb) else type(optimizer).__name__.lower(),
        "opt_lamb_epsilon": float(g0["eps"]),
        "opt_lamb_beta_1": float(beta1),
        "opt_lamb_beta_2": float(beta2),
        "opt_lamb_weight_decay_rate": max(float(g["weight_decay"]) for g in optimizer.param_groups),
    }
    if scheduler is not None and hasattr(scheduler, "mlperf_hparams"):
        out.update(scheduler.mlperf_hparams())
    return out
