"""The run's batch layout (LAYOUT: varlen, packed or stratified), resolved once from the training
folder and the config: it builds the training set and its loader, names the batch class the step
takes, and says how MLPerf counts a step's sequences (docs/design.md, "The trainer's junction")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bertperf.config import RunConfig
from bertperf.data.collate import collate_packed, collate_varlen, max_masks_per_row
from bertperf.data.dataset import ShardDataset
from bertperf.data.loader import ShardLoader
from bertperf.data.synthetic import synthetic_packed, synthetic_samples
from bertperf.errors import UserError
from bertperf.formats import detect
from bertperf.formats.packed import packed_meta
from bertperf.model.batch import PackedBatch, UnpaddedBatch


@dataclass(frozen=True)
class Layout:
    """One way of batching the training shards (an entry of LAYOUTS)."""

    name: str
    """LAYOUT's value."""
    holds: str
    """What the training folder holds for it (in messages)."""
    batch_type: type
    """The model's input class its micro-batches become (bertperf.model.batch)."""
    fixed_shapes: bool
    """Every tensor of the step keeps one shape for the whole run (COMPILE and CUDA graphs need
    it)."""
    stratified: bool = False
    """The folder is a `prep stratify` output, read bin by bin (data/order.py StratifiedPlan)."""

    def dataset(self, folder: Path) -> ShardDataset:
        return (ShardDataset.from_stratified if self.stratified else ShardDataset.from_folder)(
            folder)

    def loader(self, cfg: RunConfig, dataset: ShardDataset, rank: int,
               world_size: int) -> ShardLoader:
        """This rank's loader over `dataset` with the run's batch size, order and balance."""
        masks = max_masks_per_row(dataset.max_seq_length, dataset.max_seqs_per_row,
                                  dataset.max_pred, cfg.data.masked_lm_prob) \
            if dataset.packed else None
        return ShardLoader(dataset, cfg.train.batch_size, rank=rank, world_size=world_size,
                           seed=cfg.train.seed, prefetch=cfg.data.prefetch,
                           split=cfg.data.loader_split, masks_per_row=masks,
                           balance=cfg.data.balance)

    def synthetic_arrays(self, loader: ShardLoader, vocab_size: int, seed: int) -> dict:
        """One micro-batch of made-up samples with the run's shapes (packed: the loader's rows
        and slots; varlen: BATCHSIZE sequences of MLPerf's length mix), as the loader's batches
        look: for the compile warm-up, which must not read the training data."""
        samples = synthetic_samples(4 * loader.batch_size, seed, loader.max_seq_length,
                                    loader.max_pred, vocab_size)
        if not loader.dataset.packed:
            part = samples.take(np.arange(loader.batch_size))
            return {**collate_varlen(part), "global_sequences": np.int64(len(part))}
        rows = synthetic_packed(samples, loader.max_seq_length, loader.dataset.max_seqs_per_row)
        arrays = rows.batch(np.arange(loader.batch_size), loader.max_seq_length,
                            loader.dataset.max_seqs_per_row, loader.max_pred)
        batch = collate_packed(arrays, loader.masks_per_row)
        return {**batch, "global_sequences": batch["num_sequences"]}

    def sequences_per_row(self, cfg: RunConfig) -> float:
        """How many sequences MLPerf's global_batch_size counts per row (PACKING_FACTOR for packed
        rows, else 1)."""
        return cfg.data.packing_factor if self.name == "packed" else 1.0

    def global_batch_size(self, cfg: RunConfig) -> int:
        """Sequences per optimizer step as MLPerf's global_batch_size counts them."""
        return round(cfg.rows_per_step * self.sequences_per_row(cfg))

    def warnings(self, cfg: RunConfig, dataset: ShardDataset) -> list[str]:
        """What the data says against the settings (file headers only): packed rows holding
        another average than PACKING_FACTOR."""
        if not dataset.packed:
            return []
        metas = [packed_meta(path) for path in dataset.files]
        rate = sum(m["sequences"] for m in metas) / max(sum(m["rows"] for m in metas), 1)
        if abs(rate - cfg.data.packing_factor) <= 0.05 * cfg.data.packing_factor:
            return []
        return [f"{cfg.data.train_dir}: {rate:.3f} sequences per row, but global_batch_size "
                f"counts {cfg.data.packing_factor} (PACKING_FACTOR)"]


LAYOUTS = {  # keyed by config.LAYOUTS's names
    "varlen": Layout("varlen", "unpadded", UnpaddedBatch, fixed_shapes=False),
    "packed": Layout("packed", "packed", PackedBatch, fixed_shapes=True),
    "stratified": Layout("stratified", "length-stratified", UnpaddedBatch, fixed_shapes=False,
                         stratified=True),
}

_BY_KIND = {detect.UNPADDED: "varlen", detect.PACKED: "packed"}


def layout_of(cfg: RunConfig) -> Layout:
    """The Layout of a configuration `resolve` has returned."""
    if cfg.data.layout is None:
        raise ValueError("the layout is not resolved yet (train.layout.resolve)")
    return LAYOUTS[cfg.data.layout]


def first_shard(train_dir: Path) -> Path:
    """The first training shard of DATADIR_PHASE2 (of its first bin, for a stratify output)."""
    if ShardDataset.is_stratified(train_dir):
        return ShardDataset.from_stratified(train_dir).files[0]
    return detect.sample_files(train_dir, "training")[0]


def holds(train_dir: Path) -> str:
    """The layout the training folder's shards are made for (a one-line UserError for files
    training does not read)."""
    first = first_shard(train_dir)
    kind = detect.header(first).kind
    found = "stratified" if ShardDataset.is_stratified(train_dir) else _BY_KIND.get(kind)
    if found is None:
        raise UserError(f"{first}: a {kind} file; training reads unpadded shards (prep unpad) or "
                        "packed ones (prep pack), which both make from this one")
    return found


def resolve(cfg: RunConfig) -> RunConfig:
    """The configuration with LAYOUT set to what the training folder holds when unset, after
    the folder's files are found to be training shards (a LAYOUT the folder does not hold is
    train.allowed's to refuse)."""
    found = holds(cfg.data.train_dir)
    return replace(cfg, data=replace(cfg.data, layout=cfg.data.layout or found))
