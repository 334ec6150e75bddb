"""Placement of one global batch's W*b samples on W ranks, b each, so that every rank gets nearly
the same tokens (sum of L) and attention cost (sum of L^2): `place(lengths, W)` returns a [W, b]
permutation of the batch's indices (row r: rank r's samples, longest first), deterministic (a
stable sort, a serpentine deal in rounds of W, then swaps between the heaviest and lightest rank
while the heaviest is more than `tolerance` above the mean); `contiguous` is the unbalanced split
and `imbalance` measures a placement. The loader applies it to every global batch with
BALANCE=1 (docs/design.md, "Balanced placement", has the bound and the swap rule)."""

from __future__ import annotations

import numpy as np


def _check(n: int, world_size: int) -> int:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, not {world_size}")
    if n % world_size:
        raise ValueError(f"{n} samples do not split into {world_size} ranks of equal size")
    return n // world_size


def contiguous(n: int, world_size: int) -> np.ndarray:
    """The loader's split: rank r takes samples r*b .. (r+1)*b - 1 of the global batch."""
    b = _check(n, world_size)
    return np.arange(n, dtype=np.int64).reshape(world_size, b)


def place(lengths: np.ndarray, world_size: int, max_swaps: int | None = None,
          tolerance: float = 0.002) -> np.ndarray:
    """[world_size, b] indices into `lengths`: row r is rank r's b samples (module docstring)."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    n = len(lengths)
    b = _check(n, world_size)
    w = world_size
    out = np.empty((w, b), dtype=np.int64)
    if n == 0:
        return out
    order = np.argsort(-lengths, kind="stable")
    rounds = order.reshape(b, w).copy()  # round k: the k-th block of W, longest first
    rounds[1::2] = rounds[1::2, ::-1]  # odd rounds dealt W-1..0
    out[:] = rounds.T
    if w > 1 and b > 0:
        _refine(lengths, out, 4 * w if max_swaps is None else max_swaps,
                tolerance * float(lengths.sum()) / w)
    # each rank's samples longest first (stable: by index among equal lengths)
    within = np.lexsort((out, -lengths[out]), axis=1) if b > 1 else None
    if within is not None:
        out = np.take_along_axis(out, within, axis=1)
    return out


def _refine(lengths: np.ndarray, out: np.ndarray, max_swaps: int, slack: float) -> None:
    """Swap single samples between the heaviest and the lightest rank while that narrows their
    token gap (module docstring, step 2); `out` is changed in place."""
    L = lengths[out]  # [W, b] lengths per slot, kept in step with out
    tokens = L.sum(axis=1)
    squares = (L * L).sum(axis=1)
    for _ in range(max_swaps):
        hi, lo = int(np.argmax(tokens)), int(np.argmin(tokens))
        gap = int(tokens[hi] - tokens[lo])
        if gap <= 1 or tokens[hi] - tokens.mean() <= slack:
            return
        x, y = L[hi], L[lo]
        delta = x[:, None] - y[None, :]  # moving x to lo and y to hi
        useful = (delta > 0) & (delta < gap)
        if not useful.any():
            return
        miss = np.where(useful, np.abs(gap - 2 * delta), np.iinfo(np.int64).max)
        sq_delta = x[:, None] ** 2 - y[None, :] ** 2
        sq_miss = np.abs(int(squares[hi] - squares[lo]) - 2 * sq_delta)
        best = np.flatnonzero(miss == miss.min())
        i, j = divmod(int(best[np.argmin(sq_miss.reshape(-1)[best])]), L.shape[1])
        d, dsq = int(x[i] - y[j]), int(sq_delta[i, j])
        out[hi, i], out[lo, j] = out[lo, j], out[hi, i]
        L[hi, i], L[lo, j] = L[lo, j], L[hi, i]
        tokens[hi] -= d
        tokens[lo] += d
        squares[hi] -= dsq
        squares[lo] += dsq


def loads(lengths: np.ndarray, placement: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank tokens (sum of L) and attention cost (sum of L^2) of a placement."""
    L = np.asarray(lengths, dtype=np.int64)[np.asarray(placement)]
    return L.sum(axis=1), (L * L).sum(axis=1)


def imbalance(lengths: np.ndarray, placement: np.ndarray) -> tuple[float, float]:
    """(max/mean of the ranks' tokens, max/mean of their sum of L^2); 1.0 is perfect balance
    (and the value for an empty or all-zero batch)."""
    tokens, squares = loads(lengths, placement)

    def ratio(v: np.ndarray) -> float:
        mean = float(v.mean()) if v.size else 0.0
        return float(v.max()) / mean if mean > 0 else 1.0

    return ratio(tokens), ratio(squares)
