"""Time to train of MLPerf BERT on a cluster of GPUs, as NVIDIA's MLPerf code runs it: a model
(not a measurement) of every term of a step at any scale, shared by `model validate` (against
every published result) and `plan` (a cluster's candidate configurations). The reasoning and the
published facts behind each term: docs/design.md, "Time to train at any scale"."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache

from bertperf.benchmark import EVAL_SAMPLES, MAX_SEQ_LENGTH
from bertperf.perfmodel import scale


@dataclass(frozen=True)
class Gpu:
    """A GPU's datasheet figures the model uses."""

    name: str
    bandwidth: float
    """Memory bandwidth, bytes/s."""
    memory_gb: float
    """Memory, GB: bounds the micro-batch `plan` proposes."""
    source: str


GPUS = {g.name: g for g in (
    Gpu("A100 40GB SXM", 1.555e12, 40, "NVIDIA A100 Tensor Core GPU datasheet (2021)"),
    Gpu("A100 80GB SXM", 2.039e12, 80, "NVIDIA A100 Tensor Core GPU datasheet (2021)"),
    Gpu("A100 80GB PCIe", 1.935e12, 80, "NVIDIA A100 Tensor Core GPU datasheet (2021)"),
    Gpu("H100 80GB SXM", 3.35e12, 80, "NVIDIA H100 Tensor Core GPU datasheet (2023)"),
    Gpu("H100 80GB PCIe", 2.0e12, 80, "NVIDIA H100 Tensor Core GPU datasheet (2023)"),
    Gpu("H100 96GB SXM", 3.35e12, 96, "a submitter's system description; the bandwidth taken "
        "as the H100 SXM's"),
    Gpu("H200 141GB SXM", 4.8e12, 141, "NVIDIA H200 Tensor Core GPU datasheet (2024)"),
    Gpu("B200 180GB SXM", 8.0e12, 180, "NVIDIA DGX B200 datasheet (2024): 64 TB/s for 8 GPUs"),
    Gpu("GB200 186GB", 8.0e12, 186, "NVIDIA GB200 NVL72 datasheet (2024): 576 TB/s for 72 "
        "GPUs"),
    Gpu("V100 32GB", 0.9e12, 32, "NVIDIA Tesla V100 datasheet (2020)"),
)}
"""The GPUs of the published results and of `plan`."""


@dataclass(frozen=True)
class Fabric:
    """How a cluster's GPUs are joined."""

    gpus_per_node: int
    nvlink_domain: int
    """GPUs one NVLink/NVSwitch fabric joins (a node's, or an NVL72 rack's); the GPUs of a
    node when they are joined by PCIe only."""
    nvlink: float
    """That fabric's bandwidth a GPU and direction, bytes/s (PCIe: the GPU's x16 link)."""
    nics_per_node: int
    nic: float
    """One NIC's bandwidth a direction, bytes/s."""
    sharp: bool
    """InfiniBand with SHARP in the switches: the all-reduce across nodes reduced in the
    network (NVIDIA's multi-node configs ask for it: SBATCH_NETWORK=sharp)."""
    alpha_nvlink: float = scale.ALPHA_NVLINK_US * 1e-6
    alpha_net: float = scale.ALPHA_NET_US * 1e-6
    """Seconds a step of a ring in the node and on the network (model scale's: NCCL's hwLat)."""
    name: str = ""

    @property
    def nic_per_gpu(self) -> float:
        return self.nics_per_node * self.nic / self.gpus_per_node


def _dgx(name: str, nvlink_gbps: float, nic_gbit: float) -> Fabric:
    return Fabric(8, 8, nvlink_gbps * 1e9, 8, nic_gbit * 1e9 / 8, True, name=name)


def _pcie(name: str, nic_gbit: float) -> Fabric:
    return Fabric(8, 8, scale.PCIE4_X16, 1, nic_gbit * 1e9 / 8, False,
                  alpha_nvlink=scale.ALPHA_PCIE_US * 1e-6, name=name)


FABRICS = {f.name: f for f in (
    _dgx("dgx-a100", 300, 200), _dgx("dgx-h100", 450, 400), _dgx("dgx-b200", 900, 400),
    Fabric(4, 72, 900e9, 4, 400e9 / 8, False, name="gb200-nvl72"),
    _pcie("pcie-10gbe", 10), _pcie("pcie-25gbe", 25), _pcie("pcie-100gbe", 100),
)}
"""The known networks `plan` takes by name. DGX A100: NVSwitch 600 GB/s a GPU (300 a direction),
eight 200 Gb/s HDR InfiniBand NICs; DGX H100: 900 GB/s NVLink 4 (450), eight 400 Gb/s NDR NICs;
DGX B200: 1.8 TB/s NVLink 5 (900), eight 400 Gb/s NICs (NVIDIA's DGX datasheets); each with
SHARP, as NVIDIA's multi-node configs ask for it. GB200 NVL72: 72 GPUs on one NVLink 5 domain,
compute trays of 4 GPUs with four 400 Gb/s NICs (NVIDIA GB200 NVL72 datasheet). pcie-*: nodes of
GPUs on PCIe 4.0 x16 (NCCL's PCI latency, 5.7 us a step) with one Ethernet NIC a node."""

PARAMETERS = 336_232_258
"""BERT-large's trained parameters with MLPerf's vocabulary (test_model_cluster counts them in
model scale's meta-device model)."""
NVIDIA_GRADIENT_BYTES = 2
"""NVIDIA's code reduces fp16 gradients and gathers fp16 weights (DistributedFusedLAMB)."""
LAMB_BYTES = 32
"""Bytes of memory traffic a parameter in one LAMB step: fp32 weight, moments and the fp16
gradient read, the same written with the fp16 weight copy (28), and the update's norms read
again (4)."""
MEMORY_EFFICIENCY = 0.79
"""Fraction of the bandwidth a memory-bound kernel reaches: the A100's measured 1.616 of 2.039
TB/s (perfmodel/anchors.csv), taken for every GPU."""
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
    nodes: int
    fabric: Fabric
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


def sharp(nbytes: float, ranks: int, bandwidth: float, alpha: float) -> float:
    """In-network reduction: each GPU's bytes go up to the switches once and come back once."""
    return 2 * alpha + nbytes / bandwidth if ranks > 1 else 0.0


def communication(shape: Shape) -> dict[str, float]:
    """DistributedFusedLAMB's traffic a step, seconds: the fp16 gradients reduce-scattered in
    the node, each GPU's 1/G of them all-reduced across the nodes (in the NVLink domain at its
    bandwidth, beyond it on the NICs: SHARP where the fabric has it, else NCCL's faster of ring
    and tree), the fp16 weights all-gathered in the node."""
    f, g = shape.fabric, shape.fabric.gpus_per_node
    nbytes = PARAMETERS * shape.trained * shape.gradient_bytes
    in_node = scale.reduce_scatter(nbytes, g, f.nvlink, f.alpha_nvlink)
    if shape.gpus <= f.nvlink_domain:
        across = scale.ring_allreduce(nbytes / g, shape.nodes, f.nvlink, f.alpha_nvlink)
    elif f.sharp:
        across = sharp(nbytes / g, shape.nodes, f.nic_per_gpu, f.alpha_net)
    else:
        across = min(algo(nbytes / g, shape.nodes, f.nic_per_gpu, f.alpha_net)
                     for algo in (scale.ring_allreduce, scale.tree_allreduce))
    return {"reduce in node": in_node, "reduce across nodes": across, "gather in node": in_node}


def optimizer_seconds(shape: Shape) -> float:
    """One LAMB step over the GPU's share of the parameters, memory-bound."""
    share = shape.optimizer_share or 1 / shape.fabric.gpus_per_node
    return PARAMETERS * shape.trained * share * LAMB_BYTES / (GPUS[shape.gpu].bandwidth *
                                                             MEMORY_EFFICIENCY)


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


@dataclass(frozen=True)
class Prediction:
    shape: Shape
    samples: float
    evals: float
    terms: dict[str, float]
    """Seconds of each term over the whole run."""

    @property
    def seconds(self) -> float:
        return sum(self.terms.values())

    @property
    def step_seconds(self) -> float:
        return sum(v for k, v in self.terms.items() if k not in ("evals", "run")) / self.steps

    @property
    def steps(self) -> float:
        return self.samples / self.shape.global_batch

    @property
    def dominant(self) -> str:
        return max(self.terms, key=self.terms.get)


def predict(shape: Shape, rate: float, over: Overheads, samples: float,
            evals: float) -> Prediction:
    """The run's time to train: `samples` trained in global batches, `evals` evals."""
    steps = samples / shape.global_batch
    terms = {k: steps * v for k, v in step_terms(shape, rate, over).items()}
    terms["evals"] = evals * eval_seconds(shape, rate, over)
    terms["run"] = over.run
    return Prediction(shape, samples, evals, terms)


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
    return Prediction(shape, samples, evals, terms)


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




@cache
def _roofline_steps() -> dict[tuple[str, str], float]:
    """Seconds of the trainer's packed step (COMPILE, CUDA graphs) on each roofline GPU, bf16 and
    (where the GPU has FP8 tensor cores) with the encoder's GEMMs in FP8, priced by
    perfmodel/roofline.py (efficiencies from kernel measurements)."""
    from bertperf.model import BertConfig
    from bertperf.perfmodel import roofline, step

    config = BertConfig.large()
    trace, segments, _ = step.trace_step(config, step.model_steps()["packed"], True)
    ops = roofline.fuse_elementwise(roofline.flash_attention(
        trace.ops, segments, config.hidden_size, config.num_attention_heads))
    fp8 = roofline.fp8(ops, int(segments.sum()))
    out = {}
    for g in roofline.GPUS:
        out[g.name, "fp16"] = roofline.step_cost(ops, g, graphs=True).seconds
        if g.fp8_flops:
            out[g.name, "fp8"] = roofline.step_cost(fp8, g, graphs=True).seconds
    return out


def roofline_speedup(frm: tuple[str, str], to: tuple[str, str]) -> float | None:
    """How much faster the trainer's step runs as `to` (GPU, precision) than as `frm`, both
    priced by roofline (_roofline_steps); None where roofline prices either not."""
    steps = _roofline_steps()
    if frm not in steps or to not in steps:
        return None
    return steps[frm] / steps[to]
