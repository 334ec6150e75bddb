"""Checks of a run's configuration that need more than config.py knows, made before any rank
starts work (`train --check`, run.sub and run_and_time.sh call them first): the model shape it
names, the global batch against MLPerf's RCP table (BERT-large only), and the data's sequence
length against the model's position table. Each problem is one line naming the values and where
they come from."""

from __future__ import annotations

from pathlib import Path

from bertperf.config import RunConfig
from bertperf.errors import UserError
from bertperf.formats import detect
from bertperf.mlperf.rcp import check_global_batch
from bertperf.model.bert_config import BertConfig


def data_sequence_length(cfg: RunConfig) -> tuple[int, Path]:
    """The longest sample the data allows (max_seq_length of the first training shard, or of the
    eval file if that is longer) and the file that says so."""
    first = detect.sample_files(cfg.data.train_dir, "training")[0]
    found = [(detect.header(path).max_seq_length or 0, path)
             for path in (first, cfg.data.eval_file)]
    return max(found, key=lambda item: item[0])


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
