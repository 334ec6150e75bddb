"""Init and the training loop. `setup` builds a run from a prepared configuration (its layout,
parallelism plan and checkpoint parts: docs/design.md, "The trainer's junction"); `train_step`
is one optimizer step of GRADIENT_STEPS micro-batches, its loss summed over the step's masked
tokens and sequences and divided by their global counts; `run_loop` trains, logs, evaluates and
checkpoints until the target (success), MAX_SAMPLES_TERMINATION or MAX_STEPS (aborted) or a
non-finite loss (aborted, exit 1), telling a caller that measures it (LoopEvents) as it goes.
Nothing inside a step waits for the device: the losses are read every LOG_FREQ steps and at
evals (Interval)."""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np
import torch
from mlperf_logging.mllog import constants as C  # noqa: N812

from bertperf.benchmark import EVAL_SAMPLES
from bertperf.config import RunConfig
from bertperf.data.loader import ShardLoader
from bertperf.errors import PREEMPTED
from bertperf.data.synthetic import synthetic_samples
from bertperf.formats.samples import Samples
from bertperf.kernels import Kernels
from bertperf.mlperf.log import Blocks, MLPerfLogger
from bertperf.mlperf.plot import TRAIN_LOSS, plot_log
from bertperf.model import BatchCounts, BertConfig, BertForPreTraining
from bertperf.optim import (DynamicLossScaler, LinearWarmupPolyDecay, clipped_step, mlperf_hparams,
                            run_schedule)
from bertperf.train import checkpoint, layerwise, preflight, warmstart
from bertperf.train import dist as distributed
from bertperf.train.checks import check_run, on_cpu, prepare, run_warnings
from bertperf.train.evaluation import load_eval_share, mlm_accuracy
from bertperf.train.layout import layout_of
from bertperf.train.parallel import Plan, parallelize
from bertperf.train.scalars import Scalars, open_scalars

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Step:
    """What one optimizer step uses (train_step), built by `build_step`: `bench train` times
    the trainer's step through it."""

    cfg: RunConfig
    """The run's configuration, its layout resolved (train.checks.prepare)."""
    dist: distributed.Dist
    device: torch.device
    plan: Plan
    """How gradients leave this rank: the model the step calls, the optimizer, the micro-step
    (train/parallel.py)."""
    scheduler: LinearWarmupPolyDecay
    scaler: DynamicLossScaler | None

    def autocast(self):
        return autocast_for(self.cfg, self.device)()


@dataclass
class Trainer(Step):
    """Everything a run holds, built once by `setup`."""

    loader: ShardLoader
    batches: DeviceBatches
    """The loader's micro-batches on the device, one ahead of the step."""
    eval_share: Samples
    log: MLPerfLogger
    global_batch_size: int
    """Sequences per step as MLPerf counts them (train.layout.Layout.global_batch_size)."""
    progress: checkpoint.Progress
    """The loop's counters."""
    stages: layerwise.Stages
    """LAYERWISE's stages: the loop takes a new stage's plan and schedule from `before_step`."""
    checkpointer: checkpoint.Checkpointer = field(init=False)
    """Saves and resumes `parts()`."""
    scalars: Scalars = field(default_factory=Scalars)
    """Where the loop's scalars go besides the log (TENSORBOARD: main opens them once the run
    knows its first step)."""

    def __post_init__(self) -> None:
        dataset = self.loader.dataset
        record = checkpoint.run_record(self.cfg, dataset.num_samples, dataset.packed,
                                       self.loader.max_seq_length)
        self.checkpointer = checkpoint.Checkpointer(self.parts, self.cfg.checkpoint, self.dist,
                                                    self.device, record)

    def parts(self) -> dict[str, checkpoint.Part]:
        """The run's checkpoint parts as they are now, in their load order: the model (its
        shapes) and the run's fingerprint, or with LAYERWISE the fingerprint, the stage and
        then the model; the optimizer, schedule, loss scale, loader position, progress, random
        states and GRAD_COMM's state."""
        plan = self.plan
        model = checkpoint.ModelWeights(plan.core)
        config = checkpoint.Fingerprint(checkpoint.fingerprint(self.cfg, plan.core.config))
        first = {"model": model, "config": config}
        if self.stages.staged:
            first = {"config": config,
                     "layerwise": layerwise.StagePart(self.stages, self.resume_stage),
                     "model": model}
        return {**first, "optimizer": plan.optimizer, "scheduler": self.scheduler,
                **({"scaler": checkpoint.LossScale(self.scaler)} if self.scaler is not None
                   else {}),
                "loader": self.batches, "progress": self.progress,
                "rng": checkpoint.RandomState(self.dist.rank, self.cfg.train.seed, self.progress),
                **({"grad_comm": plan.comm} if plan.comm is not None and plan.comm.stateful
                   else {})}

    def resume_stage(self, index: int) -> None:
        """Re-enter LAYERWISE stage `index`, a checkpoint's (layerwise.StagePart)."""
        self.plan, self.scheduler = self.stages.enter(index, self.plan, self.scheduler,
                                                      self.scaler, at_step=None)


def autocast_for(cfg: RunConfig, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:  # noqa: E501
    """A factory of the run's autocast context (a null context in fp32)."""
    dtype = AUTOCAST.get(cfg.train.precision)
    return functools.partial(torch.autocast, device.type, dtype=dtype) if dtype \
        else contextlib.nullcontext


def pick_device(cfg: RunConfig) -> torch.device:
    """CPU or this rank's GPU (train.allowed made sure a CUDA run has one)."""
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


@dataclass
class Inputs:
    """What a run reads, checked, before its MLPerf log opens (`read_inputs`): a problem found
    there leaves an earlier log at the log's path as it was and writes none."""

    cfg: RunConfig
    """The prepared configuration (train.checks.prepare) with rank 0's SEED."""
    dist: distributed.Dist
    device: torch.device
    bert: BertConfig
    loader: ShardLoader
    """This rank's loader over the training shards."""
    eval_share: Samples
    """This rank's share of the eval set (train.evaluation.load_eval_share)."""
    eval_total: int
    init_weights: dict[str, torch.Tensor] | None
    """INIT_CHECKPOINT's state dict, checked against `bert`; None without one."""
    resume: tuple[Path, dict] | None
    """RESUME_FROM's checkpoint and its state (checkpoint.resumable); None for a fresh start."""


def read_inputs(cfg: RunConfig) -> Inputs:
    """Join the job and read what the run starts from, each checked: the training shards (their
    headers, and train.preflight's checks), the eval file, INIT_CHECKPOINT and RESUME_FROM's
    checkpoint (checkpoint.resumable). `cfg` is prepared (train.checks.prepare)."""
    layout = layout_of(cfg)
    device = pick_device(cfg)
    use_tf32(device)
    dist = distributed.init(cfg.dist, device)
    # one seed for the run: rank 0's (ranks started by `mpirun -np N run_and_time.sh` each draw
    # their own $RANDOM; the loader needs the same epoch order on every rank)
    cfg = replace(cfg, train=replace(cfg.train, seed=dist.from_rank0(cfg.train.seed, device)))
    bert = check_run(cfg)
    dataset = layout.dataset(cfg.data.train_dir)
    loader = layout.loader(cfg, dataset, dist.rank, dist.world_size)
    eval_share, eval_total = load_eval_share(cfg.data.eval_file, dist.rank, dist.world_size)
    report = rank0_printer(dist.rank)
    warn = rank0_printer(dist.rank, "warning: ")
    if dist.rank == 0:
        for line in layout.warnings(cfg, dataset):
            warn(line)
    preflight.verify_inputs(dist, device, loader, cfg.data.eval_file, eval_share, eval_total,
                            bert.vocab_size, cfg.data.verify, warn)
    if eval_total != EVAL_SAMPLES:
        warn(f"{cfg.data.eval_file}: {eval_total} eval samples; MLPerf's eval set has "
             f"{EVAL_SAMPLES:,}")
    init_weights = None
    if cfg.model.init_checkpoint is not None:
        from bertperf.model.convert_cli import load_init_checkpoint
        init_weights = load_init_checkpoint(cfg.model.init_checkpoint, bert)
    return Inputs(cfg, dist, device, bert, loader, eval_share, eval_total, init_weights,
                  checkpoint.resumable(cfg, bert, dist, device, report))


def setup(inputs: Inputs, log: MLPerfLogger) -> Trainer:
    """Build the run (between init_start and init_stop) from what `read_inputs` read."""
    cfg, dist, device, loader = inputs.cfg, inputs.dist, inputs.device, inputs.loader
    layout = layout_of(cfg)
    seed_everything(cfg.train.seed)  # the same initial weights on every rank
    core = BertForPreTraining(inputs.bert).to(device)
    if inputs.init_weights is not None:
        core.load_state_dict(inputs.init_weights, strict=True)
    stages = layerwise.Stages(cfg, core, dist, device)  # LAYERWISE: the encoder cut to stage 1
    step = build_step(cfg, dist, device, core)
    batches = DeviceBatches(loader, device, layout.batch_type)
    eval_share = inputs.eval_share
    if cfg.model.init_checkpoint is not None and cfg.model.init_eval:
        warmstart.sanity_eval(lambda: mlm_accuracy(core, eval_share, cfg.train.eval_batch_size,
                                                   dist, device, autocast_for(cfg, device)),
                              core.config, rank0_printer(dist.rank),
                              rank0_printer(dist.rank, "warning: "))
    seed_everything(cfg.train.seed + dist.rank)  # dropout differs between ranks

    global_batch_size = layout.global_batch_size(cfg)
    log.submission(cfg.train.submission_org, cfg.train.submission_platform,
                   division=cfg.train.submission_division)
    log.event(C.SEED, cfg.train.seed)
    log.hyperparameters({
        C.GLOBAL_BATCH_SIZE: global_batch_size,
        C.GRADIENT_ACCUMULATION_STEPS: cfg.train.gradient_steps,
        C.MAX_SEQUENCE_LENGTH: loader.max_seq_length,
        **mlperf_hparams(step.plan.optimizer, step.scheduler),
        C.EVAL_SAMPLES: inputs.eval_total,
    })
    progress = checkpoint.Progress(next_eval=cfg.first_eval(global_batch_size))
    return Trainer(**vars(step), loader=loader, batches=batches, eval_share=eval_share, log=log,
                   global_batch_size=global_batch_size, progress=progress, stages=stages)


def build_step(cfg: RunConfig, dist: distributed.Dist, device: torch.device,
               core: BertForPreTraining, kernels: Kernels | None = None) -> Step:
    """The step's parts around the one-device model `core`: the fp16 loss scaler, the
    parallelism plan (kernels, default FUSED_KERNELS's; optimizer, reduction, compile) and the
    LR schedule."""
    opt = cfg.optim
    scaler = DynamicLossScaler(init_scale=opt.init_loss_scale, device=device) \
        if cfg.train.precision == "fp16" else None
    plan = parallelize(core, cfg, dist, device, scaler, kernels=kernels)
    return Step(cfg, dist, device, plan, run_schedule(plan.optimizer, opt), scaler)


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


def to_device(arrays: Mapping, batch_type: type, device: torch.device,
              stream: torch.cuda.Stream | None = None) -> MicroBatch:
    """A loader batch as a MicroBatch on `device`: pinned and copied without blocking, on
    `stream` where given."""
    host = BatchCounts.from_arrays(arrays)
    batch = batch_type.from_arrays(arrays)
    counts = torch.tensor([host.masked, host.sequences], dtype=torch.float64)
    if device.type == "cuda":
        batch, counts = batch.pin_memory(), counts.pin_memory()
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        batch = batch.to(device, non_blocking=True)
        counts = counts.to(device, non_blocking=True)
    return MicroBatch(batch.inputs(), counts, host)


class DeviceBatches:
    """The loader's batches, epoch after epoch, as MicroBatches on `device`, one ahead: when a
    micro-batch is handed out, the next one is pinned and copied (non_blocking, on a side stream
    on CUDA) while the step works on this one; on the CPU the same path without the stream.
    Copying starts at the first micro-batch asked for, so a checkpoint's loader position can be
    loaded before. `state_dict()` is the loader's position after the last micro-batch handed out
    (the one copied ahead is not yet consumed): a checkpoint part."""

    def __init__(self, loader: ShardLoader, device: torch.device, batch_type: type) -> None:
        self.loader, self.device, self.batch_type = loader, device, batch_type
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.arrays: Iterator | None = None
        self.position = (loader.epoch, loader.position)

    def _epochs(self) -> Iterator[tuple[Mapping, tuple[int, int]]]:
        while True:
            for arrays in self.loader:
                yield arrays, (self.loader.epoch, self.loader.position)

    def _copy(self) -> tuple[MicroBatch, tuple[int, int]]:
        arrays, state = next(self.arrays)
        return to_device(arrays, self.batch_type, self.device, self.stream), state

    def __next__(self) -> MicroBatch:
        if self.arrays is None:
            self.arrays = self._epochs()
            self.ahead = self._copy()
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

    def load_state_dict(self, state: dict) -> None:
        """Go on from a saved position (rank 0's state: every rank is at the same position of
        its own part)."""
        if self.arrays is not None:
            raise RuntimeError("the loader's position is loaded before the first micro-batch")
        self.loader.load_state_dict(dict(state, rank=self.loader.rank))
        self.position = (self.loader.epoch, self.loader.position)


def train_step(step: Step, micro: list[MicroBatch]) -> torch.Tensor:
    """One optimizer step over this rank's GRADIENT_STEPS micro-batches. Returns this rank's
    share of the step's loss (a 0-d float64 device tensor; summed over ranks and divided by the
    world size it is the step's loss, module docstring), read by nobody inside the step."""
    dist, plan, last = step.dist, step.plan, len(micro) - 1
    # the reduction averages gradients over ranks: * world_size makes that average the global sum
    divisors = dist.sum(torch.stack([m.counts for m in micro]).sum(0)).clamp(min=1) \
        / dist.world_size
    total = torch.zeros((), dtype=torch.float64, device=step.device)
    for i, m in enumerate(micro):
        with plan.micro_batch(last=i == last):
            with step.autocast():
                loss = plan.forward_loss(plan.model, m.inputs, divisors)
            (step.scaler.scale_loss(loss) if step.scaler else loss).backward()
        total += loss.detach()
    outcome = clipped_step(plan.optimizer, plan.max_grad_norm, step.scaler)
    step.scheduler.step(outcome.ok)
    plan.after_step()  # GRAD_COMM=localsgd's averaging; the step's bytes counted
    plan.optimizer.zero_grad(set_to_none=True)
    return total


COMPILE_WARMUP_STEPS = 3
"""Optimizer steps of the compile warm-up: CUDA graph trees record a function on its second
call and replay it from the third."""


def warm_up(trainer: Trainer) -> None:
    """Compile before run_start what the run compiles (torch.compile of the micro-step, its CUDA
    graphs, the Triton kernels' first launches, the eval's dropout-free variants):
    COMPILE_WARMUP_STEPS steps and one eval batch on made-up data of the run's shapes, in every
    LAYERWISE stage from the run's on (layerwise.Stages.rehearse), then every checkpoint part
    (Trainer.parts: the model, optimizer, schedule, loss scale, ...) and every rank's random
    generators put back as they were, so the run that follows computes what it would have
    without it. Only where something compiles (COMPILE, USE_CUDA_GRAPH, CUDA)."""
    plan, cfg = trainer.plan, trainer.cfg
    if not (plan.compiled or trainer.device.type == "cuda"):
        return
    saved = _to_host(trainer.checkpointer.states())
    generators = checkpoint.RandomState(0, cfg.train.seed, trainer.progress)  # every rank's own
    random_state = generators.state_dict()
    layout, vocab = layout_of(cfg), plan.core.config.vocab_size
    micro = to_device(layout.synthetic_arrays(trainer.loader, vocab, cfg.train.seed),
                      layout.batch_type, trainer.device)
    samples = synthetic_samples(cfg.train.eval_batch_size, cfg.train.seed,
                                trainer.loader.max_seq_length, trainer.loader.max_pred, vocab)

    def steps() -> None:
        for _ in range(COMPILE_WARMUP_STEPS):
            train_step(trainer, [micro] * cfg.train.gradient_steps)
        mlm_accuracy(plan.core, samples, cfg.train.eval_batch_size, trainer.dist,
                     trainer.device, trainer.autocast)
    trainer.stages.rehearse(trainer.resume_stage, steps)  # every LAYERWISE stage's plan
    trainer.checkpointer.restore(saved)
    generators.load_state_dict(random_state)
    plan.traffic.reset()


def _to_host(state):
    """A copy of a state dict with every tensor on the host (what a checkpoint restores from)."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: _to_host(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_to_host(v) for v in state)
    return copy.deepcopy(state)


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

    def read(self, dist: distributed.Dist, lr: torch.Tensor) -> Reading:
        """The interval's figures, the LR `lr` holds now among them; starts the next
        interval."""
        loss, tokens = dist.sum(torch.stack([self.loss, self.loss.new_tensor(self.tokens)])
                                ).tolist()
        seconds = time.perf_counter() - self.since
        steps = max(self.steps, 1)
        reading = Reading(loss / dist.world_size / steps, float(lr), self.sequences / seconds,
                          tokens / seconds, seconds / steps)
        self.restart()
        return reading


@dataclass(frozen=True)
class Reading:
    """An interval's figures (Interval.read)."""

    loss: float
    """The mean step loss (every rank's summed)."""
    lr: float
    sequences_per_s: float
    """Sequences trained a second, every rank's (MLPerf's samples)."""
    tokens_per_s: float
    """Tokens trained a second, every rank's (the sequences' lengths, no padding)."""
    per_step: float
    """Seconds a step."""

    @property
    def rates(self) -> str:
        return f"seq/s {self.sequences_per_s:.1f} tokens/s {self.tokens_per_s:.0f}"

    @property
    def scalars(self) -> dict[str, float]:
        """The figures a scalar each (Trainer.scalars)."""
        return {"train/loss": self.loss, "train/lr": self.lr,
                "train/sequences_per_s": self.sequences_per_s,
                "train/tokens_per_s": self.tokens_per_s}


def eta(step: int, last: int, per_step: float) -> str:
    """How far a run is to step `last`, where a cap ends it, and when it gets there at
    `per_step` seconds a step (evals not counted; the target may end it sooner)."""
    left = round(max(last - step, 0) * per_step)
    return (f"{step / last:.1%} of {last} steps, ETA {left // 3600}:{left // 60 % 60:02d}:"
            f"{left % 60:02d}")


@dataclass(frozen=True)
class Stop:
    """How the training loop ended."""

    status: str
    """run_stop's status: success (target reached) or aborted (a cap, or a non-finite loss)."""
    samples: int
    """Samples trained (MLPerf's train_samples)."""
    nonfinite: bool = False
    """Aborted on a non-finite loss: the run fails (exit status 1)."""
    preempted: int | None = None
    """Aborted on the preemption warning, at this step, its checkpoint saved (exit status
    PREEMPTED)."""

    @property
    def metadata(self) -> dict:
        """run_stop's metadata."""
        reason = {} if self.preempted is None else {
            "reason": f"preempted, checkpoint at step {self.preempted}"}
        return {C.STATUS: self.status, **reason}


class LoopEvents:
    """The points of `run_loop` a caller can watch (`bench layerwise` times the run by them):
    a subclass overrides the ones it needs; here each does nothing."""

    def run_start(self, trainer: Trainer) -> None:
        """Before the first step."""

    def step_start(self) -> None:
        """Before train_step, its micro-batches on the device."""

    def step_end(self, step: int, samples: int) -> None:
        """After train_step, with the optimizer steps done and the samples trained."""

    def eval_start(self) -> None:
        """Before an eval."""

    def eval_end(self, samples: int, accuracy: float) -> None:
        """After an eval at `samples` samples trained."""


def run_loop(trainer: Trainer, report: Callable[[str], None],
             events: LoopEvents | None = None) -> Stop:
    """Train from where `trainer.progress` stands (a fresh run's zeros, or a resumed run's
    counters) until a stopping rule fires, telling `events` (LoopEvents) as it goes."""
    cfg, progress = trainer.cfg, trainer.progress
    events = events or LoopEvents()
    evaluate = functools.partial(mlm_accuracy, trainer.plan.core, trainer.eval_share,
                                 cfg.train.eval_batch_size, trainer.dist, trainer.device,
                                 trainer.autocast)
    blocks = Blocks(trainer.log)
    blocks.start(progress.samples)
    trainer.plan.model.train()
    interval = Interval(trainer.device)
    last_step = min(cfg.optim.max_steps,  # where a cap ends the run
                    math.ceil(cfg.train.max_samples_termination / trainer.global_batch_size))
    events.run_start(trainer)
    while True:
        distributed.raise_if_terminated()
        change = trainer.stages.before_step(progress, trainer.plan, trainer.scheduler,
                                            trainer.scaler, trainer.log)
        if change is not None:  # LAYERWISE: a new stage's plan and schedule
            trainer.plan, trainer.scheduler = change
        micro = [next(trainer.batches) for _ in range(cfg.train.gradient_steps)]
        events.step_start()
        interval.add(train_step(trainer, micro), micro)
        progress.step += 1
        progress.samples += sum(m.host.global_sequences for m in micro)
        step, samples = progress.step, progress.samples
        events.step_end(step, samples)
        logged = bool(cfg.train.log_every) and step % cfg.train.log_every == 0
        evaluated = samples >= progress.next_eval
        capped = samples >= cfg.train.max_samples_termination or step >= cfg.optim.max_steps
        if logged or evaluated or capped:
            lr_now = trainer.plan.optimizer.param_groups[0]["lr"]
            reading = interval.read(trainer.dist, lr_now)
            if not math.isfinite(reading.loss):
                report(f"step {step}: non-finite loss {reading.loss}; aborting")
                blocks.stop(samples)
                return Stop(C.ABORTED, samples, nonfinite=True)
            if logged:
                report(f"step {step} samples {samples} loss {reading.loss:.4f} lr "
                       f"{reading.lr:.3e} {reading.rates} "
                       f"({eta(step, last_step, reading.per_step)})")
                trainer.log.event(TRAIN_LOSS, reading.loss, metadata={
                    "samples_count": samples, "step": step, "lr": reading.lr})
                trainer.scalars.add(step, reading.scalars)
        if evaluated:
            while progress.next_eval <= samples:
                progress.next_eval += cfg.eval_interval(trainer.global_batch_size)
            events.eval_start()
            accuracy = blocks.evaluate(samples, evaluate)
            events.eval_end(samples, accuracy)
            report(f"eval at {samples} samples: mlm accuracy {accuracy:.4f}")
            trainer.scalars.add(step, {"eval/mlm_accuracy": accuracy})
            if accuracy >= cfg.train.target_accuracy:
                return Stop(C.SUCCESS, samples)
        trainer.checkpointer.maybe_save(step, last=capped)  # CHECKPOINT_EVERY, and the end
        if capped:
            blocks.stop(samples)
            return Stop(C.ABORTED, samples)
        if trainer.checkpointer.preempted(step):  # the warning: this step's checkpoint, then stop
            blocks.stop(samples)
            return Stop(C.ABORTED, samples, preempted=step)
        blocks.start(samples)  # after an eval


def resume(trainer: Trainer, found: tuple[Path, dict] | None,
           report: Callable[[str], None]) -> None:
    """Init's RESUME_FROM: the checkpoint checkpoint.resumable found (None: a fresh start)
    loaded into the run's parts, said on the console and in the log."""
    if found is None:
        return
    path, state = found
    trainer.checkpointer.load(path, state)
    p = trainer.progress
    report(f"resuming from {path}: step {p.step}, {p.samples} samples trained, next eval at "
           f"{p.next_eval} samples")
    trainer.log.resumed(path, p.step, p.samples)


def main(cfg: RunConfig, events: LoopEvents | None = None) -> int:
    """A whole MLPerf run (its loop telling `events`: run_loop); 0 when it ended by a stopping
    rule, 1 on a non-finite loss, PREEMPTED on the preemption warning. What can be checked
    before the MLPerf log opens is checked then (the configuration: train.checks.prepare; the
    data and the checkpoints: read_inputs), so that a problem there leaves an earlier log at the
    log's path as it was; any failure after the log opens logs run_stop with status aborted
    before it propagates."""
    report = rank0_printer(cfg.dist.rank)
    cfg = prepare(cfg)
    for line in run_warnings(cfg):
        rank0_printer(cfg.dist.rank, "warning: ")(line)
    with distributed.failures_as_errors(cfg.dist.rank):
        inputs = read_inputs(cfg)
        cfg = inputs.cfg
        log = MLPerfLogger(cfg.log_path, rank=cfg.dist.rank, echo=False)
        if log.kept is not None:
            report(f"MLPerf log {cfg.log_path}: the earlier log there is kept as {log.kept}")
        log.event(C.CACHE_CLEAR, cfg.train.cache_clear)
        log.start(C.INIT_START)
        trainer, stopped = None, False
        try:
            trainer = setup(inputs, log)
            resume(trainer, inputs.resume, report)
            trainer.scalars = open_scalars(cfg, trainer.dist.rank, trainer.progress.step + 1)
            del inputs  # its checkpoints' tensors are copied into the run's parts by now
            warm_up(trainer)
            log.end(C.INIT_STOP)
            log.start(C.RUN_START)
            stop = run_loop(trainer, report, events)
            log.event(C.TRAIN_SAMPLES, stop.samples)
            trainer.plan.log_traffic(log, report)
            log.end(C.RUN_STOP, metadata=stop.metadata)
            stopped = True
            if stop.status == C.SUCCESS:  # the trained model, after the timed part
                trainer.checkpointer.maybe_save(trainer.progress.step, last=True)
            report(f"run_stop: {', '.join(map(str, stop.metadata.values()))} after "
                   f"{stop.samples} samples")
            if cfg.train.plot and trainer.dist.rank == 0:
                png = plot_log(cfg.log_path, Path(f"{cfg.log_path}.png"),
                               cfg.train.target_accuracy)
                report(f"plot: {png}")
        except BaseException:
            if not stopped:
                log.end(C.RUN_STOP, metadata={C.STATUS: C.ABORTED})
            raise
        finally:
            if trainer is not None:  # DDP's reducer goes first, while the group is registered
                trainer.plan.release()
                trainer.scalars.close()
        # only here: after a failure the closing barrier would wait for a rank that is gone
        trainer.dist.close()
        return 1 if stop.nonfinite else PREEMPTED if stop.preempted is not None else 0
