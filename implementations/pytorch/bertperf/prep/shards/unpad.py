"""Unpad: padded sample files (`prep create`) to the variable-length layout the fast trainer reads.

One output per input file, same stem: `part-00000-of-00500.hdf5` becomes `part-00000-of-00500.h5`
in our flat layout (bertperf-unpadded/1, formats/unpadded.py: token ids as uint16, per-sample
offsets, nothing derivable stored), or `part-00000-of-00500.hdf5` in NVIDIA's variable-length
layout with --output_format nvidia. The input layout is detected per file (or --input_format):
padded files, NVIDIA's variable-length files, or NVIDIA's packed files (`part_XXXXX`, whose rows'
sequences become samples, in row order) for data prepared by NVIDIA's scripts. The padded reader
gives back exactly the padded samples: every padded row is checked to round-trip (mask a prefix,
zero padding, segment B a suffix of the real tokens).

Inputs are checked against their folder's MANIFEST.json when it has one (size and md5). Files are
tasks for local worker processes and MPI ranks; finished outputs are skipped on rerun.

  python -m bertperf prep unpad --input hdf5/ --output unpadded/ [--workers N]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from bertperf.errors import UserError
from bertperf.formats import detect, manifest, nvidia, unpadded
from bertperf.formats.files import atomic_output, remove_stale_temporaries
from bertperf.formats.reading import read_samples
from bertperf.prep.parallel import World, default_workers, run_tasks

STAGE = "unpad"
INPUT_KINDS = (detect.PADDED, detect.NVIDIA, detect.NVIDIA_PACKED)


# ---- the per-file task ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Task:
    src: str
    dst: str
    input_format: str
    output_format: str
    max_seq_length: int
    max_pred: int


def output_name(src: Path, output_format: str) -> str:
    return src.stem + (".hdf5" if output_format == "nvidia" else ".h5")


def run_task(task: Task) -> tuple[str, int]:
    """Unpad one file unless its output exists and verifies. ("made"|"skipped", samples)."""
    src, dst = Path(task.src), Path(task.dst)
    md5 = manifest.verified_md5(src)
    kind = detect.kind(src) if task.input_format == "auto" else task.input_format
    params = {"input_format": kind, "output_format": task.output_format}
    if kind != detect.PADDED:
        params.update(max_seq_length=task.max_seq_length, max_pred=task.max_pred)
    key = manifest.task_key(STAGE, params, [(src.name, md5)])
    entries = manifest.load(dst.parent)
    if manifest.is_done(dst.parent, dst.name, key, entries):
        return "skipped", entries[dst.name].samples or 0
    kinds = INPUT_KINDS if task.input_format == "auto" else (task.input_format,)
    samples, length, preds = read_samples(src, kinds, task.max_seq_length, task.max_pred)
    with atomic_output(dst) as tmp:
        if task.output_format == "nvidia":
            nvidia.write_varlen(tmp, samples)
        else:
            unpadded.write_shard(tmp, samples, length, preds)
    manifest.record(dst.parent, dst.name, manifest.entry_for(dst, STAGE, key, samples=len(samples)))
    return "made", len(samples)


# ---- command line --------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True,
                   help="a sample file, or a folder of them (*.h5, *.hdf5, *.hdf)")
    p.add_argument("--output", required=True, help="output folder (one file per input)")
    p.add_argument("--input_format", choices=("auto", *INPUT_KINDS), default="auto",
                   help="detected per file (default), or: padded HDF5 (prep create, NVIDIA's "
                        "fixed-length files), NVIDIA's variable-length or packed layout")
    p.add_argument("--output_format", choices=("bertperf", "nvidia"), default="bertperf",
                   help="our flat layout, STEM.h5 (default), or NVIDIA's variable-length "
                        "layout, STEM.hdf5")
    p.add_argument("--max_seq_length", type=int, default=512,
                   help="limit checked and recorded for NVIDIA input (padded input: its row "
                        "length); for packed input, the row length")
    p.add_argument("--max_predictions_per_seq", type=int, default=76,
                   help="limit checked and recorded for NVIDIA input (padded input: its row "
                        "length)")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="local worker processes (default: all cores)")


def plan(args: argparse.Namespace) -> list[Task]:
    inputs = detect.sample_files(args.input)
    out_dir = Path(args.output)
    if out_dir.resolve() in {p.parent.resolve() for p in inputs}:
        raise UserError(f"{out_dir}: the output folder must differ from the input folder")
    tasks = [Task(str(p), str(out_dir / output_name(p, args.output_format)), args.input_format,
                  args.output_format, args.max_seq_length, args.max_predictions_per_seq)
             for p in inputs]
    dsts = [t.dst for t in tasks]
    if len(set(dsts)) != len(dsts):
        dup = next(d for d in dsts if dsts.count(d) > 1)
        raise UserError(f"{dup}: two inputs would make this output (same stem)")
    manifest.own_outputs(out_dir, STAGE, [Path(d).name for d in dsts])
    return tasks


def run(args: argparse.Namespace) -> int:
    world = World()
    tasks = plan(args)
    out_dir = Path(args.output)
    with manifest.stage_outputs([out_dir], world.rank == 0):  # keeps what was finished
        if world.rank == 0:
            remove_stale_temporaries(out_dir)
        world.barrier()
        results = run_tasks(run_task, tasks, workers=args.workers, desc="unpad", world=world)
        if world.rank == 0:
            manifest.finalize(out_dir)
    if world.rank == 0:
        made = [n for status, n in results if status == "made"]
        skipped = len(results) - len(made)
        note = f", {skipped} already made and verified (skipped)" if skipped else ""
        print(f"unpad: {sum(made)} samples in {len(made)} file(s) -> {out_dir}{note}",
              file=sys.stderr)
    return 0
