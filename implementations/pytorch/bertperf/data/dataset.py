"""A training set: a fixed list of shards of one format and their sample (or row) counts, opened
only when read and at most a few at a time."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from bertperf.data.readers import PackedReader, ShardReader
from bertperf.errors import UserError
from bertperf.formats import detect, manifest
from bertperf.formats.hdf5 import read_datasets
from bertperf.formats.samples import Samples

STRATIFY_SUMMARY = "stratify.json"


@dataclass(frozen=True)
class Kind:
    """What a dataset of one shard format reads and counts."""

    reader: type
    """Its shards' reader (data/readers.py)."""
    unit: str
    """What its counts count: samples, or packed rows."""
    offsets: str
    """The HDF5 dataset whose differences are each unit's tokens."""
    recorded: bool
    """MANIFEST.json records the counts in this unit (a packed folder's counts sequences)."""


KINDS = {detect.UNPADDED: Kind(ShardReader, "samples", "offsets", recorded=True),
         detect.PACKED: Kind(PackedReader, "rows", "row_offsets", recorded=False)}


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
        first = self._header(self.files[0])
        self.kind = first.kind
        self.unit = KINDS[first.kind]
        self.max_seq_length = max_seq_length or first.max_seq_length
        self.max_pred = max_pred or first.max_pred
        self.max_seqs_per_row = first.max_seqs_per_row
        if counts is None:
            found = manifest.sample_counts(self.files) if self.unit.recorded \
                else [None] * len(self.files)
            counts = [first.count] + [c if c is not None else self._header(p).count
                                      for p, c in zip(self.files[1:], found[1:])]
        if len(counts) != len(self.files):
            raise ValueError(f"{len(counts)} counts for {len(self.files)} shards")
        self.counts = np.asarray(counts, dtype=np.int64)
        self.cache_size = max(1, cache_size)
        self.use_mmap, self.validate = use_mmap, validate
        self._readers: collections.OrderedDict[int, ShardReader | PackedReader] = \
            collections.OrderedDict()
        self._lengths: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self.bins: list[int] | None = None
        """Length-stratified data (from_stratified): how many of the shards, in order, each
        length bin holds; None otherwise."""
        self._lock = threading.Lock()

    def _header(self, path: Path) -> detect.Header:
        h = detect.header(path)
        if h.kind not in KINDS:
            raise UserError(f"{path}: a {h.kind} file; training reads bertperf-unpadded/1 or "
                            "bertperf-packed/1 shards (prep unpad, prep pack)")
        if h.kind != getattr(self, "kind", h.kind):
            raise UserError(f"{path}: {h.kind} shard among {self.kind} ones")
        return h

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, pattern: str | None = None,
                    **kwargs) -> ShardDataset:
        """The shards in `folder` (formats.detect.sample_files), only those matching the glob
        `pattern` when given; by name."""
        folder = Path(folder)
        if not folder.is_dir():
            raise UserError(f"{folder}: no such folder")
        return cls(detect.sample_files(folder, "training", pattern), **kwargs)

    @classmethod
    def from_stratified(cls, folder: str | os.PathLike, **kwargs) -> ShardDataset:
        """The shards of a `prep stratify` output folder, bin after bin (stratify.json's order,
        empty bins left out; each bin's shards by name), with `bins` set."""
        folder = Path(folder)
        try:
            bins = json.loads((folder / STRATIFY_SUMMARY).read_text())["bins"]
            names = [b["name"] for b in bins if b["samples"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{folder}: not a prep stratify output ({STRATIFY_SUMMARY}: "
                            f"{exc})") from None
        per_bin = [detect.sample_files(folder / name, "training", "part_*.h5") for name in names]
        dataset = cls([f for files in per_bin for f in files], **kwargs)
        if dataset.packed:
            raise UserError(f"{folder}: packed shards in a stratify output")
        dataset.bins = [len(files) for files in per_bin]
        return dataset

    @staticmethod
    def is_stratified(folder: str | os.PathLike) -> bool:
        """Whether `folder` is a `prep stratify` output (it holds stratify.json)."""
        return (Path(folder) / STRATIFY_SUMMARY).is_file()

    def bin_counts(self) -> list[np.ndarray]:
        """Each length bin's shard counts (stratified data only)."""
        if self.bins is None:
            raise ValueError("not a stratified dataset")
        ends = np.cumsum([0, *self.bins])
        return [self.counts[a:b] for a, b in zip(ends[:-1], ends[1:])]

    def __len__(self) -> int:
        return len(self.files)

    @property
    def packed(self) -> bool:
        return self.kind == detect.PACKED

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
            r = self.unit.reader(path, use_mmap=self.use_mmap, validate=self.validate)
            problem = None
            if r.count != self.counts[shard]:
                problem = (f"holds {r.count} {self.unit.unit}, but {int(self.counts[shard])} "
                           "were expected (MANIFEST.json stale?)")
            elif r.max_seq_length > self.max_seq_length or r.max_pred > self.max_pred or (
                    self.max_seqs_per_row is not None
                    and r.max_seqs_per_row > self.max_seqs_per_row):
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

    def lengths(self, shard: int) -> np.ndarray:
        """The tokens of each sample (each row, for packed shards) of shard `shard`, from its
        offsets only (the last 64 shards asked for are kept)."""
        with self._lock:
            found = self._lengths.get(shard)
            if found is not None:
                self._lengths.move_to_end(shard)
                return found
        path = self.files[shard]
        name = self.unit.offsets
        offsets = read_datasets(path, [name], f"a {self.kind} shard")[name]
        if len(offsets) != self.counts[shard] + 1:
            raise UserError(f"{path}: holds {len(offsets) - 1} {self.unit.unit}, but "
                            f"{int(self.counts[shard])} were expected (MANIFEST.json stale?)")
        found = np.diff(offsets.astype(np.int64)).astype(np.int32)
        with self._lock:
            self._lengths[shard] = found
            while len(self._lengths) > 64:
                self._lengths.popitem(last=False)
        return found

    def take(self, shard: int, rows: np.ndarray) -> Samples:
        """Samples `rows` of unpadded shard `shard`."""
        return self.reader(shard).take(rows)

    def close(self) -> None:
        with self._lock:
            for r in self._readers.values():
                r.close()
            self._readers.clear()

