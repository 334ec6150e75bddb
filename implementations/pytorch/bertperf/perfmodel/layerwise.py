"""`python -m bertperf model layerwise`: layerwise training on the GPU, predicted (a calibrated
model's prediction, not a measurement; no data, no training): BERT-large's step in each stage of
normal training, stacking (6 -> 12 -> 24 layers) and MSLT (6, 12, 18, 24 layers training the
newest 6, then all 24; GPU_RUNS) on one 8-GPU DGX A100 node, model scale's
config_DGXA100_1x8x56x1.sh (56 sequences a GPU, varlen, bf16): model step's traced step with the
model staged by bertperf.train.layerwise itself (frozen layers forward only), priced on the A100
by perfmodel/roofline.py; DDP's all-reduce of the trained parameters' buckets and their LAMB step
as model scale models them; each run's time to train the RCP's mean samples, split in GPU_RUNS'
proportions, against normal's. Equal samples for every run: whether stacking or MSLT converge in
them the model cannot tell (`bench layerwise` measures that on the demo). Evals are priced as
model scale prices them (a third of the stage's micro-step per eval micro-batch), which
undercounts a frozen stage's eval (evals are about 2 % of the time).
"""

from __future__ import annotations

import argparse
import functools
import platform
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from bertperf.errors import UserError
from bertperf.perfmodel.gpus import A100

if TYPE_CHECKING:
    import torch

    from bertperf.model import BertConfig
    from bertperf.perfmodel.bert import Compute
    from bertperf.perfmodel.scale import Run, Step

GPU_RUNS: dict[str, tuple[str, tuple[tuple[int, float, str], ...]]] = {
    "normal": ("all", ((24, 1.0, ""),)),
    "stacking": ("all", ((6, 0.125, ""), (12, 0.175, ""), (24, 0.70, ""))),
    "mslt": ("new", ((8, 0.25, ""), (16, 0.25, ""), (24, 0.50, "all"))),
}
"""The runs the GPU model prices: LAYERWISE_TRAIN and the stages (layers, share of the samples,
the stage's own :all/:new or ""). stacking: Gong et al.'s BERT-base reproduction (3 -> 6 -> 12
layers for 50k, 70k, 280k updates) scaled to BERT-large's 24 layers: 6 -> 12 -> 24 for 12.5 %,
17.5 %, 70 % of the samples. mslt: `bench layerwise`'s MSLT scaled to 24 layers: a third of the
layers, then two thirds with only the new third training (the word embeddings too: the trainer's
default LAYERWISE_EMBEDDINGS), a quarter of the samples each, then all 24 layers training for the
other half; the paper's schedule is not in its public abstract."""
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
    and LAYERWISE_TRAIN=`train`, for a BERT of `config` at `batch` sequences: model step's
    traced step (step.trace_step: varlen, bf16, Triton kernels, FlatLamb, on fake tensors as on
    CUDA) built by `staged`: the model cut by the trainer's own code (layerwise.Stages), the step
    built by train.loop.build_step, then each boundary entered (Stages.enter: the frozen layers
    under no_grad, what trains, the plan rebuilt over the trained parameters), priced on the A100
    (bert.priced). With LAYERWISE_SCHEDULE=restart: continue's schedule reads its step count,
    which a fake tensor has not (the schedule changes no kernel of the step)."""
    import torch

    from bertperf.perfmodel import bert
    from bertperf.perfmodel import step as model_step
    from bertperf.train import layerwise, loop

    built = []

    def staged(cfg, dist, device, core, kernels):
        cfg = replace(cfg, layerwise=replace(cfg.layerwise, layerwise=setting,
                                             layerwise_train=train,
                                             layerwise_schedule="restart"))
        stages = layerwise.Stages(cfg, core, dist, device)
        step = loop.build_step(cfg, dist, device, core, kernels=kernels)
        for i in range(1, index + 1):
            step.plan, step.scheduler = stages.enter(i, step.plan, step.scheduler, step.scaler,
                                                     at_step=0)
        built.append(core)
        return step

    trace, segments, _ = model_step.trace_step(config, model_step.model_steps(batch)["varlen"],
                                               True, build=staged)
    core, = built
    encoder = core.bert.encoder
    trained = tuple(torch.empty(p.shape, dtype=p.dtype, device="meta")
                    for p in core.parameters() if p.requires_grad)
    return StageStep(len(encoder.layer), getattr(encoder, "frozen", 0),
                     sum(op.flops for op in trace.ops),
                     bert.priced(trace, segments, config, "stage model"), trained)


def node_run(batch: int) -> Run:
    """model scale's run of one DGX A100 node (config_DGXA100_1x8x56x1.sh's shape at `batch`
    sequences a GPU, varlen, no accumulation) converging in the mean samples of its global batch's
    RCP row, evals at MLPerf's cadence."""
    from bertperf.config import reference_eval_interval
    from bertperf.mlperf.rcp import point_for
    from bertperf.perfmodel import scale

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
def gpu_predictions(batch: int = 56) -> dict[str, list[tuple[StageStep, Step]]]:
    """Each GPU_RUNS run's stages on one node (`node_run`): the stage's BERT-large step
    (`stage_step`) and model scale's prediction for the stage's share of the samples (its
    all-reduce over the trained parameters' DDP buckets on model scale's default network)."""
    from bertperf.model import BertConfig
    from bertperf.perfmodel import bert, scale

    net = scale.network_of("auto", "hierarchical")
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
            buckets = bert.gradient_buckets(None, list(step.trained))
            out[name].append((step, scale.predict(replace(base, samples=samples), step.compute,
                                                  buckets, net, 1.0)))
    return out


def print_gpu_model() -> None:
    """The GPU model's table (module docstring)."""
    from bertperf.perfmodel import roofline

    t0 = time.perf_counter()
    runs = gpu_predictions()
    normal = runs["normal"][0][1]
    base = normal.run
    gpu = roofline.GPUS[A100]
    print(f"GPU MODEL (a calibrated model's prediction, not a measurement): `python -m bertperf "
          f"model layerwise`, {time.strftime('%Y-%m-%d', time.gmtime())}, computed on "
          f"{platform.machine()} {platform.system()} in {time.perf_counter() - t0:.0f} s")
    print(f"BERT-large (24 layers) on one DGX A100 node: {base.gpus} {A100} GPUs, "
          f"{base.batch} sequences a GPU (varlen, MLPerf's length quantiles; model scale's "
          f"config_DGXA100_1x8x56x1.sh), global batch {base.global_batch}, "
          f"{base.samples:,.0f} samples in every run (the mean of its {base.samples_source} "
          f"convergence points), evals every {base.eval_interval:,} samples")
    print("each stage's step: the trainer's bf16 step (Triton kernels, FlatLamb) with its model "
          "staged by bertperf.train.layerwise itself (frozen layers forward only under no_grad, "
          "out of the optimizer and DDP), traced on fake tensors and priced by perfmodel/roofline.py "
          f"(GEMMs at {gpu.matmul_efficiency:.0%} of the tensor peak, attention at "
          f"{gpu.attention_forward_efficiency:.0%}, memory at {gpu.memory_efficiency:.0%} of the "
          "bandwidth: perfmodel/anchors.csv); all-reduce: model scale's NVSwitch model of DDP's "
          "buckets of the trained parameters only (all but the last hidden under the backward); "
          "optimizer: LAMB over the trained parameters; evals as model scale prices them")
    print("schedules: " + "; ".join(
        f"{name}: " + " -> ".join(f"{layers}{' all' if mode == 'all' else ''} ({share:.1%})"
                                  for layers, share, mode in stages)
        + f", LAYERWISE_TRAIN={train}" for name, (train, stages) in GPU_RUNS.items()))
    print("| run | stage | layers (frozen) | TFLOP a step a GPU | step ms: compute / all-reduce "
          "exposed (of total) / optimizer | step ms | share of samples | hours |")
    print("|---|---:|---|---:|---|---:|---:|---:|")
    for name, stages in runs.items():
        for i, (step, p) in enumerate(stages, 1):
            t = p.time.per_step
            print(f"| {name} | {i} | {step.layers} ({step.frozen}) | {step.flops / 1e12:.1f} | "
                  f"{t['compute'] * 1e3:.1f} / {p.exposed.total * 1e3:.1f} "
                  f"({p.comm.total * 1e3:.1f}) / {t['optimizer'] * 1e3:.1f} | "
                  f"{p.time.step_seconds * 1e3:.1f} | {p.run.samples / base.samples:.1%} | "
                  f"{p.time.seconds / 3600:.3f} |")
    total = {name: sum(p.time.seconds for _, p in stages) for name, stages in runs.items()}
    print("\n| run | predicted time to train | x normal |")
    print("|---|---:|---:|")
    for name, seconds in total.items():
        print(f"| {name} | {seconds / 3600:.3f} h ({seconds / 60:.1f} min) | "
              f"{seconds / total['normal']:.2f} |")
    print(f"\na model's prediction at equal samples: every run trains the same {base.samples:,.0f} "
          "samples; whether stacking or MSLT reach the MLM target in as many the model cannot "
          "know (`bench layerwise` measures that on the demo, on CPU)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No flags: the runs it prices are GPU_RUNS."""


def run(args: argparse.Namespace) -> int:
    print_gpu_model()
    return 0
