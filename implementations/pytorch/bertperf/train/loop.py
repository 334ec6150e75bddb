"""Init and the training loop. One optimizer step = GRADIENT_STEPS micro-batches of BATCHSIZE
sequences (LAYOUT=packed: rows) per rank, backpropagated into the same grads (DDP reduces them on
the last one), then a clipped LAMB step and a scheduler step.

Loss normalisation (train_step): the step's loss is the MLM cross-entropy summed over every masked
token of the step (all micro-batches, all ranks) divided by their number, plus the NSP
cross-entropy summed over every sequence divided by theirs; the counts come from the loader (host
metadata), are copied with the batches and summed over ranks on the device before backward. The
MLPerf reference instead takes each micro-batch's mean and lets DDP average them, which equals the
global mean only when every micro-batch holds the same number of masked tokens; with the global
counts a W-rank run over the loader's global batches (LOADER_SPLIT=global_batch) computes the same
gradient as a 1-rank run over the same global batch.

Nothing inside a step waits for the device: the micro-batches are pinned and copied one ahead on a
side stream (DeviceBatches), the divisors stay on the device, the non-finite-gradient skip and the
LR are decided there (bertperf.optim), and the loss is accumulated there and read every LOG_FREQ
steps and at evals (Interval). Samples are counted from the loader's host metadata: a packed step
trains as many sequences as its rows hold (MLPerf counts sequences), a varlen step
BATCHSIZE*GRADIENT_STEPS*ranks. Evals at EVAL_ITER_START_SAMPLES and every EVAL_ITER_SAMPLES
after; the run stops with status success at the first eval >= target, aborted at
MAX_SAMPLES_TERMINATION or MAX_STEPS, and aborted with exit status 1 when the loss read at a
report or an eval is not finite."""

from __future__ import annotations

import contextlib
import functools
import math
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np
import torch
from mlperf_logging.mllog import constants as C  # noqa: N812
from torch.nn.parallel import DistributedDataParallel

from bertperf.benchmark import EVAL_SAMPLES
from bertperf.config import RunConfig
from bertperf.data.collate import max_masks_per_row
from bertperf.data.dataset import ShardDataset
from bertperf.data.loader import ShardLoader
from bertperf.formats.packed import packed_meta
from bertperf.formats.samples import Samples
from bertperf.mlperf.log import Blocks, MLPerfLogger
from bertperf.mlperf.plot import TRAIN_LOSS, plot_log
from bertperf.model import (BatchCounts, BertForPreTraining, PackedBatch, UnpaddedBatch,
                            compiled_forward_loss)
from bertperf.optim import (DynamicLossScaler, LinearWarmupPolyDecay, clipped_step, make_optimizer,
                            mlperf_hparams, param_groups, resolve_warmup, use_flat_lamb)
from bertperf.optim.bucket_clip import clip_buckets_before_allreduce
from bertperf.train import checkpoint, preflight, warmstart
from bertperf.train import dist as distributed
from bertperf.train.checks import check_run, on_cpu, resolve_layout
from bertperf.train.evaluation import load_eval_share, mlm_accuracy

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Trainer:
    """Everything a run holds; `model` is what the loop calls (DDP-wrapped when world > 1 and
    the optimizer is not sharded), `core` the single-device model under it."""

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
    forward_loss: Callable[..., torch.Tensor]
    """bertperf.model.forward_loss, or its torch.compile'd form (COMPILE, USE_CUDA_GRAPH)."""
    batches: DeviceBatches | None = None
    """The micro-batches on the device, one ahead of the step (made when the loop starts, after
    a resume has set the loader's position)."""

    def autocast(self):
        return autocast_for(self.cfg, self.device)()


def autocast_for(cfg: RunConfig, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:  # noqa: E501
    """A factory of the run's autocast context (a null context in fp32)."""
    dtype = AUTOCAST.get(cfg.train.precision)
    return functools.partial(torch.autocast, device.type, dtype=dtype) if dtype \
        else contextlib.nullcontext


def pick_device(cfg: RunConfig) -> torch.device:
    """CPU or this rank's GPU (train.checks.check_device made sure a CUDA run has one)."""
    return torch.device("cpu") if on_cpu(cfg) else torch.device("cuda", cfg.dist.local_rank)


def use_tf32(device: torch.device) -> None:
    """fp32 matmuls and convolutions on CUDA in TF32 (Ampere and newer), as NVIDIA's containers
    run them: PRECISION=fp32 runs at tensor-core speed; bf16/fp16 autocast is unaffected."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def rank0_printer(rank: int, prefix: str = "") -> Callable[[str], None]:
    """A progress/warning printer to stderr that only rank 0 uses (the others stay silent)."""
    if rank != 0:
        return lambda line: None
    return lambda line: print(prefix + line, file=sys.stderr, flush=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def flat_lamb(cfg: RunConfig, model: torch.nn.Module) -> bool:
    """Whether LAMB runs over one flat buffer (FlatLamb): FLAT_LAMB, or when it is auto, whether
    the kernels take their Triton path for the model's parameters (CUDA, Triton installed;
    bertperf.optim.use_flat_lamb, which `bench train` asks too)."""
    return use_flat_lamb(model.parameters(), cfg.optim.flat_lamb)


def clips_before_allreduce(cfg: RunConfig, dist: distributed.Dist) -> bool:
    """Whether DDP's communication hook clips each rank's gradient buckets before their
    all-reduce (CLIP_BEFORE_ALLREDUCE=1, several ranks, MAX_GRAD_NORM > 0;
    bertperf.optim.bucket_clip), so that the step does not clip again; a single process has no
    all-reduce and clips the global norm."""
    return cfg.optim.clip_before_allreduce and dist.active and cfg.optim.max_grad_norm > 0


def setup(cfg: RunConfig, log: MLPerfLogger) -> Trainer:
    """Build the run (between init_start and init_stop)."""
    device = pick_device(cfg)
    use_tf32(device)
    cfg = resolve_layout(cfg)
    dist = distributed.init(cfg.dist, device)
    # one seed for the run: rank 0's (ranks started by `mpirun -np N run_and_time.sh` each draw
    # their own $RANDOM; the loader needs the same epoch order on every rank)
    cfg = replace(cfg, train=replace(cfg.train, seed=dist.from_rank0(cfg.train.seed, device)))
    seed_everything(cfg.train.seed)  # the same initial weights on every rank
    core = BertForPreTraining(check_run(cfg)).to(device)
    if cfg.model.init_checkpoint is not None:
        warmstart.load_weights(core, cfg.model.init_checkpoint)
    opt = cfg.optim
    name = "sharded_lamb" if opt.sharded_lamb else "flat_lamb" if flat_lamb(cfg, core) else "lamb"
    optimizer = make_optimizer(name, param_groups(core, opt.weight_decay), lr=opt.lr,
                               betas=(opt.beta1, opt.beta2), eps=opt.epsilon)
    # after FlatLamb made the parameters views of its buffer; gradient_as_bucket_view stays off,
    # so DDP copies each reduced bucket into the .grad views in place. ShardedLamb reduce-scatters
    # the gradients in its step: no DDP
    model = DistributedDataParallel(core, device_ids=[device] if device.type == "cuda" else None) \
        if dist.active and not opt.sharded_lamb else core
    warmup, start = resolve_warmup(opt.warmup_steps, opt.start_warmup_step, opt.max_steps,
                                   opt.warmup_proportion)
    scheduler = LinearWarmupPolyDecay(optimizer, warmup, opt.max_steps, start)
    scaler = DynamicLossScaler(init_scale=opt.init_loss_scale, device=device) \
        if cfg.train.precision == "fp16" else None
    if clips_before_allreduce(cfg, dist):  # the hook reads the scaler's scale
        clip_buckets_before_allreduce(model, opt.max_grad_norm, scaler)
    stratified = cfg.data.layout == "stratified"
    dataset = (ShardDataset.from_stratified if stratified else ShardDataset.from_folder)(
        cfg.data.train_dir)
    packed = cfg.data.layout == "packed"
    masks = max_masks_per_row(dataset.max_seq_length, dataset.max_seqs_per_row, dataset.max_pred,
                              cfg.data.masked_lm_prob) if packed else None
    loader = ShardLoader(dataset, cfg.train.batch_size, rank=dist.rank,
                         world_size=dist.world_size, seed=cfg.train.seed,
                         layout="varlen" if stratified else cfg.data.layout,
                         prefetch=cfg.data.prefetch, split=cfg.data.loader_split,
                         masks_per_row=masks, balance=cfg.data.balance)
    eval_share, eval_total = load_eval_share(cfg.data.eval_file, dist.rank, dist.world_size)
    report = rank0_printer(dist.rank)
    warn = rank0_printer(dist.rank, "warning: ")
    if packed and dist.rank == 0:  # the warning's reader: file headers only
        metas = [packed_meta(path) for path in dataset.files]
        rate = sum(m["sequences"] for m in metas) / max(sum(m["rows"] for m in metas), 1)
        if abs(rate - cfg.data.packing_factor) > 0.05 * cfg.data.packing_factor:
            warn(f"{cfg.data.train_dir}: {rate:.3f} sequences per row, but global_batch_size "
                 f"counts {cfg.data.packing_factor} (PACKING_FACTOR)")
    preflight.verify_inputs(dist, device, loader.dataset.files, packed,
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
    step = compiled_forward_loss(cfg.train.compile, cfg.train.use_cuda_graph,
                                 fullgraph=not dist.active)  # DDP splits its graph at buckets
    return Trainer(cfg, dist, device, core, model, optimizer, scheduler, scaler, loader,
                   eval_share, log, step)


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch on the device, with what the host knows about it."""

    inputs: dict
    """The model's keyword arguments (UnpaddedBatch or PackedBatch inputs(), on the device)."""
    counts: torch.Tensor
    """[2] float64 on the device: this rank's masked tokens and sequences (the loss divisors'
    share), copied from the host with the batch."""
    host: BatchCounts
    """The loader's counts, on the host."""


class DeviceBatches:
    """The loader's batches, epoch after epoch, as MicroBatches on `device`, one ahead: when a
    micro-batch is handed out, the next one is pinned and copied (non_blocking, on a side stream
    on CUDA) while the step works on this one; on the CPU the same path without the stream.
    `state_dict()` is the loader's position after the last micro-batch handed out (the one
    copied ahead is not yet consumed), for checkpoints."""

    def __init__(self, loader: ShardLoader, device: torch.device, batch_type: type) -> None:
        self.loader, self.device, self.batch_type = loader, device, batch_type
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.arrays = self._epochs()
        self.ahead = self._copy()

    def _epochs(self) -> Iterator[tuple[Mapping, tuple[int, int]]]:
        while True:
            for arrays in self.loader:
                yield arrays, (self.loader.epoch, self.loader.position)

    def _copy(self) -> tuple[MicroBatch, tuple[int, int]]:
        arrays, state = next(self.arrays)
        host = BatchCounts.from_arrays(arrays)
        batch = self.batch_type.from_arrays(arrays)
        counts = torch.tensor([host.masked, host.sequences], dtype=torch.float64)
        if self.stream is not None:
            batch, counts = batch.pin_memory(), counts.pin_memory()
        with torch.cuda.stream(self.stream) if self.stream is not None else \
                contextlib.nullcontext():
            batch = batch.to(self.device, non_blocking=True)
            counts = counts.to(self.device, non_blocking=True)
        return MicroBatch(batch.inputs(), counts, host), state

    def __next__(self) -> MicroBatch:
        micro, self.position = self.ahead
        if self.stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.stream)
            for t in [micro.counts, *micro.inputs.values()]:
                if isinstance(t, torch.Tensor):
                    t.record_stream(current)
        self.ahead = self._copy()
        return micro

    def state_dict(self) -> dict:
        epoch, position = self.position
        return {**self.loader.state_dict(), "epoch": epoch, "position": position}


def train_step(trainer: Trainer, micro: list[MicroBatch]) -> torch.Tensor:
    """One optimizer step over this rank's GRADIENT_STEPS micro-batches. Returns this rank's
    share of the step's loss (a 0-d float64 device tensor; summed over ranks and divided by the
    world size it is the step's loss, module docstring), read by nobody inside the step."""
    dist, last = trainer.dist, len(micro) - 1
    # DDP (or ShardedLamb's reduce-scatter) averages gradients over ranks: * world_size makes
    # that average the global sum
    divisors = dist.sum(torch.stack([m.counts for m in micro]).sum(0)).clamp(min=1) \
        / dist.world_size
    total = torch.zeros((), dtype=torch.float64, device=trainer.device)
    for i, m in enumerate(micro):
        reduce_now = i == last or trainer.model is trainer.core  # DDP reduces on the last one
        with contextlib.nullcontext() if reduce_now else trainer.model.no_sync():
            with trainer.autocast():
                loss = trainer.forward_loss(trainer.model, m.inputs, divisors)
            (trainer.scaler.scale_loss(loss) if trainer.scaler else loss).backward()
        total += loss.detach()
    clipped = clips_before_allreduce(trainer.cfg, dist)  # bucket by bucket, before all-reduce
    outcome = clipped_step(trainer.optimizer,
                           None if clipped else trainer.cfg.optim.max_grad_norm or None,
                           trainer.scaler)
    trainer.scheduler.step(outcome.ok)
    trainer.optimizer.zero_grad(set_to_none=True)
    return total


class Interval:
    """The loss, summed on the device, and the tokens, sequences and time since the last
    report; `read` is the one place the loop waits for the device (every LOG_FREQ steps and at
    evals)."""

    def __init__(self, device: torch.device) -> None:
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.restart()

    def restart(self) -> None:
        self.loss.zero_()
        self.steps = self.tokens = self.sequences = 0
        self.since = time.perf_counter()

    def add(self, loss: torch.Tensor, micro: list[MicroBatch]) -> None:
        self.loss += loss
        self.steps += 1
        self.tokens += sum(m.host.tokens for m in micro)
        self.sequences += sum(m.host.global_sequences for m in micro)

    def read(self, dist: distributed.Dist, lr: torch.Tensor) -> tuple[float, float, str]:
        """(the interval's mean step loss, summed over ranks; the LR `lr` holds now; the
        interval's rates); starts the next interval."""
        loss, tokens = dist.sum(torch.stack([self.loss, self.loss.new_tensor(self.tokens)])
                                ).tolist()
        seconds = time.perf_counter() - self.since
        mean = loss / dist.world_size / max(self.steps, 1)
        rates = f"seq/s {self.sequences / seconds:.1f} tokens/s {tokens / seconds:.0f}"
        self.restart()
        return mean, float(lr), rates


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
    trainer.batches = DeviceBatches(trainer.loader, trainer.device,
                                    PackedBatch if cfg.data.layout == "packed" else UnpaddedBatch)
    step, samples, next_eval = (start.step, start.samples, start.next_eval) if start \
        else (0, 0, cfg.first_eval)
    blocks = Blocks(trainer.log)
    blocks.start(samples)
    trainer.model.train()
    interval = Interval(trainer.device)
    while True:
        distributed.raise_if_terminated()
        micro = [next(trainer.batches) for _ in range(cfg.train.gradient_steps)]
        interval.add(train_step(trainer, micro), micro)
        step += 1
        samples += sum(m.host.global_sequences for m in micro)
        logged = bool(cfg.train.log_every) and step % cfg.train.log_every == 0
        evaluated = samples >= next_eval
        capped = samples >= cfg.train.max_samples_termination or step >= cfg.optim.max_steps
        if logged or evaluated or capped:
            lr_now = trainer.optimizer.param_groups[0]["lr"]
            loss, lr, rates = interval.read(trainer.dist, lr_now)
            if not math.isfinite(loss):
                progress(f"step {step}: non-finite loss {loss}; aborting")
                blocks.stop(samples)
                return Stop(C.ABORTED, samples, nonfinite=True)
            if logged:
                progress(f"step {step} samples {samples} loss {loss:.4f} lr {lr:.3e} {rates}")
                trainer.log.event(TRAIN_LOSS, loss,
                                  metadata={"samples_count": samples, "step": step, "lr": lr})
        if evaluated:
            while next_eval <= samples:
                next_eval += cfg.eval_interval
            accuracy = blocks.evaluate(samples, evaluate)
            progress(f"eval at {samples} samples: mlm accuracy {accuracy:.4f}")
            if accuracy >= cfg.train.target_accuracy:
                return Stop(C.SUCCESS, samples)
        checkpoint.maybe_save(trainer, step, samples, next_eval)  # CHECKPOINT_EVERY, and the end
        if capped:
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
