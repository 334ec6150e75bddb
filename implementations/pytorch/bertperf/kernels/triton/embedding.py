"""BERT's embeddings, one token per program: h = word[id] + position[pos] + token_type[seg],
out = dropout(LayerNorm(h)) with fp32 statistics, stored in the activation dtype. The backward
pass recomputes h, its statistics and the keep mask; it adds the gradient rows into the word
and position tables with fp32 atomics and sums the token-type rows (2 in BERT, hit by every
token) per program, as it does the LayerNorm weight and bias gradients."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bertperf.kernels.triton.common import (check_int32, keep_mask, layer_norm_grad,
                                            layer_norm_stats, row_config, row_programs)

BACKWARD_MAX_REGISTERS = 64
"""The backward's register cap: sm_90's compiler takes 100 a thread unasked (2 programs of 256
threads an SM); at 64 it spills nothing and 4 fit."""
BACKWARD_PER_SM = 4
"""embedding_layer_norm_bwd's programs per SM."""


@triton.jit
def _embedding_sum(IDS, SEG, POS, WORD, POSITION, TYPE, row, cols, cmask, N):
    """(h, word id, position id, segment id) of one token."""
    i = tl.load(IDS + row)
    q = tl.load(POS + row)
    s = tl.load(SEG + row)
    h = tl.load(WORD + i * N + cols, mask=cmask, other=0.0).to(tl.float32)
    h += tl.load(POSITION + q * N + cols, mask=cmask, other=0.0).to(tl.float32)
    h += tl.load(TYPE + s * N + cols, mask=cmask, other=0.0).to(tl.float32)
    return h, i, q, s


@triton.jit
def embedding_layer_norm_fwd(IDS, SEG, POS, WORD, POSITION, TYPE, W, LN_BIAS, SEED, OUT, N, p,
                             eps, BLOCK_N: tl.constexpr, DROPOUT: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    h, i, q, s = _embedding_sum(IDS, SEG, POS, WORD, POSITION, TYPE, row, cols, cmask, N)
    centred, rstd = layer_norm_stats(h, cmask, N, eps)
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    b = tl.load(LN_BIAS + cols, mask=cmask, other=0.0).to(tl.float32)
    out = centred * rstd * w + b
    if DROPOUT:
        out = tl.where(keep_mask(SEED, row * N + cols, p), out / (1.0 - p), 0.0)
    tl.store(OUT + row * N + cols, out.to(OUT.dtype.element_ty), mask=cmask)


@triton.jit
def embedding_layer_norm_bwd(DOUT, IDS, SEG, POS, WORD, POSITION, TYPE, W, SEED, DWORD,
                             DPOSITION, PARTIAL, TYPE_PARTIAL, rows, N, p, eps,
                             BLOCK_N: tl.constexpr, TYPES: tl.constexpr, DROPOUT: tl.constexpr):
    """DWORD, DPOSITION: fp32, zero-filled; PARTIAL: [2, programs, N] LayerNorm weight and bias
    gradient partial sums; TYPE_PARTIAL: [programs, TYPES, N] token-type gradient partial sums
    (TYPES: the number of token types rounded up to a power of 2)."""
    group, groups = tl.program_id(0), tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    types = tl.arange(0, TYPES)
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    dtype_rows = tl.zeros((TYPES, BLOCK_N), dtype=tl.float32)
    for row in range(group, rows, groups):
        h, i, q, s = _embedding_sum(IDS, SEG, POS, WORD, POSITION, TYPE, row, cols, cmask, N)
        centred, rstd = layer_norm_stats(h, cmask, N, eps)
        xhat = centred * rstd
        dout = tl.load(DOUT + row * N + cols, mask=cmask, other=0.0).to(tl.float32)
        if DROPOUT:
            dout = tl.where(keep_mask(SEED, row * N + cols, p), dout / (1.0 - p), 0.0)
        dw += dout * xhat
        db += dout
        dh = layer_norm_grad(xhat, rstd, dout, w, cmask, N)
        tl.atomic_add(DWORD + i * N + cols, dh, mask=cmask, sem="relaxed")
        tl.atomic_add(DPOSITION + q * N + cols, dh, mask=cmask, sem="relaxed")
        dtype_rows += tl.where(types[:, None] == s, dh[None, :], 0.0)
    tl.store(PARTIAL + group * N + cols, dw, mask=cmask)
    tl.store(PARTIAL + (groups + group) * N + cols, db, mask=cmask)
    tl.store(TYPE_PARTIAL + (group * TYPES + types[:, None]) * N + cols[None, :], dtype_rows,
             mask=cmask[None, :])


def forward(input_ids: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor,
            word: torch.Tensor, position: torch.Tensor, token_type: torch.Tensor,
            weight: torch.Tensor, ln_bias: torch.Tensor, seed: torch.Tensor | None, p: float,
            eps: float, dtype: torch.dtype) -> torch.Tensor:
    """[T, hidden] in `dtype` for the T tokens' ids (int32 or int64)."""
    n = word.shape[1]
    rows = input_ids.numel()
    out = torch.empty(rows, n, device=word.device, dtype=dtype)
    check_int32(out, word)
    embedding_layer_norm_fwd[(rows,)](input_ids.contiguous(), segment_ids.contiguous(),
                                      position_ids.contiguous(), word, position, token_type,
                                      weight, ln_bias, seed, out, n, p, eps,
                                      DROPOUT=seed is not None, **row_config(n, False))
    return out


def backward(grad: torch.Tensor, input_ids: torch.Tensor, segment_ids: torch.Tensor,
             position_ids: torch.Tensor, word: torch.Tensor, position: torch.Tensor,
             token_type: torch.Tensor, weight: torch.Tensor, seed: torch.Tensor | None,
             p: float, eps: float) -> list[torch.Tensor]:
    """[d word, d position, d token_type, d weight, d LayerNorm bias], each in its parameter's
    dtype."""
    n = word.shape[1]
    rows = input_ids.numel()
    groups = row_programs(word.device, rows, BACKWARD_PER_SM)
    types = triton.next_power_of_2(token_type.shape[0])
    f32 = dict(device=word.device, dtype=torch.float32)
    dword, dposition = torch.zeros(word.shape, **f32), torch.zeros(position.shape, **f32)
    partial = torch.empty(2, groups, n, **f32)
    type_partial = torch.empty(groups, types, n, **f32)
    embedding_layer_norm_bwd[(groups,)](grad.contiguous(), input_ids.contiguous(),
                                        segment_ids.contiguous(), position_ids.contiguous(),
                                        word, position, token_type, weight, seed, dword,
                                        dposition, partial, type_partial, rows, n, p, eps,
                                        TYPES=types, DROPOUT=seed is not None,
                                        maxnreg=BACKWARD_MAX_REGISTERS, **row_config(n, True))
    dtype_rows = type_partial.sum(0)[:token_type.shape[0]]
    return [dword.to(word.dtype), dposition.to(position.dtype), dtype_rows.to(token_type.dtype),
            partial[0].sum(0).to(weight.dtype), partial[1].sum(0).to(weight.dtype)]
