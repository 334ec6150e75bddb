"""The parallelism plan: how gradients leave a rank. Built once from the run's config and process
group around the one-device model, in a fixed order (optimizer, reduction, compile, CUDA graphs;
docs/design.md, "The trainer's junction"); the training step only asks it. A new way of reducing
gradients is one more entry of REDUCTIONS."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch
from torch.nn.parallel import DistributedDataParallel

from bertperf.config import RunConfig
from bertperf.errors import UserError
from bertperf.model import BertForPreTraining, compiled_forward_loss
from bertperf.optim import DynamicLossScaler, make_optimizer, param_groups, use_flat_lamb
from bertperf.optim.bucket_clip import clip_buckets_before_allreduce
from bertperf.train.dist import Dist


@dataclass(frozen=True)
class Reduction:
    """One way for a rank's gradients to reach the others (an entry of REDUCTIONS)."""

    name: str
    """Its key in REDUCTIONS (and in `train --check`'s line)."""
    wrapped: bool
    """The step calls the model through DistributedDataParallel, which all-reduces the gradient
    buckets during the last micro-batch's backward (the others under no_sync)."""
    optimizer: str | None = None
    """The optimizer it needs (bertperf.optim.make_optimizer's name); None: LAMB as FLAT_LAMB
    says."""
    clips_at_step: bool = True
    """The optimizer step clips the global norm of the reduced gradient (MAX_GRAD_NORM);
    False where the reduction has clipped already."""
    hook: Callable[[DistributedDataParallel, RunConfig, DynamicLossScaler | None], object] | None \
        = None
    """A DDP communication hook to register (it reduces the buckets itself)."""


REDUCTIONS = {
    "none": Reduction("none", wrapped=False),
    "allreduce": Reduction("allreduce", wrapped=True),
    "clip_allreduce": Reduction(
        "clip_allreduce", wrapped=True, clips_at_step=False,
        hook=lambda ddp, cfg, scaler: clip_buckets_before_allreduce(
            ddp, cfg.optim.max_grad_norm, scaler)),
    "reduce_scatter": Reduction("reduce_scatter", wrapped=False, optimizer="sharded_lamb"),
}
"""none: one process, nothing leaves it. allreduce: DDP's bucketed all-reduce, overlapping
backward. clip_allreduce (CLIP_BEFORE_ALLREDUCE=1): each bucket clipped on its rank, then
all-reduced (bertperf.optim.bucket_clip). reduce_scatter (SHARDED_LAMB=1): no DDP; the sharded
LAMB reduce-scatters the gradients at the step (bertperf.optim.sharded_lamb)."""


def reduction_for(cfg: RunConfig, world_size: int) -> Reduction:
    """The reduction the settings choose for `world_size` ranks."""
    o = cfg.optim
    if o.sharded_lamb:
        return REDUCTIONS["reduce_scatter"]
    if world_size == 1:
        return REDUCTIONS["none"]
    if o.clip_before_allreduce and o.max_grad_norm > 0:
        return REDUCTIONS["clip_allreduce"]
    return REDUCTIONS["allreduce"]


REFUSED: tuple[tuple[Callable[[RunConfig, bool], bool], str], ...] = (
    (lambda cfg, fixed: cfg.optim.sharded_lamb and cfg.optim.flat_lamb is False,
     "SHARDED_LAMB=1 shards FlatLamb's flat buffer: it cannot go with FLAT_LAMB=0 (set "
     "FLAT_LAMB=auto or 1)"),
    (lambda cfg, fixed: cfg.optim.sharded_lamb and cfg.optim.clip_before_allreduce,
     "CLIP_BEFORE_ALLREDUCE=1 clips DDP's all-reduce buckets, which SHARDED_LAMB=1 replaces by "
     "its reduce-scatter: set one of them to 0"),
    (lambda cfg, fixed: not fixed and (cfg.train.compile != "none" or cfg.train.use_cuda_graph),
     "COMPILE and USE_CUDA_GRAPH need LAYOUT=packed (varlen batches change shape every step)"),
    (lambda cfg, fixed: cfg.train.use_cuda_graph and cfg.train.compile not in ("none", "inductor"),
     "USE_CUDA_GRAPH=1 replays inductor's code: COMPILE={cfg.train.compile} cannot go with it "
     "(use none or inductor)"),
    (lambda cfg, fixed: cfg.train.use_cuda_graph and cfg.train.device == "cpu",
     "USE_CUDA_GRAPH=1 needs a CUDA device, not DEVICE=cpu"),
    (lambda cfg, fixed: cfg.train.use_cuda_graph and cfg.train.gradient_steps > 1
     and not cfg.optim.sharded_lamb
     and (cfg.optim.flat_lamb is False
          or (cfg.optim.flat_lamb is None and cfg.train.fused_kernels is False)),
     "USE_CUDA_GRAPH=1 with GRADIENT_STEPS={cfg.train.gradient_steps} accumulates gradients "
     "across graph replays, which only FlatLamb's preallocated gradient buffer survives (a "
     "replay frees the graph's outputs, the per-tensor LAMB's first gradients among them): "
     "FLAT_LAMB=1, or auto with FUSED_KERNELS auto or 1"),
)
"""(the combination, why it is refused; `why` is formatted with the config as `cfg`): what the
plan cannot build, said before any log."""


def check(cfg: RunConfig, fixed_shapes: bool) -> None:
    """A one-line UserError for the first refused combination of settings (REFUSED);
    `fixed_shapes`: whether the run's layout keeps every tensor's shape (train.layout)."""
    for refused, why in REFUSED:
        if refused(cfg, fixed_shapes):
            raise UserError(why.format(cfg=cfg))


@dataclass
class Plan:
    """What the training step asks: the model to call, the optimizer, the micro-step function,
    which micro-batches must not synchronise, and what the step clips."""

    reduction: Reduction
    core: BertForPreTraining
    """The one-device model (what checkpoints and evals read)."""
    model: torch.nn.Module
    """What the step calls: `core`, or DDP around it."""
    optimizer: torch.optim.Optimizer
    forward_loss: Callable[..., torch.Tensor]
    """bertperf.model.forward_loss, or its torch.compile'd form (COMPILE, USE_CUDA_GRAPH)."""
    max_grad_norm: float | None
    """The global norm the optimizer step clips to (None: none; the reduction clipped, or
    MAX_GRAD_NORM=0)."""
    compiled: bool = False
    """The micro-step is compiled (COMPILE, USE_CUDA_GRAPH): its first calls compile it."""

    def micro_batch(self, last: bool) -> ContextManager:
        """The context of one micro-batch's forward and backward: a wrapped model reduces only
        on the step's last one."""
        if self.reduction.wrapped and not last:
            return self.model.no_sync()
        return contextlib.nullcontext()

    def release(self) -> None:
        """Drop the DDP wrapper (its reducer must go while the process group still exists)."""
        self.model = self.core


def parallelize(core: BertForPreTraining, cfg: RunConfig, dist: Dist, device: torch.device,
                scaler: DynamicLossScaler | None) -> Plan:
    """The plan around `core`, applied in this order: (1) the optimizer over its parameters
    (FlatLamb makes them views of one flat buffer, so it goes before anything holds them);
    (2) the reduction: DDP and its communication hook, or nothing; (3) the micro-step compiled
    (COMPILE; fullgraph unless DDP splits the graph at its buckets); (4) CUDA graphs
    (USE_CUDA_GRAPH)."""
    reduction = reduction_for(cfg, dist.world_size)
    o = cfg.optim
    name = reduction.optimizer or \
        ("flat_lamb" if use_flat_lamb(core.parameters(), o.flat_lamb) else "lamb")
    optimizer = make_optimizer(name, param_groups(core, o.weight_decay), lr=o.lr,
                               betas=(o.beta1, o.beta2), eps=o.epsilon)
    model = core
    if reduction.wrapped:  # gradient_as_bucket_view off: DDP copies into FlatLamb's .grad views
        model = DistributedDataParallel(core, device_ids=[device] if device.type == "cuda"
                                        else None)
        if reduction.hook is not None:
            reduction.hook(model, cfg, scaler)
    forward_loss = compiled_forward_loss(cfg.train.compile, cfg.train.use_cuda_graph,
                                         fullgraph=not reduction.wrapped)
    clip = o.max_grad_norm if reduction.clips_at_step and o.max_grad_norm > 0 else None
    compiled = cfg.train.compile != "none" or cfg.train.use_cuda_graph
    return Plan(reduction, core, model, optimizer, forward_loss, clip, compiled)
