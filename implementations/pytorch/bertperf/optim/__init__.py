"""Optimizer side of the trainer: LAMB (multi-tensor), parameter groups, the MLPerf LR schedule,
global-norm clipping and fp16 dynamic loss scaling.

Modules, each usable on its own:

  lamb.Lamb                       LAMB exactly as the MLPerf TF reference (`lamb_optimizer_v1.py`)
                                  and NVIDIA's apex FusedLAMB / DistributedFusedLAMB compute it,
                                  written with torch._foreach_* (no Python loop over parameters)
  flat_lamb.FlatLamb              the same LAMB over one flat fp32 buffer (parameters, grads and
                                  moments views of flat buffers; bertperf.kernels.lamb_step: three
                                  Triton launches on CUDA), as apex's DistributedFusedLAMB
  groups.param_groups(model, wd)  two groups: decayed + layer-adapted, and bias/LayerNorm (neither)
  schedule.LinearWarmupPolyDecay  NVIDIA's LinearWarmupPolyDecayScheduler (start_warmup_step offset
                                  semantics included), LRs as device tensors; schedule.lr_at is
                                  the pure function
  clip.clip_grad_norm_            global-norm clipping with foreach; returns the norm, leaves grads
                                  untouched when the norm is not finite
  clip.DynamicLossScaler          fp16 loss scaling (init 2**20, x2 every 2000 good steps, /2 on overflow)
  clip.clipped_step               unscale -> norm -> clip -> step, or skip on a non-finite norm,
                                  decided on the device (no host sync)
  bucket_clip.clip_buckets_before_allreduce
                                  a DDP communication hook clipping each rank's gradient bucket
                                  before its all-reduce (CLIP_BEFORE_ALLREDUCE=1)
  sharded_lamb.ShardedLamb        FlatLamb with its moments and update sharded over the ranks
                                  (ZeRO-1: reduce-scatter of the gradients, per-tensor trust
                                  ratios from sums of squares all-reduced, all-gather of the
                                  weights), as apex's DistributedFusedLAMB
  factory.make_optimizer          "lamb" -> Lamb; "flat_lamb" -> FlatLamb; "sharded_lamb" ->
                                  ShardedLamb
  factory.use_flat_lamb           which LAMB a model's parameters take: FlatLamb where the kernels
                                  take Triton (CUDA, Triton installed), Lamb elsewhere, or as set
  factory.mlperf_hparams          the optimizer-related MLPerf log keys with their values

Typical step (gradient accumulation is the trainer's, train/loop.py: it backpropagates GA
micro-batches into the same .grad, each micro-batch's summed cross-entropies divided by the
step's masked-token and sequence counts over all micro-batches and ranks, then calls clipped_step
once):

    groups = param_groups(model, weight_decay=0.01)
    opt = make_optimizer("lamb", groups, lr=4.25e-4, betas=(0.9, 0.999), eps=1e-6)
    sched = LinearWarmupPolyDecay(opt, warmup_steps=0, total_steps=6700, start_warmup_step=0)
    scaler = DynamicLossScaler(device=device) if fp16 else None
    ...
    outcome = clipped_step(opt, max_grad_norm=1.0, scaler=scaler)
    sched.step(outcome.ok)  # a skipped step does not count
    opt.zero_grad(set_to_none=True)
"""

from bertperf.optim.clip import DynamicLossScaler, StepOutcome, clip_grad_norm_, clipped_step, global_grad_norm
from bertperf.optim.factory import make_optimizer, mlperf_hparams, use_flat_lamb
from bertperf.optim.flat_lamb import FlatLamb
from bertperf.optim.groups import NO_DECAY_PATTERNS, is_no_decay, param_groups
from bertperf.optim.lamb import Lamb
from bertperf.optim.schedule import LinearWarmupPolyDecay, lr_at, resolve_warmup, tf_reference_lr_at
from bertperf.optim.sharded_lamb import ShardedLamb

__all__ = [
    "NO_DECAY_PATTERNS",
    "DynamicLossScaler",
    "FlatLamb",
    "Lamb",
    "LinearWarmupPolyDecay",
    "ShardedLamb",
    "StepOutcome",
    "clip_grad_norm_",
    "clipped_step",
    "global_grad_norm",
    "is_no_decay",
    "lr_at",
    "make_optimizer",
    "mlperf_hparams",
    "param_groups",
    "resolve_warmup",
    "tf_reference_lr_at",
    "use_flat_lamb",
]
