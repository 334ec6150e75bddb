"""LayerNorm of a sub-layer's end, one row per program: h = x (+ bias) (GeLU) (dropout)
(+ residual), out = LayerNorm(h) in x's dtype, statistics in fp32. The constexpr switches give
the post-LN sub-layer end (bias, dropout, residual) and the MLM head's transform (bias, GeLU).
The backward pass recomputes h, its statistics and the keep mask from the inputs and the seed,
so nothing but the inputs is saved; the LayerNorm weight/bias and the input-bias gradients are
per-program partial sums added up by PyTorch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bertperf.kernels.triton.common import (check_int32, gelu, gelu_grad, keep_mask,
                                            layer_norm_grad, layer_norm_stats, row_config,
                                            row_programs)

BACKWARD_PER_SM = 4
"""sublayer_layer_norm_bwd's programs per SM: 64 registers x 256 threads leave room for 4."""


@triton.jit
def _sublayer_input(X, BIAS, RES, SEED, offs, cols, cmask, p, HAS_BIAS: tl.constexpr,
                    GELU: tl.constexpr, DROPOUT: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """(h, y, keep): the LayerNorm input, x + bias, and the keep mask (cmask without dropout)."""
    y = tl.load(X + offs, mask=cmask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y += tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)
    h = y
    if GELU:
        h = gelu(h)
    keep = cmask
    if DROPOUT:
        keep = keep_mask(SEED, offs, p)
        h = tl.where(keep, h / (1.0 - p), 0.0)
    if HAS_RESIDUAL:
        h += tl.load(RES + offs, mask=cmask, other=0.0).to(tl.float32)
    return h, y, keep


@triton.jit
def sublayer_layer_norm_fwd(X, BIAS, RES, W, LN_BIAS, SEED, OUT, N, p, eps,
                            BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, GELU: tl.constexpr,
                            DROPOUT: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    offs = tl.program_id(0) * N + cols
    h, y, keep = _sublayer_input(X, BIAS, RES, SEED, offs, cols, cmask, p, HAS_BIAS, GELU,
                                 DROPOUT, HAS_RESIDUAL)
    centred, rstd = layer_norm_stats(h, cmask, N, eps)
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    b = tl.load(LN_BIAS + cols, mask=cmask, other=0.0).to(tl.float32)
    tl.store(OUT + offs, (centred * rstd * w + b).to(OUT.dtype.element_ty), mask=cmask)


@triton.jit
def sublayer_layer_norm_bwd(DOUT, X, BIAS, RES, W, SEED, DX, DRES, PARTIAL, rows, N, p, eps,
                            BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, GELU: tl.constexpr,
                            DROPOUT: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """PARTIAL: [3, programs, N] fp32 partial sums of the LayerNorm weight, LayerNorm bias and
    input-bias gradients."""
    group, groups = tl.program_id(0), tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    dbias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for row in range(group, rows, groups):
        offs = row * N + cols
        h, y, keep = _sublayer_input(X, BIAS, RES, SEED, offs, cols, cmask, p, HAS_BIAS, GELU,
                                     DROPOUT, HAS_RESIDUAL)
        centred, rstd = layer_norm_stats(h, cmask, N, eps)
        xhat = centred * rstd
        dout = tl.load(DOUT + offs, mask=cmask, other=0.0).to(tl.float32)
        dw += dout * xhat
        db += dout
        dh = layer_norm_grad(xhat, rstd, dout, w, cmask, N)
        if HAS_RESIDUAL:
            tl.store(DRES + offs, dh.to(DRES.dtype.element_ty), mask=cmask)
        if DROPOUT:
            dh = tl.where(keep, dh / (1.0 - p), 0.0)
        if GELU:
            dh = dh * gelu_grad(y)
        tl.store(DX + offs, dh.to(DX.dtype.element_ty), mask=cmask)
        dbias += dh
    tl.store(PARTIAL + group * N + cols, dw, mask=cmask)
    tl.store(PARTIAL + (groups + group) * N + cols, db, mask=cmask)
    if HAS_BIAS:
        tl.store(PARTIAL + (2 * groups + group) * N + cols, dbias, mask=cmask)


@triton.jit
def keep_mask_kernel(SEED, KEEP, N, p, BLOCK_N: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    offs = tl.program_id(0) * N + cols
    tl.store(KEEP + offs, keep_mask(SEED, offs, p).to(tl.int8), mask=cols < N)


def _switches(bias, residual, seed, gelu: bool) -> dict:
    return dict(HAS_BIAS=bias is not None, GELU=gelu, DROPOUT=seed is not None,
                HAS_RESIDUAL=residual is not None)


def forward(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
            weight: torch.Tensor, ln_bias: torch.Tensor, seed: torch.Tensor | None, p: float,
            eps: float, gelu: bool) -> torch.Tensor:
    """LayerNorm(x (+ bias) (GeLU) (dropout p with the keep mask of `seed`) (+ residual)) over
    the last dimension, in x's dtype."""
    x = x.contiguous()
    residual = None if residual is None else residual.contiguous()
    n = x.shape[-1]
    check_int32(x)
    out = torch.empty_like(x)
    sublayer_layer_norm_fwd[(x.numel() // n,)](x, bias, residual, weight, ln_bias, seed, out, n,
                                               p, eps, **_switches(bias, residual, seed, gelu),
                                               **row_config(n, False))
    return out


def backward(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None,
             residual: torch.Tensor | None, weight: torch.Tensor, seed: torch.Tensor | None,
             p: float, eps: float, gelu: bool) -> list[torch.Tensor]:
    """[dx, d residual, d weight, d LayerNorm bias, d bias], each in its input's dtype (an empty
    tensor for an absent input)."""
    x, grad = x.contiguous(), grad.contiguous()
    residual = None if residual is None else residual.contiguous()
    n = x.shape[-1]
    rows = x.numel() // n
    dx = torch.empty_like(x)
    dres = torch.empty_like(residual) if residual is not None else x.new_empty(0)
    groups = row_programs(x.device, rows, BACKWARD_PER_SM)
    partial = torch.empty(3, groups, n, device=x.device, dtype=torch.float32)
    sublayer_layer_norm_bwd[(groups,)](grad, x, bias, residual, weight, seed, dx,
                                       dres if residual is not None else None, partial, rows, n,
                                       p, eps, **_switches(bias, residual, seed, gelu),
                                       **row_config(n, True))
    dw, dlb = (partial[i].sum(0).to(weight.dtype) for i in (0, 1))
    dbias = partial[2].sum(0).to(bias.dtype) if bias is not None else x.new_empty(0)
    return [dx, dres, dw, dlb, dbias]


def keep(seed: torch.Tensor, shape: tuple[int, ...], p: float) -> torch.Tensor:
    """The boolean keep mask the kernels draw for an activation of `shape` from `seed`."""
    n = shape[-1]
    out = torch.empty(shape, device=seed.device, dtype=torch.bool)
    check_int32(out)
    keep_mask_kernel[(out.numel() // n,)](seed, out.view(torch.int8), n, p,
                                         **row_config(n, False))
    return out
