"""A training set: a fixed list of shards of one format and their sample (or row) counts, opened
only when read and at most a few at a time."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from bertperf.data.readers import PackedReader, ShardReader
from bertperf.errors import UserError
from bertperf.formats import detect, manifest
from bertperf.formats.samples import Samples


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
        self.max_seq_length = max_seq_length or first.max_seq_length
        self.max_pred = max_pred or first.max_pred
        self.max_seqs_per_row = first.max_seqs_per_row
        if counts is None:  # recorded counts count sequences of packed shards, not rows
            found = manifest.sample_counts(self.files) if not self.packed \
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
        self._lock = threading.Lock()

    def _header(self, path: Path) -> detect.Header:
        h = detect.header(path)
        if h.kind not in (detect.UNPADDED, detect.PACKED):
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
