"""Gradient clipping before the all-reduce, bucket by bucket, in a DDP communication hook.

By default the trainer clips after DDP's all-reduce: clipped_step (bertperf.optim.clip) takes the
global norm of the averaged gradient and scales it to at most MAX_GRAD_NORM. With
CLIP_BEFORE_ALLREDUCE=1 each rank clips its own gradient instead, one DDP bucket at a time, as
the bucket becomes ready during backward, and launches that bucket's all-reduce (average) at
once, so the buckets of the last layers are on the wire while the first layers' gradients are
still being computed. The per-replica clip before the all-reduce is the MLPerf TF reference's
default order; clipping bucket by bucket instead of with the replica's global norm keeps the
all-reduce overlapped with backward (a global norm would need the whole backward first).

Per bucket b of n_b of the N gradient elements (DDP's bucket: `bucket.buffer()`, this rank's
gradient; with gradient accumulation the accumulated one, since DDP calls its hook only on the
micro-batch outside `no_sync`, after autograd has added that micro-batch into the .grad tensors):

    t_b    = max_norm * sqrt(n_b / N)                     the bucket's threshold
    n      = ||g_b|| / loss_scale                         the bucket's unscaled local norm
    coef_b = min(t_b / (n + 1e-6), 1)                     g_b *= coef_b / world_size; all-reduce

Why sqrt(n_b / N): the squared thresholds add up to max_norm^2, so after clipping a rank's whole
gradient has norm <= max_norm, and so has the average over the ranks (triangle inequality): the
bound global-norm clipping gives, whatever the number and sizes of the buckets (DDP's
bucket_cap_mb, and the rebuild after the first step: DDP reduces the first step in one bucket
holding every gradient, then groups them in the order they became ready, a 1 MiB first bucket
and 25 MiB ones after it). Where every bucket's share of the squared norm equals its share of
the elements, coef_b is the same for every bucket and equals the replica's global-norm clip
min(max_norm / ||g||, 1). The same max_norm for every bucket would bound the result only by
sqrt(K) * max_norm for K buckets, a bound that moves with the bucket size. The price of the
composed thresholds: a bucket holding more than its share of the squared norm is clipped even
when the rank's whole gradient is under max_norm (docs/performance.md measures the difference
from clipping after the all-reduce).

fp16: the loss is scaled before backward, so the buckets hold scaled gradients; the norm is
divided by the scaler's current scale (a device tensor, read when the hook runs) and the
coefficient applied to the scaled gradient, which clipped_step unscales after the all-reduce.
Non-finite: a bucket whose local norm is not finite (inf/NaN in it, or a sum of squares beyond
fp32) is multiplied by NaN, so every rank's reduced gradient is non-finite in that bucket and
clipped_step skips the step on every rank, as it skips one whose global norm is not finite.
The optimizer step then runs clipped_step with max_grad_norm=None: unscale, norm (of the
clipped, averaged gradient), skip on non-finite, no second clip. Nothing reads the device.
"""

# no `from __future__ import annotations`: DDP's register_comm_hook compares the hook's
# annotations with dist.GradBucket and torch.futures.Future[Tensor] themselves, not strings
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from bertperf.optim.clip import DynamicLossScaler, clip_coefficient, global_grad_norm


def bucket_threshold(max_norm: float, bucket_numel: int, total_numel: int) -> float:
    """max_norm * sqrt(bucket_numel / total_numel): the thresholds of the buckets of a gradient
    of total_numel elements have squares adding up to max_norm^2 (module docstring)."""
    return max_norm * math.sqrt(bucket_numel / total_numel)


@dataclass
class BucketClip:
    """The hook's state: what the thresholds are made of, and the loss scale."""

    max_norm: float
    """MAX_GRAD_NORM: the bound on the norm of a rank's whole clipped gradient."""
    total_numel: int
    """N: the elements of every gradient DDP reduces (the parameters that require grad)."""
    world_size: int
    """Ranks in the group; the all-reduce sums, the hook divides by this to average."""
    scaler: DynamicLossScaler | None = None
    """fp16: the loss scaler whose scale the buckets' gradients carry; None without scaling."""
    process_group: dist.ProcessGroup | None = None
    """DDP's process group (None: the default group)."""
    record: list | None = None
    """When a list, every bucket's (elements, unscaled local norm, coefficient) is appended to it
    (the last two as 0-d device tensors), for `bench clip`."""


def clip_then_allreduce(state: BucketClip, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """DDP communication hook: clip this rank's bucket to its threshold, then all-reduce it
    (average) asynchronously; DDP copies the future's tensor into the .grad tensors."""
    grads = bucket.buffer()
    norm = global_grad_norm([grads])
    if state.scaler is not None:
        norm = norm / state.scaler.scale
    threshold = bucket_threshold(state.max_norm, grads.numel(), state.total_numel)
    coef = clip_coefficient(norm, threshold, if_nonfinite=math.nan)
    if state.record is not None:
        state.record.append((grads.numel(), norm, coef))
    grads.mul_(coef * (1.0 / state.world_size))  # DDP's own average multiplies by 1/W too
    work = dist.all_reduce(grads, group=state.process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def clip_buckets_before_allreduce(model: torch.nn.parallel.DistributedDataParallel,
                                  max_norm: float,
                                  scaler: DynamicLossScaler | None = None) -> BucketClip:
    """Register clip_then_allreduce on a DDP model (before its first backward); the optimizer
    step must then not clip again (clipped_step(..., max_grad_norm=None, scaler))."""
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    group = model.process_group
    state = BucketClip(max_norm, sum(p.numel() for p in model.parameters() if p.requires_grad),
                       dist.get_world_size(group), scaler, group)
    model.register_comm_hook(state, clip_then_allreduce)
    return state
