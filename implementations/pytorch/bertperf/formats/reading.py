"""Any sample file as Samples: the one reader for the stages and the trainer that take files of
several layouts, told apart by formats.detect.

  padded         formats.padded.read_checked (every row checked to round-trip)
  unpadded       formats.unpadded.read_shard
  nvidia         formats.nvidia.read_varlen (their variable-length shards and eval file)
  nvidia-packed  formats.nvidia.read_packed, the rows' sequences in row order

Packed bertperf-packed/1 files are unpacked by `prep pack --unpack` instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from bertperf.benchmark import MAX_PREDICTIONS, MAX_SEQ_LENGTH
from bertperf.errors import UserError
from bertperf.formats import detect, nvidia, padded, unpadded
from bertperf.formats.samples import Samples

KINDS = (detect.PADDED, detect.UNPADDED, detect.NVIDIA, detect.NVIDIA_PACKED)
_NAMES = {detect.PADDED: "a padded sample file", detect.UNPADDED: "a bertperf-unpadded/1 shard",
          detect.NVIDIA: "an NVIDIA variable-length file",
          detect.NVIDIA_PACKED: "an NVIDIA packed file", detect.PACKED: "a bertperf-packed/1 shard"}


def read_samples(path: str | os.PathLike, kinds: Sequence[str] = KINDS,
                 max_seq_length: int | None = None,
                 max_pred: int | None = None) -> tuple[Samples, int, int]:
    """The samples of a file of one of `kinds` (packed: its sequences), checked, and the limits
    they were checked against: the file's own (padded, unpadded) or, for NVIDIA's layouts, which
    record none, `max_seq_length` and `max_pred` (MLPerf's 512 and 76 by default). A file of
    another kind, or a bad one, is a one-line UserError naming it."""
    path = Path(path)
    kind = detect.kind(path)
    if kind not in kinds:
        raise UserError(f"{path}: {_NAMES[kind]}, not {' or '.join(_NAMES[k] for k in kinds)}")
    if kind == detect.PADDED:
        return padded.read_checked(path)
    if kind == detect.UNPADDED:
        samples, meta = unpadded.read_shard(path)
        return samples, meta["max_seq_length"], meta["max_predictions_per_seq"]
    length = max_seq_length or MAX_SEQ_LENGTH
    preds = max_pred or MAX_PREDICTIONS
    if kind == detect.NVIDIA:
        return nvidia.read_varlen(path, length, preds), length, preds
    rows = nvidia.read_packed(path, length, preds)
    return rows.to_samples().astype_compact(), length, preds
