"""Init and the training loop. One optimizer step = GRADIENT_STEPS micro-batches of BATCHSIZE
sequences per rank, backpropagated into the same grads (DDP reduces them on the last one), then a
clipped LAMB step and a scheduler step.

Loss normalisation (train_step): the step's loss is the MLM cross-entropy summed over every masked
token of the step (all micro-batches, all ranks) divided by their number, plus the NSP
cross-entropy summed over every sequence divided by theirs; the counts are all-reduced before
backward. The MLPerf reference instead takes each micro-batch's mean and lets DDP average them,
which equals the global mean only when every micro-batch holds the same number of masked tokens;
with the global counts a W-rank run over the loader's global batches (LOADER_SPLIT=global_batch)
computes the same gradient as a 1-rank run over the same global batch. Evals at
EVAL_ITER_START_SAMPLES and every EVAL_ITER_SAMPLES after; the run stops with status success at
the first eval >= target, aborted at MAX_SAMPLES_TERMINATION or MAX_STEPS, and aborted with exit
status 1 on a non-finite loss."""

from __future__ import annotations

import contextlib
import functools
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from mlperf_logging.mllog import constants as C  # noqa: N812
from torch.nn.parallel import DistributedDataParallel

from bertperf.benchmark import EVAL_SAMPLES
from bertperf.config import RunConfig
from bertperf.data.dataset import ShardDataset
from bertperf.data.loader import ShardLoader
from bertperf.formats.samples import Samples
from bertperf.mlperf.log import MLPerfLogger
from bertperf.mlperf.plot import TRAIN_LOSS, plot_log
from bertperf.model import BertForPreTraining, UnpaddedBatch
from bertperf.optim import (DynamicLossScaler, LinearWarmupPolyDecay, clipped_step, make_optimizer,
                            mlperf_hparams, param_groups, resolve_warmup)
from bertperf.train import checkpoint, preflight, warmstart
from bertperf.train.checks import check_run
from bertperf.train import dist as distributed
from bertperf.train.evaluation import load_eval_share, mlm_accuracy

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Trainer:
    """Everything a run holds; `model` is what the loop calls (DDP-wrapped when world > 1),
    `core` the single-device model under it."""

    cfg: RunConfig
    dist: distributed.Dist
    device: torch.device
    core: BertForPreTraining
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LinearWarmupPolyDecay
    scaler: DynamicLossScaler | None
    loader: ShardLoader
    eval_share: Samples
    log: MLPerfLogger

    def autocast(self):
        return autocast_for(self.cfg, self.device)()


def autocast_for(cfg: RunConfig, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:  # noqa: E501
    """A factory of the run's autocast context (a null context in fp32)."""
    dtype = AUTOCAST.get(cfg.train.precision)
    return functools.partial(torch.autocast, device.type, dtype=dtype) if dtype \
        else contextlib.nullcontext


def pick_device(cfg: RunConfig) -> torch.device:
    want = cfg.train.device
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", cfg.dist.local_rank)
    return torch.device("cpu")


def rank0_printer(rank: int, prefix: str = "") -> Callable[[str], None]:
    """A progress/warning printer to stderr that only rank 0 uses (the others stay silent)."""
    if rank != 0:
        return lambda line: None
    return lambda line: print(prefix + line, file=sys.stderr, flush=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def setup(cfg: RunConfig, log: MLPerfLogger) -> Trainer:
    """Build the run (between init_start and init_stop)."""
    device = pick_device(cfg)
    dist = distributed.init(cfg.dist, device)
    # one seed for the run: rank 0's (ranks started by `mpirun -np N run_and_time.sh` each draw
    # their own $RANDOM; the loader needs the same epoch order on every rank)
    cfg = replace(cfg, train=replace(cfg.train, seed=dist.from_rank0(cfg.train.seed, device)))
    seed_everything(cfg.train.seed)  # the same initial weights on every rank
    core = BertForPreTraining(check_run(cfg)).to(device)
    if cfg.model.init_checkpoint is not None:
        warmstart.load_weights(core, cfg.model.init_checkpoint)
    model = DistributedDataParallel(core, device_ids=[device] if device.type == "cuda" else None) \
        if dist.active else core
    opt = cfg.optim
    optimizer = make_optimizer("lamb", param_groups(core, opt.weight_decay), lr=opt.lr,
                               betas=(opt.beta1, opt.beta2), eps=opt.epsilon)
    warmup, start = resolve_warmup(opt.warmup_steps, opt.start_warmup_step, opt.max_steps,
                                   opt.warmup_proportion)
    scheduler = LinearWarmupPolyDecay(optimizer, warmup, opt.max_steps, start)
    scaler = DynamicLossScaler(init_scale=opt.init_loss_scale) \
        if cfg.train.precision == "fp16" else None
    loader = ShardLoader(ShardDataset.from_folder(cfg.data.train_dir), cfg.train.batch_size,
                         rank=dist.rank, world_size=dist.world_size, seed=cfg.train.seed,
                         layout="varlen", prefetch=cfg.data.prefetch, split=cfg.data.loader_split)
    eval_share, eval_total = load_eval_share(cfg.data.eval_file, dist.rank, dist.world_size)
    report = rank0_printer(dist.rank)
    warn = rank0_printer(dist.rank, "warning: ")
    preflight.verify_inputs(dist, device, loader.dataset.files, not loader.dataset.packed,
                            cfg.data.eval_file, eval_share, eval_total,
                            core.config.vocab_size, cfg.data.verify, warn)
    if eval_total != EVAL_SAMPLES:
        warn(f"{cfg.data.eval_file}: {eval_total} eval samples; MLPerf's eval set has "
             f"{EVAL_SAMPLES:,}")
    if cfg.model.init_checkpoint is not None and cfg.model.init_eval:
        warmstart.sanity_eval(lambda: mlm_accuracy(core, eval_share, cfg.train.eval_batch_size,
                                                   dist, device, autocast_for(cfg, device)),
                              core.config, report, warn)
    seed_everything(cfg.train.seed + dist.rank)  # dropout differs between ranks

    log.submission(cfg.train.submission_org, cfg.train.submission_platform,
                   division=cfg.train.submission_division)
    log.event(C.SEED, cfg.train.seed)
    log.hyperparameters({
        C.GLOBAL_BATCH_SIZE: cfg.global_batch_size,
        C.GRADIENT_ACCUMULATION_STEPS: cfg.train.gradient_steps,
        C.MAX_SEQUENCE_LENGTH: loader.max_seq_length,
        **mlperf_hparams(optimizer, scheduler),
        C.EVAL_SAMPLES: eval_total,
    })
    return Trainer(cfg, dist, device, core, model, optimizer, scheduler, scaler, loader,
                   eval_share, log)


def micro_batches(loader: ShardLoader, device: torch.device) -> Iterator[dict]:
    """The rank's batches as model inputs on `device`, epoch after epoch."""
    while True:
        for arrays in loader:
            inputs = UnpaddedBatch.from_arrays(arrays).inputs()
            yield {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                   for k, v in inputs.items()}


def train_step(t: Trainer, batches: Iterator[dict]) -> torch.Tensor:
    """One optimizer step; returns [this rank's share of the step's loss * world size, tokens]
    (summed over ranks and divided by world size: the step's loss; module docstring)."""
    ga = t.cfg.train.gradient_steps
    stats = torch.zeros(2, dtype=torch.float64, device=t.device)
    micro = [next(batches) for _ in range(ga)]
    counts = t.dist.sum(torch.tensor(
        [[b["masked_lm_ids"].numel(), b["next_sentence_labels"].numel()] for b in micro],
        dtype=torch.float64, device=t.device).sum(0))
    # DDP averages gradients over ranks: * world_size makes that average the global sum
    mlm_div, nsp_div = (counts.clamp(min=1) / t.dist.world_size).tolist()
    for i, batch in enumerate(micro):
        sync = i == ga - 1 or not t.dist.active
        with (contextlib.nullcontext() if sync else t.model.no_sync()):
            with t.autocast():
                out = t.model(**batch)
                loss = F.cross_entropy(out.mlm_logits.float(), batch["masked_lm_ids"].long(),
                                       reduction="sum") / mlm_div + \
                    F.cross_entropy(out.nsp_logits.float(), batch["next_sentence_labels"].long(),
                                    reduction="sum") / nsp_div
            (t.scaler.scale_loss(loss) if t.scaler else loss).backward()
        stats[0] += loss.detach().double()
        stats[1] += batch["input_ids"].numel()
    outcome = clipped_step(t.optimizer, t.cfg.optim.max_grad_norm or None, t.scaler)
    if not outcome.skipped:
        t.scheduler.step()
    t.optimizer.zero_grad(set_to_none=True)
    return stats


def run_loop(t: Trainer, progress: Callable[[str], None],
             start: checkpoint.Position | None = None) -> tuple[str, int]:
    """Train until a stopping rule fires: (MLPerf status, samples trained). `start`: where a
    resumed run goes on (train/checkpoint.py); None for a fresh run."""
    cfg, log = t.cfg, t.log
    gbs = cfg.global_batch_size
    evaluate = functools.partial(mlm_accuracy, t.core, t.eval_share, cfg.train.eval_batch_size,
                                 t.dist, t.device, t.autocast)
    batches = micro_batches(t.loader, t.device)
    next_eval, samples, step = cfg.first_eval, 0, 0
    if start is not None:  # checkpoint hook: resumed run
        step, samples, next_eval = start.step, start.samples, start.next_eval
    log.start(C.BLOCK_START, metadata={C.FIRST_EPOCH_NUM: 0, C.EPOCH_COUNT: 1,
                                       "samples_count": samples})
    t.model.train()
    tick, tick_step, tick_tokens = time.perf_counter(), step, 0.0
    while True:
        stats = t.dist.sum(train_step(t, batches))
        step += 1
        samples += gbs
        loss = float(stats[0]) / t.dist.world_size
        if not np.isfinite(loss):
            progress(f"step {step}: non-finite loss {loss}; aborting")
            log.end(C.BLOCK_STOP, metadata={C.FIRST_EPOCH_NUM: 0, "samples_count": samples})
            return "nonfinite", samples
        tick_tokens += float(stats[1])
        if cfg.train.log_every and step % cfg.train.log_every == 0:
            dt = time.perf_counter() - tick
            n = step - tick_step
            lr = t.optimizer.param_groups[0]["lr"]
            progress(f"step {step} samples {samples} loss {loss:.4f} lr {lr:.3e} "
                     f"seq/s {n * gbs / dt:.1f} tokens/s {tick_tokens / dt:.0f}")
            log.event(TRAIN_LOSS, loss, metadata={"samples_count": samples, "step": step,
                                                  "lr": lr})
            tick, tick_step, tick_tokens = time.perf_counter(), step, 0.0
        evaluated = samples >= next_eval
        if evaluated:
            while next_eval <= samples:
                next_eval += cfg.eval_interval
            log.end(C.BLOCK_STOP, metadata={C.FIRST_EPOCH_NUM: 0, "samples_count": samples})
            log.start(C.EVAL_START, metadata={C.EPOCH_NUM: samples})
            accuracy = evaluate()
            log.event(C.EVAL_ACCURACY, accuracy, metadata={C.EPOCH_NUM: samples})
            log.end(C.EVAL_STOP, metadata={C.EPOCH_NUM: samples})
            progress(f"eval at {samples} samples: mlm accuracy {accuracy:.4f}")
            if accuracy >= cfg.train.target_accuracy:
                return C.SUCCESS, samples
        checkpoint.maybe_save(t, step, samples, next_eval)  # checkpoint hook: CHECKPOINT_EVERY
        if samples >= cfg.train.max_samples_termination or step >= cfg.optim.max_steps:
            if not evaluated:
                log.end(C.BLOCK_STOP, metadata={C.FIRST_EPOCH_NUM: 0, "samples_count": samples})
            return C.ABORTED, samples
        if evaluated:
            log.start(C.BLOCK_START, metadata={C.FIRST_EPOCH_NUM: 0, C.EPOCH_COUNT: 1,
                                               "samples_count": samples})


def main(cfg: RunConfig) -> int:
    """A whole MLPerf run; 0 when it ended by a stopping rule, 1 on a non-finite loss. Any
    failure after run_start (a dead rank, SIGTERM, an exception) logs run_stop with status
    aborted before it propagates."""
    log = MLPerfLogger(cfg.log_path, rank=cfg.dist.rank, echo=False)
    log.event(C.CACHE_CLEAR, cfg.train.cache_clear)
    log.start(C.INIT_START)
    with distributed.failures_as_errors(cfg.dist.rank):
        t = setup(cfg, log)
        finished = False
        try:
            start = checkpoint.resume(t)  # checkpoint hook: RESUME_FROM (part of init)
            log.end(C.INIT_STOP)
            log.start(C.RUN_START)
            printer = rank0_printer(t.dist.rank)
            try:
                status, samples = run_loop(t, printer, start)
            except BaseException:
                log.end(C.RUN_STOP, metadata={C.STATUS: C.ABORTED})
                raise
            log.event(C.TRAIN_SAMPLES, samples)
            log.end(C.RUN_STOP,
                    metadata={C.STATUS: C.ABORTED if status == "nonfinite" else status})
            printer(f"run_stop: {status} after {samples} samples")
            if cfg.train.plot and t.dist.rank == 0:
                png = plot_log(cfg.log_path, Path(f"{cfg.log_path}.png"),
                               cfg.train.target_accuracy)
                printer(f"plot: {png}")
            finished = True
            return 1 if status == "nonfinite" else 0
        finally:
            t.model = t.core  # DDP's reducer goes first, while the group is still registered
            if finished:  # the closing barrier would wait for a rank that is gone
                t.dist.close()
