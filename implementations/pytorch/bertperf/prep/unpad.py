"""Unpad: padded sample files (`prep create`) to the variable-length layout the fast trainer reads.

One output per input file, same stem: `part-00000-of-00500.hdf5` becomes `part-00000-of-00500.h5`
in our flat layout (bertperf-unpadded/1, data/shards.py: token ids as uint16, per-sample offsets,
nothing derivable stored), or `part-00000-of-00500.hdf5` in NVIDIA's variable-length layout with
--output_format nvidia. --input_format nvidia reads NVIDIA's variable-length files instead (data
prepared by NVIDIA's scripts). The reader gives back exactly the padded samples: every padded row
is checked to round-trip (mask a prefix, zero padding, segment B a suffix of the real tokens).

Inputs are checked against their folder's MANIFEST.json when it has one (size and md5). Files are
tasks for local worker processes and MPI ranks; finished outputs are skipped on rerun.

  python -m bertperf prep unpad --input hdf5/ --output unpadded/ [--workers N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from bertperf.data import shards
from bertperf.data.samples import PADDED_FIELDS, Samples
from bertperf.errors import UserError
from bertperf.prep import manifest
from bertperf.prep.fileio import atomic_output, md5_file, remove_stale_temporaries
from bertperf.prep.parallel import World, default_workers, run_tasks

HELP = "padded HDF5 samples to the unpadded layout (ours or NVIDIA's variable-length one)"
STAGE = "unpad"
SUFFIXES = (".h5", ".hdf5", ".hdf")
CHUNK_ROWS = 8192  # padded rows read at a time (~30 MB at 512 tokens)


# ---- inputs checked against their folder's manifest ----------------------------------------------

_MANIFESTS: dict[tuple, dict[str, manifest.Entry]] = {}


def _folder_entries(folder: Path) -> dict[str, manifest.Entry]:
    """The folder's manifest entries ({} when it has none), cached per process while unchanged."""
    stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                  for p in sorted(folder.glob(".manifest-*.jsonl"))
                  + [folder / manifest.MANIFEST_NAME] if p.exists())
    key = (str(folder.resolve()), stamp)
    if key not in _MANIFESTS:
        _MANIFESTS.clear()
        _MANIFESTS[key] = manifest.load(folder) if stamp else {}
    return _MANIFESTS[key]


def verify_input(path: str | Path) -> str:
    """md5 of input `path`; a UserError naming it when its folder's manifest disagrees."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such input file")
    entry = _folder_entries(path.parent).get(path.name)
    where = path.parent / manifest.MANIFEST_NAME
    if entry is not None and (size := path.stat().st_size) != entry.bytes:
        raise UserError(f"{path}: {size} bytes but {where} records {entry.bytes} "
                        "(truncated or replaced)")
    md5 = md5_file(path)
    if entry is not None and md5 != entry.md5:
        raise UserError(f"{path}: md5 {md5} differs from {entry.md5} recorded in {where} "
                        "(corrupt or replaced)")
    return md5


def verify_inputs(paths: list[str | Path]) -> list[str]:
    """verify_input for each path, in order: their md5s."""
    return [verify_input(p) for p in paths]


def key_from_md5s(stage: str, params: dict, named_md5s: list[tuple[str, str]]) -> str:
    """manifest.task_key for inputs whose md5s are already known (same document, same hash)."""
    doc = {"stage": stage, "params": params, "inputs": [[n, m] for n, m in named_md5s]}
    return hashlib.md5(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def list_inputs(spec: str | Path, what: str = "input") -> list[Path]:
    """A file, or the sample files (*.h5, *.hdf5, *.hdf; not hidden) of a folder, sorted by name.

    A sample file that the folder's manifest lists but that is not there is an error."""
    path = Path(spec)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UserError(f"{path}: no such {what} file or folder")
    files = sorted(p for p in path.iterdir()
                   if p.is_file() and p.suffix in SUFFIXES and not p.name.startswith("."))
    if not files:
        raise UserError(f"{path}: no sample files (*.h5, *.hdf5, *.hdf) in this folder")
    present = {p.name for p in files}
    for name in sorted(_folder_entries(path)):
        if Path(name).suffix in SUFFIXES and name not in present and "/" not in name:
            raise UserError(f"{path / name}: listed in {path / manifest.MANIFEST_NAME} but "
                            "missing (incomplete copy?)")
    return files


# ---- reading -------------------------------------------------------------------------------------

def read_padded(path: str | Path, chunk: int = CHUNK_ROWS) -> tuple[Samples, int, int]:
    """A padded file as Samples (compact dtypes), max_seq_length and max_predictions_per_seq.

    Reads CHUNK_ROWS rows at a time and checks that each row round-trips exactly: a row that the
    unpadded layout cannot represent (mask not a prefix, non-zero padding, segment 1 before
    segment 0) is a UserError naming the file and sample.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    parts: list[Samples] = []
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in PADDED_FIELDS if k not in f]
            if missing:
                hint = ""
                if f.attrs.get("format") == shards.FORMAT:
                    hint = " (already unpadded)"
                elif all(k in f for k in shards.NVIDIA_FIELDS):
                    hint = " (an NVIDIA variable-length file: use --input_format nvidia)"
                raise UserError(f"{path}: not a padded sample file, missing "
                                f"{', '.join(missing)}{hint}")
            d = {k: f[k] for k in PADDED_FIELDS}
            n = d["next_sentence_labels"].shape[0] if d["next_sentence_labels"].ndim == 1 else -1
            if n < 0 or any(d[k].ndim != 2 or d[k].shape[0] != n for k in PADDED_FIELDS[:5]):
                raise UserError(f"{path}: datasets disagree on the number of samples or rows")
            length, preds = d["input_ids"].shape[1], d["masked_lm_positions"].shape[1]
            if d["input_mask"].shape[1] != length or d["segment_ids"].shape[1] != length or \
                    d["masked_lm_ids"].shape[1] != preds:
                raise UserError(f"{path}: datasets have inconsistent row lengths")
            for start in range(0, max(n, 1), chunk):
                arrays = {k: d[k][start:start + chunk] for k in PADDED_FIELDS}
                s = Samples.from_padded(arrays)
                back = s.to_padded(length, preds)
                for k in PADDED_FIELDS:
                    if not np.array_equal(back[k], arrays[k]):
                        diff = back[k] != arrays[k]
                        row = start + int(np.argmax(diff.reshape(len(diff), -1).any(axis=1)))
                        raise UserError(f"{path}: sample {row}: {k} is not in the padded layout "
                                        "(mask not a prefix, non-zero padding or segments out of "
                                        "order), so it would not round-trip")
                parts.append(s.astype_compact())
    except UserError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise UserError(f"{path}: truncated or corrupt HDF5 file ({exc})") from None
    samples = parts[0] if len(parts) == 1 else Samples.concat(parts).astype_compact()
    shards.check(path, samples, length, preds)
    return samples, length, preds


def read_nvidia_checked(path: str | Path, max_seq_length: int, max_pred: int) -> Samples:
    """An NVIDIA variable-length file as Samples, checked like our shards."""
    samples = shards.read_nvidia(path)
    shards.check(Path(path), samples, max_seq_length, max_pred)
    return samples


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
    md5 = verify_input(src)
    params = {"input_format": task.input_format, "output_format": task.output_format}
    if task.input_format == "nvidia":
        params.update(max_seq_length=task.max_seq_length, max_pred=task.max_pred)
    key = key_from_md5s(STAGE, params, [(src.name, md5)])
    entries = manifest.load(dst.parent)
    if manifest.is_done(dst.parent, dst.name, key, entries):
        return "skipped", entries[dst.name].samples or 0
    if task.input_format == "nvidia":
        samples = read_nvidia_checked(src, task.max_seq_length, task.max_pred)
        length, preds = task.max_seq_length, task.max_pred
    else:
        samples, length, preds = read_padded(src)
    with atomic_output(dst) as tmp:
        if task.output_format == "nvidia":
            shards.write_nvidia(tmp, samples)
        else:
            shards.write_shard(tmp, samples, length, preds)
    manifest.record(dst.parent, dst.name, manifest.entry_for(dst, STAGE, key, samples=len(samples)))
    return "made", len(samples)


# ---- command line --------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True,
                   help="a sample file, or a folder of them (*.h5, *.hdf5, *.hdf)")
    p.add_argument("--output", required=True, help="output folder (one file per input)")
    p.add_argument("--input_format", choices=("padded", "nvidia"), default="padded",
                   help="padded HDF5 (prep create, NVIDIA's fixed-length files; default) or "
                        "NVIDIA's variable-length layout")
    p.add_argument("--output_format", choices=("bertperf", "nvidia"), default="bertperf",
                   help="our flat layout, STEM.h5 (default), or NVIDIA's variable-length "
                        "layout, STEM.hdf5")
    p.add_argument("--max_seq_length", type=int, default=512,
                   help="limit recorded for NVIDIA input (padded input: its row length)")
    p.add_argument("--max_predictions_per_seq", type=int, default=76,
                   help="limit recorded for NVIDIA input (padded input: its row length)")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="local worker processes (default: all cores)")


def plan(args: argparse.Namespace) -> list[Task]:
    inputs = list_inputs(args.input)
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
    return tasks


def run(args: argparse.Namespace) -> int:
    world = World()
    tasks = plan(args)
    out_dir = Path(args.output)
    if world.rank == 0:
        remove_stale_temporaries(out_dir)
    world.barrier()
    try:
        results = run_tasks(run_task, tasks, workers=args.workers, desc="unpad", world=world)
    finally:  # keep what was finished, even when a file failed
        if world.rank == 0 and ((out_dir / manifest.MANIFEST_NAME).exists()
                                or any(out_dir.glob(".manifest-*.jsonl"))):
            manifest.finalize(out_dir)
    if world.rank == 0:
        made = [n for status, n in results if status == "made"]
        skipped = len(results) - len(made)
        note = f", {skipped} already made and verified (skipped)" if skipped else ""
        print(f"unpad: {sum(made)} samples in {len(made)} file(s) -> {out_dir}{note}",
              file=sys.stderr)
    return 0
