"""Which samples each rank reads in an epoch, and in which order: a pure function of the seed,
the epoch, the rank, the world size and the shards' sample counts, so that a run can resume at any
sample exactly.

Below, a "sample" is a row for packed shards (rows hold up to max_seqs_per_row sequences).

Order (a pure function of seed, epoch, rank, world size and the shards' sample counts):
  1. The shards are permuted with a generator seeded by (seed, epoch): the same on every rank.
  2. The samples of each shard are permuted with a generator seeded by (seed, epoch, shard index).
  3. Concatenated in that order they form the epoch's global stream of S samples. Rank r reads the
     contiguous slice [r*L, (r+1)*L) of it, L = S // world_size. When the shards divide evenly
     (equal sizes, world_size | number of shards) rank r reads exactly the shards at positions
     r*N/W ... (r+1)*N/W - 1 of the permutation, each whole and by itself; otherwise a shard that
     straddles two ranks' slices is read in part by each (disjoint parts of the same permutation).
  4. Policy when S % world_size != 0: the last S % world_size samples of the global stream are not
     read in that epoch (fewer than world_size samples; different ones every epoch, since the
     permutation changes). Every rank therefore reads the same number of samples, L, and so makes
     the same number of batches, which data-parallel training needs.
  3b. split="global_batch" (the trainer's default, config LOADER_SPLIT): every rank walks the
     whole global stream instead, cut into global batches of world_size*batch_size consecutive
     samples; rank r reads rows [r*b, (r+1)*b) of each (b = batch_size). The union over ranks of
     each global batch, in rank order, is then exactly the batch of a 1-rank loader with
     batch_size W*b, so a data-parallel run sees the same global batches whatever the number of
     ranks. Each rank still reads L = S // world_size samples; when L % b = m != 0 the last
     (partial) global batch of W*m samples is split the same way, m rows per rank.
  5. Batches are consecutive runs of `batch_size` samples of the rank's stream; they may span shard
     boundaries, so shards smaller than a batch are fine. drop_last=True (default) drops the last
     partial batch of the epoch; drop_last=False yields it, smaller.
Random numbers come from PCG64 raw output (stable across numpy versions) and a stable argsort.

Resume: the loader's `position` is the number of samples of the current epoch this rank has consumed (after the
batches already yielded). Starting at (epoch, position=k) yields exactly the stream that an
uninterrupted run yields from its sample k on; when k is a multiple of batch_size the batches are
identical too. Finishing an epoch moves the loader to (epoch + 1, 0).
"""

from __future__ import annotations

import collections

import numpy as np

from bertperf.formats.samples import offsets_from_lengths

SPLITS = ("shards", "global_batch")


def permutation(n: int, *key: int) -> np.ndarray:
    """A uniform random permutation of range(n), a pure function of the non-negative ints `key`."""
    if n <= 1:
        return np.arange(n, dtype=np.int64)
    raw = np.random.PCG64(np.random.SeedSequence([0x6265_7274, *key])).random_raw(n)
    return np.argsort(raw, kind="stable").astype(np.int64, copy=False)


class EpochPlan:
    """Which samples rank `rank` of `world_size` reads in `epoch`, in order (module docstring)."""

    def __init__(self, counts: np.ndarray, seed: int, epoch: int, rank: int = 0,
                 world_size: int = 1, perm_cache: int = 8, split: str = "shards",
                 block: int = 1) -> None:
        if seed < 0 or epoch < 0:
            raise ValueError("seed and epoch must be non-negative")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        if split not in SPLITS or block < 1:
            raise ValueError(f"split must be one of {SPLITS} and block >= 1")
        self.split, self.block = split, block
        self.counts = np.asarray(counts, dtype=np.int64)
        self.seed, self.epoch, self.rank, self.world_size = seed, epoch, rank, world_size
        self.shard_order = permutation(len(self.counts), seed, epoch, 0)
        self.cum = offsets_from_lengths(self.counts[self.shard_order])
        total = int(self.cum[-1])
        self.length = total // world_size  # samples this rank reads in the epoch
        self.start = rank * self.length  # its slice of the global stream
        self._perms: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._perm_cache = perm_cache

    def shard_permutation(self, shard: int) -> np.ndarray:
        p = self._perms.get(shard)
        if p is None:
            p = permutation(int(self.counts[shard]), self.seed, self.epoch, 1, shard)
            self._perms[shard] = p
            while len(self._perms) > self._perm_cache:
                self._perms.popitem(last=False)
        else:
            self._perms.move_to_end(shard)
        return p

    def refs(self, start: int, stop: int, rank: int | None = None) -> list[tuple[int, np.ndarray]]:
        """This rank's (or rank `rank`'s) samples at positions start..stop-1, as (shard, rows)
        runs in stream order."""
        start, stop = max(0, start), min(stop, self.length)
        out: list[tuple[int, np.ndarray]] = []
        for g0, g1 in self.global_ranges(start, stop, rank):
            self._refs(g0, g1, out)
        return out

    def global_ranges(self, start: int, stop: int,
                      rank: int | None = None) -> list[tuple[int, int]]:
        """This rank's (or rank `rank`'s) positions start..stop-1 as [g0, g1) ranges of the
        epoch's global stream."""
        r = self.rank if rank is None else rank
        if stop <= start:
            return []
        if self.split == "shards":
            return [(r * self.length + start, r * self.length + stop)]
        b, w = self.block, self.world_size
        full = self.length // b  # whole global batches; then one partial of w*m samples
        out, p = [], start
        while p < stop:
            k = p // b
            if k < full:
                base_local, size, base = k * b, b, k * w * b + r * b
            else:
                base_local, size = full * b, self.length - full * b
                base = full * w * b + r * size
            end = min(stop, base_local + size)
            out.append((base + p - base_local, base + end - base_local))
            p = end
        return out

    def _refs(self, g0: int, g1: int, out: list) -> None:
        j = int(np.searchsorted(self.cum, g0, side="right")) - 1
        while j < len(self.shard_order) and self.cum[j] < g1:
            lo, hi = int(self.cum[j]), int(self.cum[j + 1])
            a, b = max(g0, lo) - lo, min(g1, hi) - lo
            if b > a:
                shard = int(self.shard_order[j])
                out.append((shard, self.shard_permutation(shard)[a:b]))
            j += 1

    def shards(self) -> list[int]:
        """The shards this rank touches this epoch, in reading order."""
        return [s for s, _ in self.refs(0, self.length)]
