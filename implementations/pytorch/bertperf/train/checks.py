"""Checks of a run's configuration that need more than config.py knows, made before any rank
writes anything (`prepare`: `train` and `train --check`, which run.sub and run_and_time.sh call
first): the layout the training folder allows, the combinations the parallelism plan refuses, the
model shape, the global batch against MLPerf's RCP table (BERT-large only), the data's sequence
length against the model's position table and the eval set's against the training shards', the
settings against the run's length (the LR warm-up, LAYERWISE's stages) and the model
(POWERSGD_RANK), the device against this machine, and the folders the run writes. Each problem
is one line naming the values and where they come from; `run_warnings` says what a valid run
still does badly here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from bertperf import config
from bertperf.config import RunConfig, layerwise_stages
from bertperf.errors import UserError
from bertperf.formats import detect
from bertperf.formats.files import folder_problem
from bertperf.formats.reading import read_samples
from bertperf.kernels import backend
from bertperf.mlperf.rcp import check_global_batch
from bertperf.model import BertForPreTraining, fp8
from bertperf.model.bert_config import BertConfig
from bertperf.train import comm, layout, parallel
from bertperf.train.evaluation import EVAL_KINDS


def data_sequence_length(cfg: RunConfig) -> tuple[int, Path]:
    """The longest sample the data allows (max_seq_length of the first training shard, or of the
    eval file if that is longer) and the file that says so."""
    first = layout.first_shard(cfg.data.train_dir)
    found = [(detect.header(path).max_seq_length or 0, path)
             for path in (first, cfg.data.eval_file)]
    return max(found, key=lambda item: item[0])


def prepare(cfg: RunConfig) -> RunConfig:
    """The configuration with its layout resolved (train.layout.resolve), after every check of
    this module and the parallelism plan's (train.parallel.check) passed: what `train` and
    `train --check` run before anything is written."""
    cfg = layout.resolve(cfg)
    parallel.check(cfg, layout.layout_of(cfg).fixed_shapes)
    check_run(cfg)
    check_eval_length(cfg)
    check_device(cfg)
    check_outputs(cfg)
    return cfg


def check_run(cfg: RunConfig) -> BertConfig:
    """The run's model config, after every check of this module passed."""
    config = BertConfig.named(cfg.model.bert_config)
    if config.is_mlperf_large:  # the benchmark itself: its batch must have an RCP
        check_global_batch(layout.layout_of(cfg).global_batch_size(cfg))
    length, source = data_sequence_length(cfg)
    if length > config.max_position_embeddings:
        raise UserError(f"BERT_CONFIG {cfg.model.bert_config}: max_position_embeddings "
                        f"{config.max_position_embeddings} is below the data's sequence length "
                        f"{length} (max_seq_length of {source})")
    o, steps, warmup_end = cfg.optim, cfg.optim.max_steps, parallel.warmup_end(cfg)
    if warmup_end >= steps:
        raise UserError(f"the LR warm-up (WARMUP_STEPS={o.warmup_steps:g}, START_WARMUP_STEP="
                        f"{o.start_warmup_step:g}, WARMUP_PROPORTION={o.warmup_proportion:g}) "
                        f"ends at step {warmup_end}, not before MAX_STEPS={steps}: "
                        f"the LR would never reach its peak, LR={o.lr:g}")
    if o.grad_comm.startswith("powersgd"):
        with torch.device("meta"):  # the shapes only: no memory, no random numbers drawn
            model = BertForPreTraining(config)
        top = comm.compressing_rank([p.shape for p in model.parameters() if p.ndim == 2])
        if o.powersgd_rank > top:
            raise UserError(f"POWERSGD_RANK={o.powersgd_rank}: PowerSGD sends a gradient as P and "
                            f"Q only where they are {comm.MIN_COMPRESSION_RATE}x smaller than it, "
                            f"and none of BERT_CONFIG {cfg.model.bert_config}'s is at this rank: "
                            f"every gradient would go whole (POWERSGD_RANK at most {top})")
    if cfg.layerwise.layerwise is not None:
        stages = layerwise_stages(cfg.layerwise.layerwise)
        before = sum(samples for _, samples, _ in stages[:-1])
        batch = layout.layout_of(cfg).global_batch_size(cfg)
        if before > (steps - 1) * batch:  # the last stage begins at the step after `before`
            raise UserError(f"LAYERWISE={cfg.layerwise.layerwise!r}: the stages before the last "
                            f"take {before} samples, but MAX_STEPS={steps} steps of {batch} end "
                            f"the run before the last stage, the whole model, trains a step (at "
                            f"most {(steps - 1) * batch} samples before it)")
        last = stages[-1][0]
        if last != config.num_hidden_layers:
            raise UserError(f"LAYERWISE={cfg.layerwise.layerwise!r}: the last stage must be the "
                            f"whole model, BERT_CONFIG {cfg.model.bert_config}'s "
                            f"{config.num_hidden_layers} layers, not {last}")
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
    (files.folder_problem): checked before the run reads its data and trains."""
    log = "MLLOG_FILE's folder" if cfg.train.log_file is not None else "LOGDIR"
    for name, folder in ((log, cfg.log_path.parent),
                         ("CHECKPOINT_DIR", cfg.checkpoint.checkpoint_dir)):
        if folder is not None and (why := folder_problem(folder)):
            raise UserError(f"{name} {folder}: {why}")


def check_device(cfg: RunConfig) -> None:
    """DEVICE=cuda, USE_CUDA_GRAPH=1 and FUSED_KERNELS=1 need a CUDA device this process can
    use (and the last, Triton); FP8=1 one of sm_89 or newer (check_fp8)."""
    check_fp8(cfg)
    wants = "DEVICE=cuda" if cfg.train.device == "cuda" else \
        "USE_CUDA_GRAPH=1" if cfg.train.use_cuda_graph else \
        "FUSED_KERNELS=1" if cfg.train.fused_kernels else None
    if wants is None:
        return
    if cfg.train.fused_kernels and cfg.train.device == "cpu":
        raise UserError("FUSED_KERNELS=1 runs Triton kernels on CUDA tensors: not with "
                        "DEVICE=cpu (FUSED_KERNELS=auto or 0)")
    if cfg.train.fused_kernels and not backend.triton_installed():
        raise UserError("FUSED_KERNELS=1 needs Triton (pip install triton; torch's CUDA wheels "
                        "bring the version they need), and it is not installed here")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise UserError(f"{wants} needs a CUDA device, and torch {torch.__version__} ({build}) "
                        "sees none here (DEVICE=cpu or auto runs on the CPU)")
    if cfg.dist.local_rank >= torch.cuda.device_count():
        raise UserError(f"{wants}: local rank {cfg.dist.local_rank} has no GPU of its own (this "
                        f"node has {torch.cuda.device_count()}; DGXNGPU ranks per node at most)")


def check_fp8(cfg: RunConfig) -> None:
    """FP8=1 or emulate needs torchao; FP8=1 a CUDA GPU with FP8 tensor cores (sm_89+)."""
    if cfg.train.fp8 == "0":
        return
    if importlib.util.find_spec("torchao") is None:
        raise UserError(f"FP8={cfg.train.fp8} trains with torchao's float8 training, which is not "
                        "installed here (pip install torchao: 0.18.0 with torch 2.13, 0.17.0 with "
                        "2.11; or make setup)")
    if cfg.train.fp8 == "1":
        cuda = torch.cuda.is_available() and not on_cpu(cfg)
        if cuda and cfg.dist.local_rank >= torch.cuda.device_count():
            return  # check_device says it
        why = fp8.supported(torch.device("cuda", cfg.dist.local_rank) if cuda
                            else torch.device("cpu"))
        if why is not None:
            raise UserError(why)


def on_cpu(cfg: RunConfig) -> bool:
    return cfg.train.device == "cpu" or (cfg.train.device == "auto"
                                         and not torch.cuda.is_available())


def matmul_slowdown(dtype: torch.dtype, n: int = 128, repeats: int = 10) -> float:
    """How many times longer an n x n matmul takes in `dtype` than in fp32 on this CPU (the
    best of `repeats` each, after one warm-up): about 1 or below where the CPU has instructions
    for it, far above where they are emulated."""
    import time

    def best(dt: torch.dtype) -> float:
        a, b = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
        a @ b
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)

    return best(dtype) / best(torch.float32)


SLOW_PRECISION = 2.0
"""A CPU whose bf16/fp16 matmuls take over this many times fp32's draws the warning."""


def run_warnings(cfg: RunConfig) -> list[str]:
    """config.warnings, a run that ends before its first eval, and a bf16/fp16 run on a CPU that
    emulates those matmuls (measured). `cfg` is prepared (its layout resolved)."""
    out = config.warnings(cfg)
    batch = layout.layout_of(cfg).global_batch_size(cfg)
    steps = min(cfg.optim.max_steps, -(-cfg.train.max_samples_termination // batch))
    if steps * batch < cfg.first_eval(batch):
        cap = f"MAX_STEPS={steps}" if steps == cfg.optim.max_steps else \
            f"MAX_SAMPLES_TERMINATION={cfg.train.max_samples_termination}"
        out.append(f"{cap} ends the run at step {steps}, after {steps * batch} samples, before "
                   f"its first eval at {cfg.first_eval(batch)} (EVAL_ITER_START_SAMPLES, "
                   "EVAL_ITER_SAMPLES): the run will log no eval, so no MLPerf result")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.precision)
    if dtype is not None and on_cpu(cfg):
        slowdown = matmul_slowdown(dtype)
        if slowdown > SLOW_PRECISION:
            out.append(f"PRECISION={cfg.train.precision} on this CPU: its {cfg.train.precision} "
                       f"matmuls measured {slowdown:.0f}x slower than fp32's (no instructions "
                       "for them; emulated), so this run will be several times slower than in "
                       "fp32 (PRECISION=fp32)")
    return out
