"""Length statistics of a folder of sample files, and a PNG histogram of the lengths. Reads padded
HDF5 (`prep create`), unpadded shards, NVIDIA's variable-length files, packed shards or NVIDIA's
packed files, detected per file, on --workers processes, reading only what it counts (offsets and
masks, never the token ids of unpadded or packed shards; NVIDIA's packed files are read and checked
whole), so it runs on the full dataset. Prints the samples (packed: sequences), mean and median
length, padding at L (1 - tokens / (samples * L)), masked tokens per sample, the NSP random
fraction (label 1), and the packing efficiency (tokens / (rows * L)): as packed for packed input,
else what `prep pack` (<= --max_seqs_per_row per row) reaches on this histogram, with its rows
and sequences per row. Writes the length histogram to --png (default DIR/lengths.png; packed
input adds the row lengths'); --json FILE writes the numbers as JSON.

example:
  python -m bertperf prep stats hdf5/training --png training_lengths.png"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertperf.benchmark import MAX_SEQ_LENGTH
from bertperf.errors import UserError
from bertperf.formats import detect, nvidia
from bertperf.formats import packed as packed_format
from bertperf.formats.files import atomic_output
from bertperf.formats.outputs import claim
from bertperf.prep.parallel import World, default_workers, run_tasks
from bertperf.prep.shards.pack import scan_lengths
from bertperf.prep.shards.packing import MAX_SEQS_PER_ROW, plan_packing


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", help="folder of sample files (padded, unpadded, packed or NVIDIA's), "
                                  "or one file")
    p.add_argument("--png", help="histogram image to write (default: FOLDER/lengths.png)")
    p.add_argument("--json", help="also write the numbers to this JSON file")
    p.add_argument("--max_seqs_per_row", type=int, default=MAX_SEQS_PER_ROW, choices=(1, 2, 3),
                   help="for unpacked input: the packing whose efficiency is reported (default 3)")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="processes reading files (default: all cores)")


@dataclass
class FileStats:
    kind: str
    hist: np.ndarray  # sample (sequence) lengths
    samples: int
    masked: int
    nsp_random: int
    max_seq_length: int | None
    rows: int = 0  # packed only
    row_hist: np.ndarray | None = None  # packed: row lengths
    seqs_hist: np.ndarray | None = None  # packed: sequences per row (index = count)


PACKED_KINDS = (detect.PACKED, detect.NVIDIA_PACKED)


def scan_file(path: str | Path) -> FileStats:
    path = Path(path)
    kind = detect.kind(path)
    if kind not in PACKED_KINDS:
        s = scan_lengths(path, kind)
        return FileStats(kind, s.hist, s.samples, s.masked, s.nsp_random, s.max_seq_length)
    if kind == detect.PACKED:
        p, meta = packed_format.read_packed(path, datasets=packed_format.INDEX_FIELDS)
        L, K, width = meta["max_seq_length"], meta["max_seqs_per_row"], meta["max_seq_length"]
    else:  # NVIDIA's files do not record their limits
        p, L, K, width = nvidia.read_packed(path), None, nvidia.MAX_SEQS_PER_ROW, MAX_SEQ_LENGTH
    return FileStats(kind, np.bincount(p.seq_lengths.astype(np.int64), minlength=width + 1),
                     p.num_sequences, len(p.mlm_positions), int(np.sum(p.nsp == 1)), L, len(p),
                     np.bincount(p.row_lengths, minlength=width + 1),
                     np.bincount(p.seqs_per_row, minlength=K + 1))


def _add(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    if a is None or b is None:
        return b if a is None else a
    out = np.zeros(max(len(a), len(b)), dtype=np.int64)
    out[:len(a)] += a
    out[:len(b)] += b
    return out


def hist_median(hist: np.ndarray) -> float:
    """np.median of the values a histogram counts."""
    n = int(hist.sum())
    if n == 0:
        return float("nan")
    cum = np.cumsum(hist)
    lo = int(np.searchsorted(cum, (n - 1) // 2 + 1))  # the ((n-1)//2)-th value, 0-based
    hi = int(np.searchsorted(cum, n // 2 + 1))  # the (n//2)-th value
    return (lo + hi) / 2


def compute(files: list[Path], workers: int = 1, max_seqs_per_row: int = MAX_SEQS_PER_ROW,
            world: World | None = None) -> dict:
    """The statistics of `files` (one kind or several) as a dict (what `stats` prints)."""
    results = run_tasks(scan_file, [str(f) for f in files], workers=workers, desc="stats",
                        world=world)
    kinds = sorted({r.kind for r in results})
    packed = set(kinds) <= set(PACKED_KINDS)
    if not packed and set(kinds) & set(PACKED_KINDS):
        raise UserError(f"{files[0].parent}: packed and unpacked files mixed ({', '.join(kinds)})")
    widths = {r.max_seq_length for r in results if r.max_seq_length is not None}
    if len(widths) > 1:
        raise UserError(f"{files[0].parent}: files of different max_seq_length {sorted(widths)}")
    L = widths.pop() if widths else MAX_SEQ_LENGTH
    hist = None
    for r in results:
        hist = _add(hist, r.hist)
    hist = _add(hist, np.zeros(L + 1, dtype=np.int64))
    n = int(hist.sum())
    tokens = int((hist * np.arange(len(hist))).sum())
    masked = sum(r.masked for r in results)
    nsp_random = sum(r.nsp_random for r in results)
    out = {
        "folder": str(files[0].parent) if len(files) > 1 else str(files[0]),
        "files": len(files),
        "kind": ",".join(kinds),
        "max_seq_length": L,
        "samples": n,
        "tokens": tokens,
        "mean_length": tokens / n if n else float("nan"),
        "median_length": hist_median(hist),
        "min_length": int(np.flatnonzero(hist)[0]) if n else None,
        "max_length": int(np.flatnonzero(hist)[-1]) if n else None,
        "full_length_fraction": int(hist[L]) / n if n and len(hist) > L else 0.0,
        "padding_fraction": 1 - tokens / (n * L) if n else float("nan"),
        "masked_per_sample": masked / n if n else float("nan"),
        "nsp_random_fraction": nsp_random / n if n else float("nan"),
        "length_histogram": hist.tolist(),
    }
    if packed:
        rows = sum(r.rows for r in results)
        row_hist = seqs_hist = None
        for r in results:
            row_hist, seqs_hist = _add(row_hist, r.row_hist), _add(seqs_hist, r.seqs_hist)
        out["packing"] = {"source": "as packed", "rows": rows,
                          "seqs_per_row": n / rows if rows else 0.0,
                          "efficiency": tokens / (rows * L) if rows else 1.0,
                          "rows_by_sequences": {str(k): int(v) for k, v in enumerate(seqs_hist)
                                                if k},
                          "row_length_histogram": row_hist.tolist()}
    elif n:
        plan = plan_packing(hist[:L + 1], max_seqs_per_row, L)
        out["packing"] = {"source": f"prep pack plan (<= {max_seqs_per_row} per row)",
                          "rows": plan.rows, "seqs_per_row": plan.seqs_per_row,
                          "efficiency": plan.efficiency}
    return out


def report(st: dict) -> str:
    L = st["max_seq_length"]
    lines = [f"stats: {st['folder']} ({st['kind']}, {st['files']} file(s))",
             f"  samples                  {st['samples']}",
             f"  tokens                   {st['tokens']}",
             f"  mean length              {st['mean_length']:.2f}",
             f"  median length            {st['median_length']:g}",
             f"  length min / max         {st['min_length']} / {st['max_length']}",
             f"  samples of length {L:<6} {st['full_length_fraction']:.2%}",
             f"  padding at {L:<13} {st['padding_fraction']:.2%}",
             f"  masked tokens/sample     {st['masked_per_sample']:.3f}",
             f"  NSP random fraction      {st['nsp_random_fraction']:.4f}"]
    if "packing" in st:
        pk = st["packing"]
        lines.append(f"  packing efficiency       {pk['efficiency']:.4%} ({pk['rows']} rows, "
                     f"{pk['seqs_per_row']:.5f} sequences/row; {pk['source']})")
        if "rows_by_sequences" in pk:
            lines.append("  rows by sequences        " + ", ".join(
                f"{k}: {v}" for k, v in pk["rows_by_sequences"].items()))
    return "\n".join(lines)


def plot(st: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L = st["max_seq_length"]
    hist = np.asarray(st["length_histogram"])
    packed = "row_length_histogram" in st.get("packing", {})
    fig, axes = plt.subplots(2 if packed else 1, 1, figsize=(9, 7 if packed else 4.2),
                             squeeze=False)
    ax = axes[0, 0]
    x = np.arange(len(hist))
    ax.bar(x[1:], hist[1:], width=1.0, color="#3b6ea8", linewidth=0)
    ax.axvline(st["mean_length"], color="#d95f02", lw=1, label=f"mean {st['mean_length']:.1f}")
    ax.axvline(st["median_length"], color="#1b9e77", lw=1, ls="--",
               label=f"median {st['median_length']:g}")
    ax.set_xlim(0, L + 1)
    ax.set_xlabel("tokens per sample" + (" (packed sequences)" if packed else ""))
    ax.set_ylabel("samples")
    ax.set_title(f"{Path(st['folder']).name}: {st['samples']:,} samples, "
                 f"{st['full_length_fraction']:.1%} at {L}, padding at {L}: "
                 f"{st['padding_fraction']:.1%}", fontsize=10)
    if hist[L] and hist[L] > 4 * max(1, hist[1:L].max()):
        ax.set_yscale("log")  # the spike at max_seq_length would flatten the rest
    ax.legend(fontsize=8)
    if packed:
        pk = st["packing"]
        rh = np.asarray(pk["row_length_histogram"])
        ax2 = axes[1, 0]
        ax2.bar(np.arange(len(rh))[1:], rh[1:], width=1.0, color="#7570b3", linewidth=0)
        ax2.set_xlim(0, L + 1)
        ax2.set_yscale("log")
        ax2.set_xlabel("tokens per packed row")
        ax2.set_ylabel("rows")
        ax2.set_title(f"{pk['rows']:,} rows, {pk['seqs_per_row']:.3f} sequences/row, "
                      f"efficiency {pk['efficiency']:.2%}", fontsize=10)
    fig.tight_layout()
    with atomic_output(png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise UserError(f"--workers must be at least 1, not {args.workers}")
    target = Path(args.folder)
    files = detect.sample_files(target)
    png = Path(args.png) if args.png else (target if target.is_dir() else target.parent) / "lengths.png"
    for flag, path in (("--png", png), ("--json", args.json)):
        if path is not None:
            claim(flag, path, "prep stats", inputs=[("FOLDER", f) for f in files])
    world = World()
    st = compute(files, args.workers, args.max_seqs_per_row, world)
    if world.rank != 0:
        return 0
    plot(st, png)
    if args.json:
        with atomic_output(args.json) as tmp:
            tmp.write_text(json.dumps(st, indent=1) + "\n")
    print(report(st))
    print(f"  histogram                {png}")
    sys.stdout.flush()
    return 0
