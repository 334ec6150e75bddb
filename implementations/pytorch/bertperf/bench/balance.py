"""Per-step imbalance across ranks of the global batches of real shards, before and after
data/balance.py places the samples.

Reads the sample lengths of a folder of bertperf-unpadded/1 shards (the offsets only), walks the
loader's epoch order (data/order.py's EpochPlan with --seed: the 1-rank global stream, which with
LOADER_SPLIT=global_batch is what every rank walks), epochs 0, 1, 2, ... one after another, and
cuts that stream into global batches of W*b samples (b = --batch). A global batch larger than an
epoch (1,024 x 32 on the wiki sample) therefore spans epochs, so its samples repeat across them;
the table says how many batches were measured (--batches at most) and how many epochs they took.

For each W in --ranks it prints the max/mean over the ranks of their tokens (sum of L) and of their
attention cost (sum of L^2), averaged over the batches and, in brackets, the worst batch: before
(the loader's contiguous split, rank r taking rows r*b..(r+1)*b-1) and after (data.balance.place),
and the time the balancer takes per global batch. Goal: tokens max/mean <= 1.02 after, at every W.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bertperf.data.balance import contiguous, imbalance, place
from bertperf.data.dataset import ShardDataset
from bertperf.data.order import EpochPlan
from bertperf.errors import UserError
from bertperf.formats.hdf5 import read_datasets

GOAL = 1.02


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="out/wiki_sample/unpadded",
                   help="folder of bertperf-unpadded/1 shards (default out/wiki_sample/unpadded, "
                        "from make demo-wiki)")
    p.add_argument("--ranks", default="8,64,1024",
                   help="simulated world sizes, comma-separated (default 8,64,1024)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank, b (default 32)")
    p.add_argument("--batches", type=int, default=50,
                   help="global batches to measure per world size, at most (default 50)")
    p.add_argument("--seed", type=int, default=1, help="seed of the epoch order (default 1)")


def shard_lengths(dataset: ShardDataset) -> list[np.ndarray]:
    """Each shard's sample lengths, from its offsets."""
    if dataset.packed:
        raise UserError(f"{dataset.files[0].parent}: packed shards; bench balance reads "
                        "bertperf-unpadded/1 shards (prep unpad)")
    out = []
    for path, count in zip(dataset.files, dataset.counts):
        off = read_datasets(path, ["offsets"], "a bertperf-unpadded/1 shard")["offsets"]
        if len(off) != count + 1:
            raise UserError(f"{path}: {len(off) - 1} samples, {int(count)} expected "
                            "(MANIFEST.json stale?)")
        out.append(np.diff(off.astype(np.int64)))
    return out


def stream(lengths: list[np.ndarray], seed: int, need: int) -> tuple[np.ndarray, int]:
    """The lengths of at least `need` samples of the 1-rank global stream, epochs 0, 1, ... in
    a row, and how many epochs that took."""
    counts = np.array([len(x) for x in lengths], dtype=np.int64)
    parts, have, epoch = [], 0, 0
    while have < need:
        plan = EpochPlan(counts, seed, epoch)
        for shard, rows in plan.refs(0, plan.length):
            parts.append(lengths[shard][rows])
            have += len(rows)
        epoch += 1
    return np.concatenate(parts), epoch


def measure(all_lengths: np.ndarray, world: int, b: int, batches: int) -> dict:
    n = world * b
    before, after, seconds = [], [], []
    split = contiguous(n, world)
    for k in range(batches):
        x = all_lengths[k * n:(k + 1) * n]
        t = time.perf_counter()
        p = place(x, world)
        seconds.append(time.perf_counter() - t)
        before.append(imbalance(x, split))
        after.append(imbalance(x, p))
    return {"before": np.array(before), "after": np.array(after),
            "ms": 1e3 * float(np.median(seconds))}


def _cell(v: np.ndarray) -> str:
    return f"{v.mean():.4f} ({v.max():.4f})"


def run(args: argparse.Namespace) -> int:
    try:
        worlds = [int(w) for w in str(args.ranks).split(",") if w.strip()]
    except ValueError:
        raise UserError(f"--ranks {args.ranks!r}: comma-separated integers expected") from None
    if not worlds or min(worlds) < 1 or args.batch < 1 or args.batches < 1:
        raise UserError("--ranks, --batch and --batches must be positive")
    dataset = ShardDataset.from_folder(args.data)
    lengths = shard_lengths(dataset)
    total = int(sum(len(x) for x in lengths))
    if total == 0:
        raise UserError(f"{args.data}: the shards hold no samples")
    print(f"{args.data}: {len(lengths)} shards, {total} samples; b = {args.batch} samples a rank, "
          f"epoch order of seed {args.seed}\n")
    print("| ranks | batches (epochs) | tokens max/mean before | after | sum L^2 max/mean before "
          "| after | balancer ms/batch |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    worst = 1.0
    for w in worlds:
        s, epochs = stream(lengths, args.seed, w * args.batch * args.batches)
        r = measure(s, w, args.batch, args.batches)
        worst = max(worst, float(r["after"][:, 0].max()))
        print(f"| {w} | {args.batches} ({epochs}) | {_cell(r['before'][:, 0])} | "
              f"{_cell(r['after'][:, 0])} | {_cell(r['before'][:, 1])} | "
              f"{_cell(r['after'][:, 1])} | {r['ms']:.2f} |")
    print(f"\nmean over the batches (worst batch); goal tokens max/mean <= {GOAL} after: "
          f"{'met' if worst <= GOAL else 'NOT met'} (worst {worst:.4f})")
    return 0
