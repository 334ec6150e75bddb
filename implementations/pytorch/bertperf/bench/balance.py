"""Per-step imbalance across ranks of the global batches of real shards, before and after
data/balance.py places the samples (what the trainer's BALANCE=1 does).

Reads the sample lengths (rows' tokens, for packed shards) of a folder of shards (the offsets
only) and walks the loader's epoch order for --seed:
- unpadded or packed shards: data/order.py's EpochPlan, the 1-rank global stream that every rank
  walks with LOADER_SPLIT=global_batch, epochs 0, 1, 2, ... one after another, cut into global
  batches of W*b samples (b = --batch). A global batch larger than an epoch (1,024 x 32 on the
  wiki sample) therefore spans epochs, so its samples repeat across them; the table says how many
  batches were measured (--batches at most) and how many epochs they took.
- a `prep stratify` output (LAYOUT=stratified): data/order.py's StratifiedPlan, every rank's b
  samples drawn from each length bin in proportion; its global batches of epoch 0 only (a world
  size whose global batch needs more than one epoch of the scarcest bin is reported as such).

For each W in --ranks it prints the max/mean over the ranks of their tokens (sum of L) and of their
attention cost (sum of L^2; for packed rows the square of the row's tokens), averaged over the
batches and, in brackets, the worst batch: before (rank r taking the batch's rows r*b..(r+1)*b-1,
the loader without BALANCE) and after (data.balance.place), and the time the balancer takes per
global batch. Goal: tokens max/mean <= 1.02 after, at every W.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bertperf.data.balance import contiguous, imbalance, place
from bertperf.data.dataset import ShardDataset
from bertperf.data.order import EpochPlan, StratifiedPlan
from bertperf.errors import UserError

GOAL = 1.02


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="out/wiki_sample/unpadded",
                   help="folder of unpadded or packed shards, or a prep stratify output "
                        "(default out/wiki_sample/unpadded, from make demo-wiki)")
    p.add_argument("--ranks", default="8,64,1024",
                   help="simulated world sizes, comma-separated (default 8,64,1024)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank, b (default 32)")
    p.add_argument("--batches", type=int, default=50,
                   help="global batches to measure per world size, at most (default 50)")
    p.add_argument("--seed", type=int, default=1, help="seed of the epoch order (default 1)")


def stream(dataset: ShardDataset, seed: int, need: int) -> tuple[np.ndarray, int]:
    """The lengths of at least `need` samples of the 1-rank global stream, epochs 0, 1, ... in
    a row, and how many epochs that took."""
    parts, have, epoch = [], 0, 0
    while have < need:
        plan = EpochPlan(dataset.counts, seed, epoch)
        for shard, rows in plan.refs(0, plan.length):
            parts.append(dataset.lengths(shard)[rows])
            have += len(rows)
        epoch += 1
    return np.concatenate(parts), epoch


def stratified_stream(dataset: ShardDataset, seed: int, world: int, b: int,
                      batches: int) -> np.ndarray:
    """The lengths of the first global batches (at most `batches`) of epoch 0 of stratified
    data, every rank's b samples in rank order."""
    plan = StratifiedPlan(dataset.bin_counts(), seed, 0, 0, world, block=b)
    refs = plan.everyone(0, min(plan.batches, batches) * b)
    # everyone() gives rank after rank; regroup into global batches of W*b, rank order kept
    flat = np.concatenate([dataset.lengths(shard)[rows] for shard, rows in refs]) if refs \
        else np.zeros(0, dtype=np.int32)
    n = len(flat) // world // b
    return flat.reshape(world, n, b).transpose(1, 0, 2).reshape(-1)


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
    stratified = ShardDataset.is_stratified(args.data)
    dataset = (ShardDataset.from_stratified if stratified else ShardDataset.from_folder)(args.data)
    if dataset.num_samples == 0:
        raise UserError(f"{args.data}: the shards hold no samples")
    what = "length-stratified samples" if stratified else \
        "packed rows" if dataset.packed else "samples"
    print(f"{args.data}: {len(dataset)} shards, {dataset.num_samples} {what}; b = {args.batch} "
          f"a rank, epoch order of seed {args.seed}\n")
    print("| ranks | batches (epochs) | tokens max/mean before | after | sum L^2 max/mean before "
          "| after | balancer ms/batch |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    worst = 1.0
    for w in worlds:
        if stratified:
            s, epochs = stratified_stream(dataset, args.seed, w, args.batch, args.batches), 1
            count = len(s) // (w * args.batch)
            if count == 0:
                print(f"| {w} | 0 | global batch larger than an epoch of the scarcest bin "
                      "| | | | |")
                continue
        else:
            count = args.batches
            s, epochs = stream(dataset, args.seed, w * args.batch * count)
        r = measure(s, w, args.batch, count)
        worst = max(worst, float(r["after"][:, 0].max()))
        print(f"| {w} | {count} ({epochs}) | {_cell(r['before'][:, 0])} | "
              f"{_cell(r['after'][:, 0])} | {_cell(r['before'][:, 1])} | "
              f"{_cell(r['after'][:, 1])} | {r['ms']:.2f} |")
    print(f"\nmean over the batches (worst batch); goal tokens max/mean <= {GOAL} after: "
          f"{'met' if worst <= GOAL else 'NOT met'} (worst {worst:.4f})")
    return 0
