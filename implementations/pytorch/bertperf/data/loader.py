"""Per-rank training data: shards read lazily (memory-mapped), a deterministic resumable order,
batches as padded, unpadded (varlen) or packed numpy arrays, prefetched on a background thread.

Pieces, each usable on its own:

  ShardReader(path)            one bertperf-unpadded/1 shard, memory-mapped (`take(rows)` copies
                               only the rows asked for; h5py slice reads where a file cannot
                               be mapped)
  PackedReader(path)           one bertperf-packed/1 shard (bertperf.data.packed), memory-mapped;
                               `batch(rows, ...)` = Packed.batch on the mapped arrays
  ShardDataset(files, counts)  a list of shards of one format with their counts (from MANIFEST.json
                               when present, else from each file's header); opens shards lazily,
                               keeps at most `cache_size` of them mapped
  EpochPlan(counts, seed, epoch, rank, world_size)
                               which samples rank `rank` reads in `epoch`, and in which order
  ShardLoader(dataset, batch_size, rank=, world_size=, seed=, split=, ...)
                               iterate batches; state_dict()/load_state_dict() or start_sample=
                               for exact resume; `prefetch` batches built ahead on a thread

Below, a "sample" is a row for packed shards (rows hold up to max_seqs_per_row sequences).

Order (a pure function of seed, epoch, rank, world size and the shards' sample counts):
  1. The shards are permuted with a generator seeded by (seed, epoch): the same on every rank.
  2. The samples of each shard are permuted with a generator seeded by (seed, epoch, shard index).
  3. Concatenated in that order they form the epoch's global stream of S samples. Rank r reads the
     contiguous slice [r*L, (r+1)*L) of it, L = S // world_size. When the shards divide evenly
     (equal sizes, world_size | number of shards) rank r reads exactly the shards at positions
     r*N/W ... (r+1)*N/W - 1 of the permutation, each whole and by itself; otherwise a shard that
     straddles two ranks' slices is read in part by each (disjoint parts of the same permutation).
  4. Policy when S % world_size != 0: the last S % world_size samples of the global stream are not
     read in that epoch (fewer than world_size samples; different ones every epoch, since the
     permutation changes). Every rank therefore reads the same number of samples, L, and so makes
     the same number of batches, which data-parallel training needs.
  3b. split="global_batch" (the trainer's default, config LOADER_SPLIT): every rank walks the
     whole global stream instead, cut into global batches of world_size*batch_size consecutive
     samples; rank r reads rows [r*b, (r+1)*b) of each (b = batch_size). The union over ranks of
     each global batch, in rank order, is then exactly the batch of a 1-rank loader with
     batch_size W*b, so a data-parallel run sees the same global batches whatever the number of
     ranks. Each rank still reads L = S // world_size samples; when L % b = m != 0 the last
     (partial) global batch of W*m samples is split the same way, m rows per rank.
  5. Batches are consecutive runs of `batch_size` samples of the rank's stream; they may span shard
     boundaries, so shards smaller than a batch are fine. drop_last=True (default) drops the last
     partial batch of the epoch; drop_last=False yields it, smaller.
Random numbers come from PCG64 raw output (stable across numpy versions) and a stable argsort.

Resume: `position` is the number of samples of the current epoch this rank has consumed (after the
batches already yielded). Starting at (epoch, position=k) yields exactly the stream that an
uninterrupted run yields from its sample k on; when k is a multiple of batch_size the batches are
identical too. Finishing an epoch moves the loader to (epoch + 1, 0).

Batch layouts: "padded" or "varlen" from unpadded shards (see `collate_padded`, `collate_varlen`);
"packed" from packed shards (`bertperf.data.packed.Packed.batch`: [B, L] rows with position_ids,
sequence_index, seq_lengths/seq_starts and per-sequence NSP labels).
"""

from __future__ import annotations

import collections
import hashlib
import json
import mmap
import os
import queue
import threading
from pathlib import Path
from typing import Iterator, Sequence

import h5py
import numpy as np

from bertperf.data.samples import Samples, offsets_from_lengths, ranges
from bertperf.data.shards import FIELDS, FORMAT
from bertperf.errors import UserError

try:  # the packed layout (bertperf-packed/1), written by `prep pack`
    from bertperf.data import packed as packed_format
except ImportError:  # pragma: no cover
    packed_format = None

STATE_FORMAT = "bertperf-loader-state/1"
PACKED_FORMAT = "bertperf-packed/1"
LAYOUTS = ("padded", "varlen", "packed")
SPLITS = ("shards", "global_batch")
_INDEX_FIELDS = ("offsets", "b_starts", "mlm_offsets", "nsp")  # small: read whole in h5py mode


# ---- random permutations, stable across numpy versions -------------------------------------------

def permutation(n: int, *key: int) -> np.ndarray:
    """A uniform random permutation of range(n), a pure function of the non-negative ints `key`."""
    if n <= 1:
        return np.arange(n, dtype=np.int64)
    raw = np.random.PCG64(np.random.SeedSequence([0x6265_7274, *key])).random_raw(n)
    return np.argsort(raw, kind="stable").astype(np.int64, copy=False)


# ---- one shard -----------------------------------------------------------------------------------

def _format_of(f: h5py.File) -> str | None:
    fmt = f.attrs.get("format")
    return fmt.decode() if isinstance(fmt, bytes) else fmt


class _MappedFile:
    """The datasets `fields` of one HDF5 shard for random access without reading it whole.

    Contiguous datasets become numpy views of one read-only mmap of the file (pages are read on
    touch and belong to the page cache, not to this process's heap). Where a dataset is chunked or
    compressed (or use_mmap=False) the file stays open in h5py and `small` datasets are read whole;
    the others are left as h5py datasets for the subclass to slice.
    """

    format = ""
    fields: tuple[str, ...] = ()
    small: tuple[str, ...] = ()

    def __init__(self, path: str | os.PathLike, *, use_mmap: bool = True) -> None:
        self.path = Path(path)
        self._file = None
        self._mmap = None
        self._arrays: dict = {}
        try:
            f = h5py.File(self.path, "r")
        except (OSError, ValueError) as exc:
            raise UserError(f"{self.path}: cannot open shard ({exc})") from None
        try:
            fmt = _format_of(f)
            if fmt != self.format:
                raise UserError(f"{self.path}: not a {self.format} shard (format={fmt!r})")
            missing = [k for k in self.fields if k not in f]
            if missing:
                raise UserError(f"{self.path}: missing dataset(s) {', '.join(missing)}")
            self.attrs = {k: (int(v) if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype,
                                                                         np.integer) else v)
                          for k, v in f.attrs.items()}
            self.max_seq_length = int(f.attrs["max_seq_length"])
            self.max_pred = int(f.attrs["max_predictions_per_seq"])
            dsets = {k: f[k] for k in self.fields}
            mappable = use_mmap and all(
                d.size == 0 or (d.chunks is None and d.compression is None and not d.external
                                and d.id.get_offset() is not None) for d in dsets.values())
            if mappable:
                self.mode = "mmap"
                places = {k: (d.dtype, d.size, d.id.get_offset()) for k, d in dsets.items()}
                f.close()
                self._arrays = self._map(places)
            else:
                self.mode = "h5py"
                self._file = f
                self._arrays = {k: (d[()] if k in self.small else d) for k, d in dsets.items()}
        except UserError:
            f.close()
            raise
        except (OSError, KeyError, ValueError, TypeError) as exc:
            f.close()
            raise UserError(f"{self.path}: truncated or corrupt shard ({exc})") from None

    def _map(self, places: dict) -> dict[str, np.ndarray]:
        size = self.path.stat().st_size
        for k, (dtype, n, off) in places.items():
            if n and off + n * dtype.itemsize > size:
                raise UserError(f"{self.path}: dataset {k} runs past the end of the file "
                                "(truncated shard)")
        out = {}
        if size:
            with open(self.path, "rb") as fh:
                self._mmap = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        for k, (dtype, n, off) in places.items():
            out[k] = (np.frombuffer(self._mmap, dtype=dtype, count=n, offset=off) if n
                      else np.zeros(0, dtype=dtype))
        return out

    def _inconsistent(self) -> UserError:
        self.close()
        return UserError(f"{self.path}: datasets disagree on their sizes (truncated or corrupt)")

    def __len__(self) -> int:
        return self.count

    def close(self) -> None:
        self._arrays = {}
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # a caller still holds a view: the mapping goes when that view does
            self._mmap = None


class ShardReader(_MappedFile):
    """A bertperf-unpadded/1 shard: `take(rows)` copies only the samples asked for. Without a
    mapping, tokens and masks are read sample by sample through h5py."""

    format = FORMAT
    fields = FIELDS
    small = _INDEX_FIELDS

    def __init__(self, path: str | os.PathLike, *, use_mmap: bool = True,
                 validate: bool = False) -> None:
        super().__init__(path, use_mmap=use_mmap)
        a = self._arrays
        self.count = int(a["nsp"].shape[0])
        # cheap consistency checks (the full check reads everything: validate=True)
        if (len(a["offsets"]) != self.count + 1 or len(a["mlm_offsets"]) != self.count + 1
                or len(a["b_starts"]) != self.count
                or a["offsets"][-1] != a["input_ids"].shape[0]
                or a["mlm_offsets"][-1] != a["mlm_positions"].shape[0]
                or a["mlm_ids"].shape[0] != a["mlm_positions"].shape[0]):
            raise self._inconsistent()
        if validate:
            from bertperf.data.shards import check
            try:
                check(self.path, self.read_range(0, self.count), self.max_seq_length, self.max_pred)
            except UserError:
                self.close()
                raise

    def _gather(self, name: str, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        data = self._arrays[name]
        if self.mode == "mmap":
            return data[ranges(starts, lengths)]
        parts = [data[int(s):int(s + n)] for s, n in zip(starts, lengths) if n]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=data.dtype)

    def take(self, rows: np.ndarray) -> Samples:
        """Samples `rows` of this shard, in that order (copies of only those rows)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.count):
            raise IndexError(f"{self.path}: rows outside 0..{self.count - 1}")
        a = self._arrays
        try:
            off, moff = a["offsets"], a["mlm_offsets"]
            starts = off[rows]
            lengths = off[rows + 1] - starts
            mstarts = moff[rows]
            counts = moff[rows + 1] - mstarts
            return Samples(self._gather("input_ids", starts, lengths),
                           offsets_from_lengths(lengths),
                           a["b_starts"][rows], self._gather("mlm_positions", mstarts, counts),
                           self._gather("mlm_ids", mstarts, counts), offsets_from_lengths(counts),
                           a["nsp"][rows])
        except (OSError, ValueError) as exc:
            raise UserError(f"{self.path}: cannot read samples ({exc})") from None

    def read_range(self, start: int, stop: int) -> Samples:
        """Samples start..stop-1, read as contiguous slices."""
        a = self._arrays
        off = np.asarray(a["offsets"][start:stop + 1], dtype=np.int64)
        moff = np.asarray(a["mlm_offsets"][start:stop + 1], dtype=np.int64)
        if stop <= start:
            off, moff = np.zeros(1, np.int64), np.zeros(1, np.int64)
        t0, t1, m0, m1 = int(off[0]), int(off[-1]), int(moff[0]), int(moff[-1])
        return Samples(np.array(a["input_ids"][t0:t1]), off - t0,
                       np.array(a["b_starts"][start:stop]), np.array(a["mlm_positions"][m0:m1]),
                       np.array(a["mlm_ids"][m0:m1]), moff - m0, np.array(a["nsp"][start:stop]))


class PackedReader(_MappedFile):
    """A bertperf-packed/1 shard (bertperf.data.packed): its unit is a row (up to
    max_seqs_per_row sequences); `batch(rows)` is `Packed.batch` on the mapped arrays, so only the
    rows asked for are read. Without a mapping the file is read whole (h5py cannot gather rows)."""

    format = PACKED_FORMAT

    fields = packed_format.FIELDS if packed_format else ()
    small = fields  # h5py mode: everything (see the docstring)

    def __init__(self, path: str | os.PathLike, *, use_mmap: bool = True,
                 validate: bool = False) -> None:
        if packed_format is None:
            raise UserError(f"{path}: reading packed shards needs bertperf.data.packed")
        super().__init__(path, use_mmap=use_mmap)
        self.max_seqs_per_row = int(self.attrs["max_seqs_per_row"])
        a = self._arrays
        self.packed = packed_format.Packed(*(a[k] for k in packed_format.FIELDS))
        self.count = len(a["row_offsets"]) - 1
        S = len(a["seq_lengths"])
        if (self.count < 0 or len(a["row_seq_offsets"]) != self.count + 1
                or a["row_offsets"][-1] != len(a["input_ids"])
                or a["row_seq_offsets"][-1] != S or len(a["mlm_offsets"]) != S + 1
                or a["mlm_offsets"][-1] != len(a["mlm_positions"])
                or len(a["mlm_ids"]) != len(a["mlm_positions"])
                or len(a["b_starts"]) != S or len(a["nsp"]) != S):
            raise self._inconsistent()
        if validate:
            meta = {"max_seq_length": self.max_seq_length, "max_predictions_per_seq": self.max_pred,
                    "max_seqs_per_row": self.max_seqs_per_row}
            try:
                packed_format.check(self.path, self.packed, meta)
            except UserError:
                self.close()
                raise

    def batch(self, rows: np.ndarray, max_seq_length: int, max_seqs_per_row: int,
              max_pred: int) -> dict[str, np.ndarray]:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.count):
            raise IndexError(f"{self.path}: rows outside 0..{self.count - 1}")
        try:
            return self.packed.batch(rows, max_seq_length, max_seqs_per_row, max_pred)
        except (OSError, ValueError) as exc:
            raise UserError(f"{self.path}: cannot read rows ({exc})") from None

    def close(self) -> None:
        self.packed = None
        super().close()


def open_shard(path: str | os.PathLike, **kwargs) -> ShardReader | PackedReader:
    """The reader for the shard's format (bertperf-unpadded/1 or bertperf-packed/1)."""
    return (PackedReader if shard_header(Path(path))["format"] == PACKED_FORMAT
            else ShardReader)(path, **kwargs)


# ---- a list of shards ----------------------------------------------------------------------------

def _manifest_counts(files: list[Path]) -> list[int | None]:
    """Sample counts recorded in each file's folder MANIFEST.json (None where not recorded)."""
    docs: dict[Path, dict] = {}
    out: list[int | None] = []
    for p in files:
        folder = p.parent
        if folder not in docs:
            try:
                docs[folder] = json.loads((folder / "MANIFEST.json").read_text()).get("files", {})
            except (OSError, ValueError, AttributeError):
                docs[folder] = {}
        e = docs[folder].get(p.name)
        out.append(e.get("samples") if isinstance(e, dict) else None)
    return out


def shard_header(path: Path) -> dict:
    """format, count (samples, or rows of a packed shard), max_seq_length, max_pred and
    max_seqs_per_row (packed) from a shard's header, without reading its data."""
    if not path.is_file():
        raise UserError(f"{path}: no such shard")
    try:
        with h5py.File(path, "r") as f:
            fmt = _format_of(f)
            if fmt == PACKED_FORMAT:
                count, extra = int(f["row_offsets"].shape[0]) - 1, int(f.attrs["max_seqs_per_row"])
            elif fmt == FORMAT:
                count, extra = int(f["nsp"].shape[0]), None
            else:
                raise UserError(f"{path}: not a {FORMAT} or {PACKED_FORMAT} shard "
                                f"(format={fmt!r})")
            return {"format": fmt, "count": count, "max_seq_length": int(f.attrs["max_seq_length"]),
                    "max_pred": int(f.attrs["max_predictions_per_seq"]), "max_seqs_per_row": extra}
    except UserError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise UserError(f"{path}: truncated or corrupt shard ({exc})") from None


class ShardDataset:
    """A fixed list of shards of one format and their counts; shards are opened only when read.

    The unit of a bertperf-unpadded/1 dataset is a sample, of a bertperf-packed/1 one a row.
    `counts` may be given (e.g. from a manifest); by default they come from the folder's
    MANIFEST.json where it records them (unpadded shards), else from each file's header. A count
    that disagrees with the file when it is opened is an error. At most `cache_size` shards are
    open at a time. One loader at a time should read a dataset.
    """

    def __init__(self, files: Sequence[str | os.PathLike], counts: Sequence[int] | None = None, *,
                 cache_size: int = 4, use_mmap: bool = True, validate: bool = False,
                 max_seq_length: int | None = None, max_pred: int | None = None) -> None:
        self.files = [Path(f) for f in files]
        if not self.files:
            raise UserError("no shards given to the loader")
        first = shard_header(self.files[0])
        self.format = first["format"]
        self.max_seq_length = max_seq_length or first["max_seq_length"]
        self.max_pred = max_pred or first["max_pred"]
        self.max_seqs_per_row = first["max_seqs_per_row"]
        if counts is None:
            found = _manifest_counts(self.files) if self.format == FORMAT \
                else [None] * len(self.files)
            counts = [first["count"]] + [
                c if c is not None else self._header(p)["count"]
                for p, c in zip(self.files[1:], found[1:])]
        if len(counts) != len(self.files):
            raise ValueError(f"{len(counts)} counts for {len(self.files)} shards")
        self.counts = np.asarray(counts, dtype=np.int64)
        self.cache_size = max(1, cache_size)
        self.use_mmap, self.validate = use_mmap, validate
        self._readers: collections.OrderedDict[int, ShardReader | PackedReader] = \
            collections.OrderedDict()
        self._lock = threading.Lock()

    def _header(self, path: Path) -> dict:
        h = shard_header(path)
        if h["format"] != self.format:
            raise UserError(f"{path}: a {h['format']} shard among {self.format} ones")
        return h

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, pattern: str | None = None,
                    **kwargs) -> ShardDataset:
        """The shards in `folder`: `pattern` (a glob), else every *.h5 / *.hdf5 file; by name."""
        folder = Path(folder)
        if not folder.is_dir():
            raise UserError(f"{folder}: no such folder")
        globs = [pattern] if pattern else ["*.h5", "*.hdf5"]
        files = sorted({p for g in globs for p in folder.glob(g)
                        if p.is_file() and not p.name.startswith(".")})
        if not files:
            raise UserError(f"{folder}: no shards ({' or '.join(globs)})")
        return cls(files, **kwargs)

    def __len__(self) -> int:
        return len(self.files)

    @property
    def packed(self) -> bool:
        return self.format == PACKED_FORMAT

    @property
    def num_samples(self) -> int:
        """Samples (rows, for packed shards) in all shards."""
        return int(self.counts.sum())

    def fingerprint(self) -> str:
        """Identifies the shard list (names and counts) in a loader state."""
        doc = [[p.name, int(c)] for p, c in zip(self.files, self.counts)]
        return hashlib.md5(json.dumps(doc).encode()).hexdigest()

    def reader(self, shard: int) -> ShardReader | PackedReader:
        with self._lock:
            r = self._readers.get(shard)
            if r is not None:
                self._readers.move_to_end(shard)
                return r
            path = self.files[shard]
            cls = PackedReader if self.packed else ShardReader
            r = cls(path, use_mmap=self.use_mmap, validate=self.validate)
            problem = None
            if r.count != self.counts[shard]:
                problem = (f"holds {r.count} {'rows' if self.packed else 'samples'}, but "
                           f"{int(self.counts[shard])} were expected (MANIFEST.json stale?)")
            elif r.max_seq_length > self.max_seq_length or r.max_pred > self.max_pred or (
                    self.packed and r.max_seqs_per_row > self.max_seqs_per_row):
                problem = (f"max_seq_length/max_predictions_per_seq {r.max_seq_length}/"
                           f"{r.max_pred} exceed the dataset's {self.max_seq_length}/"
                           f"{self.max_pred}")
            if problem:
                r.close()
                raise UserError(f"{path}: {problem}")
            self._readers[shard] = r
            while len(self._readers) > self.cache_size:
                _, old = self._readers.popitem(last=False)
                old.close()
            return r

    def take(self, shard: int, rows: np.ndarray) -> Samples:
        """Samples `rows` of unpadded shard `shard`."""
        return self.reader(shard).take(rows)

    def close(self) -> None:
        with self._lock:
            for r in self._readers.values():
                r.close()
            self._readers.clear()


def stratified_datasets(folder: str | os.PathLike, **kwargs) -> dict[str, ShardDataset]:
    """One ShardDataset per length bin of a `prep stratify` output folder (from stratify.json)."""
    folder = Path(folder)
    try:
        doc = json.loads((folder / "stratify.json").read_text())
        bins = doc["bins"]
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{folder}: not a stratify output (stratify.json: {exc})") from None
    return {b["name"]: ShardDataset.from_folder(folder / b["name"], "part_*.h5", **kwargs)
            for b in bins if b["samples"]}


# ---- the order -----------------------------------------------------------------------------------

class EpochPlan:
    """Which samples rank `rank` of `world_size` reads in `epoch`, in order (module docstring)."""

    def __init__(self, counts: np.ndarray, seed: int, epoch: int, rank: int = 0,
                 world_size: int = 1, perm_cache: int = 8, split: str = "shards",
                 block: int = 1) -> None:
        if seed < 0 or epoch < 0:
            raise ValueError("seed and epoch must be non-negative")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        if split not in SPLITS or block < 1:
            raise ValueError(f"split must be one of {SPLITS} and block >= 1")
        self.split, self.block = split, block
        self.counts = np.asarray(counts, dtype=np.int64)
        self.seed, self.epoch, self.rank, self.world_size = seed, epoch, rank, world_size
        self.shard_order = permutation(len(self.counts), seed, epoch, 0)
        self.cum = offsets_from_lengths(self.counts[self.shard_order])
        total = int(self.cum[-1])
        self.length = total // world_size  # samples this rank reads in the epoch
        self.start = rank * self.length  # its slice of the global stream
        self._perms: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._perm_cache = perm_cache

    def shard_permutation(self, shard: int) -> np.ndarray:
        p = self._perms.get(shard)
        if p is None:
            p = permutation(int(self.counts[shard]), self.seed, self.epoch, 1, shard)
            self._perms[shard] = p
            while len(self._perms) > self._perm_cache:
                self._perms.popitem(last=False)
        else:
            self._perms.move_to_end(shard)
        return p

    def refs(self, start: int, stop: int) -> list[tuple[int, np.ndarray]]:
        """This rank's samples at positions start..stop-1, as (shard, rows) runs in stream order."""
        start, stop = max(0, start), min(stop, self.length)
        out: list[tuple[int, np.ndarray]] = []
        for g0, g1 in self.global_ranges(start, stop):
            self._refs(g0, g1, out)
        return out

    def global_ranges(self, start: int, stop: int) -> list[tuple[int, int]]:
        """This rank's positions start..stop-1 as [g0, g1) ranges of the epoch's global stream."""
        if stop <= start:
            return []
        if self.split == "shards":
            return [(self.start + start, self.start + stop)]
        b, w, r = self.block, self.world_size, self.rank
        full = self.length // b  # whole global batches; then one partial of w*m samples
        out, p = [], start
        while p < stop:
            k = p // b
            if k < full:
                base_local, size, base = k * b, b, k * w * b + r * b
            else:
                base_local, size = full * b, self.length - full * b
                base = full * w * b + r * size
            end = min(stop, base_local + size)
            out.append((base + p - base_local, base + end - base_local))
            p = end
        return out

    def _refs(self, g0: int, g1: int, out: list) -> None:
        j = int(np.searchsorted(self.cum, g0, side="right")) - 1
        while j < len(self.shard_order) and self.cum[j] < g1:
            lo, hi = int(self.cum[j]), int(self.cum[j + 1])
            a, b = max(g0, lo) - lo, min(g1, hi) - lo
            if b > a:
                shard = int(self.shard_order[j])
                out.append((shard, self.shard_permutation(shard)[a:b]))
            j += 1

    def shards(self) -> list[int]:
        """The shards this rank touches this epoch, in reading order."""
        return [s for s, _ in self.refs(0, self.length)]


# ---- batches -------------------------------------------------------------------------------------

def collate_padded(s: Samples, max_seq_length: int, max_pred: int) -> dict[str, np.ndarray]:
    """The reference's padded arrays (Samples.to_padded): input_ids/input_mask/segment_ids [B, L],
    masked_lm_positions/masked_lm_ids [B, P] (0 = padding), next_sentence_labels [B]."""
    return s.to_padded(max_seq_length, max_pred)


def collate_varlen(s: Samples) -> dict[str, np.ndarray]:
    """Unpadded arrays for a variable-length (cu_seqlens) trainer, T = total tokens, M = masks:
    input_ids/segment_ids/position_ids [T]; cu_seqlens [B+1] int32 (sample i = tokens
    cu_seqlens[i]:cu_seqlens[i+1]); max_seqlen [] int32; masked_lm_positions [M] int64 indexes
    the flat token array; masked_lm_ids [M]; cu_masked [B+1] (sample i's masks);
    next_sentence_labels [B]."""
    lengths = s.lengths
    counts = s.mlm_counts
    within = ranges(np.zeros(len(s), dtype=np.int64), lengths)  # position inside its sample
    seg = within >= np.repeat(s.b_starts.astype(np.int64), lengths)
    flat_pos = s.mlm_positions.astype(np.int64) + np.repeat(s.offsets[:-1], counts)
    return {
        "input_ids": s.input_ids.astype(np.int32),
        "segment_ids": seg.astype(np.int8),
        "position_ids": within.astype(np.int32),
        "cu_seqlens": s.offsets.astype(np.int32),
        "max_seqlen": np.int32(lengths.max() if len(s) else 0),
        "masked_lm_positions": flat_pos,
        "masked_lm_ids": s.mlm_ids.astype(np.int32),
        "cu_masked": s.mlm_offsets.astype(np.int32),
        "next_sentence_labels": s.nsp.astype(np.int8),
    }


def to_torch(batch: dict[str, np.ndarray], device=None, pin_memory: bool = False) -> dict:
    """The batch as torch tensors (torch is optional: imported only here)."""
    try:
        import torch
    except ImportError:
        raise UserError("to_torch needs PyTorch (pip install torch)") from None
    out = {}
    for k, v in batch.items():
        t = torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) \
            else torch.tensor(v)
        if pin_memory:
            t = t.pin_memory()
        out[k] = t.to(device, non_blocking=pin_memory) if device is not None else t
    return out


_DONE = object()


class ShardLoader:
    """Batches of rank `rank`'s samples, one epoch per `for` loop (module docstring for the order).

    Iterating yields the rest of the current epoch from `position`, then moves to (epoch + 1, 0).
    `prefetch` > 0 builds that many batches ahead on a background thread (bounded queue); the
    batches are the same with or without it.
    """

    def __init__(self, dataset: ShardDataset, batch_size: int, *, rank: int = 0,
                 world_size: int = 1, seed: int = 0, epoch: int = 0, start_sample: int = 0,
                 layout: str | None = None, drop_last: bool = True, prefetch: int = 2,
                 max_seq_length: int | None = None, max_pred: int | None = None,
                 split: str = "shards") -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        layout = layout or ("packed" if dataset.packed else "padded")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
        if (layout == "packed") != dataset.packed:
            raise ValueError(f"layout {layout!r} does not fit {dataset.format} shards (packed "
                             "shards give layout 'packed', unpadded shards 'padded' or 'varlen')")
        if seed < 0 or epoch < 0 or start_sample < 0:
            raise ValueError("seed, epoch and start_sample must be non-negative")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        self.split = split
        self.dataset, self.batch_size = dataset, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.layout, self.drop_last, self.prefetch = layout, drop_last, max(0, prefetch)
        self.max_seq_length = max_seq_length or dataset.max_seq_length
        self.max_pred = max_pred or dataset.max_pred
        self.epoch, self.position = epoch, start_sample
        self._plan: EpochPlan | None = None

    # -- order --
    def plan(self, epoch: int | None = None) -> EpochPlan:
        epoch = self.epoch if epoch is None else epoch
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = self.new_plan(epoch)
        return self._plan

    def new_plan(self, epoch: int) -> EpochPlan:
        return EpochPlan(self.dataset.counts, self.seed, epoch, self.rank, self.world_size,
                         split=self.split, block=self.batch_size)

    @property
    def samples_per_epoch(self) -> int:
        return self.dataset.num_samples // self.world_size

    def __len__(self) -> int:
        """Batches in a whole epoch."""
        n = self.samples_per_epoch
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int, position: int = 0) -> None:
        self.epoch, self.position = epoch, position

    def batch_starts(self) -> range:
        length = self.samples_per_epoch
        end = length if not self.drop_last else \
            self.position + max(0, length - self.position) // self.batch_size * self.batch_size
        return range(self.position, end, self.batch_size)

    def samples(self, plan: EpochPlan, start: int, stop: int) -> Samples:
        parts = [self.dataset.take(shard, rows) for shard, rows in plan.refs(start, stop)]
        return parts[0] if len(parts) == 1 else Samples.concat(parts)

    def make_batch(self, plan: EpochPlan, start: int) -> dict[str, np.ndarray]:
        if self.layout == "packed":
            parts = [self.dataset.reader(shard).batch(rows, self.max_seq_length,
                                                      self.dataset.max_seqs_per_row, self.max_pred)
                     for shard, rows in plan.refs(start, start + self.batch_size)]
            return parts[0] if len(parts) == 1 else \
                {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        s = self.samples(plan, start, start + self.batch_size)
        if self.layout == "varlen":
            return collate_varlen(s)
        return collate_padded(s, self.max_seq_length, self.max_pred)

    # -- iteration --
    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        epoch, plan = self.epoch, self.plan()
        starts = self.batch_starts()
        if self.prefetch == 0:
            for start in starts:
                batch = self.make_batch(plan, start)
                self.position = min(start + self.batch_size, plan.length)
                yield batch
        else:
            q: queue.Queue = queue.Queue(maxsize=self.prefetch)
            stop_event = threading.Event()
            # the producer gets its own plan object, so the caller may inspect self.plan() meanwhile
            producer_plan = self.new_plan(epoch)

            def produce() -> None:
                try:
                    for start in starts:
                        item = self.make_batch(producer_plan, start)
                        while not stop_event.is_set():
                            try:
                                q.put(item, timeout=0.1)
                                break
                            except queue.Full:
                                continue
                        if stop_event.is_set():
                            return
                    item = _DONE
                except BaseException as exc:  # handed to the consumer, raised there
                    item = exc
                while not stop_event.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        return
                    except queue.Full:
                        continue

            thread = threading.Thread(target=produce, name="bertperf-loader", daemon=True)
            thread.start()
            try:
                for start in starts:
                    item = q.get()
                    if isinstance(item, BaseException):
                        raise item
                    self.position = min(start + self.batch_size, plan.length)
                    yield item
                item = q.get()
                if isinstance(item, BaseException):
                    raise item
            finally:
                stop_event.set()
                thread.join()
        if self.epoch == epoch:
            self.epoch, self.position = epoch + 1, 0

    # -- resume --
    def state_dict(self) -> dict:
        return {"format": STATE_FORMAT, "seed": self.seed, "epoch": self.epoch,
                "position": self.position, "rank": self.rank, "world_size": self.world_size,
                "split": self.split, "batch_size": self.batch_size,
                "samples": self.dataset.num_samples, "fingerprint": self.dataset.fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("format") != STATE_FORMAT:
            raise UserError(f"loader state: unknown format {state.get('format')!r}")
        checks = [("seed", self.seed), ("rank", self.rank), ("world_size", self.world_size),
                  ("fingerprint", self.dataset.fingerprint()),
                  ("split", self.split)]  # states without "split" are "shards" states
        if self.split == "global_batch":  # the split's blocks are batch_size long
            checks.append(("batch_size", self.batch_size))
        for key, mine in checks:
            got = state.get(key, "shards") if key == "split" else state.get(key)
            if got != mine:
                raise UserError(f"loader state: {key} {got!r} differs from this loader's "
                                f"{mine!r}; exact resume needs the same shards, seed, rank, "
                                "world size and split (and batch size for split global_batch)")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def close(self) -> None:
        self.dataset.close()
