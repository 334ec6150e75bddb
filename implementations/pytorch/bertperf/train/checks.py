"""Checks of a run before any rank writes anything (`prepare`: `train` and `train --check`, which
run.sub and run_and_time.sh call first): the layout the training folder holds, every combination
of settings train.allowed refuses, then the data: its sequence length against the model's
position table, the eval set's against the training shards', and the folders the run writes.
Each problem is one line naming the values and where they come from; `run_warnings` says what a
valid run still does badly here."""

from __future__ import annotations

from pathlib import Path

import torch

from bertperf import config
from bertperf.config import RunConfig
from bertperf.errors import UserError
from bertperf.formats import detect
from bertperf.formats.files import folder_problem
from bertperf.formats.outputs import claim
from bertperf.formats.reading import read_samples
from bertperf.model.bert_config import NAMED, BertConfig
from bertperf.train import allowed, comm, layerwise, layout
from bertperf.train.allowed import on_cpu
from bertperf.train.evaluation import EVAL_KINDS


def data_sequence_length(cfg: RunConfig) -> tuple[int, Path]:
    """The longest sample the data allows (max_seq_length of the first training shard, or of the
    eval file if that is longer) and the file that says so."""
    first = layout.first_shard(cfg.data.train_dir)
    found = [(detect.header(path).max_seq_length or 0, path)
             for path in (first, cfg.data.eval_file)]
    return max(found, key=lambda item: item[0])


def prepare(cfg: RunConfig) -> RunConfig:
    """The configuration with its layout resolved (train.layout.resolve), after train.allowed's
    refusals, every check of this module and INIT_CHECKPOINT's that read no tensor
    (convert_cli.check_init_checkpoint) passed: what `train` and `train --check` run before
    anything is written."""
    cfg = layout.resolve(cfg)
    allowed.check(cfg)
    bert = check_run(cfg)
    if cfg.model.init_checkpoint is not None:
        from bertperf.model.convert_cli import check_init_checkpoint
        check_init_checkpoint(cfg.model.init_checkpoint, bert)
    check_eval_length(cfg)
    check_outputs(cfg)
    return cfg


def check_run(cfg: RunConfig) -> BertConfig:
    """The run's model config, after the data's sequence length was checked against it."""
    config = BertConfig.named(cfg.model.bert_config)
    length, source = data_sequence_length(cfg)
    if length > config.max_position_embeddings:
        raise UserError(f"BERT_CONFIG {cfg.model.bert_config}: max_position_embeddings "
                        f"{config.max_position_embeddings} is below the data's sequence length "
                        f"{length} (max_seq_length of {source})")
    return config


def check_eval_length(cfg: RunConfig) -> None:
    """The eval set's max_seq_length is the training shards': the evals score the sequences the
    run trains on. A padded eval file states it; NVIDIA's variable-length one does not, so it is
    read, and a sample longer than the shards' limit tells."""
    first, eval_file = layout.first_shard(cfg.data.train_dir), cfg.data.eval_file
    trained, stated = (detect.header(path).max_seq_length for path in (first, eval_file))
    if stated is None:
        longest = int(read_samples(eval_file, EVAL_KINDS)[0].lengths.max(initial=0))
        if longest > trained:
            raise UserError(f"EVAL_FILE {eval_file} holds sequences of {longest} tokens, but the "
                            f"training shards' max_seq_length is {trained} ({first}): make both "
                            "with one max_seq_length")
    elif stated != trained:
        raise UserError(f"EVAL_FILE {eval_file} has max_seq_length {stated}, but the training "
                        f"shards' is {trained} ({first}): make both with one max_seq_length")


def check_outputs(cfg: RunConfig) -> None:
    """The folders the run writes, the MLPerf log's (LOGDIR, or MLLOG_FILE's folder) and
    CHECKPOINT_DIR, are folders this process can write into, or can be made
    (files.folder_problem), and the log is none of the run's inputs and no file but an earlier
    MLPerf log (formats.outputs; an earlier log is kept as <path>.N), PLOT's and TENSORBOARD's
    outputs none but their own: checked before the run reads its data and trains."""
    named = cfg.train.log_file is not None
    for name, folder in (("LOGDIR", None if named else cfg.log_path.parent),
                         ("CHECKPOINT_DIR", cfg.checkpoint.checkpoint_dir)):
        if folder is not None and (why := folder_problem(folder)):
            raise UserError(f"{name} {folder}: {why}")
    bert_config = None if cfg.model.bert_config in NAMED else cfg.model.bert_config
    inputs = [("DATADIR_PHASE2", cfg.data.train_dir), ("EVAL_FILE", cfg.data.eval_file),
              ("INIT_CHECKPOINT", cfg.model.init_checkpoint), ("BERT_CONFIG", bert_config)]
    claim("MLLOG_FILE" if named else "the MLPerf log", cfg.log_path, "mlperf log", inputs=inputs)
    if cfg.train.plot:  # <log>.png: the curves of an earlier run are redrawn, nothing else
        claim("PLOT=1's", Path(f"{cfg.log_path}.png"), "plot", force=True)
    if cfg.train.tensorboard:  # an earlier run's curves are added to, nothing else
        claim("TENSORBOARD_DIR" if cfg.train.tensorboard_dir else "TENSORBOARD=1's",
              cfg.tensorboard_path, "tensorboard", inputs=inputs)


def matmul_slowdown(dtype: torch.dtype, n: int = 256, repeats: int = 10) -> float:
    """How many times longer an n x n matmul takes in `dtype` than in fp32 on this CPU: about 1
    or below where the CPU has instructions for it, far above where they are emulated. The two
    are timed in turns on one thread, `repeats` pairs after one warm-up each, and the best of
    each kept, so a busy neighbour on the machine slows both alike and the ratio stands (a
    multi-threaded matmul waits for its slowest thread, which a neighbour delays at random)."""
    import time

    pairs = {dt: (torch.randn(n, n).to(dt), torch.randn(n, n).to(dt))
             for dt in (torch.float32, dtype)}
    best = dict.fromkeys(pairs, float("inf"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for a, b in pairs.values():
            a @ b
        for _ in range(repeats):
            for dt, (a, b) in pairs.items():
                start = time.perf_counter()
                a @ b
                best[dt] = min(best[dt], time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return best[dtype] / best[torch.float32]


SLOW_PRECISION = 2.0
"""A CPU whose bf16/fp16 matmuls take over this many times fp32's draws the warning."""


def run_warnings(cfg: RunConfig) -> list[str]:
    """config.warnings, a run that ends before its first eval, LAYERWISE's (layerwise.warnings),
    a GRAD_COMM mode's setting without the mode (comm.warnings), and a bf16/fp16 run on a CPU
    that emulates those matmuls (measured).
    `cfg` is prepared (its layout resolved)."""
    out = config.warnings(cfg)
    batch = layout.layout_of(cfg).global_batch_size(cfg)
    steps = min(cfg.optim.max_steps, -(-cfg.train.max_samples_termination // batch))
    if steps * batch < cfg.first_eval(batch):
        cap = f"MAX_STEPS={steps}" if steps == cfg.optim.max_steps else \
            f"MAX_SAMPLES_TERMINATION={cfg.train.max_samples_termination}"
        out.append(f"{cap} ends the run at step {steps}, after {steps * batch} samples, before "
                   f"its first eval at {cfg.first_eval(batch)} (EVAL_ITER_START_SAMPLES, "
                   "EVAL_ITER_SAMPLES): the run will log no eval, so no MLPerf result")
    out += layerwise.warnings(cfg, batch) + comm.warnings(cfg)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.precision)
    if dtype is not None and on_cpu(cfg):
        slowdown = matmul_slowdown(dtype)
        if slowdown > SLOW_PRECISION:
            out.append(f"PRECISION={cfg.train.precision} on this CPU: its {cfg.train.precision} "
                       f"matmuls measured {slowdown:.0f}x slower than fp32's (no instructions "
                       "for them; emulated), so this run will be several times slower than in "
                       "fp32 (PRECISION=fp32)")
    return out
