"""`python -m bertperf bench layerwise`: layerwise training (LAYERWISE, bertperf.train.layerwise)
against normal training, the trainer itself run in this process on one CPU rank (--threads
threads), on the demo's data (`make demo`: FOLDOC, 128-token samples; --eval-samples of its
2,000-sample eval set, evenly spaced),
with a BERT of --layers layers of width --hidden (dropout 0.1), the same data order, seed and LR
schedule (--samples samples, warm-up the first 10 %) for every run:

  normal    the whole model from the first step (seeds --seed and --seed + 1: the run-to-run
            spread)
  stacking  progressive stacking: half the layers, then all (LAYERWISE_TRAIN=all, the new
            layers copies of the trained ones, LAMB reset at the boundary), --stage samples
  mslt      multi-stage layerwise training: a third of the layers, two thirds, all of them
            training only the new top third (the rest frozen: forward only), then the remaining
            samples with the whole model training (LAYERWISE_TRAIN=new, copies, LAMB reset)
  mslt_fresh  mslt with the new layers freshly initialised (LAYERWISE_INIT=fresh); --runs only

Clocks (--clock): wall time, or the process's CPU time (`cpu`: what the run's own threads
spent, the loader's prefetch thread included; steadier than wall time on a machine other work
shares). A run's training time is the clock's time in the training loop without its evals (every
--eval-every samples, on the whole eval set); the step times are train_step's, and the frozen
forward the time from the embeddings' start to the last frozen layer's end inside train_step
(forward hooks). First table, per run: samples and training seconds to --target (the first eval
at or above it), that time over normal training's (seed --seed), the accuracy at normal's
time-to-target (the last eval by then), the final accuracy and the total training time. Second
table, per stage: depth, trained layers, steps, median step time and the frozen forward's mean
share of it. Goal: the target in <= 0.6 x normal training's time, the final accuracy within the
two normal seeds' spread.

--gpu-model, alone (no data, no training; a calibrated model's prediction, not a measurement):
BERT-large's step in each stage of normal training, stacking (6 -> 12 -> 24 layers) and MSLT
(6, 12, 18, 24 layers training the newest 6, then all 24; GPU_RUNS) on one 8-GPU DGX A100 node,
bench scale's config_DGXA100_1x8x56x1.sh (56 sequences a GPU, varlen, bf16): bench train's traced
step with the model staged by bertperf.train.layerwise itself (frozen layers forward only),
priced on the A100 by bench/roofline.py; DDP's all-reduce of the trained parameters' buckets and
their LAMB step as bench scale models them; each run's time to train the RCP's mean samples,
split in GPU_RUNS' proportions, against normal's. Equal samples for every run: whether stacking
or MSLT converge in them the model cannot tell. Evals are priced as bench scale prices them (a
third of the stage's micro-step per eval micro-batch), which undercounts a frozen stage's eval
(evals are about 2 % of the time).
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import torch

from bertperf.bench import cpu_name
from bertperf.errors import UserError

if TYPE_CHECKING:
    from bertperf.bench.scale import Compute, Prediction, Run
    from bertperf.model import BertConfig

GOAL = 0.6
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
POSITIVE = ("layers", "hidden", "batch", "samples", "stage", "eval_every", "eval_samples",
            "threads")
"""The whole-number flags that must be at least 1."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--demo", default="out/demo",
                   help="prepare_demo.sh's output folder (default out/demo, from make demo)")
    p.add_argument("--layers", type=int, default=6, help="encoder layers (default 6)")
    p.add_argument("--hidden", type=int, default=128, help="hidden size (default 128; 2 heads, "
                                                           "FFN 4x)")
    p.add_argument("--batch", type=int, default=32, help="sequences a step (default 32)")
    p.add_argument("--lr", type=float, default=0.01, help="LAMB's LR (default 0.01)")
    p.add_argument("--samples", type=int, default=16000,
                   help="samples each run trains (default 16,000)")
    p.add_argument("--stage", type=int, default=3200,
                   help="samples of each stage but the last (default 3,200)")
    p.add_argument("--eval-every", type=int, default=1600, help="samples between evals "
                                                                "(default 1,600)")
    p.add_argument("--eval-samples", type=int, default=500,
                   help="eval samples, every k-th of the demo's 2,000 (default 500)")
    p.add_argument("--target", type=float, default=0.10,
                   help="the masked-LM accuracy timed (default 0.10, demo-like)")
    p.add_argument("--seed", type=int, default=1, help="seed (default 1; normal also +1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--clock", choices=CLOCKS, default="wall",
                   help="training time as wall time (default) or the process's CPU time")
    p.add_argument("--runs", default="normal,normal2,stacking,mslt",
                   help="which runs, comma-separated: normal, normal2, stacking, mslt, mslt_fresh "
                        "(default the first four)")
    p.add_argument("--out", default=None, help="folder for the runs' MLPerf logs (default: a "
                                               "temporary one)")
    p.add_argument("--gpu-model", action="store_true",
                   help="only the GPU model: BERT-large's step in each stage priced on the "
                        "A100 and the predicted time to train on one 8-GPU DGX A100 node (no "
                        "data, no training)")


def schedules(layers: int, stage: int) -> dict[str, dict[str, str]]:
    """The runs' LAYERWISE settings."""
    half, third = max(1, layers // 2), max(1, layers // 3)
    mslt = {"LAYERWISE": f"{third}:{stage},{2 * third}:{stage},{layers}:{stage},{layers}:all",
            "LAYERWISE_TRAIN": "new", "LAYERWISE_INIT": "copy", "LAYERWISE_OPTIMIZER": "reset"}
    return {
        "normal": {},
        "normal2": {},
        "stacking": {"LAYERWISE": f"{half}:{stage},{layers}", "LAYERWISE_TRAIN": "all",
                     "LAYERWISE_INIT": "copy", "LAYERWISE_OPTIMIZER": "reset"},
        "mslt": mslt,
        "mslt_fresh": {**mslt, "LAYERWISE_INIT": "fresh"},
    }


class Recorder:
    """The clocks of one run, through wrappers around the loop's run_loop, train_step and
    mlm_accuracy and forward hooks on the model (module docstring)."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now
        self.t0 = 0.0
        self.eval_seconds = 0.0
        self.evals: list[tuple[int, float, float]] = []  # samples, accuracy, training seconds
        self.steps: list[tuple[int, int, float, float]] = []  # depth, frozen, seconds, frozen s
        self.in_step = False
        self.frozen_start = self.frozen_seconds = 0.0
        self.trainer = None

    def clock(self) -> float:
        return self.now() - self.t0 - self.eval_seconds

    def install(self, loop) -> dict:
        real = {"run_loop": loop.run_loop, "train_step": loop.train_step,
                "mlm_accuracy": loop.mlm_accuracy}

        def run_loop(trainer, report):
            self.trainer = trainer
            self.hooks(trainer)
            self.t0 = self.now()
            return real["run_loop"](trainer, report)

        def train_step(step, micro):
            encoder = step.plan.core.bert.encoder
            self.frozen_seconds, self.in_step = 0.0, True
            start = self.now()
            loss = real["train_step"](step, micro)
            seconds = self.now() - start
            self.in_step = False
            self.steps.append((len(encoder.layer), getattr(encoder, "frozen", 0), seconds,
                               self.frozen_seconds))
            return loss

        def mlm_accuracy(*args, **kwargs):
            at = self.clock()
            start = self.now()
            accuracy = real["mlm_accuracy"](*args, **kwargs)
            self.eval_seconds += self.now() - start
            self.evals.append((self.trainer.progress.samples, float(accuracy), at))
            return accuracy

        loop.run_loop, loop.train_step, loop.mlm_accuracy = run_loop, train_step, mlm_accuracy
        return real

    def hooks(self, trainer) -> None:
        core = trainer.plan.core
        encoder = core.bert.encoder
        layers = trainer.stages.spare if trainer.stages.staged else list(encoder.layer)

        def begin(module, args):
            self.frozen_start = self.now()

        def end(i):
            def hook(module, args, out):
                if self.in_step and getattr(encoder, "frozen", 0) == i + 1:
                    self.frozen_seconds += self.now() - self.frozen_start
            return hook
        core.bert.embeddings.register_forward_pre_hook(begin)
        for i, layer in enumerate(layers):
            layer.register_forward_hook(end(i))


def eval_subset(demo: Path, count: int, out: Path) -> Path:
    """`count` samples of the demo's eval file, evenly spaced, written to `out`."""
    from bertperf.formats.padded import read_samples, write_arrays
    arrays = read_samples(demo / "hdf5" / "eval" / "eval_10k.hdf5")
    total = len(arrays["next_sentence_labels"])
    rows = np.linspace(0, total - 1, min(count, total)).round().astype(np.int64)
    write_arrays(out, {k: v[rows] for k, v in arrays.items()})
    return out


def one_run(name: str, settings: dict[str, str], args, out: Path, model: Path,
            eval_file: Path) -> Recorder:
    """Train one run in this process; its clocks."""
    from bertperf import config
    from bertperf.train import loop
    demo = Path(args.demo)
    steps = args.samples // args.batch
    seed = args.seed + (1 if name == "normal2" else 0)
    env = {"DATADIR_PHASE2": str(demo / "unpadded"),
           "EVAL_FILE": str(eval_file),
           "BERT_CONFIG": str(model), "DEVICE": "cpu", "PRECISION": "fp32", "SEED": str(seed),
           "BATCHSIZE": str(args.batch), "LR": str(args.lr), "MAX_STEPS": str(steps),
           "WARMUP_STEPS": str(steps // 10), "EVAL_ITER_SAMPLES": str(args.eval_every),
           "EVAL_BATCHSIZE": "256", "MAX_SAMPLES_TERMINATION": str(args.samples),
           "SUBMISSION_DIVISION": "open", "TARGET_MLM_ACCURACY": "0.99", "LOG_FREQ": "0",
           "DATA_VERIFY": "none", "LOGDIR": str(out), "MLLOG_FILE": str(out / f"{name}.txt"),
           **settings}
    recorder = Recorder(CLOCKS[args.clock])
    real = recorder.install(loop)
    try:
        loop.main(config.load(env))
    finally:
        loop.run_loop, loop.train_step, loop.mlm_accuracy = (real["run_loop"], real["train_step"],
                                                             real["mlm_accuracy"])
    return recorder


def to_target(r: Recorder, target: float) -> tuple[int, float] | None:
    """(samples, training seconds) at the first eval at or above `target`."""
    return next(((s, t) for s, a, t in r.evals if a >= target), None)


def accuracy_at(r: Recorder, seconds: float) -> float | None:
    """The accuracy of the last eval at or before `seconds` of training."""
    got = [a for _, a, t in r.evals if t <= seconds + 1e-9]
    return got[-1] if got else None


# ---- the GPU model ------------------------------------------------------------------------------

GPU_RUNS: dict[str, tuple[str, tuple[tuple[int, float, str], ...]]] = {
    "normal": ("all", ((24, 1.0, ""),)),
    "stacking": ("all", ((6, 0.125, ""), (12, 0.175, ""), (24, 0.70, ""))),
    "mslt": ("new", ((6, 0.15, ""), (12, 0.15, ""), (18, 0.15, ""), (24, 0.15, ""),
                     (24, 0.40, "all"))),
}
"""The runs the GPU model prices: LAYERWISE_TRAIN and the stages (layers, share of the samples,
the stage's own :all/:new or ""). stacking: Gong et al.'s BERT-base reproduction (3 -> 6 -> 12
layers for 50k, 70k, 280k updates) scaled to BERT-large's 24 layers: 6 -> 12 -> 24 for 12.5 %,
17.5 %, 70 % of the samples. mslt: 6 layers more a stage, only the new ones trained, 15 % of the
samples each, then the whole model 40 % (the demo's proportions: three stages of 20 %, then 40 %);
the paper's schedule is not in its public abstract."""
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class StageStep:
    """A stage's step as the trainer runs it, traced and priced (`stage_step`)."""

    layers: int
    frozen: int
    """Layers run forward only (the trainer's StagedEncoder.frozen)."""
    flops: float
    """The traced step's FLOPs: forward, backward, gradient accumulation and optimizer."""
    compute: Compute
    trained: tuple[torch.Tensor, ...]
    """The trained parameters in definition order, as meta tensors (DDP's buckets)."""


@functools.cache
def stage_step(config: BertConfig, batch: int, setting: str | None, train: str,
               index: int) -> StageStep:
    """The trainer's step in stage `index` of LAYERWISE=`setting` (None: unset, normal training)
    and LAYERWISE_TRAIN=`train`, for a BERT of `config` at `batch` sequences: bench train's
    traced step (train.trace_step: varlen, bf16, Triton kernels, FlatLamb, on fake tensors as on
    CUDA) with its model staged by the trainer's own code (layerwise.Stages, then Stages.enter at
    each boundary: the frozen layers under no_grad, what trains, the plan rebuilt over the
    trained parameters), priced on the A100 (scale.priced). With LAYERWISE_SCHEDULE=restart:
    continue's schedule reads its step count, which a fake tensor has not (the schedule changes
    no kernel of the step)."""
    from bertperf.bench import scale
    from bertperf.bench import train as bench_train
    from bertperf.train import layerwise, loop
    from bertperf.train.checkpoint import Progress

    real, built = loop.build_step, {}

    def build_step(cfg, dist, device, core):
        cfg = replace(cfg, layerwise=replace(cfg.layerwise, layerwise=setting,
                                             layerwise_train=train,
                                             layerwise_schedule="restart"))
        stages = layerwise.Stages(cfg, core)
        step = real(cfg, dist, device, core)
        trainer = SimpleNamespace(**vars(step), progress=Progress(),
                                  checkpointer=SimpleNamespace(parts={}))
        for i in range(1, index + 1):
            stages.enter(trainer, i, boundary=True)
        step.plan, step.scheduler = trainer.plan, trainer.scheduler
        built["core"] = core
        return step

    loop.build_step = build_step
    try:
        trace, segments, _ = bench_train.trace_step(
            config, bench_train.model_steps(batch)["varlen"], "varlen", True)
    finally:
        loop.build_step = real
    core = built["core"]
    encoder = core.bert.encoder
    trained = tuple(torch.empty(p.shape, dtype=p.dtype, device="meta")
                    for p in core.parameters() if p.requires_grad)
    return StageStep(len(encoder.layer), getattr(encoder, "frozen", 0),
                     sum(op.flops for op in trace.ops),
                     scale.priced(trace, segments, config, "stage model"), trained)


def node_run(batch: int) -> Run:
    """bench scale's run of one DGX A100 node (config_DGXA100_1x8x56x1.sh's shape at `batch`
    sequences a GPU, varlen, no accumulation) converging in the mean samples of its global batch's
    RCP row, evals at MLPerf's cadence."""
    from bertperf.bench import scale
    from bertperf.config import reference_eval_interval
    from bertperf.mlperf.rcp import point_for

    gbs = GPUS_PER_NODE * batch
    point = point_for(gbs)
    if point is None:
        raise UserError(f"global batch {gbs} is not a BERT RCP row: its samples are unknown")
    return scale.Run(f"1 x DGX A100, {GPUS_PER_NODE} x {batch}", 1, GPUS_PER_NODE, batch, 1,
                     False, 1.0, sum(point.samples_to_converge) / len(point.samples_to_converge),
                     f"RCP {gbs}", reference_eval_interval(gbs))


def stage_setting(stages: tuple[tuple[int, float, str], ...], counts: list[int]) -> str | None:
    """LAYERWISE for GPU_RUNS' stages with these samples (None for one stage: unset)."""
    if len(stages) == 1:
        return None
    last = len(stages) - 1
    return ",".join(f"{layers}" + (f":{n}" if i < last else "") + (f":{mode}" if mode else "")
                    for i, ((layers, _, mode), n) in enumerate(zip(stages, counts)))


@functools.cache
def gpu_predictions(batch: int = 56) -> dict[str, list[tuple[StageStep, Prediction]]]:
    """Each GPU_RUNS run's stages on one node (`node_run`): the stage's BERT-large step
    (`stage_step`) and bench scale's prediction for the stage's share of the samples (its
    all-reduce over the trained parameters' DDP buckets on bench scale's default network)."""
    from bertperf.bench import scale
    from bertperf.model import BertConfig

    parser = argparse.ArgumentParser()
    scale.add_arguments(parser)
    net = scale.network(parser.parse_args([]))
    config, base = BertConfig.large(), node_run(batch)
    out = {}
    for name, (train, stages) in GPU_RUNS.items():
        counts = [round(share * base.samples) for _, share, _ in stages[:-1]]
        counts.append(base.samples - sum(counts))
        setting = stage_setting(stages, counts)
        out[name] = []
        for index, samples in enumerate(counts):
            layers, _, mode = stages[index]  # the whole model training: normal's step
            whole = layers == config.num_hidden_layers and (mode or train) == "all"
            step = stage_step(config, batch, None, "all", 0) if whole else \
                stage_step(config, batch, setting, train, index)
            buckets = scale.gradient_buckets(None, list(step.trained))
            out[name].append((step, scale.predict(replace(base, samples=samples), step.compute,
                                                  buckets, net, 1.0)))
    return out


def print_gpu_model() -> None:
    """The GPU model's table (module docstring)."""
    from bertperf.bench import roofline, scale

    t0 = time.perf_counter()
    runs = gpu_predictions()
    normal = runs["normal"][0][1]
    base = normal.run
    gpu = next(g for g in roofline.GPUS if g.name == scale.GPU)
    print(f"GPU MODEL (a calibrated model's prediction, not a measurement): `python -m bertperf "
          f"bench layerwise --gpu-model`, {time.strftime('%Y-%m-%d', time.gmtime())}, computed on "
          f"{platform.machine()} {platform.system()} in {time.perf_counter() - t0:.0f} s")
    print(f"BERT-large (24 layers) on one DGX A100 node: {base.gpus} {scale.GPU} GPUs, "
          f"{base.batch} sequences a GPU (varlen, MLPerf's length quantiles; bench scale's "
          f"config_DGXA100_1x8x56x1.sh), global batch {base.global_batch}, "
          f"{base.samples:,.0f} samples in every run (the mean of its {base.samples_source} "
          f"convergence points), evals every {base.eval_interval:,} samples")
    print("each stage's step: the trainer's bf16 step (Triton kernels, FlatLamb) with its model "
          "staged by bertperf.train.layerwise itself (frozen layers forward only under no_grad, "
          "out of the optimizer and DDP), traced on fake tensors and priced by bench/roofline.py "
          f"(GEMMs at {gpu.matmul_efficiency:.0%} of the tensor peak, attention at "
          f"{gpu.attention_forward_efficiency:.0%}, memory at {gpu.memory_efficiency:.0%} of the "
          "bandwidth: bench/anchors.csv); all-reduce: bench scale's NVSwitch model of DDP's "
          "buckets of the trained parameters only (all but the last hidden under the backward); "
          "optimizer: LAMB over the trained parameters; evals as bench scale prices them")
    print("schedules: " + "; ".join(
        f"{name}: " + " -> ".join(f"{layers}{' all' if mode == 'all' else ''} ({share:.1%})"
                                  for layers, share, mode in stages)
        + f", LAYERWISE_TRAIN={train}" for name, (train, stages) in GPU_RUNS.items()))
    print("| run | stage | layers (frozen) | TFLOP a step a GPU | step ms: compute / all-reduce "
          "exposed (of total) / optimizer | step ms | share of samples | hours |")
    print("|---|---:|---|---:|---|---:|---:|---:|")
    for name, stages in runs.items():
        for i, (step, p) in enumerate(stages, 1):
            t = p.terms
            print(f"| {name} | {i} | {step.layers} ({step.frozen}) | {step.flops / 1e12:.1f} | "
                  f"{t['compute'] * 1e3:.1f} / {p.exposed.total * 1e3:.1f} "
                  f"({p.comm.total * 1e3:.1f}) / {t['optimizer'] * 1e3:.1f} | "
                  f"{p.step_seconds * 1e3:.1f} | {p.run.samples / base.samples:.1%} | "
                  f"{p.seconds_to_train / 3600:.3f} |")
    total = {name: sum(p.seconds_to_train for _, p in stages) for name, stages in runs.items()}
    print("\n| run | predicted time to train | x normal |")
    print("|---|---:|---:|")
    for name, seconds in total.items():
        print(f"| {name} | {seconds / 3600:.3f} h ({seconds / 60:.1f} min) | "
              f"{seconds / total['normal']:.2f} |")
    print(f"\na model's prediction at equal samples: every run trains the same {base.samples:,.0f} "
          "samples; whether stacking or MSLT reach the MLM target in as many the model cannot "
          "know (the demo part of this bench measures that on CPU)")


def run(args: argparse.Namespace) -> int:
    if args.gpu_model:
        print_gpu_model()
        return 0
    demo = Path(args.demo)
    if not (demo / "unpadded").is_dir() or not (demo / "hdf5" / "eval" / "eval_10k.hdf5").is_file():
        raise UserError(f"{demo}: no demo data (unpadded/ and hdf5/eval/eval_10k.hdf5); make demo "
                        "prepares it")
    small = [f"--{name.replace('_', '-')}" for name in POSITIVE if getattr(args, name) < 1]
    if small:
        raise UserError(f"{', '.join(small)}: must be at least 1")
    if args.layers < 3 or args.samples < 4 * args.stage:
        raise UserError("--layers must be at least 3 and --samples at least 4 x --stage")
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    plans = schedules(args.layers, args.stage)
    unknown = [n for n in names if n not in plans]
    if unknown or "normal" not in names:
        raise UserError(f"--runs: {', '.join(plans)} (normal among them), not {args.runs!r}")
    torch.set_num_threads(args.threads)
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_layerwise_"))
    out.mkdir(parents=True, exist_ok=True)
    model = out / "bert_config.json"
    model.write_text(json.dumps({"vocab_size": 30522, "hidden_size": args.hidden,
                                 "num_hidden_layers": args.layers, "num_attention_heads": 2,
                                 "intermediate_size": 4 * args.hidden}))
    eval_file = eval_subset(demo, args.eval_samples, out / "eval.hdf5")
    print(f"{cpu_name()}, {torch.get_num_threads()} thread(s); torch {torch.__version__}; "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}\nBERT {args.layers} layers x "
          f"{args.hidden}, batch {args.batch}, {args.samples} samples, LR {args.lr}, evals every "
          f"{args.eval_every} samples on {args.eval_samples} eval samples, target "
          f"{args.target}; {args.clock} clock; logs in {out}", flush=True)
    results = {}
    for name in names:
        print(f"{name}: {plans[name] or 'LAYERWISE unset'}", flush=True)
        results[name] = one_run(name, plans[name], args, out, model, eval_file)
    base = results["normal"]
    base_target = to_target(base, args.target)
    base_time = base_target[1] if base_target else base.evals[-1][2]
    print(f"\n| run | samples to {args.target} | training s to it | x normal | accuracy at "
          f"{base_time:.0f} s | final accuracy | training s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        got = to_target(r, args.target)
        at = accuracy_at(r, base_time)
        print(f"| {name} | {got[0] if got else 'not reached'} | "
              f"{f'{got[1]:.0f}' if got else '-'} | "
              f"{f'{got[1] / base_target[1]:.2f}' if got and base_target else '-'} | "
              f"{f'{at:.4f}' if at is not None else '-'} | {r.evals[-1][1]:.4f} | "
              f"{r.evals[-1][2]:.0f} |")
    print("\n| run | stage | layers (frozen) | steps | median step ms | frozen forward share |")
    print("|---|---:|---|---:|---:|---:|")
    for name, r in results.items():
        stages: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for depth, frozen, seconds, frozen_s in r.steps:
            stages.setdefault((depth, frozen), []).append((seconds, frozen_s))
        for i, ((depth, frozen), times) in enumerate(stages.items(), 1):
            step = statistics.median(s for s, _ in times)
            share = sum(f for _, f in times) / sum(s for s, _ in times)
            print(f"| {name} | {i} | {depth} ({frozen}) | {len(times)} | {step * 1000:.0f} | "
                  f"{share:.0%} |")
    print("\nEval curves (samples: accuracy @ training s):")
    for name, r in results.items():
        print(f"  {name}: " + ", ".join(f"{s}: {a:.4f} @ {t:.0f}" for s, a, t in r.evals))
    spread = [results[n].evals[-1][1] for n in ("normal", "normal2") if n in results]
    for name in ("stacking", "mslt", "mslt_fresh"):
        if name in results and base_target:
            got = to_target(results[name], args.target)
            ratio = got[1] / base_target[1] if got else float("inf")
            final = results[name].evals[-1][1]
            print(f"{name}: {ratio:.2f} x normal's time to {args.target} (goal <= {GOAL}); final "
                  f"accuracy {final:.4f} against normal's {min(spread):.4f}-{max(spread):.4f}: "
                  f"goal {'met' if ratio <= GOAL and final >= min(spread) else 'not met'}")
    return 0
