"""Random access to one shard for training: the file memory-mapped (pages belong to the page
cache, not to the process), only the rows asked for copied out.

  ShardReader(path)   a bertperf-unpadded/1 shard: `take(rows)` -> Samples
  PackedReader(path)  a bertperf-packed/1 shard: `batch(rows, ...)` = Packed.batch on the mapped
                      arrays
  open_shard(path)    the reader for the shard's format

Where a file cannot be mapped (chunked or compressed datasets) they read through h5py instead.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import h5py
import numpy as np

from bertperf.errors import UserError
from bertperf.formats import detect, packed, unpadded
from bertperf.formats.samples import Samples, offsets_from_lengths, ranges

_INDEX_FIELDS = ("offsets", "b_starts", "mlm_offsets", "nsp")  # small: read whole in h5py mode


class _MappedFile:
    """The datasets `fields` of one HDF5 shard for random access without reading it whole.

    Contiguous datasets become numpy views of one read-only mmap of the file (pages are read on
    touch and belong to the page cache, not to this process's heap). Where a dataset is chunked or
    compressed (or use_mmap=False) the file stays open in h5py and `small` datasets are read whole;
    the others are left as h5py datasets for the subclass to slice.
    """

    kind = ""
    fields: tuple[str, ...] = ()
    small: tuple[str, ...] = ()

    def __init__(self, path: str | os.PathLike, *, use_mmap: bool = True) -> None:
        self.path = Path(path)
        detect.require(self.path, self.kind)
        self._file = None
        self._mmap = None
        self._arrays: dict = {}
        try:
            f = h5py.File(self.path, "r")
        except (OSError, ValueError) as exc:
            raise UserError(f"{self.path}: cannot open shard ({exc})") from None
        try:
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

    kind = detect.UNPADDED
    fields = unpadded.FIELDS
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
            try:
                unpadded.check(self.path, self.read_range(0, self.count), self.max_seq_length, self.max_pred)
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
    """A bertperf-packed/1 shard (bertperf.formats.packed): its unit is a row (up to
    max_seqs_per_row sequences); `batch(rows)` is `Packed.batch` on the mapped arrays, so only the
    rows asked for are read. Without a mapping the file is read whole (h5py cannot gather rows)."""

    kind = detect.PACKED
    fields = packed.FIELDS
    small = fields  # h5py mode: everything (see the docstring)

    def __init__(self, path: str | os.PathLike, *, use_mmap: bool = True,
                 validate: bool = False) -> None:
        super().__init__(path, use_mmap=use_mmap)
        self.max_seqs_per_row = int(self.attrs["max_seqs_per_row"])
        a = self._arrays
        self.rows = packed.Packed(*(a[k] for k in packed.FIELDS))
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
                packed.check(self.path, self.rows, meta)
            except UserError:
                self.close()
                raise

    def batch(self, rows: np.ndarray, max_seq_length: int, max_seqs_per_row: int,
              max_pred: int) -> dict[str, np.ndarray]:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.count):
            raise IndexError(f"{self.path}: rows outside 0..{self.count - 1}")
        try:
            return self.rows.batch(rows, max_seq_length, max_seqs_per_row, max_pred)
        except (OSError, ValueError) as exc:
            raise UserError(f"{self.path}: cannot read rows ({exc})") from None

    def close(self) -> None:
        self.rows = None
        super().close()


def open_shard(path: str | os.PathLike, **kwargs) -> ShardReader | PackedReader:
    """The reader for the shard's format (bertperf-unpadded/1 or bertperf-packed/1)."""
    return (PackedReader if detect.kind(path) == detect.PACKED else ShardReader)(path, **kwargs)
