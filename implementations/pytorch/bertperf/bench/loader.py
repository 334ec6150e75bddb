"""Speed and memory of the per-rank training data loader (bertperf.data.loader).

Writes synthetic bertperf-unpadded/1 shards (MLPerf-like lengths: 512 tokens at most, 76 masks at
most) and the same samples packed (greedily, up to 3 sequences a row, bertperf-packed/1) into a
temporary folder, or reads --data DIR, and measures for one loader worker (the producing thread)
the samples/s of each kind of batch arrays: padded [B, 512] arrays, unpadded varlen arrays (cu_seqlens)
and packed rows (a batch is batch_size rows; samples/s counts the sequences in them), without and
with prefetching. Then, in a fresh process, the peak RSS of a loader that reads one whole epoch of
--rss_shards (4320) small shards, all on one rank (the worst case: a real rank reads
4320 / world_size of them). Goal: >= 5,000 samples/s from one worker (several times what one
H100 trains, about 1,000 samples/s) and < 2 GB per rank.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable


from bertperf.data.collate import collate_padded
from bertperf.data.dataset import ShardDataset
from bertperf.data.loader import ShardLoader
from bertperf.data.synthetic import write_synthetic_packed, write_synthetic_shards
from bertperf.errors import UserError
from bertperf.formats.samples import Samples

GOAL_RATE = 5000
GOAL_RSS_MB = 2048


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", help="folder of unpadded shards to read (default: synthetic shards)")
    p.add_argument("--batch_size", type=int, default=56, help="local batch size (default 56)")
    p.add_argument("--seconds", type=float, default=3.0, help="time per measurement (default 3)")
    p.add_argument("--shards", type=int, default=8, help="synthetic shards for the rate rows")
    p.add_argument("--samples_per_shard", type=int, default=4096)
    p.add_argument("--rss_shards", type=int, default=4320,
                   help="small shards for the memory row (default 4320; 0 skips it)")
    p.add_argument("--rss_samples_per_shard", type=int, default=24)
    p.add_argument("--seed", type=int, default=1)


# ---- measurements --------------------------------------------------------------------------------

def padded(dataset: ShardDataset) -> Callable[[Samples], dict]:
    """The reference's padded arrays of `dataset`'s samples (data/collate.py collate_padded)."""
    return functools.partial(collate_padded, max_seq_length=dataset.max_seq_length,
                             max_pred=dataset.max_pred)


def measure_rate(dataset: ShardDataset, batch_size: int, arrays: str, prefetch: int,
                 seconds: float) -> tuple[float, float]:
    """(samples/s, tokens/s) of one loader making `arrays` ("padded", "varlen" or, from packed
    shards, "packed") iterated for about `seconds` (whole epochs in a row); for packed rows the
    samples are the sequences in them."""
    loader = ShardLoader(dataset, batch_size, prefetch=prefetch, seed=7,
                         collate=padded(dataset) if arrays == "padded" else None)
    samples = tokens = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for batch in loader:
            samples += int(batch["global_sequences"])  # one rank: its own
            if arrays == "padded":
                tokens += int(batch["input_mask"].sum())
            else:  # varlen and packed batches count themselves
                tokens += int(batch["num_tokens"])
            if time.perf_counter() - t0 >= seconds:
                break
    elapsed = time.perf_counter() - t0
    dataset.close()
    return samples / elapsed, tokens / elapsed


def _rss_kb() -> tuple[int, int]:
    """(current, peak) resident set size of this process in KiB (the peak twice without /proc)."""
    try:
        status = Path("/proc/self/status").read_text().splitlines()
        values = {line.split(":")[0]: int(line.split()[1]) for line in status
                  if line.startswith(("VmRSS:", "VmHWM:"))}
        return values["VmRSS"], values["VmHWM"]
    except (OSError, KeyError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak, peak


def rss_child(folder: str, batch_size: int) -> None:
    """Run in a fresh process: one epoch over every shard in `folder`; print a JSON line."""
    base, _ = _rss_kb()
    t0 = time.perf_counter()
    dataset = ShardDataset.from_folder(folder)
    t_open = time.perf_counter() - t0
    loader = ShardLoader(dataset, batch_size, collate=padded(dataset), prefetch=2, seed=3)
    n = 0
    t1 = time.perf_counter()
    for batch in loader:
        n += len(batch["next_sentence_labels"])
    t_iter = time.perf_counter() - t1
    _, peak = _rss_kb()
    print(json.dumps({"shards": len(dataset), "samples": n, "base_kb": base, "peak_kb": peak,
                      "index_s": t_open, "epoch_s": t_iter}))


def measure_rss(folder: Path, batch_size: int) -> dict:
    code = ("import sys; from bertperf.bench.loader import rss_child; "
            f"rss_child({str(folder)!r}, {batch_size})")
    package_root = str(Path(__file__).resolve().parents[2])  # so the child imports this bertperf
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise UserError(f"bench loader: memory measurement failed: "
                        f"{(run.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bertperf-bench-loader-") as tmp:
        work = Path(tmp)
        if args.data:
            datasets = [ShardDataset.from_folder(args.data)]
            source = f"{args.data} ({len(datasets[0])} {datasets[0].kind} shards)"
        else:
            t0 = time.perf_counter()
            write_synthetic_shards(work / "rate", args.shards, args.samples_per_shard, args.seed)
            write_synthetic_packed(work / "packed", args.shards, args.samples_per_shard, args.seed)
            datasets = [ShardDataset.from_folder(work / "rate"),
                        ShardDataset.from_folder(work / "packed")]
            source = (f"synthetic, {args.shards} shards x {args.samples_per_shard} samples, "
                      f"unpadded and the same packed greedily into "
                      f"{datasets[1].num_samples} rows (written in "
                      f"{time.perf_counter() - t0:.1f} s)")
        rows = []
        for dataset in datasets:
            kind = "packed" if dataset.packed else "unpadded"
            for arrays in ("packed",) if dataset.packed else ("padded", "varlen"):
                for prefetch in (0, 2):
                    rate, tok_rate = measure_rate(dataset, args.batch_size, arrays, prefetch,
                                                  args.seconds)
                    rows.append((f"{kind} shards -> {arrays}", prefetch, rate, tok_rate))
        rss = None
        if args.rss_shards:
            t0 = time.perf_counter()
            write_synthetic_shards(work / "rss", args.rss_shards, args.rss_samples_per_shard,
                                   args.seed + 1)
            t_write = time.perf_counter() - t0
            rss = measure_rss(work / "rss", args.batch_size)
    print(f"\nloader, one worker, batch {args.batch_size} (rows, for packed shards); {source}")
    print(f"| {'arrays':30s} | prefetch | samples/s | tokens/s (M) | tokens/sample | "
          f">= {GOAL_RATE}/s |")
    print(f"|{'-' * 32}|----------|-----------|--------------|---------------|-----------|")
    for label, prefetch, rate, tok_rate in rows:
        ok = "yes" if rate >= GOAL_RATE else "NO"
        print(f"| {label:30s} | {prefetch:8d} | {rate:9.0f} | {tok_rate / 1e6:12.2f} | "
              f"{tok_rate / max(rate, 1e-9):13.0f} | {ok:>9s} |")
    print("(samples = sequences; a packed row holds up to 3)")
    if rss is not None:
        peak, base = rss["peak_kb"] / 1024, rss["base_kb"] / 1024
        ok = "yes" if peak < GOAL_RSS_MB else "NO"
        print(f"\npeak RSS, one rank reading all {rss['shards']} shards ({rss['samples']} samples, "
              f"padded, prefetch 2; fresh process; shards written in {t_write:.1f} s):")
        print(f"| RSS after imports | peak RSS | index {rss['shards']} shards | one epoch | "
              f"< {GOAL_RSS_MB} MB |")
        print("|-------------------|----------|------------------|-----------|-----------|")
        print(f"| {base:14.0f} MB | {peak:5.0f} MB | {rss['index_s']:14.2f} s | "
              f"{rss['epoch_s']:7.2f} s | {ok:>9s} |")
    print(f"\n(total {time.perf_counter() - t_start:.0f} s)")
    return 0
