"""Synthetic training data of MLPerf's shape: samples with an MLPerf-like length mix (valid for
every reader and stage), packed greedily, and written as unpadded or packed shards. The benchmarks,
the trainer's compile warm-up and `make gpu-check` use it where no real data is at hand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from bertperf.formats.samples import Samples, offsets_from_lengths, ranges
from bertperf.formats.unpadded import write_shard


def synthetic_samples(n: int, seed: int, max_seq_length: int = 512, max_pred: int = 76,
                      vocab_size: int = 30522) -> Samples:
    """n valid samples with an MLPerf-like length mix: about half near the maximum, a third in
    between, a tenth short; 15 % of positions masked (at most max_pred), B starting inside."""
    rng = np.random.default_rng(seed)
    lo = min(8, max_seq_length)
    kind = rng.random(n)
    lengths = np.where(kind < 0.55, rng.integers(max(lo, max_seq_length * 15 // 16),
                                                 max_seq_length + 1, n),
                       np.where(kind < 0.9, rng.integers(max(lo, max_seq_length // 4),
                                                         max_seq_length + 1, n),
                                rng.integers(lo, max(lo, max_seq_length // 4) + 1, n)))
    lengths = np.maximum(lengths, 3).astype(np.int64)
    offsets = offsets_from_lengths(lengths)
    low = 999 if vocab_size > 999 else vocab_size // 2  # word pieces; a tiny vocab's upper half
    ids = rng.integers(low, vocab_size, int(offsets[-1]), dtype=np.int64)
    ids[offsets[:-1]] = min(101, vocab_size - 2)  # [CLS]
    ids[offsets[1:] - 1] = min(102, vocab_size - 1)  # final [SEP]
    b_starts = 2 + (rng.random(n) * (lengths - 2)).astype(np.int64)  # in [2, length - 1]
    counts = np.clip(np.rint(0.15 * lengths).astype(np.int64), 1, min(max_pred, 10**9))
    counts = np.minimum(counts, lengths - 1)
    # ascending distinct positions in 1..length-1: evenly spaced slots, a random offset in each
    owner = np.repeat(np.arange(n), counts)
    k = ranges(np.zeros(n, dtype=np.int64), counts)
    span = (lengths - 1)[owner] / counts[owner]  # >= 1: slots [k*span, (k+1)*span) are disjoint
    slot0 = np.floor(k * span).astype(np.int64)
    slot1 = np.floor((k + 1) * span).astype(np.int64)
    positions = 1 + slot0 + (rng.random(len(k)) * (slot1 - slot0)).astype(np.int64)
    mlm_ids = rng.integers(low, vocab_size, len(positions), dtype=np.int64)
    nsp = (rng.random(n) < 0.5).astype(np.int64)
    return Samples(ids, offsets, b_starts, positions, mlm_ids, offsets_from_lengths(counts), nsp)


def _write_synthetic(folder: Path, shards: int, per_shard: int, seed: int, max_seq_length: int,
                     max_pred: int, write: Callable[[Path, Samples], None]) -> list[Path]:
    """`shards` shards of per_shard synthetic samples each, written by `write(path, samples)`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(shards):
        path = folder / f"part_{i:05d}.h5"
        write(path, synthetic_samples(per_shard, seed * 100003 + i, max_seq_length, max_pred))
        paths.append(path)
    return paths


def write_synthetic_shards(folder: Path, shards: int, per_shard: int, seed: int,
                           max_seq_length: int = 512, max_pred: int = 76) -> list[Path]:
    """Unpadded shards of per_shard synthetic samples each."""
    return _write_synthetic(folder, shards, per_shard, seed, max_seq_length, max_pred,
                            lambda path, s: write_shard(path, s, max_seq_length, max_pred))


def synthetic_packed(samples: Samples, max_seq_length: int = 512, max_seqs_per_row: int = 3):
    """The samples packed greedily in their order (a new row when the next one does not fit)."""
    from bertperf.formats.packed import Packed

    sizes, fill, count = [], 0, 0
    for n in samples.lengths.tolist():
        if count and (fill + n > max_seq_length or count == max_seqs_per_row):
            sizes.append(count)
            fill, count = 0, 0
        fill, count = fill + n, count + 1
    if count:
        sizes.append(count)
    return Packed.from_samples(samples, np.arange(len(samples)), np.asarray(sizes))


def write_synthetic_packed(folder: Path, shards: int, per_shard: int, seed: int,
                           max_seq_length: int = 512, max_pred: int = 76) -> list[Path]:
    """Packed shards of per_shard synthetic samples each (rows of up to 3 sequences)."""
    from bertperf.formats.packed import write_packed

    return _write_synthetic(folder, shards, per_shard, seed, max_seq_length, max_pred,
                            lambda path, s: write_packed(path, synthetic_packed(s, max_seq_length),
                                                         max_seq_length, max_pred, 3))
