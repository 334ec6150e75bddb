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
from bertperf.kernels import Kernels
from bertperf.mlperf.log import MLPerfLogger
from bertperf.model import BertForPreTraining, compiled_forward_loss
from bertperf.model import fp8
from bertperf.optim import DynamicLossScaler, make_optimizer, param_groups, use_flat_lamb
from bertperf.optim.bucket_clip import clip_buckets_before_allreduce
from bertperf.train import comm
from bertperf.train.comm import Comm, Traffic, comm_start, grad_bytes
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
}
"""none: one process, nothing leaves it. allreduce: DDP's bucketed all-reduce, overlapping
backward. clip_allreduce (CLIP_BEFORE_ALLREDUCE=1): each bucket clipped on its rank, then
all-reduced (bertperf.optim.bucket_clip). reduce_scatter (SHARDED_LAMB=1): no DDP; the sharded
LAMB reduce-scatters the gradients at the step (bertperf.optim.sharded_lamb). A GRAD_COMM
mode with a hook (bertperf.train.comm.MODES; `hooked`): bf16 / fp16 (each bucket all-reduced
in the half type), powersgd / powersgd_bf16 (low-rank P, Q with error feedback and warm start from
POWERSGD_START), localsgd (each node steps alone from LOCALSGD_START, parameters averaged every
LOCALSGD_PERIOD steps); the step clips the global norm of what the hook hands back (the
decompressed average; under local SGD the rank's, or its node's, own gradient)."""


def hooked(name: str) -> Reduction:
    """GRAD_COMM mode `name`'s reduction: DDP with the mode's hook."""
    return Reduction(name, wrapped=True, comm=name)


def reduction_for(cfg: RunConfig, world_size: int) -> Reduction:
    """The reduction the settings choose for `world_size` ranks."""
    o = cfg.optim
    if o.sharded_lamb:
        return REDUCTIONS["reduce_scatter"]
    if world_size == 1:  # GRAD_COMM has nothing to exchange: no effect (config.warnings)
        return REDUCTIONS["none"]
    if comm.MODES[o.grad_comm].hooked:
        return hooked(o.grad_comm)
    if o.clip_before_allreduce and o.max_grad_norm > 0:
        return REDUCTIONS["clip_allreduce"]
    return REDUCTIONS["allreduce"]


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
    kernels: Kernels = Kernels()
    """How the model and FlatLamb run bertperf.kernels (FUSED_KERNELS)."""
    hook_state: object | None = None
    """What the reduction's DDP communication hook returned (clip_allreduce: its
    bertperf.optim.bucket_clip.BucketClip, whose `record` bench clip reads); None without."""
    grad_comm: str = "allreduce"
    """GRAD_COMM as set (with one rank, `reduction` is none whatever it says)."""

    def after_step(self) -> None:
        """After each optimizer step, before the gradients are cleared: GRAD_COMM's part of the
        step (local SGD's averaging) and the step's bytes counted."""
        if self.comm is not None:
            self.comm.after_step()
        else:
            self.traffic.world += self.step_bytes
        self.traffic.steps += 1

    def log_traffic(self, log: MLPerfLogger, report: Callable[[str], None]) -> None:
        """The run's gradient bytes, in the MLPerf log (`grad_comm_bytes`) and on the console."""
        t, name = self.traffic, self.reduction.name
        log.grad_comm_bytes(self.grad_comm, name, t.per_step(), t.world, t.node, t.steps)
        report(f"gradient exchange ({name}): {t.per_step() / 2**20:.3f} MiB a step to all ranks "
               f"({t.world} bytes over {t.steps} steps"
               + (f"; {t.node} bytes within the node" if t.node else "") + ")")

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
                scaler: DynamicLossScaler | None, traffic: Traffic | None = None,
                kernels: Kernels | None = None) -> Plan:
    """The plan around `core`, applied in this order: the kernels (`kernels`, default:
    FUSED_KERNELS's) set on the model, and on FlatLamb; (0) FP8: the encoder's linear layers
    become torchao's Float8Linear in place, holding the same parameters (bertperf.model.fp8);
    (1) the optimizer over its parameters (FlatLamb makes them views of one flat buffer, so it
    goes before anything holds them; FLAT_LAMB=auto: where the kernels run on CUDA); (2) the
    reduction: DDP and its communication hook, or nothing; (3) the micro-step compiled (COMPILE;
    fullgraph unless DDP splits the graph at its buckets); (4) CUDA graphs (USE_CUDA_GRAPH).
    `traffic`: the counter to go on with (a LAYERWISE stage's new plan)."""
    kernels = kernels if kernels is not None else Kernels(cfg.train.fused_kernels)
    core.use_kernels(kernels)
    if cfg.train.fp8 != "0":  # (0) FP8: before anything holds the layers or their parameters
        fp8.convert(core.bert.encoder, emulate=cfg.train.fp8 == "emulate")
    reduction = reduction_for(cfg, dist.world_size)
    traffic = traffic if traffic is not None else Traffic()
    o = cfg.optim
    cuda = device.type == "cuda" or kernels.assume_cuda
    name = reduction.optimizer or \
        ("flat_lamb" if use_flat_lamb(o.flat_lamb, kernels.fused, cuda) else "lamb")
    flat = {"kernels": kernels} if name != "lamb" else {}  # FlatLamb, ShardedLamb: lamb_step
    optimizer = make_optimizer(name, param_groups(core, o.weight_decay), lr=o.lr,
                               betas=(o.beta1, o.beta2), eps=o.epsilon, **flat)
    model, hook_state = core, None
    if reduction.wrapped:  # gradient_as_bucket_view off: DDP copies into FlatLamb's .grad views
        model = DistributedDataParallel(core, device_ids=[device] if device.type == "cuda"
                                        else None)
        if reduction.hook is not None:
            hook_state = reduction.hook(model, cfg, scaler)
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
    return Plan(reduction=reduction, core=core, model=model, optimizer=optimizer,
                forward_loss=forward_loss, max_grad_norm=clip, compiled=compiled, traffic=traffic,
                comm=hooked, step_bytes=step_bytes, kernels=kernels, hook_state=hook_state,
                grad_comm=o.grad_comm)
