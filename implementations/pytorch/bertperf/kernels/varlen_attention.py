"""Variable-length (unpadded) multi-head self-attention: the tokens of S sequences concatenated,
sequence i = rows cu_seqlens[i]:cu_seqlens[i+1]; a token attends only to the tokens of its own
sequence, with no mask and no padding (NVIDIA: `--unpad_fmha`, fmhalib on packed QKV).

Every function takes the packed projection qkv [T, 3, H, D] (q, k, v = qkv[:, 0], [:, 1], [:, 2],
as BertSelfAttention's one GEMM makes it) and returns [T, H, D]; its gradient is one [T, 3, H, D]
tensor (unbind's backward stacks; three views of qkv would each zero-fill a [T, 3, H, D] gradient
and autograd would add them). cu_seqlens is [S+1] int32, non-decreasing, cu_seqlens[0] = 0,
cu_seqlens[-1] = T; a repeated offset is an empty sequence (a fixed-shape batch pads its sequence
count with them), which changes nothing for the others. max_seqlen is a Python int no smaller
than the longest length: the CUDA kernels size their grids with it, without a host sync, so a
fixed bound (512) keeps every shape constant. scale defaults to 1 / sqrt(D); dropout_p is applied
to the attention probabilities.

Two paths run the model: `varlen_attention_flash` (FlashAttention's variable-length kernels, CUDA)
and `varlen_attention_padded` (one padded SDPA: CPU, and CUDA cases the flash kernels refuse);
`varlen_attention_reference` defines them, one sequence at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

HALF = (torch.float16, torch.bfloat16)


def varlen_attention(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                     dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
    """Attention of each sequence over itself, by the fastest path for the tensors: those the
    flash kernels take (`flash_supported`) -> `varlen_attention_flash`, with or without dropout;
    anything else (CPU; CUDA in fp32 outside autocast, before sm80, other head sizes) ->
    `varlen_attention_padded`."""
    if flash_supported(qkv):
        return varlen_attention_flash(qkv, cu_seqlens, max_seqlen, dropout_p, scale)
    return varlen_attention_padded(qkv, cu_seqlens, max_seqlen, dropout_p, scale)


def flash_dtype(qkv: torch.Tensor) -> torch.dtype | None:
    """The dtype the flash kernels run qkv in: its own if fp16/bf16, else autocast's while CUDA
    autocast is on in fp16/bf16 (the op has no autocast rule, so the cast is ours), else None."""
    if qkv.dtype in HALF:
        return qkv.dtype
    if qkv.is_cuda and torch.is_autocast_enabled("cuda") and \
            torch.get_autocast_dtype("cuda") in HALF:
        return torch.get_autocast_dtype("cuda")
    return None


def flash_supported(qkv: torch.Tensor) -> bool:
    """Whether `varlen_attention_flash` takes qkv (or a tensor of its kind): CUDA, sm80 or newer,
    fp16/bf16 (or under such autocast), head size a multiple of 8 up to 256."""
    return (qkv.is_cuda and flash_dtype(qkv) is not None
            and qkv.shape[-1] % 8 == 0 and qkv.shape[-1] <= 256
            and torch.cuda.get_device_properties(qkv.device).major >= 8)


def varlen_attention_flash(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                           dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
    """FlashAttention's variable-length kernels, forward and backward, with dropout: torch's
    `aten._flash_attention_forward` / `_flash_attention_backward` on cu_seqlens, wrapped in the
    custom op `bertperf::varlen_flash_attention` (one node for torch.compile; the backward is
    registered with it and stacks dq, dk, dv into qkv's one gradient). CUDA sm80+, fp16/bf16;
    fp32 inputs under fp16/bf16 autocast are cast here and the output stays in that dtype.

    Dropout draws its keep mask in the kernel from the default CUDA generator (philox, safe under
    CUDA-graph capture); the forward returns the generator state it used (rng_state) and the
    backward regenerates the same mask from it. The kernel compares 8 random bits with
    floor((1 - p) * 255), so it keeps a probability with chance (floor((1 - p) * 255) + 1) / 256
    (0.8984 for p = 0.1) and scales the kept ones by 1 / (1 - p). Nothing here reads a device
    value on the host; max_seqlen only sizes the grid (blocks past a sequence's end exit)."""
    dtype = flash_dtype(qkv)
    if dtype is None:
        raise ValueError(f"flash attention runs in float16 or bfloat16, not {qkv.dtype}")
    scale = qkv.shape[-1] ** -0.5 if scale is None else scale
    out, _, _, _ = flash_forward(qkv.to(dtype), cu_seqlens.to(torch.int32), max_seqlen,
                                 float(dropout_p), float(scale))
    return out


@torch.library.custom_op("bertperf::varlen_flash_attention", mutates_args=(),
                         tags=(torch.Tag.nondeterministic_seeded,))
def flash_forward(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, dropout_p: float,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The output [T, H, D], the softmax log-sum-exp [H, T] (fp32) and the two rng tensors of
    the aten op ((seed, offset) as uint64[2] and a scalar), all kept for the backward. The kernel
    reads q, k, v as strided views of qkv."""
    q, k, v = qkv.unbind(1)
    out, lse, rng_state, rng_unused, _ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, False, False,
        scale=scale)
    return out, lse, rng_state, rng_unused


@flash_forward.register_fake
def _(qkv, cu_seqlens, max_seqlen, dropout_p, scale):
    # As the CUDA kernel allocates them (all on qkv's device).
    total, _, heads, dim = qkv.shape
    return (qkv.new_empty((total, heads, dim)), qkv.new_empty((heads, total), dtype=torch.float32),
            qkv.new_empty((2,), dtype=torch.uint64), qkv.new_empty((), dtype=torch.uint64))


def _flash_setup_context(ctx, inputs, output) -> None:
    qkv, cu_seqlens, max_seqlen, dropout_p, scale = inputs
    out, lse, rng_state, rng_unused = output
    ctx.mark_non_differentiable(lse, rng_state, rng_unused)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(qkv, cu_seqlens, out, lse, rng_state, rng_unused)
    ctx.max_seqlen, ctx.dropout_p, ctx.scale = max_seqlen, dropout_p, scale


def _flash_backward(ctx, grad_out, *_):
    qkv, cu_seqlens, out, lse, rng_state, rng_unused = ctx.saved_tensors
    grads = torch.ops.aten._flash_attention_backward(
        grad_out, *qkv.unbind(1), out, lse, cu_seqlens, cu_seqlens, ctx.max_seqlen,
        ctx.max_seqlen, ctx.dropout_p, False, rng_state, rng_unused, scale=ctx.scale)
    return torch.stack(grads, 1), None, None, None, None


flash_forward.register_autograd(_flash_backward, setup_context=_flash_setup_context)


def varlen_attention_padded(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                            dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
    """The sequences scattered into a zero-padded [S, max_seqlen, 3, H, D] batch, one batched
    `scaled_dot_product_attention` with padding keys masked out, and the real rows gathered
    back. Costs S * max_seqlen^2 instead of sum(L^2), but runs as a few large kernels (the
    per-sequence loop of the reference spends most of its backward zero-filling and adding
    [T, H, D] gradients once per sequence: 6 s vs 0.3 s per step of the tiny demo model), and
    reads nothing back to the host, so on CUDA it is the sync-free fallback where the flash
    kernels do not apply (SDPA picks its CUDA kernel for a masked batch, memory-efficient
    attention where it can, dropout included)."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    num_seqs, (total, _, heads, dim) = len(lengths), qkv.shape
    seq = torch.repeat_interleave(torch.arange(num_seqs, device=qkv.device), lengths,
                                  output_size=total)
    slot = seq * max_seqlen + torch.arange(total, device=qkv.device) - cu_seqlens.long()[seq]
    padded = qkv.new_zeros(num_seqs * max_seqlen, *qkv.shape[1:]).index_copy(0, slot, qkv)
    q, k, v = (x.transpose(1, 2) for x in padded.view(num_seqs, max_seqlen, 3, heads, dim)
               .unbind(2))  # [S, H, L, D]
    keys = torch.arange(max_seqlen, device=qkv.device)[None, :] < lengths[:, None]  # [S, L]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keys[:, None, None, :],
                                         dropout_p=dropout_p, scale=scale)
    return out.transpose(1, 2).reshape(num_seqs * max_seqlen, heads, dim).index_select(0, slot)


def varlen_attention_reference(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                               dropout_p: float = 0.0, scale: float | None = None,
                               dropout_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The definition, one sequence at a time: softmax(q k^T * scale), dropout, times v.
    dropout_mask (bool [S, H, M, M], M >= the longest length, True = keep) replaces the random
    draw: sequence i keeps the probabilities where dropout_mask[i, :, :L_i, :L_i] is True and
    scales them by 1 / (1 - dropout_p), so a path can be checked against the mask it drew.
    max_seqlen is not needed here."""
    q, k, v = qkv.unbind(1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    bounds = cu_seqlens.tolist()
    outs = []
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        qs, ks, vs = (x[start:end].transpose(0, 1) for x in (q, k, v))  # [H, L, D]
        probs = torch.softmax(qs @ ks.transpose(1, 2) * scale, dim=-1)
        if dropout_p > 0 and dropout_mask is None:
            probs = F.dropout(probs, dropout_p, training=True)
        elif dropout_p > 0:
            probs = probs * dropout_mask[i, :, :end - start, :end - start] / (1 - dropout_p)
        outs.append((probs @ vs).transpose(0, 1))
    return torch.cat(outs) if outs else q.new_empty(q.shape)
