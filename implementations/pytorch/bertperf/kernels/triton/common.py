"""Device functions shared by the kernels (GeLU, dropout's keep mask, LayerNorm of one row) and
launch helpers."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def gelu(y):
    """Exact (erf) GeLU."""
    return 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))


@triton.jit
def gelu_grad(y):
    """d gelu(y) / dy = Phi(y) + y * phi(y)."""
    cdf = 0.5 * (1.0 + tl.math.erf(y * 0.7071067811865476))
    return cdf + y * 0.3989422804014327 * tl.exp(-0.5 * y * y)


@triton.jit
def keep_mask(seed_ptr, offsets, p):
    """Dropout's keep decision for the elements at `offsets` (their index in the row-major
    activation): Philox uniform draws from the seed at seed_ptr, kept with probability 1 - p.
    The backward pass calls this again instead of storing the mask."""
    return tl.rand(tl.load(seed_ptr), offsets) >= p


@triton.jit
def layer_norm_stats(h, mask, n, eps):
    """h - mean (0 outside mask) and 1 / sqrt(biased variance + eps) of one row, in float32."""
    mean = tl.sum(h, axis=0) / n
    centred = tl.where(mask, h - mean, 0.0)
    var = tl.sum(centred * centred, axis=0) / n
    return centred, 1.0 / tl.sqrt(var + eps)


@triton.jit
def layer_norm_grad(xhat, rstd, dout, weight, mask, n):
    """Gradient w.r.t. one row's LayerNorm input from the gradient of its output."""
    wdy = tl.where(mask, dout * weight, 0.0)
    c1 = tl.sum(xhat * wdy, axis=0) / n
    c2 = tl.sum(wdy, axis=0) / n
    return (wdy - (xhat * c1 + c2)) * rstd


def row_config(n: int, backward: bool) -> dict:
    """Block size and warps of a kernel that holds one row of n elements per program: about 8
    elements per thread forward, 4 backward (more live values, Philox included)."""
    block = triton.next_power_of_2(n)
    per_thread = 4 if backward else 8
    return dict(BLOCK_N=block, num_warps=min(max(block // (32 * per_thread), 1), 16))


def row_programs(device: torch.device, rows: int, per_sm: int, columns: int = 1) -> int:
    """How many row groups a kernel that loops over rows and accumulates per-program partial
    sums (the backward passes' weight and bias gradients) runs, for a grid of row groups x
    `columns`: per_sm programs per SM in all on CUDA, as many as stay resident at once (the
    ahead-of-time compile test checks each kernel's per_sm against its registers), so the
    grid is one wave; per_sm on the CPU."""
    sms = _sm_count(device.index) if device.type == "cuda" else 1
    return max(1, min(rows, per_sm * sms // columns))


@functools.cache
def _sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(
        index if index is not None else torch.cuda.current_device()).multi_processor_count


def check_int32(*tensors: torch.Tensor) -> None:
    """The kernels index elements with int32 offsets."""
    for t in tensors:
        if t.numel() >= 2**31:
            raise ValueError(f"tensor of {t.numel()} elements: the kernels index with int32")
