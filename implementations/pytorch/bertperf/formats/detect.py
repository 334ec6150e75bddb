"""Which layout a sample file is in, what its header says, and which files of a folder hold samples.

The one place that tells the layouts apart (docs/data_format.md):

  padded         `prep create` / `prep eval` output and NVIDIA's fixed-length files: input_mask
                 [N, L] and five other 2-D/1-D datasets (formats/padded.py)
  unpadded       bertperf-unpadded/1, attribute format (formats/unpadded.py)
  packed         bertperf-packed/1, attribute format (formats/packed.py)
  nvidia         NVIDIA's variable-length files (convert_fixed2variable.py): vlen input_ids,
                 no packed_input_len (formats/nvidia.py)
  nvidia-packed  NVIDIA's packed training files (create_packed_trainset.py): vlen input_ids
                 with packed_input_len (formats/nvidia.py)
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

import h5py

from bertperf.errors import UserError
from bertperf.formats import manifest

PADDED, UNPADDED, PACKED, NVIDIA, NVIDIA_PACKED = KINDS = (
    "padded", "unpadded", "packed", "nvidia", "nvidia-packed")
SUFFIXES = (".h5", ".hdf5", ".hdf")
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_FORMAT_ATTRS = {"bertperf-unpadded/1": UNPADDED, "bertperf-packed/1": PACKED}


@dataclass(frozen=True)
class Header:
    """What a sample file says about itself, read without its data."""

    kind: str
    """One of KINDS."""
    count: int
    """Samples; rows for the packed kinds."""
    max_seq_length: int | None
    """Longest sample (row) the layout allows; None where the file does not say (NVIDIA's)."""
    max_pred: int | None
    """Most masked positions per sample; None where the file does not say."""
    max_seqs_per_row: int | None
    """Sequences per row of a bertperf-packed/1 file; None for the other kinds."""

    @property
    def packed(self) -> bool:
        return self.kind in (PACKED, NVIDIA_PACKED)


def header(path: str | os.PathLike) -> Header:
    """The layout and header of a sample file; a one-line UserError naming it otherwise."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        with h5py.File(path, "r") as f:
            fmt = f.attrs.get("format")
            fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
            if fmt is not None:
                if fmt not in _FORMAT_ATTRS:
                    raise UserError(f"{path}: unknown sample-file format {fmt!r}")
                kind = _FORMAT_ATTRS[fmt]
                packed = kind == PACKED
                return Header(kind, int(f["row_offsets" if packed else "offsets"].shape[0]) - 1,
                              int(f.attrs["max_seq_length"]), int(f.attrs["max_predictions_per_seq"]),
                              int(f.attrs["max_seqs_per_row"]) if packed else None)
            if "input_ids" in f and h5py.check_vlen_dtype(f["input_ids"].dtype) is not None:
                kind = NVIDIA_PACKED if "packed_input_len" in f else NVIDIA
                return Header(kind, int(f["input_ids"].shape[0]), None, None, None)
            if "input_mask" in f and f["input_mask"].ndim == 2 and "masked_lm_positions" in f:
                return Header(PADDED, int(f["input_mask"].shape[0]), int(f["input_mask"].shape[1]),
                              int(f["masked_lm_positions"].shape[-1]), None)
    except UserError:
        raise
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise UserError(f"{path}: truncated or corrupt HDF5 file ({exc})") from None
    raise UserError(f"{path}: not a sample file (neither padded, unpadded, packed nor one of "
                    "NVIDIA's layouts)")


def kind(path: str | os.PathLike) -> str:
    """The layout of a sample file (one of KINDS)."""
    return header(path).kind


def require(path: str | os.PathLike, wanted: str) -> Header:
    """The header of a file that must be of kind `wanted`; a one-line UserError otherwise."""
    h = header(path)
    if h.kind != wanted:
        raise UserError(f"{path}: a {h.kind} sample file, not a {wanted} one")
    return h


def _is_sample_file(path: Path) -> bool:
    if path.name.startswith(".") or not path.is_file():
        return False
    if path.suffix in SUFFIXES:
        return True
    if path.suffix:  # MANIFEST.json, stratify.json, a PNG: not HDF5
        return False
    with open(path, "rb") as f:  # NVIDIA's packed shards are named part_XXXXX, without a suffix
        return f.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE


def sample_files(spec: str | os.PathLike, what: str = "input", pattern: str | None = None) \
        -> list[Path]:
    """A file, or the sample files of a folder sorted by name: *.h5, *.hdf5, *.hdf and HDF5 files
    without a suffix, not hidden; only those whose name matches the glob `pattern` when given.
    A file that the folder's MANIFEST.json lists but that is not there (an incomplete copy) is
    an error, as is a folder without any."""
    path = Path(spec)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UserError(f"{path}: no such {what} file or folder")
    files = sorted(p for p in path.iterdir()
                   if _is_sample_file(p) and (pattern is None or fnmatch.fnmatch(p.name, pattern)))
    if not files:
        raise UserError(f"{path}: no sample files ({pattern or '*.h5, *.hdf5, *.hdf'}) in this "
                        "folder")
    present = {p.name for p in files}
    for name in sorted(manifest.folder_entries(path)):
        if "/" not in name and name not in present and Path(name).suffix in SUFFIXES \
                and (pattern is None or fnmatch.fnmatch(name, pattern)):
            raise UserError(f"{path / name}: listed in {path / manifest.MANIFEST_NAME} but "
                            "missing (incomplete copy?)")
    return files
