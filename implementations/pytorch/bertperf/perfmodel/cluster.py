"""Time to train of MLPerf BERT on a cluster of GPUs, as NVIDIA's MLPerf code runs it: a model
(not a measurement) of every term of a step at any scale, shared by `model validate` (against
every published result) and `plan` (a cluster's candidate configurations). The reasoning and the
published facts behind each term: docs/design.md, "Time to train at any scale"."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bertperf.benchmark import EVAL_SAMPLES, MAX_SEQ_LENGTH
from bertperf.perfmodel import bert
from bertperf.perfmodel.network import Network, reduce_scatter, ring_allreduce, sharp, \
    tree_allreduce
from bertperf.perfmodel.timing import Prediction


NVIDIA_GRADIENT_BYTES = 2
"""NVIDIA's code reduces fp16 gradients and gathers fp16 weights (DistributedFusedLAMB)."""
LAMB_BYTES = 32
"""Bytes of memory traffic a parameter in one LAMB step: fp32 weight, moments and the fp16
gradient read, the same written with the fp16 weight copy (28), and the update's norms read
again (4)."""
EVAL_BATCH = 16
"""Sequences a GPU evaluates at once: run_and_time.sh's --eval_batch_size=16 in NVIDIA's code."""
MEAN_LENGTH = 255.8
"""Tokens in MLPerf's mean training sequence (Graphcore's histogram of the data): an eval
sequence padded to MAX_SEQ_LENGTH costs MAX_SEQ_LENGTH / MEAN_LENGTH training sequences."""
FORWARD_SHARE = 1 / 3
"""A forward pass's share of a training micro-step (backward = 2 x forward)."""
NVIDIA_OVERLAP_BLOCKS = 5
"""--dwu-num-blocks of NVIDIA's configs with --dwu-overlap-reductions (the `_clipafter` ones):
the reductions of all blocks but the last overlap the backward."""


@dataclass(frozen=True)
class Shape:
    """A run's shape: what a step does on every GPU."""

    gpu: str
    """Its name in perfmodel/gpus.py."""
    nodes: int
    fabric: Network
    batch: int
    """Micro-batch a GPU (packed: rows)."""
    accumulation: int
    packing: float
    """Sequences a row (1: unpacked)."""
    blocks: int
    """Pieces the gradients are reduced in, all but the last under the backward (1: none
    overlaps; NVIDIA's --dwu-overlap-reductions: NVIDIA_OVERLAP_BLOCKS; DDP: its buckets)."""
    gradient_bytes: int = NVIDIA_GRADIENT_BYTES
    """Bytes a gradient element crosses the fabrics in (the weights are gathered in the same)."""
    optimizer_share: float = 0.0
    """The share of the parameters a GPU steps: 1 replicated, 1/G DistributedFusedLAMB (0: that,
    the default), 1/(N G) sharded over every GPU."""
    trained: float = 1.0
    """The share of the parameters that train (a LAYERWISE stage's): their gradients cross the
    fabrics and LAMB steps them."""

    @property
    def gpus(self) -> int:
        return self.nodes * self.fabric.gpus_per_node

    @property
    def global_batch(self) -> int:
        return round(self.gpus * self.batch * self.accumulation * self.packing)

    @property
    def sequences_per_micro_step(self) -> float:
        return self.batch * self.packing


@dataclass(frozen=True)
class Overheads:
    """What the model cannot derive from datasheets and is fitted on published results."""

    seconds: float
    """Seconds a micro-step takes whatever its size and the GPU's speed: its kernels' launch
    floors and the host's work."""
    sequences: float
    """Sequences' worth of work a micro-step takes beyond its own sequences: at 2-16 sequences a
    GPU its GEMMs fill one wave of the GPU's SMs or less, and its kernels have their floors, so
    a micro-step costs as if it held this many more (a time that scales with the GPU's speed,
    as a wave does)."""
    run: float
    """Seconds a run takes beyond its steps and evals: from run_start to the first step (data
    loading, the first batch), and the end."""


TERMS = ("compute", "fixed", "optimizer", "reduce in node", "reduce across nodes",
         "gather in node", "evals", "run")


def communication(shape: Shape) -> dict[str, float]:
    """DistributedFusedLAMB's traffic a step, seconds: the fp16 gradients reduce-scattered in
    the node, each GPU's 1/G of them all-reduced across the nodes (in the NVLink domain at its
    bandwidth, beyond it on the NICs: SHARP where the fabric has it, else NCCL's faster of ring
    and tree), the fp16 weights all-gathered in the node."""
    f, g = shape.fabric, shape.fabric.gpus_per_node
    nbytes = bert.parameter_count() * shape.trained * shape.gradient_bytes
    in_node = reduce_scatter(nbytes, g, f.nvlink, f.alpha_nvlink)
    if shape.gpus <= f.domain:
        across = ring_allreduce(nbytes / g, shape.nodes, f.nvlink, f.alpha_nvlink)
    elif f.sharp:
        across = sharp(nbytes / g, shape.nodes, f.nic_per_gpu, f.alpha_net)
    else:
        across = min(algo(nbytes / g, shape.nodes, f.nic_per_gpu, f.alpha_net)
                     for algo in (ring_allreduce, tree_allreduce))
    return {"reduce in node": in_node, "reduce across nodes": across, "gather in node": in_node}


def optimizer_seconds(shape: Shape) -> float:
    """One LAMB step over the GPU's share of the parameters, memory-bound: at the bandwidth
    roofline prices the GPU's memory-bound kernels at."""
    from bertperf.perfmodel import roofline

    share = shape.optimizer_share or 1 / shape.fabric.gpus_per_node
    gpu = roofline.GPUS[shape.gpu]
    return bert.parameter_count() * shape.trained * share * LAMB_BYTES / (
        gpu.bandwidth * gpu.memory_efficiency)


def step_terms(shape: Shape, rate: float, over: Overheads) -> dict[str, float]:
    """Seconds of each term of a training step on every GPU; `rate`: the GPU's sequences a
    second in the steady state of a large micro-batch (calibrated)."""
    compute = shape.accumulation * shape.sequences_per_micro_step / rate
    comm = communication(shape)
    if shape.blocks > 1:  # all blocks but the last reduce under the last micro-step's backward
        hidden_room = (1 - FORWARD_SHARE) * compute / shape.accumulation
        reductions = comm["reduce in node"] + comm["reduce across nodes"]
        hidden = min(reductions * (shape.blocks - 1) / shape.blocks, hidden_room)
        scale = 1 - hidden / reductions if reductions else 1.0
        comm = {**comm, "reduce in node": comm["reduce in node"] * scale,
                "reduce across nodes": comm["reduce across nodes"] * scale}
    return {"compute": compute, "fixed": shape.accumulation * (over.seconds + over.sequences / rate),
            "optimizer": optimizer_seconds(shape), **comm}


def eval_seconds(shape: Shape, rate: float, over: Overheads) -> float:
    """One eval: every GPU's share of the 10,000 eval samples in batches of up to EVAL_BATCH,
    each sequence padded to MAX_SEQ_LENGTH (NVIDIA's --pad_fmha keeps static shapes), forward
    only, each batch with a micro-step's fixed work."""
    share = math.ceil(EVAL_SAMPLES / shape.gpus)
    padded = share * MAX_SEQ_LENGTH / MEAN_LENGTH
    batches = math.ceil(share / EVAL_BATCH)
    return FORWARD_SHARE * ((padded + batches * over.sequences) / rate + batches * over.seconds)


def predict(shape: Shape, rate: float, over: Overheads, samples: float,
            evals: float) -> Prediction:
    """The run's time to train: `samples` trained in global batches, `evals` evals."""
    steps = samples / shape.global_batch
    terms = {k: steps * v for k, v in step_terms(shape, rate, over).items()}
    terms["evals"] = evals * eval_seconds(shape, rate, over)
    terms["run"] = over.run
    return Prediction(samples, shape.global_batch, evals, terms)


def staged(shape: Shape, rate: float, over: Overheads, samples: float, evals: float,
           stages: list[tuple[float, float, float]]) -> Prediction:
    """A LAYERWISE run: each stage (share of the samples and of the evals, its step's compute
    against the whole model's, the share of the parameters it trains) predicted at the rate the
    lighter step gives, the run's constant once."""
    terms: dict[str, float] = {}
    for share, compute, trained in stages:
        part = predict(replace(shape, trained=trained), rate / compute, over, samples * share,
                       evals * share)
        for name, seconds in part.terms.items():
            terms[name] = terms.get(name, 0.0) + seconds
    terms["run"] = over.run
    return Prediction(samples, shape.global_batch, evals, terms)


def calibrated_rate(shape: Shape, over: Overheads, samples: float, evals: float,
                    seconds: float) -> float:
    """The `rate` at which `predict` gives `seconds` for this run (a measured one: its own
    samples and evals), found by bisection; nan where no rate can (the overheads alone take
    longer)."""
    low, high = 1.0, 1e6
    if predict(shape, high, over, samples, evals).seconds > seconds:
        return math.nan
    for _ in range(60):
        mid = math.sqrt(low * high)
        if predict(shape, mid, over, samples, evals).seconds > seconds:
            low = mid
        else:
            high = mid
    return math.sqrt(low * high)
