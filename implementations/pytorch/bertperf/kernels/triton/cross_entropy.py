"""Cross-entropy over the vocabulary straight from the (bf16) logits, weighted per row. The
forward pass reads each row once in blocks with an online log-sum-exp and keeps only the row's
fp32 log-sum-exp; the backward pass reads the row again and writes the gradient in the logits'
dtype. No fp32 copy of the logits is ever made."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def cross_entropy_fwd(LOGITS, LABELS, WEIGHTS, LOSS, LSE, V, stride, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    base = LOGITS + row.to(tl.int64) * stride
    cols = tl.arange(0, BLOCK_V)
    m = tl.full((), -float("inf"), tl.float32)
    s = tl.full((), 0.0, tl.float32)
    for start in range(0, V, BLOCK_V):
        mask = start + cols < V
        x = tl.load(base + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(s)
    w = tl.load(WEIGHTS + row).to(tl.float32)
    target = tl.load(base + tl.load(LABELS + row)).to(tl.float32)
    tl.store(LSE + row, lse)
    tl.store(LOSS + row, tl.where(w != 0.0, w * (lse - target), 0.0))


@triton.jit
def cross_entropy_bwd(LOGITS, LABELS, WEIGHTS, LSE, GRAD, DLOGITS, V, stride,
                      BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = cols < V
    offs = row.to(tl.int64) * stride + cols
    x = tl.load(LOGITS + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(WEIGHTS + row).to(tl.float32)
    label = tl.load(LABELS + row)
    d = tl.exp(x - tl.load(LSE + row)) - tl.where(cols == label, 1.0, 0.0)
    d = tl.where(w != 0.0, d * (w * tl.load(GRAD).to(tl.float32)), 0.0)
    tl.store(DLOGITS + offs, d.to(DLOGITS.dtype.element_ty), mask=mask)


def launch_config(v: int) -> dict:
    """Block size and warps for rows of v logits."""
    return dict(BLOCK_V=min(4096, triton.next_power_of_2(v)), num_warps=8)


def forward(logits: torch.Tensor, labels: torch.Tensor,
            weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over rows of weight * cross-entropy, fp32 0-d; per-row log-sum-exp, fp32 [M]).
    logits [M, V] with unit column stride (a column slice of wider logits is read in place)."""
    rows, v = logits.shape
    loss = torch.empty(rows, device=logits.device, dtype=torch.float32)
    lse = torch.empty(rows, device=logits.device, dtype=torch.float32)
    cross_entropy_fwd[(rows,)](logits, labels.contiguous(), weights.contiguous(), loss, lse, v,
                               logits.stride(0), **launch_config(v))
    return loss.sum(), lse


def backward(grad: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor,
             weights: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """d loss / d logits, in the logits' dtype and strides."""
    rows, v = logits.shape
    dlogits = torch.empty_strided(logits.shape, logits.stride(), device=logits.device,
                                  dtype=logits.dtype)
    cfg = launch_config(v)
    cross_entropy_bwd[(rows, triton.cdiv(v, cfg["BLOCK_V"]))](
        logits, labels.contiguous(), weights.contiguous(), lse, grad, dlogits, v,
        logits.stride(0), **cfg)
    return dlogits
