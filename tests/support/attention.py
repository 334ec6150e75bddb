"""Variable-length attention's inputs and its dropout read back: cu_seqlens offsets of sequence
lengths and the keep mask a path drew from a packed [T, 3, H, D] projection (keep_mask_of), for
test_attention.py and tests/gpu/test_kernels_gpu.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def offsets(lengths: list[int]) -> torch.Tensor:
    return F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).to(torch.int32)


def keep_mask_of(path, qkv: torch.Tensor, cu: torch.Tensor, max_seqlen: int, dropout_p: float,
                 seed: int) -> torch.Tensor:
    """The keep mask `path` draws after torch.manual_seed(seed) for qkv's q and k, read from its
    output: with one-hot values (v[start + j, h] = e_j) output row i of a sequence is its row of
    dropped-out probabilities, exactly 0 where dropped. Needs D >= the longest length; returns
    bool [S, H, L, L], L the longest length, as varlen_attention_reference takes it."""
    lengths = (cu[1:] - cu[:-1]).tolist()
    total, _, heads, dim = qkv.shape
    longest = max(lengths)
    assert dim >= longest
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=qkv.device),
                                  (cu[1:] - cu[:-1]).long())
    position = torch.arange(total, device=qkv.device) - cu.long()[seq]
    onehot = F.one_hot(position, dim).to(qkv.dtype)[:, None, :].expand(total, heads, dim)
    torch.manual_seed(seed)
    with torch.no_grad():
        rows = path(torch.stack([qkv[:, 0], qkv[:, 1], onehot], 1), cu, max_seqlen, dropout_p)
    mask = torch.zeros(len(lengths), heads, longest, longest, dtype=torch.bool, device=qkv.device)
    for i, (start, n) in enumerate(zip(cu.tolist(), lengths)):
        mask[i, :, :n, :n] = (rows[start:start + n, :, :n] != 0).transpose(0, 1)
    return mask
