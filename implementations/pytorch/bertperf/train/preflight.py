"""Checks before the run's MLPerf log opens: the data is what its manifests recorded, and its token
ids fit the model's vocabulary. Each problem is a one-line error naming the file; all ranks fail
together (the verdict is summed over ranks) so no rank is left waiting in a collective.

Training shards are checked against their folder's MANIFEST.json (written by `prep unpad`,
`chop`, `pack` or `stratify`): every shard must be listed, with its recorded size; with
DATA_VERIFY=md5 (the default) its md5 as well, the shards spread over the ranks (rank r hashes
shards r, r+W, ...). The eval file is checked the same way against its folder's manifest (written
by `prep eval`), and its sample count against the manifest's, so a truncated eval set cannot pass.
The token ids of the eval set and of one training shard per rank (unpadded or packed) must fit
the model's vocabulary; packed rows of that shard must fit a packed batch's masked slots (the
loader checks every row it reads the same way, later).
A folder without a manifest (e.g. shards made by NVIDIA's scripts) is used with a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from bertperf.data.loader import ShardLoader
from bertperf.errors import UserError
from bertperf.formats import manifest
from bertperf.formats.samples import Samples
from bertperf.train.dist import Dist, FollowOnError

ROWS_AT_ONCE = 4096
"""Packed rows checked at a time (their batch arrays held at once)."""


def manifest_problems(files: Sequence[Path], mode: str, rank: int, world_size: int,
                      warn: Callable[[str], None]) -> list[str]:
    """This rank's share of the problems of `files` against their folders' manifests."""
    problems = []
    by_folder: dict[Path, dict[str, manifest.Entry]] = {}
    for i, path in enumerate(files):
        folder = path.parent
        if folder not in by_folder:
            if not (folder / manifest.MANIFEST_NAME).is_file():
                warn(f"{folder}: no {manifest.MANIFEST_NAME}; its files are not verified")
            by_folder[folder] = manifest.load(folder) \
                if (folder / manifest.MANIFEST_NAME).is_file() else {}
        entries = by_folder[folder]
        if not entries:
            continue
        entry = entries.get(path.name)
        if entry is None:
            problems.append(f"{path}: not in {folder / manifest.MANIFEST_NAME}")
        elif why := manifest.check_file(path, entry,
                                        md5=mode == "md5" and i % world_size == rank):
            problems.append(f"{path}: {why}")
    return problems


def eval_count_problem(path: Path, count: int) -> str | None:
    """Whether the eval file holds the number of samples its manifest recorded."""
    folder = path.parent
    if not (folder / manifest.MANIFEST_NAME).is_file():
        return None
    entry = manifest.load(folder).get(path.name)
    if entry is not None and entry.samples is not None and entry.samples != count:
        return f"{path}: {count} eval samples read, the manifest recorded {entry.samples}"
    return None


def vocab_problem(samples: Samples, vocab_size: int, source: str) -> str | None:
    """Token ids beyond the model's vocabulary (data made with another vocab, or the wrong
    bert_config)."""
    if len(samples.input_ids) == 0:
        return None
    top = int(np.max(samples.input_ids))
    if top >= vocab_size:
        return (f"{source}: token id {top} >= vocab_size {vocab_size} of the model config "
                "(vocab/config mismatch)")
    return None


def run_checks(dist: Dist, device: torch.device, checks: Callable[[], list[str]]) -> None:
    """Run `checks` on every rank; raise on every rank if any rank found a problem."""
    try:
        problems = checks()
    except UserError as exc:
        problems = [str(exc)]
    bad = int(dist.sum(torch.tensor([len(problems)], dtype=torch.float64, device=device)).item())
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"rank {dist.rank}: {problems[0]}{more}")
    if bad:
        raise FollowOnError(f"rank {dist.rank}: data check failed on another rank (see its error)")


def verify_inputs(dist: Dist, device: torch.device, loader: ShardLoader, eval_file: Path,
                  eval_share: Samples, eval_total: int, vocab_size: int, mode: str,
                  warn: Callable[[str], None]) -> None:
    """Every check of this module, before the run's log opens (docstring at the top), over
    `loader`'s shards (bertperf-unpadded/1 or bertperf-packed/1); the packed rows of this rank's
    shard also go through the loader's own check of their masked tokens (MASKED_LM_PROB)."""
    dataset = loader.dataset
    files = dataset.files

    def checks() -> list[str]:
        problems = [] if mode == "none" else \
            manifest_problems(list(files) + [eval_file], mode, dist.rank, dist.world_size, warn)
        problems += [p for p in (eval_count_problem(eval_file, eval_total),
                                 vocab_problem(eval_share, vocab_size, str(eval_file))) if p]
        if not problems:
            from bertperf.formats.packed import unpack
            from bertperf.formats.unpadded import read_shard
            k = dist.rank % len(files)
            samples = (unpack if dataset.packed else read_shard)(files[k])[0]
            problems += [p for p in [vocab_problem(samples, vocab_size, str(files[k]))] if p]
            if dataset.packed:
                count = int(dataset.counts[k])
                for start in range(0, count, ROWS_AT_ONCE):
                    loader.packed_rows(k, np.arange(start, min(start + ROWS_AT_ONCE, count)))
        return problems

    run_checks(dist, device, checks)
