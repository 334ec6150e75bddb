"""Random pre-training samples and their content digests: make_samples draws samples of given
lengths ([CLS] A [SEP] B [SEP], ~15% masked, random NSP) as the prep stages write them, and
sample_digests is the sorted md5 of each sample, to compare what a stage wrote with what it read
whatever the order or the layout (test_pack.py, test_nvidia_formats.py,
test_stage_failures.py)."""

from __future__ import annotations

import hashlib

import numpy as np

from bertperf.formats.samples import Samples, offsets_from_lengths

CLS, SEP = 101, 102


def make_samples(rng: np.random.Generator, lengths: np.ndarray, max_pred: int = 76) -> Samples:
    """Random samples of the given lengths: [CLS] A [SEP] B [SEP], ~15% masked, random NSP."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = offsets_from_lengths(lengths)
    ids = rng.integers(1000, 30000, size=int(offsets[-1]))
    ids[offsets[:-1]] = CLS
    ids[offsets[1:] - 1] = SEP
    b_starts = np.minimum(2 + rng.integers(0, np.maximum(lengths - 2, 1)), lengths)
    positions, mlm_ids, counts = [], [], []
    for n in lengths:
        k = int(min(max_pred, max(1, round(0.15 * (n - 3)))), )
        k = min(k, int(n) - 1)
        pos = np.sort(rng.choice(np.arange(1, n), size=k, replace=False))
        positions.append(pos)
        mlm_ids.append(rng.integers(1000, 30000, size=k))
        counts.append(k)
    return Samples(ids, offsets, b_starts, np.concatenate(positions), np.concatenate(mlm_ids),
                   offsets_from_lengths(np.array(counts)), rng.integers(0, 2, size=len(lengths)))


def sample_digests(s: Samples) -> list[str]:
    out = []
    for i in range(len(s)):
        a, b = s.offsets[i], s.offsets[i + 1]
        m0, m1 = s.mlm_offsets[i], s.mlm_offsets[i + 1]
        h = hashlib.md5()
        for part in (s.input_ids[a:b], [s.b_starts[i], s.nsp[i]], s.mlm_positions[m0:m1],
                     s.mlm_ids[m0:m1]):
            h.update(np.asarray(part, dtype=np.int64).tobytes() + b"|")
        out.append(h.hexdigest())
    return sorted(out)
