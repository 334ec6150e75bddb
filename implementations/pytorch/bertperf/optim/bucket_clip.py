"""Gradient clipping before the all-reduce (CLIP_BEFORE_ALLREDUCE=1), bucket by bucket in a DDP
communication hook, so the all-reduces overlap backward (docs/design.md gives the reasoning and
the price). As DDP hands over bucket b, n_b of the N gradient elements (the accumulated gradient:
DDP calls the hook outside `no_sync` only), the rank clips it and launches its all-reduce:

    t_b = max_norm * sqrt(n_b / N)        the bucket's threshold
    n   = ||g_b|| / loss_scale            its unscaled local norm
    g_b *= min(t_b / (n + 1e-6), 1) / world_size, then all-reduced (summed)

The squared thresholds add up to max_norm**2, so a rank's clipped gradient and the average stay
within max_norm. A bucket with a non-finite norm is made NaN, so every rank skips the step; the
step runs clipped_step with max_grad_norm=None (unscale, skip, no second clip). Nothing reads
the device."""

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
