"""Checks of a run's configuration that need more than config.py knows, made before any rank
starts work (`train --check`, run.sub and run_and_time.sh call them first): the batch layout the
training folder allows, the model shape it names, the global batch against MLPerf's RCP table
(BERT-large only), and the data's sequence length against the model's position table. Each
problem is one line naming the values and where they come from."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bertperf.config import RunConfig
from bertperf.data.dataset import ShardDataset
from bertperf.errors import UserError
from bertperf.formats import detect
from bertperf.mlperf.rcp import check_global_batch
from bertperf.model.bert_config import BertConfig


def first_shard(train_dir: Path) -> Path:
    """The first training shard of DATADIR_PHASE2 (of its first bin, for a stratify output)."""
    if ShardDataset.is_stratified(train_dir):
        return ShardDataset.from_stratified(train_dir).files[0]
    return detect.sample_files(train_dir, "training")[0]


def data_sequence_length(cfg: RunConfig) -> tuple[int, Path]:
    """The longest sample the data allows (max_seq_length of the first training shard, or of the
    eval file if that is longer) and the file that says so."""
    first = first_shard(cfg.data.train_dir)
    found = [(detect.header(path).max_seq_length or 0, path)
             for path in (first, cfg.data.eval_file)]
    return max(found, key=lambda item: item[0])


def resolve_layout(cfg: RunConfig) -> RunConfig:
    """The configuration with LAYOUT set (what the training folder holds, when unset) and the
    settings that need packed rows checked."""
    first = first_shard(cfg.data.train_dir)
    kind = detect.header(first).kind
    holds = {detect.UNPADDED: "varlen", detect.PACKED: "packed"}.get(kind)
    if holds is None:
        raise UserError(f"{first}: a {kind} file; training reads unpadded shards (prep unpad) or "
                        "packed ones (prep pack), which both make from this one")
    if ShardDataset.is_stratified(cfg.data.train_dir):
        holds, kind = "stratified", "length-stratified"
    layout = cfg.data.layout or holds
    if layout != holds:
        raise UserError(f"LAYOUT={layout}, but {cfg.data.train_dir} holds {kind} shards (prep "
                        "pack makes packed shards from unpadded ones, --unpack the reverse; "
                        "prep stratify makes length-stratified ones)")
    if layout == "packed" and cfg.data.loader_split != "global_batch":
        raise UserError("LAYOUT=packed counts each global batch's sequences on every rank: it "
                        f"needs LOADER_SPLIT=global_batch, not {cfg.data.loader_split}")
    if layout == "stratified" and cfg.data.loader_split != "global_batch":
        raise UserError("LAYOUT=stratified composes each global batch from every length bin: "
                        f"it needs LOADER_SPLIT=global_batch, not {cfg.data.loader_split}")
    if layout != "packed" and (cfg.train.compile != "none" or cfg.train.use_cuda_graph):
        raise UserError("COMPILE and USE_CUDA_GRAPH need LAYOUT=packed (varlen batches change "
                        "shape every step)")
    return replace(cfg, data=replace(cfg.data, layout=layout))


def check_run(cfg: RunConfig) -> BertConfig:
    """The run's model config, after every check of this module passed."""
    config = BertConfig.named(cfg.model.bert_config)
    if config.is_mlperf_large:  # the benchmark itself: its batch must have an RCP
        check_global_batch(cfg.global_batch_size)
    length, source = data_sequence_length(cfg)
    if length > config.max_position_embeddings:
        raise UserError(f"BERT_CONFIG {cfg.model.bert_config}: max_position_embeddings "
                        f"{config.max_position_embeddings} is below the data's sequence length "
                        f"{length} (max_seq_length of {source})")
    return config
