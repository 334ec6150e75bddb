"""Speed of `prep create` on the Wikipedia sample with the MLPerf flags.

Runs the text stages once (clean, segment, split into one part per input file), then times `create`
(512 tokens, 76 predictions, dupe factor 10, seed 12345) in several configurations, each into a fresh
folder, and prints samples/s and MB of text/s. The pure-Python row (reference tokenizer and Python
instance builder) is this project's own statement of the reference algorithm; the reference script's
own rate was measured separately (docs/performance.md says how).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bertperf.errors import UserError
from bertperf.resources import find_vocab, find_wiki_sample

MLPERF_FLAGS = ["--max_seq_length=512", "--max_predictions_per_seq=76", "--masked_lm_prob=0.15",
                "--random_seed=12345", "--dupe_factor=10"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wiki_dir", help="wikiextractor files (default: ../shared/data/wiki_sample)")
    p.add_argument("--vocab_file", help="vocab (default: found as in bertperf.resources)")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="the 'all cores' row")
    p.add_argument("--skip_python", action="store_true", help="skip the slow pure-Python row")
    p.add_argument("--copies", type=int, default=4,
                   help="time create on this many copies of each part (more work per process)")


def _timed_process(argv: list[str]) -> float:
    """Run `python -m bertperf argv` in a fresh process (cold caches, imports counted)."""
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "bertperf", *argv], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if run.returncode != 0:
        raise UserError(f"bench: `python -m bertperf {' '.join(argv)}` failed: "
                        f"{run.stderr.strip().splitlines()[-1:]}")
    return seconds


def _samples(folder: Path) -> int:
    doc = json.loads((folder / "MANIFEST.json").read_text())
    return sum(e["samples"] or 0 for e in doc["files"].values())


def run(args: argparse.Namespace) -> int:
    wiki = Path(args.wiki_dir) if args.wiki_dir else find_wiki_sample()
    vocab = str(args.vocab_file or find_vocab())
    rows = []
    with tempfile.TemporaryDirectory(prefix="bertperf-bench-") as tmp:
        work = Path(tmp)
        n_files = len([p for p in wiki.rglob("*") if p.is_file()])
        stages = [
            ("clean", ["prep", "clean", "--input", str(wiki), "--output", str(work / "clean")]),
            ("segment", ["prep", "segment", "--input", str(work / "clean"),
                         "--output", str(work / "segmented")]),
            ("split", ["prep", "split", "--input", str(work / "segmented"), "--raw_dir", str(wiki),
                       "--output", str(work / "parts"), "--num_test_articles", "40",
                       "--block_size", "1.0", "--num_outputs", str(n_files)]),
        ]
        for name, argv in stages:
            seconds = _timed_process(argv + ["--workers", "1"])
            print(f"{name:8s} {seconds:7.2f} s (1 worker, whole process)")
        parts = work / "bench_parts"
        parts.mkdir()
        originals = sorted((work / "parts").glob("part-*"))
        total = len(originals) * args.copies
        for k in range(total):  # copies of the sample parts, so each process has real work
            shutil.copy(originals[k % len(originals)], parts / f"part-{k:05d}-of-{total:05d}")
        text_mb = sum(p.stat().st_size for p in parts.glob("part-*")) / 1e6
        configs = [("C builder", 1, "c", "python"),
                   ("C builder + HF tok.", 1, "c", "hf"),
                   ("C builder", args.workers, "c", "python")]
        if not args.skip_python:
            configs.insert(0, ("pure Python", 1, "python", "python"))
        for label, workers, engine, tok in configs:
            out = work / f"hdf5-{engine}-{tok}-{workers}"
            seconds = _timed_process(
                ["prep", "create", "--input_dir", str(parts), "--output_dir", str(out),
                 "--vocab_file", vocab, "--workers", str(workers), "--engine", engine,
                 "--tokenizer", tok, *MLPERF_FLAGS])
            rows.append((label, workers, seconds, _samples(out)))
    print(f"\ncreate on {text_mb:.2f} MB of text ({total} parts: {args.copies} copies of the "
          f"{len(originals)} parts from {n_files} wiki files), MLPerf flags, fresh process per row")
    print(f"| {'configuration':20s} | workers | seconds | samples | samples/s | MB/s | vs pure Python |")
    print(f"|{'-' * 22}|---------|---------|---------|-----------|------|----------------|")
    base = rows[0][3] / rows[0][2] if not args.skip_python else None
    for label, workers, seconds, samples in rows:
        rate = samples / seconds
        ratio = f"{rate / base:.1f}x" if base else "-"
        print(f"| {label:20s} | {workers:7d} | {seconds:7.2f} | {samples:7d} | {rate:9.0f} | "
              f"{text_mb / seconds:4.2f} | {ratio:>14s} |")
    return 0
