"""LAMB over flat fp32 buffers in three launches for all parameters: (1) moments, then each
chunk's squared norms of the weights and of the update; (2) one program per tensor adds its
chunks' sums and writes -lr * trust ratio; (3) the update, recomputed from the new moments with
the same device function as in (1), applied with that factor. A chunk is BLOCK elements of one
tensor (a tensor's last chunk may be shorter), so no program straddles two tensors."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _chunk(CHUNK_TENSOR, TENSOR_CHUNKS, OFFSETS, BLOCK: tl.constexpr):
    """This program's tensor, element indices into the flat buffers and their mask."""
    c = tl.program_id(0)
    t = tl.load(CHUNK_TENSOR + c)
    start = tl.load(OFFSETS + t) + (c - tl.load(TENSOR_CHUNKS + t)) * BLOCK
    idx = start + tl.arange(0, BLOCK)
    return t, idx, idx < tl.load(OFFSETS + t + 1)


@triton.jit
def _update(m, v, w, wd, eps, COEF):
    """u = m / bc1 / (sqrt(v / bc2) + eps) + wd * w, rounded as bertperf.optim.lamb does it."""
    bc1, bc2 = tl.load(COEF + 2), tl.load(COEF + 3)
    return tl.div_rn(m * tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(v, bc2)) + eps), bc1) + wd * w


@triton.jit
def lamb_moments(W, G, M, VSQ, CHUNK_TENSOR, TENSOR_CHUNKS, OFFSETS, WD, COEF, PARTIAL, beta3,
                 one_minus_beta2, eps, BLOCK: tl.constexpr):
    """COEF: fp32 [4], the moments' decay factors and the bias corrections (kernels.lamb)."""
    t, idx, mask = _chunk(CHUNK_TENSOR, TENSOR_CHUNKS, OFFSETS, BLOCK)
    g = tl.load(G + idx, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(M + idx, mask=mask, other=0.0) * tl.load(COEF) + beta3 * g
    v = tl.load(VSQ + idx, mask=mask, other=0.0) * tl.load(COEF + 1) + one_minus_beta2 * g * g
    w = tl.load(W + idx, mask=mask, other=0.0)
    tl.store(M + idx, m, mask=mask)
    tl.store(VSQ + idx, v, mask=mask)
    u = tl.where(mask, _update(m, v, w, tl.load(WD + t), eps, COEF), 0.0)
    c = tl.program_id(0)
    tl.store(PARTIAL + 2 * c, tl.sum(w * w, axis=0))
    tl.store(PARTIAL + 2 * c + 1, tl.sum(u * u, axis=0))


@triton.jit
def lamb_ratios(TENSOR_CHUNKS, PARTIAL, ADAPT, LR, SCALE, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    first, last = tl.load(TENSOR_CHUNKS + t), tl.load(TENSOR_CHUNKS + t + 1)
    w_sq = tl.zeros((BLOCK,), dtype=tl.float32)
    u_sq = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(first, last, BLOCK):
        c = start + tl.arange(0, BLOCK)
        w_sq += tl.load(PARTIAL + 2 * c, mask=c < last, other=0.0)
        u_sq += tl.load(PARTIAL + 2 * c + 1, mask=c < last, other=0.0)
    w_norm = tl.sqrt_rn(tl.sum(w_sq, axis=0))
    u_norm = tl.sqrt_rn(tl.sum(u_sq, axis=0))
    adapt = (tl.load(ADAPT + t) != 0) & (w_norm > 0) & (u_norm > 0)
    ratio = tl.where(adapt, tl.div_rn(w_norm, tl.where(adapt, u_norm, 1.0)), 1.0)
    tl.store(SCALE + t, ratio * -tl.load(LR).to(tl.float32))


@triton.jit
def lamb_apply(W, M, VSQ, CHUNK_TENSOR, TENSOR_CHUNKS, OFFSETS, WD, COEF, SCALE, eps,
               BLOCK: tl.constexpr):
    t, idx, mask = _chunk(CHUNK_TENSOR, TENSOR_CHUNKS, OFFSETS, BLOCK)
    m = tl.load(M + idx, mask=mask, other=0.0)
    v = tl.load(VSQ + idx, mask=mask, other=0.0)
    w = tl.load(W + idx, mask=mask, other=0.0)
    u = _update(m, v, w, tl.load(WD + t), eps, COEF)
    tl.store(W + idx, w + u * tl.load(SCALE + t), mask=mask)


RATIO_BLOCK = 1024
NUM_WARPS = 16


def step(layout, params: torch.Tensor, grads: torch.Tensor, exp_avg: torch.Tensor,
         exp_avg_sq: torch.Tensor, coef: torch.Tensor, lr: torch.Tensor, beta3: float,
         one_minus_beta2: float, eps: float) -> None:
    """One LAMB step in place on the flat buffers (layout: bertperf.kernels.lamb.LambLayout;
    coef: fp32 [4] decay factors and bias corrections; lr: fp32 [1]; both on the buffers'
    device)."""
    chunks = layout.chunk_tensor.numel()
    partial = torch.empty(chunks, 2, device=params.device, dtype=torch.float32)
    scale = torch.empty(len(layout.numels), device=params.device, dtype=torch.float32)
    tables = (layout.chunk_tensor, layout.tensor_chunks, layout.offsets, layout.weight_decay)
    lamb_moments[(chunks,)](params, grads, exp_avg, exp_avg_sq, *tables, coef, partial, beta3,
                            one_minus_beta2, eps, BLOCK=layout.block, num_warps=NUM_WARPS)
    lamb_ratios[(len(layout.numels),)](layout.tensor_chunks, partial, layout.adapt, lr, scale,
                                       BLOCK=RATIO_BLOCK, num_warps=NUM_WARPS)
    lamb_apply[(chunks,)](params, exp_avg, exp_avg_sq, *tables, coef, scale, eps,
                          BLOCK=layout.block, num_warps=NUM_WARPS)
