"""Checks of a run's configuration that need more than config.py knows, made before any rank
writes anything (`prepare`: `train` and `train --check`, which run.sub and run_and_time.sh call
first): the layout the training folder allows, the combinations the parallelism plan refuses, the
model shape, the global batch against MLPerf's RCP table (BERT-large only), the data's sequence
length against the model's position table, and the device against this machine. Each problem is
one line naming the values and where they come from; `run_warnings` says what a valid run still
does badly here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from bertperf import config
from bertperf.config import RunConfig, layerwise_stages
from bertperf.errors import UserError
from bertperf.formats import detect
from bertperf.kernels import backend
from bertperf.mlperf.rcp import check_global_batch
from bertperf.model import fp8
from bertperf.model.bert_config import BertConfig
from bertperf.train import layout, parallel


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
    check_device(cfg)
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
    if cfg.layerwise.layerwise is not None:
        last = layerwise_stages(cfg.layerwise.layerwise)[-1][0]
        if last != config.num_hidden_layers:
            raise UserError(f"LAYERWISE={cfg.layerwise.layerwise!r}: the last stage must be the "
                            f"whole model, BERT_CONFIG {cfg.model.bert_config}'s "
                            f"{config.num_hidden_layers} layers, not {last}")
    return config


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
    """config.warnings, and a bf16/fp16 run on a CPU that emulates those matmuls (measured)."""
    out = config.warnings(cfg)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.precision)
    if dtype is not None and on_cpu(cfg):
        slowdown = matmul_slowdown(dtype)
        if slowdown > SLOW_PRECISION:
            out.append(f"PRECISION={cfg.train.precision} on this CPU: its {cfg.train.precision} "
                       f"matmuls measured {slowdown:.0f}x slower than fp32's (no instructions "
                       "for them; emulated), so this run will be several times slower than in "
                       "fp32 (PRECISION=fp32)")
    return out
