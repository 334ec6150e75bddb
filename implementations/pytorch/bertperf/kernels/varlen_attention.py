"""Variable-length (unpadded) multi-head self-attention: the tokens of S sequences concatenated,
sequence i = rows cu_seqlens[i]:cu_seqlens[i+1]; a token attends only to the tokens of its own
sequence, with no mask and no padding (NVIDIA: `--unpad_fmha`, fmhalib on packed QKV).

Every function takes q, k, v of shape [T, H, D] and returns [T, H, D]; cu_seqlens is [S+1]
int32, non-decreasing, cu_seqlens[0] = 0, cu_seqlens[-1] = T; a repeated offset is an empty
sequence (a fixed-shape batch pads its sequence count with them), which changes nothing for the
others. max_seqlen is a Python int no smaller than the longest length: the CUDA kernels size
their grids with it, without a host sync, so a fixed bound (512) keeps every shape constant.
scale defaults to 1 / sqrt(D); dropout_p is applied to the attention probabilities.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F



def _varlen_attn():
    """torch.nn.attention.varlen.varlen_attn (FlashAttention's varlen kernels, torch >= 2.10;
    dropout fixed at 0), or None. Imported on first CUDA use: the module pulls in the compiler
    stack (seconds of start-up that CPU runs do not need)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # pragma: no cover - older torch
        return None
    return varlen_attn


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_seqlen: int, dropout_p: float = 0.0,
                     scale: float | None = None) -> torch.Tensor:
    """Attention of each sequence over itself, by the fastest path for the device and arguments:
    CUDA without dropout in fp16/bf16 -> `varlen_attention_flash`; other CUDA cases ->
    `varlen_attention_sdpa`; any other device -> `varlen_attention_padded`."""
    if q.is_cuda:
        if dropout_p == 0.0 and flash_supported(q):
            return varlen_attention_flash(q, k, v, cu_seqlens, max_seqlen, scale)
        return varlen_attention_sdpa(q, k, v, cu_seqlens, max_seqlen, dropout_p, scale)
    return varlen_attention_padded(q, k, v, cu_seqlens, max_seqlen, dropout_p, scale)


def flash_supported(q: torch.Tensor) -> bool:
    """Whether `varlen_attention_flash` takes q (and k, v of the same kind)."""
    return (q.is_cuda and _varlen_attn() is not None
            and q.dtype in (torch.float16, torch.bfloat16)
            and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256
            and torch.cuda.get_device_capability(q.device) >= (8, 0))


def varlen_attention_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens: torch.Tensor, max_seqlen: int,
                           scale: float | None = None) -> torch.Tensor:
    """`torch.nn.attention.varlen.varlen_attn` (FlashAttention / cuDNN varlen kernels, forward
    and backward); CUDA, fp16/bf16, no dropout."""
    varlen_attn = _varlen_attn()
    if varlen_attn is None:
        raise RuntimeError("torch.nn.attention.varlen.varlen_attn needs torch >= 2.10")
    cu = cu_seqlens.to(torch.int32)
    return varlen_attn(q, k, v, cu, cu, max_seqlen, max_seqlen, scale=scale)


def varlen_attention_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          cu_seqlens: torch.Tensor, max_seqlen: int, dropout_p: float = 0.0,
                          scale: float | None = None) -> torch.Tensor:
    """`scaled_dot_product_attention` on jagged nested tensors: one call for all sequences; on
    CUDA it runs the flash or memory-efficient varlen kernels (with dropout), elsewhere a
    per-sequence math path."""
    offsets = cu_seqlens.to(torch.int64)

    def jagged(x: torch.Tensor) -> torch.Tensor:  # [T, H, D] -> [S, H, (L), D]
        return torch.nested.nested_tensor_from_jagged(x, offsets, max_seqlen=max_seqlen) \
            .transpose(1, 2)

    out = F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v), dropout_p=dropout_p,
                                         scale=scale)
    return out.transpose(1, 2).values()


def varlen_attention_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            cu_seqlens: torch.Tensor, max_seqlen: int, dropout_p: float = 0.0,
                            scale: float | None = None) -> torch.Tensor:
    """The CPU path: the sequences scattered into a zero-padded [S, H, max_seqlen, D] batch, one
    batched `scaled_dot_product_attention` with padding keys masked out, and the real rows
    gathered back. Costs S * max_seqlen^2 instead of sum(L^2), but runs as a few large kernels;
    the per-sequence loop of the reference spends most of its backward zero-filling and adding
    [T, H, D] gradients once per sequence (6 s vs 0.3 s per step of the tiny demo model)."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    num_seqs, (total, heads, dim) = len(lengths), q.shape
    seq = torch.repeat_interleave(torch.arange(num_seqs, device=q.device), lengths,
                                  output_size=total)
    slot = seq * max_seqlen + torch.arange(total, device=q.device) - cu_seqlens.long()[seq]

    def padded(x: torch.Tensor) -> torch.Tensor:  # [T, H, D] -> [S, H, L, D]
        out = x.new_zeros(num_seqs * max_seqlen, heads, dim).index_copy(0, slot, x)
        return out.view(num_seqs, max_seqlen, heads, dim).transpose(1, 2)

    keys = torch.arange(max_seqlen, device=q.device)[None, :] < lengths[:, None]  # [S, L]
    out = F.scaled_dot_product_attention(padded(q), padded(k), padded(v),
                                         attn_mask=keys[:, None, None, :], dropout_p=dropout_p,
                                         scale=scale)
    return out.transpose(1, 2).reshape(num_seqs * max_seqlen, heads, dim).index_select(0, slot)


def varlen_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               cu_seqlens: torch.Tensor, max_seqlen: int,
                               dropout_p: float = 0.0,
                               scale: float | None = None) -> torch.Tensor:
    """The definition, one sequence at a time: softmax(q k^T * scale) (dropout) v. max_seqlen is
    not needed here."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    bounds = cu_seqlens.tolist()
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (x[start:end].transpose(0, 1) for x in (q, k, v))  # [H, L, D]
        probs = torch.softmax(qs @ ks.transpose(1, 2) * scale, dim=-1)
        if dropout_p > 0:
            probs = F.dropout(probs, dropout_p, training=True)
        outs.append((probs @ vs).transpose(0, 1))
    return torch.cat(outs) if outs else torch.empty_like(q)
