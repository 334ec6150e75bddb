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
import math
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
from bertperf.mlperf.log import Blocks, MLPerfLogger
from bertperf.mlperf.plot import TRAIN_LOSS, plot_log
from bertperf.model import BertForPreTraining, UnpaddedBatch
from bertperf.optim import (DynamicLossScaler, LinearWarmupPolyDecay, clipped_step, make_optimizer,
                            mlperf_hparams, param_groups, resolve_warmup)
from bertperf.train import checkpoint, preflight, warmstart
from bertperf.train import dist as distributed
from bertperf.train.checks import check_run
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


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step reports; the same on every rank."""

    loss: float
    """The step's loss: MLM + NSP cross-entropy over every micro-batch of every rank (module
    docstring)."""
    tokens: int
    """Tokens the step trained on, all micro-batches of all ranks."""


def pretraining_loss(out, batch: dict, mlm_divisor: float, nsp_divisor: float) -> torch.Tensor:
    """This micro-batch's share of the step's loss: its summed cross-entropies over the step's
    divisors (train_step)."""
    mlm = F.cross_entropy(out.mlm_logits.float(), batch["masked_lm_ids"].long(), reduction="sum")
    nsp = F.cross_entropy(out.nsp_logits.float(), batch["next_sentence_labels"].long(),
                          reduction="sum")
    return mlm / mlm_divisor + nsp / nsp_divisor


def train_step(trainer: Trainer, batches: Iterator[dict]) -> StepResult:
    """One optimizer step over GRADIENT_STEPS micro-batches of this rank."""
    dist, accumulation = trainer.dist, trainer.cfg.train.gradient_steps
    micro = [next(batches) for _ in range(accumulation)]
    counts = dist.sum(torch.tensor(
        [[b["masked_lm_ids"].numel(), b["next_sentence_labels"].numel()] for b in micro],
        dtype=torch.float64, device=trainer.device).sum(0))
    # DDP averages gradients over ranks: * world_size makes that average the global sum
    mlm_divisor, nsp_divisor = (counts.clamp(min=1) / dist.world_size).tolist()
    totals = torch.zeros(2, dtype=torch.float64, device=trainer.device)  # this rank's loss, tokens
    for i, batch in enumerate(micro):
        reduce_now = i == accumulation - 1 or not dist.active  # DDP reduces on the last one
        with contextlib.nullcontext() if reduce_now else trainer.model.no_sync():
            with trainer.autocast():
                loss = pretraining_loss(trainer.model(**batch), batch, mlm_divisor, nsp_divisor)
            (trainer.scaler.scale_loss(loss) if trainer.scaler else loss).backward()
        totals[0] += loss.detach().double()
        totals[1] += batch["input_ids"].numel()
    outcome = clipped_step(trainer.optimizer, trainer.cfg.optim.max_grad_norm or None,
                           trainer.scaler)
    if not outcome.skipped:
        trainer.scheduler.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    loss, tokens = dist.sum(totals).tolist()
    return StepResult(loss / dist.world_size, int(tokens))


class Throughput:
    """Sequences and tokens per second since the last progress line."""

    def __init__(self, step: int) -> None:
        self.restart(step)

    def restart(self, step: int) -> None:
        self.since, self.step, self.tokens = time.perf_counter(), step, 0

    def add(self, tokens: int) -> None:
        self.tokens += tokens

    def report(self, step: int, global_batch_size: int) -> str:
        """The rates up to `step`, which starts the next interval."""
        seconds = time.perf_counter() - self.since
        text = (f"seq/s {(step - self.step) * global_batch_size / seconds:.1f} "
                f"tokens/s {self.tokens / seconds:.0f}")
        self.restart(step)
        return text


@dataclass(frozen=True)
class Stop:
    """How the training loop ended."""

    status: str
    """run_stop's status: success (target reached) or aborted (a cap, or a non-finite loss)."""
    samples: int
    """Samples trained (MLPerf's train_samples)."""
    nonfinite: bool = False
    """Aborted on a non-finite loss: the run fails (exit status 1)."""


def run_loop(trainer: Trainer, progress: Callable[[str], None],
             start: checkpoint.Position | None = None) -> Stop:
    """Train until a stopping rule fires. `start`: where a resumed run goes on
    (train/checkpoint.py); None for a fresh run."""
    cfg = trainer.cfg
    evaluate = functools.partial(mlm_accuracy, trainer.core, trainer.eval_share,
                                 cfg.train.eval_batch_size, trainer.dist, trainer.device,
                                 trainer.autocast)
    batches = micro_batches(trainer.loader, trainer.device)
    step, samples, next_eval = (start.step, start.samples, start.next_eval) if start \
        else (0, 0, cfg.first_eval)
    blocks = Blocks(trainer.log)
    blocks.start(samples)
    trainer.model.train()
    throughput = Throughput(step)
    while True:
        result = train_step(trainer, batches)
        step += 1
        samples += cfg.global_batch_size
        if not math.isfinite(result.loss):
            progress(f"step {step}: non-finite loss {result.loss}; aborting")
            blocks.stop(samples)
            return Stop(C.ABORTED, samples, nonfinite=True)
        throughput.add(result.tokens)
        if cfg.train.log_every and step % cfg.train.log_every == 0:
            lr = trainer.optimizer.param_groups[0]["lr"]
            progress(f"step {step} samples {samples} loss {result.loss:.4f} lr {lr:.3e} "
                     + throughput.report(step, cfg.global_batch_size))
            trainer.log.event(TRAIN_LOSS, result.loss,
                              metadata={"samples_count": samples, "step": step, "lr": lr})
        evaluated = samples >= next_eval
        if evaluated:
            while next_eval <= samples:
                next_eval += cfg.eval_interval
            accuracy = blocks.evaluate(samples, evaluate)
            progress(f"eval at {samples} samples: mlm accuracy {accuracy:.4f}")
            if accuracy >= cfg.train.target_accuracy:
                return Stop(C.SUCCESS, samples)
        checkpoint.maybe_save(trainer, step, samples, next_eval)  # CHECKPOINT_EVERY, and the end
        if samples >= cfg.train.max_samples_termination or step >= cfg.optim.max_steps:
            blocks.stop(samples)
            return Stop(C.ABORTED, samples)
        blocks.start(samples)  # after an eval


def main(cfg: RunConfig) -> int:
    """A whole MLPerf run; 0 when it ended by a stopping rule, 1 on a non-finite loss. Any
    failure after run_start (a dead rank, SIGTERM, an exception) logs run_stop with status
    aborted before it propagates."""
    report = rank0_printer(cfg.dist.rank)
    log = MLPerfLogger(cfg.log_path, rank=cfg.dist.rank, echo=False)
    if log.kept is not None:
        report(f"MLPerf log {cfg.log_path}: the earlier log there is kept as {log.kept}")
    log.event(C.CACHE_CLEAR, cfg.train.cache_clear)
    log.start(C.INIT_START)
    with distributed.failures_as_errors(cfg.dist.rank):
        trainer = setup(cfg, log)
        finished = False
        try:
            start = checkpoint.resume(trainer, report)  # RESUME_FROM: part of init
            if start is not None:
                log.resumed(start.checkpoint, start.step, start.samples)
            log.end(C.INIT_STOP)
            log.start(C.RUN_START)
            try:
                stop = run_loop(trainer, report, start)
            except BaseException:
                log.end(C.RUN_STOP, metadata={C.STATUS: C.ABORTED})
                raise
            log.event(C.TRAIN_SAMPLES, stop.samples)
            log.end(C.RUN_STOP, metadata={C.STATUS: stop.status})
            report(f"run_stop: {stop.status} after {stop.samples} samples")
            if cfg.train.plot and trainer.dist.rank == 0:
                png = plot_log(cfg.log_path, Path(f"{cfg.log_path}.png"),
                               cfg.train.target_accuracy)
                report(f"plot: {png}")
            finished = True
            return 1 if stop.nonfinite else 0
        finally:
            trainer.model = trainer.core  # DDP's reducer goes first, while the group is registered
            if finished:  # the closing barrier would wait for a rank that is gone
                trainer.dist.close()
