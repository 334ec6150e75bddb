"""BERT-large as the trainer runs it, for the cluster models: its parameters (the model built on
the meta device), DDP's gradient buckets, and its step priced by perfmodel/roofline.py on any GPU
of perfmodel/gpus.py (a model, not a measurement)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from bertperf.perfmodel.gpus import A100, anchors


@cache
def parameters():
    """BERT-large's parameters (meta tensors: shapes and dtypes, no memory), in definition order,
    and the number of them in its embeddings."""
    import torch

    from bertperf.model import BertConfig, BertForPreTraining

    with torch.device("meta"):
        model = BertForPreTraining(BertConfig.large())
    params = [p for p in model.parameters() if p.requires_grad]
    return params, sum(p.numel() for p in model.bert.embeddings.parameters())


@cache
def parameter_count() -> int:
    """BERT-large's trained parameters."""
    return sum(p.numel() for p in parameters()[0])


DDP_BUCKET_CAP_MB = 25
"""DDP's default bucket_cap_mb (None): the 25 MiB its docstring states, in no public name."""


def bucket_gradients(dtype=None, params=None) -> list[list]:
    """DDP's gradient buckets in the order they are all-reduced (gradient-ready order: the
    parameters' reverse), by torch's own bucket assignment with DDP's limits: each bucket's
    gradients (meta tensors), each in `dtype` (default: its parameter's). `params`: the trained
    parameters in definition order (meta tensors; default: all of BERT-large's)."""
    import torch.distributed as dist

    params = parameters()[0] if params is None else params
    grads = [p if dtype is None else p.to(dtype) for p in reversed(params)]
    indices, _ = dist._compute_bucket_assignment_by_size(
        grads, [dist._DEFAULT_FIRST_BUCKET_BYTES, DDP_BUCKET_CAP_MB * 2 ** 20],
        [False] * len(grads))
    return [[grads[i] for i in bucket] for bucket in indices]


def gradient_buckets(dtype=None, params=None) -> list[int]:
    """Bytes of each of DDP's gradient buckets (bucket_gradients), in all-reduce order."""
    return [sum(g.numel() * g.element_size() for g in bucket)
            for bucket in bucket_gradients(dtype, params)]


@dataclass(frozen=True)
class Compute:
    """One GPU's work a step at a local batch, in seconds."""

    micro_step: float
    """Forward, backward and gradient accumulation of one micro-batch."""
    backward: float
    """The part of it the all-reduce can overlap (backward and accumulation)."""
    optimizer: float
    source: str


@cache
def modelled(batch: int, packed: bool) -> Compute:
    """roofline's price on the A100 of the trainer's traced step at this micro-batch (model
    step's: bf16, Triton kernels, FlatLamb)."""
    from bertperf.model import BertConfig
    from bertperf.perfmodel import step

    config = BertConfig.large()
    layout = "packed" if packed else "varlen"
    trace, segments, _ = step.trace_step(config, step.model_steps(batch)[layout], True)
    return priced(trace, segments, config, f"{layout} model")


def priced(trace, segments, config, source: str) -> Compute:
    """roofline's price on the A100 of a traced step (step.trace_step's trace and segments, of a
    model of `config`), its attention as FlashAttention."""
    from bertperf.perfmodel import roofline

    ops = roofline.flash_attention(trace.ops, segments, config.hidden_size,
                                   config.num_attention_heads)
    gpu = roofline.GPUS[A100]

    def seconds(*phases: str) -> float:
        return roofline.step_cost([op for op in ops if op.phase in phases], gpu).seconds

    return Compute(seconds("forward", "backward", "accumulate"),
                   seconds("backward", "accumulate"), seconds("optimizer"), source)


@cache
def _traced_step():
    """The trainer's packed step (COMPILE, CUDA graphs) as roofline prices it: its kernels in
    bf16, and with the encoder's GEMMs in FP8."""
    from bertperf.model import BertConfig
    from bertperf.perfmodel import roofline, step

    config = BertConfig.large()
    trace, segments, _ = step.trace_step(config, step.model_steps()["packed"], True)
    ops = roofline.fuse_elementwise(roofline.flash_attention(
        trace.ops, segments, config.hidden_size, config.num_attention_heads))
    return {"fp16": ops, "fp8": roofline.fp8(ops, int(segments.sum()))}


@cache
def step_seconds(gpu: str, precision: str) -> float | None:
    """Seconds of the trainer's packed step on `gpu` (perfmodel/gpus.py) at `precision` (fp16:
    bf16/fp16; fp8: the encoder's GEMMs in FP8), priced by perfmodel/roofline.py (efficiencies
    from kernel measurements); None: FP8 on a GPU without FP8 tensor cores."""
    from bertperf.perfmodel import roofline

    priced = roofline.GPUS[gpu]
    if precision == "fp8" and not priced.fp8_flops:
        return None
    return roofline.step_cost(_traced_step()[precision], priced, graphs=True).seconds


SPEED_ANCHOR = "bert_dle_fp16"
"""The anchors.csv quantity of a published BERT-large rate of one GPU with one code for every GPU:
phase-2 sequences/s of one GPU running NVIDIA DeepLearningExamples' PyTorch BERT (fp16, one
container), published for the A100 and the V100 alike."""


def speedup(frm: tuple[str, str], to: tuple[str, str]) -> tuple[float | None, str]:
    """How much faster the trainer runs as `to` (GPU, precision) than as `frm`, and how that is
    known: at fp16 on two GPUs with a SPEED_ANCHOR rate each, the ratio of the two (measured);
    else roofline's (roofline_speedup; None where it prices either not)."""
    rows = anchors()
    if frm[1] == to[1] == "fp16" and all((SPEED_ANCHOR, g) in rows for g in (frm[0], to[0])):
        theirs, mine = rows[SPEED_ANCHOR, frm[0]], rows[SPEED_ANCHOR, to[0]]
        return mine.value / theirs.value, (
            f"published BERT-large rates, {mine.value:g} / {theirs.value:g} seq/s "
            f"({SPEED_ANCHOR}, perfmodel/anchors.csv)")
    return roofline_speedup(frm, to), "roofline"


def roofline_speedup(frm: tuple[str, str], to: tuple[str, str]) -> float | None:
    """How much faster the trainer's step runs as `to` (GPU, precision) than as `frm`, both
    priced by roofline (step_seconds); None where roofline prices either not (FP8 on a GPU
    without FP8 tensor cores, a GPU perfmodel/gpus.py does not know)."""
    from bertperf.perfmodel import gpus

    if frm[0] not in gpus.GPUS or to[0] not in gpus.GPUS:
        return None
    a, b = step_seconds(*frm), step_seconds(*to)
    return None if a is None or b is None else a / b
