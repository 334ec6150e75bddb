"""Which samples (packed rows, for packed shards) each rank reads in an epoch, and in which order:
a pure function of the seed, the epoch, the rank, the world size and the shards' sample counts,
so a run resumes at any sample exactly. The shards are permuted by (seed, epoch), each shard's
samples by (seed, epoch, shard); concatenated they are the epoch's global stream, of which rank r
reads its slice (split="shards") or rows r*b..(r+1)*b of every global batch of W*b consecutive
samples (split="global_batch": the same global batches at any W); every rank reads S // W samples.
EpochPlan is that order; StratifiedPlan draws every rank's batch from each length bin of a
`prep stratify` output in fixed proportion. Random numbers: PCG64 raw output and a stable
argsort (the same on every numpy). docs/design.md, "Epoch order", has the rules in full."""

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
                 block: int = 1, key: tuple[int, ...] = ()) -> None:
        if seed < 0 or epoch < 0:
            raise ValueError("seed and epoch must be non-negative")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        if split not in SPLITS or block < 1:
            raise ValueError(f"split must be one of {SPLITS} and block >= 1")
        self.split, self.block, self.key = split, block, tuple(key)
        self.counts = np.asarray(counts, dtype=np.int64)
        self.seed, self.epoch, self.rank, self.world_size = seed, epoch, rank, world_size
        self.shard_order = permutation(len(self.counts), seed, epoch, *self.key, 0)
        self.cum = offsets_from_lengths(self.counts[self.shard_order])
        total = int(self.cum[-1])
        self.length = total // world_size  # samples this rank reads in the epoch
        self.start = rank * self.length  # its slice of the global stream
        self._perms: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._perm_cache = perm_cache

    def shard_permutation(self, shard: int) -> np.ndarray:
        p = self._perms.get(shard)
        if p is None:
            p = permutation(int(self.counts[shard]), self.seed, self.epoch, *self.key, 1, shard)
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

    def everyone(self, start: int, stop: int) -> list[tuple[int, np.ndarray]]:
        """Every rank's samples at positions start..stop-1, in rank order: with
        split="global_batch" and start..stop one batch, a global batch of the 1-rank stream."""
        out: list[tuple[int, np.ndarray]] = []
        b, full = self.block, self.length // self.block
        if self.split == "global_batch" and start % b == 0 and (
                stop - start == b and start // b < full or
                start == full * b and stop == self.length > start):
            # one whole global batch: the ranks' parts follow each other in the global stream
            g0 = self.global_ranges(start, start + 1, 0)[0][0]
            g1 = self.global_ranges(stop - 1, stop, self.world_size - 1)[0][1]
            self._refs(g0, g1, out)
            return out
        for r in range(self.world_size):
            out += self.refs(start, stop, r)
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


def bin_quota(bin_samples: np.ndarray, batch_size: int) -> np.ndarray:
    """How many of a rank's `batch_size` samples come from each length bin: batch_size split in
    proportion to the bins' sample counts, by largest remainder (ties: the lower bin)."""
    n = np.asarray(bin_samples, dtype=np.float64)
    if n.sum() <= 0:
        raise ValueError("the bins hold no samples")
    quota = batch_size * n / n.sum()
    c = np.floor(quota).astype(np.int64)
    c[np.argsort(-(quota - c), kind="stable")[:batch_size - int(c.sum())]] += 1
    return c


class StratifiedPlan:
    """The epoch order of length-stratified data (`prep stratify`: one set of shards per length
    bin): every rank's batch of b samples holds the same number c_k from each bin k (bin_quota).

    Each bin's samples are ordered as an EpochPlan of its own shards (1 rank, permutations keyed
    by the bin as well, so bins are shuffled independently). Global batch j takes W*c_k
    consecutive samples of bin k's order, c_k for each rank in rank order: rank r's slot s (bin k,
    the i-th of its c_k) is sample j*W*c_k + r*c_k + i of bin k. An epoch has as many global
    batches as the scarcest bin allows, min_k floor(n_k / (W*c_k)); the rest of each bin (fewer
    than W*c_k samples of the scarcest, more of the others) is not read that epoch, different ones
    every epoch. `length` is a multiple of b: every batch is whole. Shard numbers in refs() count
    the bins' shards one bin after another (ShardDataset.from_stratified's order)."""

    def __init__(self, bin_counts: list[np.ndarray], seed: int, epoch: int, rank: int = 0,
                 world_size: int = 1, block: int = 1) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        if block < 1:
            raise ValueError("block >= 1")
        self.seed, self.epoch, self.rank, self.world_size, self.block = \
            seed, epoch, rank, world_size, block
        self.bins = [EpochPlan(c, seed, epoch, key=(k,)) for k, c in enumerate(bin_counts)]
        self.first_shard = offsets_from_lengths(
            np.array([len(c) for c in bin_counts], dtype=np.int64))
        self.quota = bin_quota([p.length for p in self.bins], block)
        self.slots = offsets_from_lengths(self.quota)  # rank-batch slots of bin k: [slots[k], ..)
        self.batches = min(p.length // (world_size * int(q))
                           for p, q in zip(self.bins, self.quota) if q > 0)
        self.length = self.batches * block

    def refs(self, start: int, stop: int, rank: int | None = None) -> list[tuple[int, np.ndarray]]:
        """This rank's (or rank `rank`'s) samples at positions start..stop-1, as (shard, rows)
        runs in stream order."""
        r = self.rank if rank is None else rank
        b, w = self.block, self.world_size
        out: list[tuple[int, np.ndarray]] = []
        start, stop = max(0, start), min(stop, self.length)
        for j in range(start // b, -(-stop // b)):
            lo, hi = max(start - j * b, 0), min(stop - j * b, b)  # slots of batch j wanted
            for k, plan in enumerate(self.bins):
                a, z = max(lo, self.slots[k]), min(hi, self.slots[k + 1])
                if z > a:
                    base = j * w * self.quota[k] + r * self.quota[k] - self.slots[k]
                    out += [(int(self.first_shard[k]) + shard, rows)
                            for shard, rows in plan.refs(int(base + a), int(base + z))]
        return out

    def everyone(self, start: int, stop: int) -> list[tuple[int, np.ndarray]]:
        """Every rank's samples at positions start..stop-1, in rank order."""
        out: list[tuple[int, np.ndarray]] = []
        for r in range(self.world_size):
            out += self.refs(start, stop, r)
        return out
