"""Split unpadded shards into length bins, each its own set of shuffled shards.

  prep stratify --input unpadded/ --output strat/ [--bins 128,256,384,512] [--shards_per_bin K]
                [--seed N] [--workers N]

Writes one folder per bin (`bin_001-128/`, `bin_129-256/`, ...) with K shards `part_XXXXX.h5`
(bertperf-unpadded/1, plus the attributes bin_min_length/bin_max_length) and a MANIFEST.json,
and `stratify.json`: samples and tokens per bin. A sample of n tokens goes to the first bin whose
upper edge is >= n; every part of a bin gets an equal share of every input shard's samples, and
the result depends on the inputs, --bins, --shards_per_bin and --seed only (docs/design.md,
"Training shards"). The trainer's LAYOUT=stratified gives every rank's batch the same length
profile by drawing fixed counts from each bin (data/order.py StratifiedPlan). Temporary files
live in OUTPUT/.stratify-tmp (as much free space as the input); the outputs replace earlier ones
only when everything succeeded, so a failure leaves no partial output."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertperf.data.order import permutation
from bertperf.data.readers import ShardReader
from bertperf.errors import UserError
from bertperf.formats import detect, manifest
from bertperf.formats.files import atomic_output
from bertperf.formats.hdf5 import new_file
from bertperf.formats.outputs import claim
from bertperf.formats.samples import Samples
from bertperf.formats.unpadded import read_shard, shard_meta, write_shard
from bertperf.prep.parallel import World, default_workers, run_tasks

STAGE = "stratify"
SUMMARY = "stratify.json"
SUMMARY_FORMAT = "bertperf-stratify/1"
TMP = ".stratify-tmp"
_SPILL_TAG, _PART_TAG = 1, 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="folder of bertperf-unpadded/1 shards")
    p.add_argument("--output", required=True, help="folder for the bin folders and stratify.json")
    p.add_argument("--input_glob", default=None,
                   help="shards to take from --input (default: *.h5 and *.hdf5)")
    p.add_argument("--bins", default="128,256,384,512",
                   help="upper edges of the length bins, increasing (default 128,256,384,512)")
    p.add_argument("--shards_per_bin", type=int, default=0,
                   help="shards written per bin (default: as many as input shards)")
    p.add_argument("--seed", type=int, default=12345, help="shuffle seed (default 12345)")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="local worker processes (default: all cores)")
    p.add_argument("--max_task_samples", type=int, default=100_000,
                   help="samples one pass-2 task gathers at a time (default 100000: about "
                        "100 MB at 512 tokens, plus one part being shuffled)")


def parse_bins(text: str) -> list[int]:
    try:
        edges = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--bins: expected comma-separated integers, got {text!r}") from None
    if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise UserError(f"--bins: edges must be positive and increasing, got {text!r}")
    return edges


def bin_names(edges: list[int]) -> list[tuple[str, int, int]]:
    """(folder name, min length, max length) of each bin."""
    width = max(3, len(str(edges[-1])))
    lows = [1] + [e + 1 for e in edges[:-1]]
    return [(f"bin_{lo:0{width}d}-{hi:0{width}d}", lo, hi) for lo, hi in zip(lows, edges)]


@dataclass(frozen=True)
class SpillTask:
    index: int
    path: str
    edges: tuple[int, ...]
    spill_dir: str
    seed: int


@dataclass(frozen=True)
class PartTask:
    bin: int
    parts: tuple[int, int]  # part indices [first, last + 1)
    shards_per_bin: int
    spills: tuple[tuple[str, int, int], ...]  # (spill path, bin samples before it, its samples)
    out_dir: str
    seed: int
    max_seq_length: int
    max_pred: int
    bin_range: tuple[int, int]
    key: str


def spill_path(spill_dir: str, b: int, index: int) -> Path:
    return Path(spill_dir) / f"bin{b}" / f"in_{index:06d}.h5"


def run_spill(task: SpillTask) -> tuple[list[int], list[int]]:
    """Pass 1: one input shard's samples, split by bin and shuffled, spilled. Returns per-bin
    sample and token counts."""
    samples, meta = read_shard(task.path)
    lengths = samples.lengths
    if len(samples) and lengths.max() > task.edges[-1]:
        i = int(np.argmax(lengths > task.edges[-1]))
        raise UserError(f"{task.path}: sample {i} has {int(lengths[i])} tokens, more than the last "
                        f"bin edge {task.edges[-1]}")
    which = np.searchsorted(np.asarray(task.edges), lengths, side="left")
    counts, tokens = [], []
    for b in range(len(task.edges)):
        rows = np.flatnonzero(which == b)
        counts.append(len(rows))
        tokens.append(int(lengths[rows].sum()))
        if len(rows):
            rows = rows[permutation(len(rows), task.seed, _SPILL_TAG, task.index, b)]
            out = spill_path(task.spill_dir, b, task.index)
            out.parent.mkdir(parents=True, exist_ok=True)
            write_shard(out, take(samples, rows), meta["max_seq_length"],
                        meta["max_predictions_per_seq"])
    return counts, tokens


def dealt(before: int, n: int, k: int) -> np.ndarray:
    """How many of the bin stream's samples before..before+n-1 part p gets (stream position j
    goes to part j mod k), for p in 0..k-1."""
    def upto(x: int) -> np.ndarray:  # count of j in [0, x) with j % k == p
        return np.maximum(0, (x - np.arange(k) + k - 1) // k)
    return upto(before + n) - upto(before)


def take(s: Samples, rows: np.ndarray, chunk: int = 4096) -> Samples:
    """s.take(rows), a chunk of rows at a time: Samples.take builds int64 token indices (three
    arrays of 8 bytes a token), which for a whole shard would outweigh the shard itself."""
    if len(rows) <= chunk:
        return s.take(rows)
    return Samples.concat([s.take(rows[i:i + chunk]) for i in range(0, len(rows), chunk)])


def view(s: Samples, a: int, b: int) -> Samples:
    """Samples a..b-1 of `s` as views (no copy)."""
    t0, t1, m0, m1 = (int(x) for x in (s.offsets[a], s.offsets[b], s.mlm_offsets[a],
                                       s.mlm_offsets[b]))
    return Samples(s.input_ids[t0:t1], s.offsets[a:b + 1] - t0, s.b_starts[a:b],
                   s.mlm_positions[m0:m1], s.mlm_ids[m0:m1], s.mlm_offsets[a:b + 1] - m0,
                   s.nsp[a:b])


def run_parts(task: PartTask) -> list[tuple[int, int, int]]:
    """Pass 2: parts task.parts of one bin, from every spill file's share. Returns
    (part, samples, tokens) for each part written."""
    first, last = task.parts
    pieces: list[list[Samples]] = [[] for _ in range(last - first)]
    for path, before, n in task.spills:
        cut = np.zeros(task.shards_per_bin + 1, dtype=np.int64)
        np.cumsum(dealt(before, n, task.shards_per_bin), out=cut[1:])
        if cut[last] == cut[first]:
            continue
        reader = ShardReader(path)
        try:
            block = reader.read_range(int(cut[first]), int(cut[last]))
        finally:
            reader.close()
        base = int(cut[first])
        for p in range(first, last):
            if cut[p + 1] > cut[p]:
                pieces[p - first].append(view(block, int(cut[p]) - base, int(cut[p + 1]) - base))
    done = []
    out_dir = Path(task.out_dir)
    for p in range(first, last):
        parts, pieces[p - first] = pieces[p - first], []  # freed as each part is written
        s = Samples.concat(parts) if parts else None
        del parts
        if s is not None:
            s = take(s, permutation(len(s), task.seed, _PART_TAG, task.bin, p))
        else:
            z64 = np.zeros(1, dtype=np.int64)
            empty = np.zeros(0, dtype=np.uint16)
            s = Samples(empty, z64, empty, empty, empty, z64.copy(), np.zeros(0, dtype=np.uint8))
        out = out_dir / f"part_{p:05d}.h5"
        with atomic_output(out) as tmp:
            write_shard(tmp, s, task.max_seq_length, task.max_pred)
            with new_file(tmp, "a") as f:
                f.attrs["bin_min_length"], f.attrs["bin_max_length"] = task.bin_range
        manifest.record(out_dir, out.name, manifest.entry_for(out, STAGE, task.key, len(s)))
        done.append((p, len(s), int(s.lengths.sum())))
    return done


# ---- planning -----------------------------------------------------------------------------------

def replace_outputs(out_dir: Path, tmp: Path, names: list[str], summary: dict) -> None:
    """Swap the new bin folders (made in `tmp`) and stratify.json in for any earlier ones; on an
    error the earlier ones are put back."""
    trash = tmp / "old"
    trash.mkdir()
    moved: list[str] = []
    placed: list[str] = []
    try:
        for old in sorted(out_dir.glob("bin_*")):
            if old.is_dir():
                old.rename(trash / old.name)
                moved.append(old.name)
        for name in names:
            (tmp / name).rename(out_dir / name)
            placed.append(name)
        with atomic_output(out_dir / SUMMARY) as t:
            t.write_text(json.dumps(summary, indent=1) + "\n")
    except BaseException:
        for name in placed:
            shutil.rmtree(out_dir / name, ignore_errors=True)
        for name in moved:
            (trash / name).rename(out_dir / name)
        raise
    shutil.rmtree(tmp)


def run(args: argparse.Namespace) -> int:
    edges = parse_bins(args.bins)
    if args.seed < 0:
        raise UserError("--seed must be non-negative")
    if args.shards_per_bin < 0 or args.max_task_samples < 1:
        raise UserError("--shards_per_bin and --max_task_samples must be positive")
    in_dir, out_dir = Path(args.input), Path(args.output)
    inputs = detect.sample_files(in_dir, pattern=args.input_glob)
    if out_dir.resolve() == in_dir.resolve():
        raise UserError(f"{out_dir}: output folder must differ from the input folder")
    claim("--output", out_dir, "prep stratify", inputs=[("--input", p) for p in inputs])
    metas = [shard_meta(p) for p in inputs]  # cheap: headers only; fails on a corrupt header
    msl = {m["max_seq_length"] for m in metas}
    mpred = {m["max_predictions_per_seq"] for m in metas}
    if len(msl) > 1 or len(mpred) > 1:
        raise UserError(f"{in_dir}: shards disagree on max_seq_length/max_predictions_per_seq "
                        f"({sorted(msl)}, {sorted(mpred)})")
    max_seq_length, max_pred = msl.pop(), mpred.pop()
    if max_seq_length > edges[-1]:
        raise UserError(f"--bins: the last edge {edges[-1]} is below the shards' max_seq_length "
                        f"{max_seq_length}; add an edge >= {max_seq_length}")
    k = args.shards_per_bin or len(inputs)
    names = bin_names(edges)
    world = World()
    tmp = out_dir / TMP
    spill_dir = tmp / "spill"
    # a failure leaves nothing: the temporary folder goes, then the output folder if it is new
    with manifest.stage_outputs([out_dir], world.rank == 0):
        try:
            if world.rank == 0:
                if tmp.exists():
                    shutil.rmtree(tmp)  # left by a killed run
                spill_dir.mkdir(parents=True)
            world.barrier()
            # pass 1
            results = run_tasks(run_spill, [SpillTask(i, str(p), tuple(edges), str(spill_dir),
                                                      args.seed) for i, p in enumerate(inputs)],
                                workers=args.workers, desc="stratify (bin)", world=world)
            shape = (len(inputs), len(edges))
            counts = np.array([c for c, _ in results], dtype=np.int64).reshape(shape)
            tokens = np.array([t for _, t in results], dtype=np.int64).reshape(shape)
            # pass 2
            params = {"bins": edges, "shards_per_bin": k, "seed": args.seed}
            key = manifest.task_key(STAGE, params,
                                    [(p.name, manifest.recorded_md5(p)) for p in inputs])
            tasks = []
            for b, (name, lo, hi) in enumerate(names):
                total = int(counts[:, b].sum())
                before = np.concatenate([[0], np.cumsum(counts[:, b])[:-1]])
                spills = tuple((str(spill_path(str(spill_dir), b, i)), int(before[i]),
                                int(counts[i, b])) for i in range(len(inputs)) if counts[i, b])
                if world.rank == 0:
                    (tmp / name).mkdir()
                if not total:
                    continue
                per_task = max(1, args.max_task_samples // max(1, -(-total // k)))
                per_task = min(per_task, max(1, -(-k // max(1, args.workers * world.size))))
                for first in range(0, k, per_task):
                    tasks.append(PartTask(b, (first, min(k, first + per_task)), k, spills,
                                          str(tmp / name), args.seed, max_seq_length, max_pred,
                                          (lo, hi), key))
            world.barrier()
            run_tasks(run_parts, tasks, workers=args.workers, desc="stratify (write)", unit="task",
                      world=world)
            if world.rank == 0:
                shutil.rmtree(spill_dir)
                for name, _, _ in names:
                    manifest.finalize(tmp / name)
                summary = {
                    "format": SUMMARY_FORMAT, "input": str(in_dir), "input_shards": len(inputs),
                    "seed": args.seed, "shards_per_bin": k, "max_seq_length": max_seq_length,
                    "max_predictions_per_seq": max_pred,
                    "samples": int(counts.sum()), "tokens": int(tokens.sum()),
                    "bins": [{"name": name, "min_length": lo, "max_length": hi,
                              "samples": int(counts[:, b].sum()), "tokens": int(tokens[:, b].sum()),
                              "shards": k if counts[:, b].sum() else 0}
                             for b, (name, lo, hi) in enumerate(names)],
                }
                replace_outputs(out_dir, tmp, [n for n, _, _ in names], summary)
                print(f"stratify: {summary['samples']} samples from {len(inputs)} shard(s) into "
                      f"{len(edges)} bins x {k} shards: "
                      + ", ".join(f"{b['name']} {b['samples']}" for b in summary["bins"]),
                      file=sys.stderr)
        except BaseException:
            if world.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
    world.barrier()
    return 0
