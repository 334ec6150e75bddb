"""Pack up to 3 samples into each fixed-size row (bertperf-packed/1, bertperf.formats.packed).
Reads a folder of unpadded shards, padded HDF5 (`prep create`, `prep eval`) or NVIDIA's
variable-length or packed files (whose rows' sequences are packed anew), detected per file, in
two passes of bounded memory: the lengths, every one checked before anything is written; then a
plan from their histogram (prep.shards.packing) and the samples streamed into the planned rows, a
row written when its last sequence arrives. Output: part-XXXXX-of-NNNNN.hdf5 (one per input file
unless --num_shards or --rows_per_shard say otherwise), each shard's rows shuffled with --seed,
and MANIFEST.json; the shards are moved into --output only when all are complete, and a rerun
that matches the manifest skips the work. Prints rows, sequences per row and the efficiency
(real tokens / (rows * max_seq_length)). --unpack turns packed shards back into unpadded ones
(the same samples, reordered).

examples:
  python -m bertperf prep pack --input unpadded/ --output packed/ --num_shards 4320
  python -m bertperf prep pack --unpack --input packed/ --output unpacked/"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from bertperf.benchmark import MAX_PREDICTIONS, MAX_SEQ_LENGTH
from bertperf.errors import UserError
from bertperf.formats import detect, manifest, nvidia, unpadded
from bertperf.formats import packed as packed_format
from bertperf.formats.files import atomic_output, remove_stale_temporaries
from bertperf.formats.outputs import claim
from bertperf.formats.reading import read_samples
from bertperf.formats.samples import Samples, ranges
from bertperf.prep.parallel import World, default_workers, run_tasks
from bertperf.prep.shards.packing import (DEFAULT_MAX_PENDING, MAX_SEQS_PER_ROW, Packer, Rows,
                                          plan_packing)

STAGE = "pack"
BLOCK_ROWS = 1 << 15  # padded files are read this many samples at a time
PUSH_SAMPLES = 1 << 14  # samples given to the packer at a time (bounds the temporaries)
WRITE_ROWS = 1 << 13  # rows assembled at a time when writing a shard
STAGING_PREFIX = ".pack-staging-"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="folder of sample files (or packed, --unpack)")
    p.add_argument("--output", required=True, help="folder for the packed (or unpacked) shards")
    p.add_argument("--max_seqs_per_row", type=int, default=MAX_SEQS_PER_ROW, choices=(1, 2, 3),
                   help="most sequences in a row (default 3)")
    p.add_argument("--max_seq_length", type=int, default=None,
                   help="row capacity (default: the inputs' max_seq_length, 512 for NVIDIA files)")
    p.add_argument("--seed", type=int, default=12345, help="seed of the row shuffle in each shard")
    shards_ = p.add_mutually_exclusive_group()
    shards_.add_argument("--num_shards", type=int,
                         help="output shards (default: one per input file); each shard is "
                              "assembled in memory, about 1 KB per row")
    shards_.add_argument("--rows_per_shard", type=int, help="rows in each output shard")
    p.add_argument("--max_pending", type=int, default=DEFAULT_MAX_PENDING,
                   help="most samples held for incomplete rows (default 1,000,000, ~1 GB)")
    p.add_argument("--unpack", action="store_true", help="packed shards -> unpadded shards")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="processes for the length pass and --unpack (default: all cores)")


# ---- inputs of any layout ------------------------------------------------------------------------

@dataclass
class FileLengths:
    kind: str
    hist: np.ndarray  # counts by length 0..max_len
    samples: int
    max_seq_length: int | None  # from the file's layout, None when it does not say
    max_pred: int | None
    masked: int = 0  # masked tokens
    nsp_random: int = 0  # samples with nsp == 1


def _hist_checked(path: Path, lengths: np.ndarray, limit: int | None, what: str = "sample") \
        -> np.ndarray:
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and lengths.min() < 1:
        i = int(np.argmax(lengths < 1))
        raise UserError(f"{path}: {what} {i} is empty")
    if limit is not None and len(lengths) and lengths.max() > limit:
        i = int(np.argmax(lengths > limit))
        raise UserError(f"{path}: {what} {i} has {int(lengths[i])} tokens, more than {limit}")
    return np.bincount(lengths, minlength=(limit or 0) + 1)


def scan_lengths(path: Path, kind: str | None = None, limit: int | None = None) -> FileLengths:
    """Pass 1 over one file: lengths (and mask/NSP counts) without the token data."""
    kind = kind or detect.kind(path)
    try:
        if kind == detect.UNPADDED:
            meta = unpadded.shard_meta(path)
            with h5py.File(path, "r") as f:
                offsets = f["offsets"][()]
                mlm_offsets = f["mlm_offsets"][()]
                nsp = f["nsp"][()]
            n = meta["samples"]
            if len(offsets) != n + 1 or len(mlm_offsets) != n + 1 or (n and offsets[0] != 0) \
                    or offsets[-1] != meta["tokens"] or np.any(np.diff(offsets) < 0):
                raise UserError(f"{path}: offsets inconsistent with {n} samples and "
                                f"{meta['tokens']} tokens")
            lim = limit or meta["max_seq_length"]
            return FileLengths(kind, _hist_checked(path, np.diff(offsets), lim), n,
                               meta["max_seq_length"], meta["max_predictions_per_seq"],
                               int(mlm_offsets[-1] - mlm_offsets[0]), int(np.sum(nsp == 1)))
        if kind == detect.PADDED:
            with h5py.File(path, "r") as f:
                mask, pos, nsp_d = f["input_mask"], f["masked_lm_positions"], f["next_sentence_labels"]
                n, width = mask.shape
                if len(pos) != n or len(nsp_d) != n:
                    raise UserError(f"{path}: datasets disagree on the number of samples")
                lim = limit or width
                hist = np.zeros(lim + 1, dtype=np.int64)
                masked = nsp_random = 0
                for start in range(0, n, BLOCK_ROWS):
                    m = mask[start:start + BLOCK_ROWS]
                    lengths = m.astype(bool).sum(axis=1)
                    try:
                        hist += _hist_checked(path, lengths, lim)
                    except UserError as exc:  # name the sample by its index in the file
                        i = int(np.argmax((lengths < 1) | (lengths > lim)))
                        raise UserError(str(exc).replace(f"sample {i} ", f"sample {start + i} ")) \
                            from None
                    masked += int(np.count_nonzero(pos[start:start + BLOCK_ROWS]))
                    nsp_random += int(np.sum(nsp_d[start:start + BLOCK_ROWS] == 1))
            return FileLengths(kind, hist, n, width, int(pos.shape[1]), masked, nsp_random)
        if kind == detect.NVIDIA:
            with h5py.File(path, "r") as f:
                ids, pos = f["input_ids"], f["masked_lm_positions"]
                nsp = np.asarray(f["next_sentence_labels"][()]).reshape(-1)
                lengths = np.fromiter((len(x) for x in ids[()]), dtype=np.int64, count=len(ids))
                masked = sum(len(x) for x in pos[()])
            return FileLengths(kind, _hist_checked(path, lengths, limit or MAX_SEQ_LENGTH),
                               len(lengths), None, None, int(masked), int(np.sum(nsp == 1)))
        if kind == detect.NVIDIA_PACKED:  # the rows' sequences
            lengths, counts, nsp = nvidia.packed_sequences(path)
            return FileLengths(kind, _hist_checked(path, lengths, limit or MAX_SEQ_LENGTH,
                                                   "sequence"),
                               len(lengths), None, None, int(counts.sum()), int(np.sum(nsp == 1)))
    except UserError:
        raise
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise UserError(f"{path}: truncated or corrupt HDF5 file ({exc})") from None
    raise UserError(f"{path}: {kind} files cannot be packed (unpack them first: pack --unpack)")


def read_blocks(path: Path, kind: str, max_pred: int):
    """Pass 2: the file's samples (packed files: sequences), in order, as Samples blocks
    (checked)."""
    if kind in (detect.UNPADDED, detect.NVIDIA, detect.NVIDIA_PACKED):
        yield read_samples(path, (kind,), max_pred=max_pred)[0]
    elif kind == detect.PADDED:
        try:
            with h5py.File(path, "r") as f:
                n = len(f["next_sentence_labels"])
                for start in range(0, n, BLOCK_ROWS):
                    block = {k: f[k][start:start + BLOCK_ROWS] for k in
                             ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                              "masked_lm_ids", "next_sentence_labels")}
                    s = Samples.from_padded(block)
                    bad = s.lengths[np.repeat(np.arange(len(s)), s.mlm_counts)] <= s.mlm_positions
                    if bad.any():
                        i = start + int(np.repeat(np.arange(len(s)), s.mlm_counts)[np.argmax(bad)])
                        raise UserError(f"{path}: sample {i}: a masked position lies past its tokens")
                    yield s
        except UserError:
            raise
        except (OSError, KeyError, ValueError) as exc:
            raise UserError(f"{path}: truncated or corrupt HDF5 file ({exc})") from None
    else:
        raise UserError(f"{path}: {kind} files cannot be packed")


def _scan_task(task: tuple[str, int | None]) -> FileLengths:
    path, limit = task
    return scan_lengths(Path(path), None, limit)


# ---- writing ---------------------------------------------------------------------------------------

class ShardWriter:
    """Collects completed rows and writes shards of planned sizes, each shuffled with the seed."""

    def __init__(self, staging: Path, shard_rows: list[int], seed: int, attrs: dict) -> None:
        self.staging, self.shard_rows, self.seed, self.attrs = staging, shard_rows, seed, attrs
        self.parts: list[tuple[Samples, np.ndarray]] = []  # (sequences in row order, row sizes)
        self.buffered = 0
        self.written: list[tuple[Path, int, int, int]] = []  # (path, rows, sequences, tokens)

    def add(self, samples: Samples, sizes: np.ndarray) -> None:
        if len(sizes):
            self.parts.append((samples, sizes))
            self.buffered += len(sizes)
        while len(self.written) < len(self.shard_rows) - 1 and \
                self.buffered >= self.shard_rows[len(self.written)]:
            self._write(self.shard_rows[len(self.written)])

    def close(self) -> None:
        """Write what is left: the last shard takes any rows beyond the plan (overflow)."""
        while self.buffered:
            self._write(self.buffered if len(self.written) >= len(self.shard_rows) - 1
                        else min(self.buffered, self.shard_rows[len(self.written)]))

    def _write(self, n: int) -> None:
        samples = self.parts[0][0] if len(self.parts) == 1 else \
            Samples.concat([p[0] for p in self.parts])
        sizes = np.concatenate([p[1] for p in self.parts])
        seq_off = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=seq_off[1:])
        index = len(self.written)
        perm = np.random.default_rng([self.seed, index]).permutation(n)
        s_n = int(seq_off[n])  # rows 0..n-1 hold sequences 0..s_n-1
        tokens, masks = int(samples.offsets[s_n]), int(samples.mlm_offsets[s_n])
        path = self.staging / f"shard-{index:05d}.hdf5"
        with packed_format.PackedWriter(
                path, n, s_n, tokens, masks,
                wide_ids=samples.input_ids.dtype.itemsize > 2 and _max(samples.input_ids) >= 1 << 16,
                wide_mlm_ids=samples.mlm_ids.dtype.itemsize > 2 and _max(samples.mlm_ids) >= 1 << 16,
                **self.attrs) as w:
            for c in range(0, n, WRITE_ROWS):  # in pieces: temporaries stay small
                rows = perm[c:c + WRITE_ROWS]
                w.append(packed_format.Packed.from_samples(
                    samples, ranges(seq_off[rows], sizes[rows]), sizes[rows]))
        self.written.append((path, n, s_n, tokens))
        rest = np.arange(n, len(sizes))
        if len(rest):
            self.parts = [(samples.take(np.arange(s_n, len(samples))), sizes[rest])]
        else:
            self.parts = []
        self.buffered = len(rest)


def _max(a: np.ndarray) -> int:
    return int(a.max()) if a.size else 0


def shard_sizes(rows: int, num_shards: int | None, rows_per_shard: int | None,
                num_inputs: int) -> list[int]:
    """Planned rows per output shard (NVIDIA's rule: the first rows % n shards get one more)."""
    if rows_per_shard is not None:
        if rows_per_shard < 1:
            raise UserError(f"--rows_per_shard must be at least 1, not {rows_per_shard}")
        n = max(1, -(-rows // rows_per_shard))
        return [rows_per_shard] * (n - 1) + [rows - rows_per_shard * (n - 1)]
    n = num_shards if num_shards is not None else num_inputs
    if n < 1:
        raise UserError(f"--num_shards must be at least 1, not {n}")
    if rows < n:
        if num_shards is not None:
            raise UserError(f"only {rows} rows to write, fewer than --num_shards {n}")
        n = max(1, rows)
    base, extra = divmod(rows, n)
    return [base + 1] * extra + [base] * (n - extra)


def _already_done(out: Path, key: str) -> list[str] | None:
    entries = {n: e for n, e in manifest.load(out).items() if e.stage == STAGE}
    mine = sorted(n for n, e in entries.items() if e.key == key)
    if not mine or len(mine) != len(entries):
        return None
    if all(manifest.is_done(out, n, key, entries) for n in mine):
        return mine
    return None


# ---- the stage ---------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise UserError(f"--workers must be at least 1, not {args.workers}")
    if args.unpack:
        return run_unpack(args)
    if args.max_pending < 1:
        raise UserError(f"--max_pending must be at least 1, not {args.max_pending}")
    world = World()
    inputs = detect.sample_files(args.input)
    out = Path(args.output)
    if out.resolve() == Path(args.input).resolve():
        raise UserError(f"{out}: --output must differ from --input")
    scans = run_tasks(_scan_task, [(str(p), args.max_seq_length) for p in inputs],
                      workers=args.workers, desc="pack: lengths", world=world)
    if world.rank != 0:
        return 0
    widths = {s.max_seq_length for s in scans if s.max_seq_length is not None}
    if args.max_seq_length is None and len(widths) > 1:
        raise UserError(f"{args.input}: files of different max_seq_length {sorted(widths)}; "
                        f"give --max_seq_length")
    L = args.max_seq_length or (widths.pop() if widths else MAX_SEQ_LENGTH)
    preds = {s.max_pred for s in scans if s.max_pred is not None}
    max_pred = max(preds) if preds else MAX_PREDICTIONS
    kinds = {s.kind for s in scans}
    hist = np.zeros(L + 1, dtype=np.int64)
    for s in scans:
        hist[:len(s.hist)] += s.hist[:L + 1]
    n_samples = int(hist.sum())
    if n_samples == 0:
        raise UserError(f"{args.input}: no samples to pack")
    plan = plan_packing(hist, args.max_seqs_per_row, L)
    sizes = shard_sizes(plan.rows, args.num_shards, args.rows_per_shard, len(inputs))
    params = {"max_seqs_per_row": args.max_seqs_per_row, "max_seq_length": L, "seed": args.seed,
              "shard_rows": sizes, "format": packed_format.FORMAT}
    key = manifest.task_key(STAGE, params, [(p.name, manifest.recorded_md5(p)) for p in inputs])
    done = _already_done(out, key)
    if done:
        print(f"pack: {len(done)} shard(s) in {out} already made from these inputs and verified "
              f"(skipped); {_summary(plan.rows, plan.sequences, plan.tokens, L)}", file=sys.stderr)
        return 0
    manifest.own_outputs(out, STAGE, shard_names(len(sizes)))
    with manifest.stage_outputs([out]):
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{out}: cannot create output folder: {exc.strerror}") from None
        remove_stale_temporaries(out)
        for old in out.glob(STAGING_PREFIX + "*"):
            shutil.rmtree(old, ignore_errors=True)
        staging = out / f"{STAGING_PREFIX}{os.getpid()}"
        staging.mkdir()
        try:
            stats, written = _pack_stream(inputs, scans, plan, sizes, staging, args, L, max_pred)
            names = _publish(out, staging, written, key)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    rows = sum(w[1] for w in written)
    seqs = sum(w[2] for w in written)
    tokens = sum(w[3] for w in written)
    note = ""
    if stats.overflow:
        note = (f"; {stats.overflow} samples packed outside the plan ({stats.flushes} flush(es) at "
                f"--max_pending {args.max_pending}: input far from random order)")
    print(f"pack: {', '.join(sorted(kinds))} input, {n_samples} samples -> "
          f"{_summary(rows, seqs, tokens, L)} (plan: {plan.efficiency:.4%}, {len(plan.counts)} "
          f"row shapes); {len(names)} shard(s) in {out}; at most {stats.peak_pending} samples "
          f"held{note}", file=sys.stderr)
    return 0


def _summary(rows: int, seqs: int, tokens: int, L: int) -> str:
    return (f"{rows} rows, {seqs / max(rows, 1):.5f} sequences/row, "
            f"efficiency {tokens / max(rows * L, 1):.4%}")


def _pack_stream(inputs, scans, plan, sizes, staging, args, L, max_pred):
    packer = Packer(plan, args.max_pending)
    writer = ShardWriter(staging, sizes, args.seed,
                         {"max_seq_length": L, "max_pred": max_pred,
                          "max_seqs_per_row": args.max_seqs_per_row})
    store: Samples | None = None  # samples of incomplete rows, ids store_ids (ascending)
    store_ids = np.zeros(0, dtype=np.int64)
    next_id = 0

    def emit(rows: Rows) -> None:
        nonlocal store, store_ids
        if not len(rows):
            return
        at = np.searchsorted(store_ids, rows.refs)
        writer.add(store.take(at), rows.sizes)
        keep = np.ones(len(store_ids), dtype=bool)
        keep[at] = False
        keep_idx = np.flatnonzero(keep)
        store, store_ids = store.take(keep_idx), store_ids[keep_idx]

    for path, scan in zip(inputs, scans):
        seen = 0
        for whole in read_blocks(path, scan.kind, max_pred):
            lengths = whole.lengths
            if len(lengths) and lengths.max() > L:
                raise UserError(f"{path}: sample {seen + int(np.argmax(lengths > L))} has "
                                f"{int(lengths.max())} tokens, more than {L}")
            for start in range(0, len(whole), PUSH_SAMPLES):
                part = np.arange(start, min(start + PUSH_SAMPLES, len(whole)))
                block = whole if len(part) == len(whole) else whole.take(part)
                ids = np.arange(next_id, next_id + len(block), dtype=np.int64)
                next_id += len(block)
                seen += len(block)
                store = block if store is None else Samples.concat([store, block])
                store_ids = np.concatenate([store_ids, ids])
                emit(packer.push(block.lengths, ids))
            del whole
        if seen != scan.samples:
            raise UserError(f"{path}: changed while packing ({scan.samples} samples, now {seen})")
    emit(packer.finish())
    if store is not None and len(store):
        raise AssertionError("samples left over after packing")
    writer.close()
    return packer.stats, writer.written


def _publish(out: Path, staging: Path, written, key: str) -> list[str]:
    """Replace the previous pack outputs of `out` with the staged shards; record them."""
    names = shard_names(len(written))
    old = manifest.own_outputs(out, STAGE, names)
    entries = [(name, manifest.entry_for(path, STAGE, key, samples=None))
               for (path, *_), name in zip(written, names)]
    manifest.forget(out, old - set(names))
    for (path, *_), name in zip(written, names):
        os.replace(path, out / name)
    for name, entry in entries:
        manifest.record(out, name, entry)
    manifest.finalize(out)
    return names


def shard_names(n: int) -> list[str]:
    return [f"part-{i:05d}-of-{n:05d}.hdf5" for i in range(n)]


# ---- unpack ------------------------------------------------------------------------------------------

def _check_packed_task(path: str) -> int:
    return len(packed_format.read_packed(path, datasets=packed_format.INDEX_FIELDS)[0])


def _unpack_task(task: tuple[str, str, str]) -> tuple[str, int]:
    src, dst, key = task
    samples, meta = packed_format.unpack(src)
    dst_path = Path(dst)
    with atomic_output(dst_path) as tmp:
        unpadded.write_shard(tmp, samples, meta["max_seq_length"], meta["max_predictions_per_seq"])
    manifest.record(dst_path.parent, dst_path.name,
                    manifest.entry_for(dst_path, "unpack", key, samples=None))
    return dst_path.name, len(samples)


def run_unpack(args: argparse.Namespace) -> int:
    world = World()
    inputs = detect.sample_files(args.input)
    out = Path(args.output)
    if out.resolve() == Path(args.input).resolve():
        raise UserError(f"{out}: --output must differ from --input")
    for p in inputs:
        if detect.kind(p) != detect.PACKED:
            raise UserError(f"{p}: not a {packed_format.FORMAT} file (--unpack reads packed shards)")
        claim("--output", out / p.name, "prep unpack", inputs=[("--input", q) for q in inputs])
    # check every input first (offsets, row lengths, masks): a bad file leaves no outputs at all
    run_tasks(_check_packed_task, [str(p) for p in inputs], workers=args.workers,
              desc="unpack: check", world=world)
    with manifest.stage_outputs([out], world.rank == 0):
        if world.rank == 0:
            try:
                out.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UserError(f"{out}: cannot create output folder: {exc.strerror}") from None
            remove_stale_temporaries(out)
        world.barrier()
        tasks = [(str(p), str(out / p.name),
                  manifest.task_key("unpack", {}, [(p.name, manifest.recorded_md5(p))]))
                 for p in inputs]
        results = run_tasks(_unpack_task, tasks, workers=args.workers, desc="unpack", world=world)
        if world.rank == 0:
            manifest.finalize(out)
    if world.rank == 0:
        print(f"unpack: {sum(n for _, n in results)} samples from {len(results)} packed shard(s) "
              f"-> {out}", file=sys.stderr)
    return 0
