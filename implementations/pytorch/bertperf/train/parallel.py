"""The parallelism plan: how gradients leave a rank. Built once from the run's config and process
group around the one-device model, in a fixed order (optimizer, reduction, compile, CUDA graphs;
docs/design.md, "The trainer's junction"); the training step only asks it. A new way of reducing
gradients is one more entry of REDUCTIONS."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch
from torch.nn.parallel import DistributedDataParallel

from bertperf.config import RunConfig
from bertperf.errors import UserError
from bertperf.model import BertForPreTraining, compiled_forward_loss
from bertperf.model import fp8
from bertperf.optim import (DynamicLossScaler, make_optimizer, param_groups, resolve_warmup,
                            use_flat_lamb)
from bertperf.optim.bucket_clip import clip_buckets_before_allreduce
from bertperf.train import comm
from bertperf.train.comm import Comm, Traffic, grad_bytes
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
    comm: str | None = None
    """A GRAD_COMM mode (bertperf.train.comm.MODES): its hook on DDP, its step after the
    optimizer's, its state a checkpoint part (`grad_comm`) where it keeps one."""


REDUCTIONS = {
    "none": Reduction("none", wrapped=False),
    "allreduce": Reduction("allreduce", wrapped=True),
    "clip_allreduce": Reduction(
        "clip_allreduce", wrapped=True, clips_at_step=False,
        hook=lambda ddp, cfg, scaler: clip_buckets_before_allreduce(
            ddp, cfg.optim.max_grad_norm, scaler)),
    "reduce_scatter": Reduction("reduce_scatter", wrapped=False, optimizer="sharded_lamb"),
    **{mode: Reduction(mode, wrapped=True, comm=mode) for mode in comm.MODES},
}
"""none: one process, nothing leaves it. allreduce: DDP's bucketed all-reduce, overlapping
backward. clip_allreduce (CLIP_BEFORE_ALLREDUCE=1): each bucket clipped on its rank, then
all-reduced (bertperf.optim.bucket_clip). reduce_scatter (SHARDED_LAMB=1): no DDP; the sharded
LAMB reduce-scatters the gradients at the step (bertperf.optim.sharded_lamb). GRAD_COMM's
modes (open division; bertperf.train.comm): bf16 / fp16 (each bucket all-reduced in the half
type), powersgd / powersgd_bf16 (low-rank P, Q with error feedback and warm start from
POWERSGD_START), localsgd (each node steps alone from LOCALSGD_START, parameters averaged every
LOCALSGD_PERIOD steps); the step clips the global norm of what the hook hands back (the
decompressed average; under local SGD the rank's, or its node's, own gradient)."""

STATEFUL = ("powersgd", "powersgd_bf16", "localsgd")
"""GRAD_COMM modes that keep state across steps (a checkpoint part)."""


def warmup_end(cfg: RunConfig) -> int:
    """The optimizer step at which the LR warm-up ends (WARMUP_STEPS + START_WARMUP_STEP, or
    MAX_STEPS x WARMUP_PROPORTION)."""
    o = cfg.optim
    warmup, start = resolve_warmup(o.warmup_steps, o.start_warmup_step, o.max_steps,
                                   o.warmup_proportion)
    return max(0, warmup + start)


def comm_start(cfg: RunConfig) -> int:
    """The step from which GRAD_COMM's method runs: POWERSGD_START (default: the end of the LR
    warm-up, at least 2) or LOCALSGD_START (default: the end of the LR warm-up)."""
    o = cfg.optim
    if o.grad_comm.startswith("powersgd"):
        return o.powersgd_start if o.powersgd_start is not None else max(2, warmup_end(cfg))
    return o.localsgd_start if o.localsgd_start is not None else warmup_end(cfg)


def reduction_for(cfg: RunConfig, world_size: int) -> Reduction:
    """The reduction the settings choose for `world_size` ranks."""
    o = cfg.optim
    if o.sharded_lamb:
        return REDUCTIONS["reduce_scatter"]
    if world_size == 1:  # GRAD_COMM has nothing to exchange: no effect (config.warnings)
        return REDUCTIONS["none"]
    if o.grad_comm != "allreduce":
        return REDUCTIONS[o.grad_comm]
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
    (lambda cfg, fixed: cfg.train.fp8 != "0" and cfg.train.precision != "bf16",
     "FP8={cfg.train.fp8} runs the encoder's GEMMs in FP8 around bf16 activations: it needs "
     "PRECISION=bf16, not {cfg.train.precision}"),
    (lambda cfg, fixed: cfg.train.use_cuda_graph and cfg.train.gradient_steps > 1
     and not cfg.optim.sharded_lamb
     and (cfg.optim.flat_lamb is False
          or (cfg.optim.flat_lamb is None and cfg.train.fused_kernels is False)),
     "USE_CUDA_GRAPH=1 with GRADIENT_STEPS={cfg.train.gradient_steps} accumulates gradients "
     "across graph replays, which only FlatLamb's preallocated gradient buffer survives (a "
     "replay frees the graph's outputs, the per-tensor LAMB's first gradients among them): "
     "FLAT_LAMB=1, or auto with FUSED_KERNELS auto or 1"),
    (lambda cfg, fixed: cfg.optim.grad_comm != "allreduce" and cfg.optim.sharded_lamb,
     "GRAD_COMM={cfg.optim.grad_comm} is a DDP communication hook, and SHARDED_LAMB=1 has no DDP "
     "(it reduce-scatters at the step): set GRAD_COMM=allreduce or SHARDED_LAMB=0"),
    (lambda cfg, fixed: cfg.optim.grad_comm != "allreduce" and cfg.optim.clip_before_allreduce,
     "GRAD_COMM={cfg.optim.grad_comm} and CLIP_BEFORE_ALLREDUCE=1 are both DDP communication "
     "hooks and DDP takes one: set CLIP_BEFORE_ALLREDUCE=0 (the step clips the decompressed "
     "average)"),
    (lambda cfg, fixed: cfg.optim.grad_comm in STATEFUL and cfg.layerwise.layerwise is not None,
     "GRAD_COMM={cfg.optim.grad_comm} keeps per-bucket state that a LAYERWISE stage's new DDP "
     "buckets would not match: use GRAD_COMM=allreduce, bf16 or fp16 with LAYERWISE"),
    (lambda cfg, fixed: cfg.optim.grad_comm.startswith("powersgd")
     and cfg.train.precision == "fp16",
     "GRAD_COMM={cfg.optim.grad_comm} with PRECISION=fp16: an overflowed step's inf would stay in "
     "PowerSGD's error feedback for good: use PRECISION=bf16 or fp32"),
    (lambda cfg, fixed: cfg.optim.grad_comm.startswith("powersgd")
     and cfg.optim.powersgd_start is not None
     and cfg.optim.powersgd_start < max(2, warmup_end(cfg)),
     "POWERSGD_START={cfg.optim.powersgd_start} is before the end of the LR warm-up (step "
     "{end}; and PowerSGD's error feedback needs 2 plain steps): compress from step {end} or "
     "later (unset: from there)"),
    (lambda cfg, fixed: cfg.optim.grad_comm == "localsgd"
     and cfg.optim.localsgd_period >= cfg.optim.max_steps - comm_start(cfg),
     "LOCALSGD_PERIOD={cfg.optim.localsgd_period}: the ranks step alone for the last {alone} of "
     "MAX_STEPS={cfg.optim.max_steps} steps (from LOCALSGD_START, or the end of the LR warm-up), "
     "too few for this period: their parameters would be averaged after the first of those "
     "steps and never again (LOCALSGD_PERIOD below {alone})"),
)
"""(the combination, why it is refused; `why` is formatted with the config as `cfg`): what the
plan cannot build, said before any log."""


def check(cfg: RunConfig, fixed_shapes: bool) -> None:
    """A one-line UserError for the first refused combination of settings (REFUSED);
    `fixed_shapes`: whether the run's layout keeps every tensor's shape (train.layout)."""
    for refused, why in REFUSED:
        if refused(cfg, fixed_shapes):
            raise UserError(why.format(cfg=cfg, end=max(2, warmup_end(cfg)),
                                       alone=cfg.optim.max_steps - comm_start(cfg)))


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
    traffic: Traffic = field(default_factory=Traffic)
    """The bytes this rank hands to collectives (bertperf.train.comm), counted every step."""
    comm: Comm | None = None
    """GRAD_COMM's hook and state (None: allreduce, or one rank)."""
    step_bytes: int = 0
    """Without `comm`: the bytes the reduction all-reduces a step (the trained parameters'
    gradients; 0 on one rank)."""

    def after_step(self) -> None:
        """After each optimizer step, before the gradients are cleared: GRAD_COMM's part of the
        step (local SGD's averaging) and the step's bytes counted."""
        if self.comm is not None:
            self.comm.after_step()
        else:
            self.traffic.world += self.step_bytes
        self.traffic.steps += 1

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
                scaler: DynamicLossScaler | None, traffic: Traffic | None = None) -> Plan:
    """The plan around `core`, applied in this order: (0) FP8: the encoder's linear layers
    become torchao's Float8Linear in place, holding the same parameters (bertperf.model.fp8);
    (1) the optimizer over its parameters (FlatLamb makes them views of one flat buffer, so it
    goes before anything holds them); (2) the reduction: DDP and its communication hook, or
    nothing; (3) the micro-step compiled (COMPILE; fullgraph unless DDP splits the graph at its
    buckets); (4) CUDA graphs (USE_CUDA_GRAPH). `traffic`: the counter to go on with (a
    LAYERWISE stage's new plan)."""
    if cfg.train.fp8 != "0":  # (0) FP8: before anything holds the layers or their parameters
        fp8.convert(core.bert.encoder, emulate=cfg.train.fp8 == "emulate")
    reduction = reduction_for(cfg, dist.world_size)
    traffic = traffic if traffic is not None else Traffic()
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
    trained = [p for p in core.parameters() if p.requires_grad]
    hooked = comm.MODES[reduction.comm](cfg, traffic, comm_start(cfg)) if reduction.comm \
        else None
    if hooked is not None:
        hooked.install(model, trained)
    forward_loss = compiled_forward_loss(cfg.train.compile, cfg.train.use_cuda_graph,
                                         fullgraph=not reduction.wrapped)
    clip = o.max_grad_norm if reduction.clips_at_step and o.max_grad_norm > 0 else None
    compiled = cfg.train.compile != "none" or cfg.train.use_cuda_graph
    step_bytes = 0 if reduction.name == "none" else grad_bytes(trained)
    return Plan(reduction, core, model, optimizer, forward_loss, clip, compiled, traffic, hooked,
                step_bytes)
