"""gelu(x + bias) over [rows, N] tiles, and its backward (dx and the bias gradient, the latter
as per-program partial sums added up by PyTorch: deterministic, no atomics)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bertperf.kernels.triton.common import check_int32, gelu, gelu_grad, row_programs

BLOCK_M = 8
NUM_WARPS = 8
BACKWARD_PER_SM = 3
"""bias_gelu_bwd's programs per SM: 80 registers x 256 threads leave room for 3 (sm_80, sm_90)."""


@triton.jit
def bias_gelu_fwd(X, BIAS, Y, rows, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = c < N
    mask = (r[:, None] < rows) & cmask[None, :]
    offs = r[:, None] * N + c[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(BIAS + c, mask=cmask, other=0.0).to(tl.float32)
    tl.store(Y + offs, gelu(x + b[None, :]).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def bias_gelu_bwd(DY, X, BIAS, DX, DBIAS_PARTIAL, rows, N, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    group, groups = tl.program_id(0), tl.num_programs(0)
    c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = c < N
    b = tl.load(BIAS + c, mask=cmask, other=0.0).to(tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(group * BLOCK_M, rows, groups * BLOCK_M):
        r = start + tl.arange(0, BLOCK_M)
        mask = (r[:, None] < rows) & cmask[None, :]
        offs = r[:, None] * N + c[None, :]
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        dx = dy * gelu_grad(x + b[None, :])
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
        acc += dx
    tl.store(DBIAS_PARTIAL + group * N + c, tl.sum(acc, axis=0), mask=cmask)


def column_block(n: int) -> int:
    """BLOCK_N for rows of n elements."""
    return min(512, triton.next_power_of_2(n))


def forward(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(x + bias) in x's dtype; bias [N] broadcast over x's last dimension N."""
    x = x.contiguous()
    n = x.shape[-1]
    rows = x.numel() // n
    check_int32(x)
    y = torch.empty_like(x)
    block_n = column_block(n)
    grid = (triton.cdiv(rows, BLOCK_M), triton.cdiv(n, block_n))
    bias_gelu_fwd[grid](x, bias, y, rows, n, BLOCK_M=BLOCK_M, BLOCK_N=block_n,
                        num_warps=NUM_WARPS)
    return y


def backward(grad: torch.Tensor, x: torch.Tensor,
             bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx in x's dtype, dbias in bias's dtype) from the output gradient."""
    x, grad = x.contiguous(), grad.contiguous()
    n = x.shape[-1]
    rows = x.numel() // n
    dx = torch.empty_like(x)
    block_n = column_block(n)
    groups = row_programs(x.device, triton.cdiv(rows, BLOCK_M), BACKWARD_PER_SM,
                          columns=triton.cdiv(n, block_n))
    partial = torch.empty(groups, n, device=x.device, dtype=torch.float32)
    bias_gelu_bwd[(groups, triton.cdiv(n, block_n))](grad, x, bias, dx, partial, rows, n,
                                                     BLOCK_M=BLOCK_M, BLOCK_N=block_n,
                                                     num_warps=NUM_WARPS)
    return dx, partial.sum(0).to(bias.dtype)
