r"""Chop: re-shard unpadded samples into S shards of equal size, with a global sample-level shuffle.

  python -m bertperf prep chop --input unpadded/ --output shards_4320/ --num_shards 4320 \
      [--seed 24] [--format bertperf|nvidia] [--workers N] [--memory_gb 4] [--tmp_dir DIR]

Input: every sample file of a folder in name order (our unpadded layout, NVIDIA's variable-length
or packed files, detected per file or --input_format), checked against the folder's MANIFEST.json
when there is one and fully checked when read. Shard sizes follow NVIDIA's chop_hdf5_files.py
(nominal = ceil(N/S); the first S*nominal - N shards hold nominal - 1); outputs are
part_XXXXX_of_0SSSS.h5 (.hdf5 with --format nvidia). A seeded permutation sends every sample to
one output position, so each shard draws from the whole dataset and the same inputs, S and seed
give byte-identical shards for any workers, ranks or memory. Memory: the permutation (4 bytes a
sample) and --memory_gb; temporary disk about the input's size under --tmp_dir (default: the
output folder; with MPI, a folder every rank sees), removed at the end, also on failure. A rerun
skips the shards MANIFEST.json records that still verify (docs/design.md, "Training shards")."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from bertperf.errors import UserError
from bertperf.formats import detect, manifest, nvidia, unpadded
from bertperf.formats.files import atomic_output, remove_stale_temporaries
from bertperf.formats.reading import read_samples
from bertperf.formats.samples import Samples, offsets_from_lengths
from bertperf.prep.parallel import World, default_workers, run_tasks

STAGE = "chop"
SPILL_CHUNK = 1 << 14  # input samples scattered at a time in pass 1
TAKE_CHUNK = 1 << 14  # output samples gathered at a time in pass 2
BASELINE = 200 << 20  # interpreter, numpy, h5py: not available for data
WORK_PREFIX = ".chop-work.tmp-"


# ---- the arithmetic -----------------------------------------------------------------------------

def shard_counts(n_samples: int, n_shards: int) -> np.ndarray:
    """Samples per shard, NVIDIA's chop_hdf5_files.py rule (the first n_excess shards one fewer)."""
    nominal = -(-n_samples // n_shards)
    n_excess = n_shards * nominal - n_samples
    counts = np.full(n_shards, nominal, dtype=np.int64)
    counts[:n_excess] -= 1
    return counts


def permutation(n_samples: int, seed: int) -> np.ndarray:
    """numpy.random.default_rng(seed).permutation(n_samples), built in place as int32 if it fits."""
    dtype = np.int32 if n_samples < 2**31 else np.int64
    perm = np.arange(n_samples, dtype=dtype)
    np.random.default_rng(seed).shuffle(perm)
    return perm


def shard_name(k: int, n_shards: int, fmt: str) -> str:
    return f"part_{k:05d}_of_{n_shards:05d}" + (".hdf5" if fmt == "nvidia" else ".h5")


# ---- pass 0: check and measure the inputs -------------------------------------------------------

@dataclass(frozen=True)
class InputInfo:
    path: str
    md5: str
    kind: str  # formats.detect's
    samples: int  # the sequences of packed rows
    tokens: int  # exact for our shards and NVIDIA's packed files, an upper bound for varlen ones
    masks: int
    max_seq_length: int
    max_pred: int
    wide_ids: bool  # input ids or masked ids need int32


_INPUT_KINDS = {detect.UNPADDED: "bertperf", detect.NVIDIA: "nvidia",
                detect.NVIDIA_PACKED: "nvidia-packed"}


def inspect(task: tuple[str, str, int, int]) -> InputInfo:
    path_s, want, length, preds = task
    path = Path(path_s)
    md5 = manifest.verified_md5(path)
    kind = detect.kind(path)
    fmt = _INPUT_KINDS.get(kind)
    if fmt is None:
        raise UserError(f"{path}: a {kind} sample file; chop reads {unpadded.FORMAT} shards or "
                        "NVIDIA's variable-length or packed files"
                        + (" (unpad it first: prep unpad)" if kind == detect.PADDED else ""))
    if want not in ("auto", fmt):
        raise UserError(f"{path}: a {fmt} file, but --input_format={want}")
    try:
        with h5py.File(path, "r") as f:
            if fmt == "bertperf":
                missing = [k for k in unpadded.FIELDS if k not in f]
                if missing:
                    raise UserError(f"{path}: missing dataset(s) {', '.join(missing)}")
                n, t, m = (int(f[k].shape[0]) for k in ("nsp", "input_ids", "mlm_ids"))
                length = int(f.attrs["max_seq_length"])
                preds = int(f.attrs["max_predictions_per_seq"])
                wide = f["input_ids"].dtype.itemsize > 2 or f["mlm_ids"].dtype.itemsize > 2
            else:
                base = [h5py.check_vlen_dtype(f[k].dtype) for k in ("input_ids", "masked_lm_ids")]
                if any(b is None for b in base):
                    raise UserError(f"{path}: NVIDIA layout expected variable-length datasets")
                wide = any(b.itemsize > 2 for b in base)
                if fmt == "nvidia":
                    n = int(f["next_sentence_labels"].shape[0])
                    t = path.stat().st_size // 3  # at least 2 bytes of id + 1 of segment a token
                    m = min(n * preds, t // 5 + n)
                else:  # the rows' sequences: their lengths and mask counts, exactly
                    lengths, counts, _ = nvidia.packed_sequences(path)
                    n, t, m = len(lengths), int(lengths.sum()), int(counts.sum())
    except UserError:
        raise
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise UserError(f"{path}: truncated or corrupt HDF5 file ({exc})") from None
    return InputInfo(str(path), md5, kind, n, t, m, length, preds, wide)


def _check_done(task: tuple[str, list[str], str]) -> list[bool]:
    out_dir, names, key = task
    entries = manifest.load(out_dir)
    return [manifest.is_done(out_dir, name, key, entries) for name in names]


# ---- the plan -----------------------------------------------------------------------------------

@dataclass
class Plan:
    n_samples: int
    n_shards: int
    counts: np.ndarray  # [S]
    starts: np.ndarray  # [S+1] first output position of each shard
    shards_per_group: int
    group_bytes: float  # estimated pass-2 working set of one group

    @property
    def nominal(self) -> int:
        return int(self.counts.max())

    @property
    def n_excess(self) -> int:
        return int(self.n_shards * self.nominal - self.n_samples)

    @property
    def n_groups(self) -> int:
        return -(-self.n_shards // self.shards_per_group)

    def group_shards(self, g: int) -> range:
        return range(g * self.shards_per_group, min(self.n_shards, (g + 1) * self.shards_per_group))

    @property
    def group_positions(self) -> np.ndarray:
        """[G+1]: group g holds output positions group_positions[g] .. group_positions[g+1]-1."""
        return self.starts[[*range(0, self.n_shards, self.shards_per_group), self.n_shards]]


def make_plan(infos: list[InputInfo], n_shards: int, memory_bytes: float, workers: int,
              out_format: str) -> Plan:
    n = sum(i.samples for i in infos)
    counts = shard_counts(n, n_shards)
    nominal = int(counts.max())
    tok = sum(i.tokens for i in infos) / n
    msk = sum(i.masks for i in infos) / n
    ib = 4 if any(i.wide_ids for i in infos) else 2
    # group arrays: ids, masks (position + id), per sample dest/length/b_start/count/nsp (15 B),
    # two offsets arrays and the destination -> row inverse (24 B)
    per_sample = ib * tok + (2 + ib) * msk + 15 + 24
    shard = nominal * (ib * tok + (2 + ib) * msk + 24)
    transient = 2 * shard + min(nominal, TAKE_CHUNK) * 24 * tok  # gathered parts + concat, ranges
    if out_format == "nvidia":
        transient += nominal * (17 * tok + 500)  # write_nvidia: segment ids, int64 columns, objects
    budget = memory_bytes / max(1, workers) - BASELINE - transient
    spg = int(budget // (nominal * per_sample)) if budget > 0 else 1
    spg = max(1, min(n_shards, spg))
    return Plan(n, n_shards, counts, offsets_from_lengths(counts), spg,
                spg * nominal * per_sample + transient + BASELINE)


# ---- pass 1: scatter samples into group spill files ---------------------------------------------

SPILL_DTYPES = (np.int64, np.uint16, np.uint16, np.uint16, np.uint8)  # dest, length, b_start,
# masked count, nsp; then input_ids, mlm_positions (uint16), mlm_ids


def _append_record(path: Path, dest: np.ndarray, s: Samples, lo: int, hi: int,
                   ids_dtype: np.dtype) -> tuple[int, int, int]:
    t0, t1 = int(s.offsets[lo]), int(s.offsets[hi])
    m0, m1 = int(s.mlm_offsets[lo]), int(s.mlm_offsets[hi])
    arrays = [np.array([hi - lo, t1 - t0, m1 - m0], dtype=np.int64),
              dest[lo:hi].astype(np.int64), np.diff(s.offsets[lo:hi + 1]).astype(np.uint16),
              s.b_starts[lo:hi].astype(np.uint16),
              np.diff(s.mlm_offsets[lo:hi + 1]).astype(np.uint16),
              s.nsp[lo:hi].astype(np.uint8), s.input_ids[t0:t1].astype(ids_dtype),
              s.mlm_positions[m0:m1].astype(np.uint16), s.mlm_ids[m0:m1].astype(ids_dtype)]
    with open(path, "ab") as f:
        for a in arrays:
            f.write(np.ascontiguousarray(a).data)
    return hi - lo, t1 - t0, m1 - m0


@dataclass(frozen=True)
class ScatterTask:
    index: int
    info: InputInfo
    first: int  # global index of the file's first sample
    work: str
    group_positions: np.ndarray
    needed: np.ndarray  # [G] bool: groups that have shards to (re)make
    ids_dtype: str


def scatter(task: ScatterTask) -> np.ndarray:
    """Read one input file (fully checked) and append its samples to their groups' spill files."""
    info = task.info
    path = Path(info.path)
    samples, _, _ = read_samples(path, (info.kind,), info.max_seq_length, info.max_pred)
    n = len(samples)
    if n != info.samples:
        raise UserError(f"{path}: {n} samples now, {info.samples} when checked (changed?)")
    perm = np.load(Path(task.work) / "perm.npy", mmap_mode="r")
    gpos = task.group_positions
    n_groups = len(gpos) - 1
    stats = np.zeros((n_groups, 3), dtype=np.int64)
    ids_dtype = np.dtype(task.ids_dtype)
    for c0 in range(0, n, SPILL_CHUNK):
        c1 = min(n, c0 + SPILL_CHUNK)
        dest = np.asarray(perm[task.first + c0:task.first + c1], dtype=np.int64)
        group = np.searchsorted(gpos, dest, side="right") - 1
        order = np.argsort(group, kind="stable")
        order = order[task.needed[group[order]]]
        if not len(order):
            continue
        part = samples.take(c0 + order)
        pdest, pgroup = dest[order], group[order]
        bounds = np.searchsorted(pgroup, np.arange(n_groups + 1))
        for g in np.flatnonzero(np.diff(bounds)):
            spill = Path(task.work) / f"g{g:05d}" / f"i{task.index:05d}.bin"
            stats[g] += _append_record(spill, pdest, part, int(bounds[g]), int(bounds[g + 1]),
                                       ids_dtype)
    return stats


# ---- pass 2: gather each group, order it by destination, write its shards -----------------------

@dataclass(frozen=True)
class GatherTask:
    group: int
    folder: str  # the group's spill folder
    totals: tuple[int, int, int]  # samples, tokens, masks
    first_position: int
    starts: np.ndarray  # positions where the group's shards start, and where the last ends
    names: tuple[str, ...]
    done: tuple[bool, ...]
    out_dir: str
    out_format: str
    max_seq_length: int
    max_pred: int
    key: str
    ids_dtype: str


def _read_spill(folder: Path, totals: tuple[int, int, int], ids_dtype: np.dtype):
    n, t, m = totals
    small = [np.empty(n, dtype=d) for d in SPILL_DTYPES]
    ids, mpos, mids = np.empty(t, ids_dtype), np.empty(m, np.uint16), np.empty(m, ids_dtype)
    fill = [0, 0, 0]
    for path in sorted(folder.glob("i*.bin")):
        with open(path, "rb") as f:
            while head := f.read(24):
                rn, rt, rm = (int(x) for x in np.frombuffer(head, dtype=np.int64))
                if fill[0] + rn > n or fill[1] + rt > t or fill[2] + rm > m:
                    raise UserError(f"{path}: spill file holds more than pass 1 counted")
                t0, m0 = fill[1], fill[2]
                views = [a[fill[0]:fill[0] + rn] for a in small] + \
                    [ids[t0:t0 + rt], mpos[m0:m0 + rm], mids[m0:m0 + rm]]
                for v in views:
                    if f.readinto(memoryview(v).cast("B")) != v.nbytes:
                        raise UserError(f"{path}: spill file cut short")
                fill = [fill[0] + rn, fill[1] + rt, fill[2] + rm]
    if tuple(fill) != (n, t, m):
        raise UserError(f"{folder}: spill files hold {tuple(fill)} (samples, tokens, masks), "
                        f"pass 1 wrote {(n, t, m)}")
    return small, ids, mpos, mids


def take_chunked(s: Samples, rows: np.ndarray, chunk: int = TAKE_CHUNK) -> Samples:
    """s.take(rows) with the index arrays bounded by `chunk` samples at a time."""
    if len(rows) <= chunk:
        return s.take(rows)
    return Samples.concat([s.take(rows[i:i + chunk]) for i in range(0, len(rows), chunk)])


def gather(task: GatherTask) -> int:
    folder, out_dir = Path(task.folder), Path(task.out_dir)
    (dest, lengths, b_starts, counts, nsp), ids, mpos, mids = \
        _read_spill(folder, task.totals, np.dtype(task.ids_dtype))
    n = len(dest)
    rel = dest - task.first_position
    del dest
    if n and (rel.min() < 0 or rel.max() >= n):
        raise UserError(f"{folder}: a sample's destination lies outside its group")
    rows = np.full(n, -1, dtype=np.int64)  # rows[p]: the loaded sample going to position p
    rows[rel] = np.arange(n)
    del rel
    if np.any(rows < 0):
        raise UserError(f"{folder}: destinations repeat within the group")
    samples = Samples(ids, offsets_from_lengths(lengths), b_starts, mpos, mids,
                      offsets_from_lengths(counts), nsp)
    del lengths, counts
    made = 0
    for k, (name, done) in enumerate(zip(task.names, task.done)):
        if done:
            continue
        lo, hi = (int(task.starts[k]) - task.first_position,
                  int(task.starts[k + 1]) - task.first_position)
        shard = take_chunked(samples, rows[lo:hi])
        dst = out_dir / name
        with atomic_output(dst) as tmp:
            if task.out_format == "nvidia":
                nvidia.write_varlen(tmp, shard)
            else:
                unpadded.write_shard(tmp, shard, task.max_seq_length, task.max_pred)
        manifest.record(out_dir, name, manifest.entry_for(dst, STAGE, task.key, samples=len(shard)))
        made += 1
        del shard
    shutil.rmtree(folder, ignore_errors=True)  # frees temporary disk as pass 2 goes on
    return made


# ---- command line -------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True,
                   help="folder of unpadded shards (or NVIDIA's variable-length or packed files)")
    p.add_argument("--output", required=True, help="output folder for the S shards")
    p.add_argument("--num_shards", type=int, required=True,
                   help="number of output shards (MLPerf: 4320, or 2048 below 256 nodes)")
    p.add_argument("--seed", type=int, default=24, help="shuffle seed (default 24, NVIDIA's)")
    p.add_argument("--format", choices=("bertperf", "nvidia"), default="bertperf",
                   help="output layout: ours (.h5, default) or NVIDIA's variable-length (.hdf5)")
    p.add_argument("--input_format", choices=("auto", *_INPUT_KINDS.values()), default="auto",
                   help="input layout (default: detected per file)")
    p.add_argument("--max_seq_length", type=int, default=512,
                   help="limit for NVIDIA-layout input (our shards record theirs)")
    p.add_argument("--max_predictions_per_seq", type=int, default=76,
                   help="limit for NVIDIA-layout input (our shards record theirs)")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="local worker processes (default: all cores)")
    p.add_argument("--memory_gb", type=float, default=4.0,
                   help="memory for pass 2 on this host, shared by the workers (default 4); the "
                        "permutation (4 bytes a sample) comes on top")
    p.add_argument("--tmp_dir", help="folder for the temporary spill files (default: --output)")


def _plan_lines(plan: Plan, infos: list[InputInfo], in_dir: Path, args, work: Path) -> list[str]:
    mb = 1 << 20
    perm_bytes = plan.n_samples * (4 if plan.n_samples < 2**31 else 8)
    budget = args.memory_gb * (1 << 30) / max(1, args.workers)
    small = f", shards 0-{plan.n_excess - 1} hold {plan.nominal - 1}" if plan.n_excess else ""
    return [
        f"chop: {plan.n_samples:,} samples in {len(infos)} file(s) of {in_dir} -> "
        f"{plan.n_shards} shards: nominal {plan.nominal}, n_excess {plan.n_excess}{small}; "
        f"seed {args.seed}",
        f"chop: {plan.n_groups} group(s) of up to {plan.shards_per_group} shard(s), ~"
        f"{plan.group_bytes / mb:,.0f} MB per worker (budget {budget / mb:,.0f} MB); "
        f"permutation {perm_bytes / mb:,.0f} MB; temporary files in {work}",
    ]


def run(args: argparse.Namespace) -> int:
    world = World()
    n_shards = args.num_shards
    if n_shards < 1:
        raise UserError(f"--num_shards={n_shards}: must be at least 1")
    if args.memory_gb <= 0:
        raise UserError(f"--memory_gb={args.memory_gb}: must be positive")
    in_dir, out_dir = Path(args.input), Path(args.output)
    if not in_dir.is_dir():
        raise UserError(f"{in_dir}: no such input folder")
    inputs = detect.sample_files(in_dir)
    if out_dir.resolve() == in_dir.resolve():
        raise UserError(f"{out_dir}: the output folder must differ from the input folder")

    infos: list[InputInfo] = run_tasks(
        inspect, [(str(p), args.input_format, args.max_seq_length, args.max_predictions_per_seq)
                  for p in inputs], workers=args.workers, desc="chop: check inputs", world=world)
    first = infos[0]
    for i in infos:
        if (i.max_seq_length, i.max_pred) != (first.max_seq_length, first.max_pred):
            raise UserError(f"{i.path}: max_seq_length/max_predictions_per_seq {i.max_seq_length}/"
                            f"{i.max_pred} differ from {first.path}'s {first.max_seq_length}/"
                            f"{first.max_pred}")
    if first.max_seq_length >= 1 << 16:
        raise UserError(f"{first.path}: max_seq_length {first.max_seq_length} is too large")
    n_samples = sum(i.samples for i in infos)
    if n_shards > n_samples:
        raise UserError(f"{in_dir}: {n_samples} samples, fewer than --num_shards={n_shards}")
    plan = make_plan(infos, n_shards, args.memory_gb * (1 << 30), args.workers, args.format)
    names = [shard_name(k, n_shards, args.format) for k in range(n_shards)]
    manifest.own_outputs(out_dir, STAGE, names)
    params = {"num_shards": n_shards, "seed": args.seed, "format": args.format,
              "max_seq_length": first.max_seq_length, "max_pred": first.max_pred,
              "shuffle": "numpy-default_rng-permutation/1"}
    key = manifest.task_key(STAGE, params, [(Path(i.path).name, i.md5) for i in infos])
    tmp_base = Path(args.tmp_dir) if args.tmp_dir else out_dir
    work = tmp_base / f"{WORK_PREFIX}{world.allgather(os.getpid())[0]}"
    if world.rank == 0:
        for line in _plan_lines(plan, infos, in_dir, args, work):
            print(line, file=sys.stderr)

    # resume: which shards exist, were made from these inputs and parameters, and still verify
    groups = [plan.group_shards(g) for g in range(plan.n_groups)]
    any_there = world.allgather(any((out_dir / name).exists() for name in names))[0]
    if any_there:
        checks = run_tasks(_check_done, [(str(out_dir), [names[k] for k in r], key)
                                         for r in groups],
                           workers=args.workers, desc="chop: verify existing", world=world)
        done = [d for part in checks for d in part]
    else:
        done = [False] * n_shards
    if world.rank == 0:
        others = sorted(n for n in manifest.written_by(out_dir, STAGE) - set(names)
                        if (out_dir / n).exists())
        if others:
            print(f"chop: warning: {out_dir} also holds {len(others)} shard file(s) of another "
                  f"plan (e.g. {others[0]}); a trainer reading the folder would see them too",
                  file=sys.stderr)
    needed = np.array([not all(done[k] for k in r) for r in groups])
    made = 0
    # what was finished stays recorded; new folders left empty (a failure, --tmp_dir) go
    with manifest.stage_outputs([out_dir, tmp_base], world.rank == 0):
        if needed.any():
            if world.rank == 0:
                remove_stale_temporaries(out_dir)
                if tmp_base.is_dir():
                    for old in tmp_base.glob(f"{WORK_PREFIX}*"):
                        shutil.rmtree(old, ignore_errors=True)
            world.barrier()
            try:
                made = _chop(world, args, plan, infos, groups, names, done, needed, key, work,
                             out_dir)
            finally:
                if world.rank == 0:
                    shutil.rmtree(work, ignore_errors=True)
    if world.rank == 0:
        skipped = n_shards - made
        note = f", {skipped} already made and verified (skipped)" if skipped else ""
        print(f"chop: wrote {made} shard(s) to {out_dir}{note}", file=sys.stderr)
    return 0


def _chop(world: World, args, plan: Plan, infos: list[InputInfo], groups: list[range],
          names: list[str], done: list[bool], needed: np.ndarray, key: str, work: Path,
          out_dir: Path) -> int:
    ids_dtype = np.dtype(np.int32 if any(i.wide_ids for i in infos) else np.uint16).str
    if world.rank == 0:
        try:
            for g in np.flatnonzero(needed):
                (work / f"g{g:05d}").mkdir(parents=True, exist_ok=True)
            out_dir.mkdir(parents=True, exist_ok=True)
            np.save(work / "perm.npy", permutation(plan.n_samples, args.seed))
        except OSError as exc:
            raise UserError(f"{work}: cannot write temporary files ({exc.strerror})") from None
    world.barrier()
    firsts = np.cumsum([0] + [i.samples for i in infos])
    gpos = plan.group_positions
    stats = run_tasks(scatter, [ScatterTask(k, info, int(firsts[k]), str(work), gpos, needed,
                                            ids_dtype) for k, info in enumerate(infos)],
                      workers=args.workers, desc="chop: scatter", world=world)
    totals = np.sum(stats, axis=0)
    tasks = []
    for g in np.flatnonzero(needed):
        r = groups[g]
        if totals[g][0] != plan.starts[r.stop] - plan.starts[r.start]:
            raise UserError(f"{work}: group {g} received {totals[g][0]} samples, expected "
                            f"{plan.starts[r.stop] - plan.starts[r.start]}")
        tasks.append(GatherTask(int(g), str(work / f"g{g:05d}"), tuple(int(x) for x in totals[g]),
                                int(plan.starts[r.start]), plan.starts[r.start:r.stop + 1],
                                tuple(names[k] for k in r), tuple(done[k] for k in r),
                                str(out_dir), args.format, infos[0].max_seq_length,
                                infos[0].max_pred, key, ids_dtype))
    made = run_tasks(gather, tasks, workers=args.workers, desc="chop: write", unit="group",
                     world=world)
    return int(sum(made))
