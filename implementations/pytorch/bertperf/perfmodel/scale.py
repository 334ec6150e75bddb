"""`python -m bertperf model scale`: a performance model of the trainer on DGX A100 clusters, and
with --cluster commodity on commodity ones (a model, not a measurement). From a single-GPU step
time and the real gradient messages it predicts the step time and the time to train of each
config_DGXA100_*.sh, names the term that dominates the step, and puts the published MLPerf times
beside them.

A step on every GPU, with b sequences (LAYOUT=packed: rows) a micro-batch and g micro-batches:

  compute    g micro-steps (forward + backward + gradient accumulation) at b on one A100:
             perfmodel/roofline.py's price of the trainer's traced bf16 step (varlen or packed, with
             bertperf.kernels' Triton kernels, as it runs on CUDA), or a measured time
             (--step-ms B=MS)
  all-reduce the gradients in DDP's buckets: the model's parameters (BERT-large, built on the
             meta device) in gradient-ready order (the reverse of their definition), cut by
             torch's own bucket assignment with DDP's limits (1 MiB first, then 25 MiB), each
             parameter at the gradient's size (--grad-dtype, default the parameters' float32).
             Each bucket is one all-reduce (below); the buckets but the last overlap the last
             micro-step's backward (at most --overlap of its time), the last bucket (the
             embeddings, whose gradient is ready last) never does
  optimizer  one LAMB step over all parameters on every GPU (roofline's price of FlatLamb's
             kernels), or --optimizer-ms
  evals      every eval interval (MLPerf's formula of the global batch) each GPU runs the forward
             pass over its share of the 10,000 eval samples: a third of a micro-step (backward =
             2 x forward, model/flops.py) per b of them; spread over the steps in the table
  data       not on the step's path: the loader builds batches ahead on a thread (PREFETCH)

All-reduce of M bytes over p GPUs, latency alpha a step and bandwidth B a GPU and direction:

  ring   2 (p-1) alpha + 2 (p-1)/p M / B        (reduce-scatter then all-gather)
  tree   2 ceil(log2 p) alpha + 2 M / B          (pipelined double binary tree, NCCL)
  auto   (default) the faster of the two for each bucket, as NCCL's tuner picks by its model
  hierarchical (default), nodes of G GPUs on NVSwitch, N nodes on InfiniBand:
         reduce-scatter in the node   (G-1) a_nvl + (G-1)/G M / B_nvl
         all-reduce across the nodes  ring or tree of M/G bytes, each GPU on its share of the
                                      node's NICs (8 x 200 Gb/s = 25 GB/s a GPU)
         all-gather in the node       as the reduce-scatter
  flat   one ring or tree over all N G GPUs, every step at a GPU's share of the NICs
One node: the ring or tree over its G GPUs on NVSwitch. These are NCCL's own cost model's terms
(src/graph/tuning.cc: a ring all-reduce takes 2 (nRanks-1) steps, 2 (nNodes-1) of them on the
network; a tree 2 (log2 nNodes) network hops; their algorithm bandwidths busBw nRanks/(2 (nRanks-
1)) and busBw/2), whose per-step latencies are the defaults: 3.4 us on NVLink, 9.6 us on the
network (hwLat, ring, Simple protocol: the one for large messages).

Time to train = S / GBS steps x the step + S / interval evals, S the samples to converge: the
mean of MLPerf's reference convergence points for the config's global batch (ruleset 5.0.0,
mlperf/rcp.py), or for a published run the mean samples its logs trained. Not modelled: the
time between run_start and the first step, NCCL's kernels slowing the compute they overlap,
the spread of work across ranks (BALANCE), stragglers, SHARP.

--cluster commodity: N nodes of G PCIe GPUs at one config's global batch. In the node a ring at
the GPU's PCIe link (its `nvlink`), across nodes one Ethernet NIC a node shared by the G GPUs
(nics_per_node 1: M/G a GPU at NIC/G), hierarchical as above. Each GRAD_COMM mode's all-reduces
(mode_messages; localsgd: the node's own all-reduce, and the parameters over all ranks every
LOCALSGD_PERIOD steps, amortised) and PowerSGD's compression compute (powersgd_seconds); powersgd
and localsgd all-reduce plainly during the warm-up. A GPU's compute is the A100's times the
ratio of the two GPUs' published BERT-large rates with one code (anchors.csv, SPEED_ANCHOR); a
GPU without one is not predicted. Samples: the RCP's times the mode's SAMPLES_FACTOR.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import math
import platform
import subprocess
import sys
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from bertperf.benchmark import EVAL_SAMPLES
from bertperf.config import GRAD_COMMS as MODES, reference_eval_interval
from bertperf.errors import UserError
from bertperf.perfmodel import TOLERANCE

CONFIGS = "config_DGXA100_*x*.sh"
"""The config files modelled by default, in the current folder (the checkout's root)."""
GPU = "A100 80GB SXM"
"""The roofline GPU (roofline.py's GPUS) the compute is priced on."""

NVLINK_GBPS = 300.0
"""NVSwitch bandwidth a GPU and direction, busbw-equivalent, GB/s: third-generation NVLink gives an
A100 600 GB/s in all (NVIDIA A100 Tensor Core GPU Architecture whitepaper, 2020: six NVSwitches,
GPU-to-GPU 600 GB/s). NCCL's own model caps an A100's busBw at 235 (tuning.cc)."""
NIC_GBIT = 200.0
NICS_PER_NODE = 8
"""DGX A100: eight single-port ConnectX-6 HDR InfiniBand adapters at 200 Gb/s, one a GPU, for the
compute fabric (NVIDIA, "Defining AI Innovation with NVIDIA DGX A100", developer.nvidia.com
blog, 2020)."""
ALPHA_NVLINK_US, ALPHA_NET_US = 3.4, 9.6
"""Per-step latency of a ring all-reduce on NVLink and on the network, microseconds (NCCL
src/graph/tuning.cc hwLat, Ring/Simple; NVIDIA/nccl at 01afd20)."""


@dataclass(frozen=True)
class Network:
    gpus_per_node: int
    nvlink: float
    """The fabric in the node a GPU and direction, bytes/s (busbw-equivalent): NVSwitch, or a
    commodity node's PCIe link."""
    nic: float
    """One NIC's bandwidth a direction, bytes/s: InfiniBand, or a commodity node's Ethernet."""
    nics_per_node: int
    alpha_nvlink: float
    """Seconds a step in the node (NVLink or PCIe)."""
    alpha_net: float
    """Seconds a step on the network."""
    algorithm: str = "auto"
    """ring, tree or auto (the faster of the two for each all-reduce): the all-reduce across the
    nodes (flat: over all GPUs; one node: in it)."""
    topology: str = "hierarchical"
    """hierarchical (reduce-scatter in the node, all-reduce across nodes, all-gather in the node)
    or flat (one all-reduce over every GPU at its share of the NICs)."""

    @property
    def nic_per_gpu(self) -> float:
        return self.nics_per_node * self.nic / self.gpus_per_node


@dataclass(frozen=True)
class Comm:
    """Seconds an all-reduce spends on each fabric."""

    nvlink: float = 0.0
    network: float = 0.0

    @property
    def total(self) -> float:
        return self.nvlink + self.network

    def __add__(self, other: Comm) -> Comm:
        return Comm(self.nvlink + other.nvlink, self.network + other.network)

    def scaled(self, factor: float) -> Comm:
        return Comm(self.nvlink * factor, self.network * factor)


def ring_allreduce(nbytes: float, ranks: int, bandwidth: float, alpha: float) -> float:
    """2 (p-1) alpha + 2 (p-1)/p M / B."""
    if ranks < 2:
        return 0.0
    return 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * nbytes / bandwidth


def tree_allreduce(nbytes: float, ranks: int, bandwidth: float, alpha: float) -> float:
    """2 ceil(log2 p) alpha + 2 M / B."""
    if ranks < 2:
        return 0.0
    return 2 * math.ceil(math.log2(ranks)) * alpha + 2 * nbytes / bandwidth


def reduce_scatter(nbytes: float, ranks: int, bandwidth: float, alpha: float) -> float:
    """(p-1) alpha + (p-1)/p M / B (an all-gather takes the same)."""
    if ranks < 2:
        return 0.0
    return (ranks - 1) * alpha + (ranks - 1) / ranks * nbytes / bandwidth


ALGORITHMS = {"ring": ring_allreduce, "tree": tree_allreduce}
CLUSTERS = ("dgx", "commodity")
CHOICES = (*ALGORITHMS, "auto")
TOPOLOGIES = ("hierarchical", "flat")


def allreduce(nbytes: float, nodes: int, net: Network) -> Comm:
    """One all-reduce of `nbytes` on every GPU of `nodes` nodes (module docstring); algorithm
    auto: the faster of ring and tree, as NCCL's tuner picks one for each call by its model."""
    if net.algorithm == "auto":
        return min((allreduce(nbytes, nodes, replace(net, algorithm=a)) for a in ALGORITHMS),
                   key=lambda c: c.total)
    algo, g = ALGORITHMS[net.algorithm], net.gpus_per_node
    if nodes == 1:
        return Comm(nvlink=algo(nbytes, g, net.nvlink, net.alpha_nvlink))
    if net.topology == "flat":
        return Comm(network=algo(nbytes, nodes * g, net.nic_per_gpu, net.alpha_net))
    in_node = 2 * reduce_scatter(nbytes, g, net.nvlink, net.alpha_nvlink)
    return Comm(nvlink=in_node, network=algo(nbytes / g, nodes, net.nic_per_gpu, net.alpha_net))


# ---- the model's parts from the model itself ---------------------------------------------------

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
    gpu = next(g for g in roofline.GPUS if g.name == GPU)

    def seconds(*phases: str) -> float:
        return roofline.step_cost([op for op in ops if op.phase in phases], gpu).seconds

    return Compute(seconds("forward", "backward", "accumulate"),
                   seconds("backward", "accumulate"), seconds("optimizer"), source)


# ---- runs ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    """A run's shape and how many samples it trains."""

    label: str
    nodes: int
    gpus_per_node: int
    batch: int
    """Sequences (packed: rows) a micro-batch on a GPU."""
    accumulation: int
    packed: bool
    packing_factor: float
    samples: float
    """Samples to converge (a mean)."""
    samples_source: str
    eval_interval: int
    published: Published | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def global_batch(self) -> int:
        """Sequences a step as MLPerf counts them (packed rows x the packing factor)."""
        rows = self.gpus * self.batch * self.accumulation
        return round(rows * self.packing_factor) if self.packed else rows

    @property
    def sequences_per_micro_batch(self) -> float:
        return self.batch * (self.packing_factor if self.packed else 1)


@dataclass(frozen=True)
class Published:
    """A published MLPerf result beside the configs: a row of perfmodel/results.csv (recomputed
    from its logs by `model results`: the olympic mean of its runs, their mean samples)."""

    label: str
    source: str
    """<round>:<organization>/results/<system> (results.csv's source names the snapshot)."""
    division: str
    nodes: int
    batch: int
    packed: bool
    global_batch: int
    minutes: float
    samples: int
    eval_interval: int


SCALE_RESULTS = ("NVIDIA", "Samsung")
"""Whose DGX A100 results (8 A100 80GB SXM a node) `model scale` puts beside its configs:
NVIDIA's own, and Samsung's (open division: Adam, not LAMB; its own code). NVIDIA's packed runs
count 2 sequences a row (its --average_packing_rate). A result whose logs give no eval interval
(v1.x) gets MLPerf's cadence for its batch, which Samsung's config also sets (325,000)."""


def load_published(path: Path | None = None) -> list[Published]:
    """The SCALE_RESULTS rows of the results table (`path`, default the package's), oldest
    round first; a UserError naming the line and column of what is malformed."""
    from bertperf.perfmodel import results

    return [Published(f"{r.round} {r.organization} {r.nodes}xDGX A100",
                      f"{r.round}:{r.organization}/results/{r.system}", r.division, r.nodes,
                      r.batch, r.packed, r.global_batch, r.minutes, r.samples,
                      r.eval_interval or reference_eval_interval(r.global_batch))
            for r in results.load_results(path or results.RESULTS)
            if r.organization in SCALE_RESULTS and r.gpu == "A100 80GB SXM"
            and r.gpus_per_node == 8]


def read_config(path: Path) -> dict[str, str]:
    """The variables a config file exports, sourced by bash in an empty environment."""
    try:
        out = subprocess.run(["bash", "-c", 'set -a; source "$0" >/dev/null; env -0', str(path)],
                             capture_output=True, env={"PATH": "/usr/bin:/bin"}, check=True)
    except subprocess.CalledProcessError as exc:
        raise UserError(f"{path}: sourcing it failed: "
                        f"{exc.stderr.decode(errors='replace').strip()[-200:]}") from None
    return dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)


def config_run(path: Path) -> Run:
    """A config file's run, converging in the mean samples of the RCP row of its global batch."""
    from bertperf.mlperf.rcp import point_for

    env = read_config(path)
    if "DGX A100" not in env.get("SUBMISSION_PLATFORM", ""):
        raise UserError(f"{path}: not a DGX A100 config (SUBMISSION_PLATFORM="
                        f"{env.get('SUBMISSION_PLATFORM')!r}): the model prices A100s")

    def number(name: str, conv=int, default: str | None = None):
        text = env.get(name, default)
        try:
            return conv(text)
        except (TypeError, ValueError):
            raise UserError(f"{path}: {name}={text!r} is not a number") from None

    packed = env.get("LAYOUT") == "packed"
    shape = Run(path.name, number("DGXNNODES"), number("DGXNGPU"), number("BATCHSIZE"),
                number("GRADIENT_STEPS", int, "1"), packed,
                number("PACKING_FACTOR", float, "2") if packed else 1.0,
                samples=0, samples_source="", eval_interval=0)
    gbs = shape.global_batch
    point = point_for(gbs)
    if point is None:
        raise UserError(f"{path}: global batch {gbs} is not a BERT RCP row, so its samples to "
                        "converge are unknown")
    published = next((p for p in reversed(load_published()) if p.division == "closed"
                      and p.nodes == shape.nodes and p.batch == shape.batch
                      and p.global_batch == gbs), None)  # the latest round's
    return replace(shape, samples=sum(point.samples_to_converge) / len(point.samples_to_converge),
                   samples_source=f"RCP {gbs}", published=published,
                   eval_interval=number("EVAL_ITER_SAMPLES", int,
                                        str(reference_eval_interval(gbs))))


def published_run(p: Published, gpus_per_node: int = 8) -> Run:
    return Run(f"{p.label} ({p.division}; {p.nodes}x{gpus_per_node}x{p.batch}x1"
               f"{' packed' if p.packed else ''})", p.nodes, gpus_per_node, p.batch, 1, p.packed,
               2.0 if p.packed else 1.0, p.samples, "its logs", p.eval_interval, p)


# ---- the prediction ------------------------------------------------------------------------------

TERMS = ("compute", "optimizer", "all-reduce in node", "all-reduce across nodes", "compression",
         "evals")


@dataclass(frozen=True)
class Prediction:
    run: Run
    compute: Compute
    comm: Comm
    """The step's all-reduces, all of them."""
    exposed: Comm
    """The part not hidden under backward."""
    eval_seconds: float
    """One eval."""
    compression: float = 0.0
    """Seconds a step compressing and decompressing the gradients (GRAD_COMM=powersgd)."""

    @property
    def steps(self) -> float:
        return self.run.samples / self.run.global_batch

    @property
    def evals(self) -> float:
        return self.run.samples / self.run.eval_interval

    @property
    def terms(self) -> dict[str, float]:
        """Seconds a step of each term (evals spread over the steps)."""
        return dict(zip(TERMS, (self.run.accumulation * self.compute.micro_step,
                                self.compute.optimizer, self.exposed.nvlink, self.exposed.network,
                                self.compression, self.evals * self.eval_seconds / self.steps)))

    @property
    def step_seconds(self) -> float:
        """A training step, evals not counted."""
        terms = self.terms
        return sum(terms.values()) - terms["evals"]

    @property
    def seconds_to_train(self) -> float:
        return self.steps * self.step_seconds + self.evals * self.eval_seconds

    @property
    def dominant(self) -> str:
        terms = self.terms
        return max(terms, key=terms.get)


def predict(run: Run, compute: Compute, buckets: list[int], net: Network,
            overlap: float) -> Prediction:
    """The run's step and time to train (module docstring)."""
    net = replace(net, gpus_per_node=run.gpus_per_node)
    return overlapped(run, compute, [allreduce(b, run.nodes, net) for b in buckets], overlap)


def overlapped(run: Run, compute: Compute, buckets: list[Comm], overlap: float,
               after: Comm = Comm(), compression: float = 0.0) -> Prediction:
    """The run's step from each bucket's communication in all-reduce order (the buckets but the
    last under at most `overlap` of the backward), `after` the step's communication that
    nothing hides and `compression` its compression compute (module docstring)."""
    *early, last = buckets
    rest = sum(early, Comm())
    hidden = min(rest.total, overlap * compute.backward)
    exposed = last + after + (rest.scaled(1 - hidden / rest.total) if rest.total else rest)
    shares = math.ceil(math.ceil(EVAL_SAMPLES / run.gpus) / run.sequences_per_micro_batch)
    return Prediction(run, compute, rest + last + after, exposed, shares * compute.micro_step / 3,
                      compression)


# ---- commodity clusters --------------------------------------------------------------------------

@dataclass(frozen=True)
class CommodityGpu:
    """A PCIe GPU's datasheet numbers (COMMODITY_GPUS)."""

    name: str
    tensor_flops: float
    """Dense fp16 tensor-core peak with fp32 accumulation, FLOP/s."""
    vector_flops: float
    """float32 peak without tensor cores, FLOP/s."""
    bandwidth: float
    """Memory bandwidth, bytes/s."""
    pcie: float
    """Its PCIe x16 link, bytes/s a direction."""


PCIE3_X16, PCIE4_X16 = 15.75e9, 31.5e9
"""A PCIe x16 link a direction, bytes/s: 16 lanes at 8 (3.0) or 16 (4.0) GT/s with 128b/130b
encoding (PCI-SIG, PCI Express Base Specification 3.0 and 4.0; NVIDIA's V100 datasheet rounds
3.0 x16 to "32 GB/s" both ways). The link's rate: NCCL's ring over PCIe reaches less, and GPUs
behind one switch or across CPU sockets share less; neither is modelled."""
COMMODITY_GPUS = {
    "V100": CommodityGpu("V100 32GB", 125e12, 15.7e12, 900e9, PCIE3_X16),
    "RTX3090": CommodityGpu("RTX 3090", 71e12, 35.6e12, 936e9, PCIE4_X16),
    "A5000": CommodityGpu("RTX A5000", 111.1e12, 27.8e12, 768e9, PCIE4_X16),
}
"""Datasheets: NVIDIA Tesla V100 (2020): SXM2 125 TFLOP/s tensor, 15.7 float32, HBM2 900 GB/s,
PCIe 3.0 x16 (the PCIe card: 112 and 14 at lower clocks); NVIDIA Ampere GA102 GPU Architecture
whitepaper (2020), RTX 3090: 71 TFLOP/s fp16 tensor with fp32 accumulation (142 with sparsity),
35.6 float32, GDDR6X 936 GB/s, PCIe 4.0 x16; NVIDIA RTX A5000 datasheet (2021): 222.2 TFLOP/s
tensor with sparsity (111.1 dense), 27.8 float32, GDDR6 768 GB/s, PCIe 4.0 x16."""
ETHERNET_GBIT = "10,25"
"""The default Ethernet rates, Gb/s a direction: 10GBASE and 25GBASE line rates (IEEE 802.3ae-2002
and 802.3by-2016). TCP/IP's headers (about 5 % at a 1,500-byte MTU) are not taken off."""
ALPHA_PCIE_US = 5.7
"""Per-step latency of a ring all-reduce on PCIe, microseconds (NCCL src/graph/tuning.cc hwLat,
PCI, Ring/Simple; NVIDIA/nccl at 01afd20). Across nodes the network's ALPHA_NET_US: NCCL's model
has one value for every network, sockets over Ethernet included."""
SPEED_ANCHOR = "bert_dle_fp16"
"""The anchors.csv quantity a commodity GPU's compute is calibrated on: BERT-large phase-2
sequences/s of one GPU running NVIDIA DeepLearningExamples' PyTorch BERT (fp16, one container),
published for the A100 and the GPU alike."""
COMMODITY_CONFIG = "config_DGXA100_8x8x48x1.sh"
"""The config whose global batch (3,072: its RCP row's samples apply) and warm-up a commodity
cluster keeps: nodes x GPUs a node x micro-batch x GRADIENT_STEPS = 3,072."""
MICRO_BATCH = 16
"""Sequences a micro-batch on a commodity GPU (unpadded: about the tokens of the 8 padded
sequences DeepLearningExamples runs on a V100 32GB in phase 2)."""
SAMPLES_FACTOR = {"allreduce": 1.0, "bf16": 1.0, "fp16": 1.0, "powersgd": 1.33,
                  "powersgd_bf16": 1.33, "localsgd": 1.0}
"""Samples to the target of each mode against allreduce's, measured on the demo by `bench comm`
(docs/slow_networks.md), not on BERT-large: powersgd and powersgd_bf16 1.33x, bf16, fp16 and
localsgd 1.0x. --samples-factor replaces them."""
PAPER = ("Lin, Li and Pekhimenko, arXiv 2008.00177: BERT pre-trained in 12 days on an "
         "academic-size cluster of widely available GPUs (the abstract, the only public part, "
         "names no hardware; a full pre-training, not MLPerf's phase-2 run from the checkpoint "
         "to 0.72 MLM accuracy, so not the same work)")


def slowdown(gpu: CommodityGpu) -> float:
    """How many times the A100's time the trainer's step takes on `gpu`: the ratio of the two
    GPUs' SPEED_ANCHOR rates in anchors.csv; a UserError where `gpu` has none."""
    from bertperf.perfmodel import roofline

    rows = roofline.anchors()
    if (SPEED_ANCHOR, gpu.name) not in rows:
        raise UserError(f"{gpu.name}: not predicted: no published BERT-large throughput of it in "
                        f"perfmodel/anchors.csv ({SPEED_ANCHOR}) to calibrate its compute on")
    return rows[SPEED_ANCHOR, roofline.A100].value / rows[SPEED_ANCHOR, gpu.name].value


def powersgd_split(grad, rank: int) -> tuple[int, int] | None:
    """(n, m) of a gradient PowerSGD compresses at `rank` (torch's powerSGD_hook: viewed as
    n = its first dimension by m, compressed where (n + m) r x 2 < n m); None if sent whole."""
    if grad.dim() < 2:
        return None
    n = grad.shape[0]
    m = grad.numel() // n
    return (n, m) if (n + m) * rank * 2 < n * m else None


def mode_messages(mode: str, rank: int) -> list[list[int]]:
    """Bytes of each all-reduce over all ranks a step of `mode` once it has started, bucket by
    bucket: the fp32 bucket; half of it (bf16, fp16); PowerSGD's whole tensors, P and Q (three
    all-reduces a bucket; _bf16: 2 bytes a number); none under localsgd (the node's all-reduce
    and the periodic average are `localsgd_comm`'s)."""
    out = []
    for bucket in bucket_gradients():
        numel = sum(g.numel() for g in bucket)
        if mode in ("allreduce", "bf16", "fp16"):
            out.append([numel * (4 if mode == "allreduce" else 2)])
        elif mode == "localsgd":
            out.append([])
        else:
            whole = p = q = 0
            for g in bucket:
                split = powersgd_split(g, rank)
                if split is None:
                    whole += g.numel()
                else:
                    p, q = p + split[0] * rank, q + split[1] * rank
            out.append([n * (2 if mode == "powersgd_bf16" else 4) for n in (whole, p, q) if n])
    return out


def powersgd_seconds(gpu: CommodityGpu, rank: int, itemsize: int) -> float:
    """Compressing and decompressing every gradient PowerSGD compresses, a step, priced by
    roofline on `gpu`'s datasheet at the A100's calibrated fractions (no kernel measurement of
    these GPUs is at hand): for each n x m gradient M (e = n m elements) torch's hook adds the
    error (reads M and the error, writes M), P = M Q (2 e r FLOPs), orthogonalises P (Gram-
    Schmidt, 4 n r^2 FLOPs, r launches), Q = M^T P (2 e r), M = P Q^T (2 e r) and the new error
    (reads both Ms, writes it); its matmuls in float32, at the float32 peak."""
    from bertperf.perfmodel import roofline

    a100 = next(g for g in roofline.GPUS if g.name == roofline.A100)
    priced = replace(a100, name=gpu.name, tensor_flops=gpu.tensor_flops,
                     vector_flops=gpu.vector_flops, bandwidth=gpu.bandwidth)
    ops = []
    for g in parameters()[0]:
        split = powersgd_split(g, rank)
        if split is None:
            continue
        n, m = split
        e, factors = n * m, (n + m) * rank
        ops += [roofline.Op("error_add", "backward", "", e, nbytes=3 * e * itemsize),
                roofline.Op("p", "backward", "", 2 * e * rank, nbytes=(e + factors) * itemsize),
                roofline.Op("orthogonalize", "backward", "", 4 * n * rank ** 2,
                            nbytes=2 * n * rank * itemsize, launches=rank),
                roofline.Op("q", "backward", "", 2 * e * rank, nbytes=(e + factors) * itemsize),
                roofline.Op("decompress", "backward", "", 2 * e * rank,
                            nbytes=(e + factors) * itemsize),
                roofline.Op("error", "backward", "", e, nbytes=3 * e * itemsize)]
    return roofline.step_cost(ops, priced).seconds


@dataclass(frozen=True)
class ModeRun:
    """A GRAD_COMM mode on a commodity cluster: its step once it has started, the plain step
    before (the warm-up), and the bytes it hands to collectives over all ranks a step."""

    mode: str
    prediction: Prediction
    plain: Prediction
    start: int
    """Steps of plain all-reduce before the mode starts (powersgd, localsgd: the warm-up)."""
    world_bytes: float

    @property
    def seconds_to_train(self) -> float:
        p = self.prediction
        return p.seconds_to_train + self.start * (self.plain.step_seconds - p.step_seconds)


def commodity_mode(run: Run, compute: Compute, gpu: CommodityGpu, net: Network, mode: str,
                   overlap: float, rank: int, period: int, warmup: int,
                   factor: float) -> ModeRun:
    """`mode` on the cluster `run` (its samples x `factor`), the network `net`."""
    net = replace(net, gpus_per_node=run.gpus_per_node)
    params = parameters()[0]
    full = [[b] for b in gradient_buckets()]
    ran = replace(run, samples=run.samples * factor,
                  samples_source=f"{run.samples_source} x {factor:g}")

    def buckets(messages: list[list[int]], nodes: int) -> list[Comm]:
        return [sum((allreduce(m, nodes, net) for m in bucket), Comm()) for bucket in messages]

    plain = overlapped(ran, compute, buckets(full, run.nodes), overlap)
    if mode == "localsgd":
        parameters_bytes = sum(p.numel() * p.element_size() for p in params)
        average = allreduce(parameters_bytes, run.nodes, net).scaled(1 / period)
        prediction = overlapped(ran, compute, buckets(full, 1), overlap, after=average)
        world = parameters_bytes / period
    else:
        messages = mode_messages(mode, rank)
        extra = (powersgd_seconds(gpu, rank, 2 if mode.endswith("bf16") else 4)
                 if mode.startswith("powersgd") else 0.0)
        prediction = overlapped(ran, compute, buckets(messages, run.nodes), overlap,
                                compression=extra)
        world = sum(map(sum, messages))
    start = warmup if mode in ("powersgd", "powersgd_bf16", "localsgd") else 0
    return ModeRun(mode, prediction, plain, start, world)


# ---- the calibration check -----------------------------------------------------------------------

CALIBRATION = ("v2.0 NVIDIA 1xDGX A100", "v2.1 NVIDIA 1xDGX A100")
"""The published runs the model's A100 prediction is checked against (tests/unit/
test_model_scale.py): NVIDIA's closed 1xDGX A100 runs, fp16 (the A100's fp16 and bf16 tensor
peaks are the same), 56 unpadded sequences a GPU, fused bias/GeLU/dropout/LayerNorm kernels and
fused attention (FMHA), no CUDA graphs (config_DGXA100_1x8x56x1.sh of their pytorch and
pytorch-22.09 folders): 300 and 304 sequences/s a GPU, evals included."""


def per_gpu_rate(p: Prediction) -> float:
    """Sequences/s a GPU over the whole run, evals included (how the result logs' rate is
    counted: samples / run time / GPUs)."""
    return p.run.samples / p.seconds_to_train / p.run.gpus


def published_per_gpu_rate(run: Run) -> float:
    return run.published.samples / (run.published.minutes * 60) / run.gpus


def calibration() -> list[Prediction]:
    """The model's predictions of the CALIBRATION runs: the trainer's varlen bf16 step with the
    Triton kernels and FlatLamb at their 56 sequences a GPU on the A100 (`modelled`), their 8
    GPUs' all-reduce, LAMB and evals, with model scale's defaults."""
    net = Network(8, NVLINK_GBPS * 1e9, NIC_GBIT * 1e9 / 8, NICS_PER_NODE, ALPHA_NVLINK_US * 1e-6,
                  ALPHA_NET_US * 1e-6)
    runs = [published_run(p) for p in load_published() if p.label in CALIBRATION]
    return [predict(r, modelled(r.batch, r.packed), gradient_buckets(), net, 1.0) for r in runs]


def describe_calibration(predictions: list[Prediction]) -> str:
    """One line: each CALIBRATION run's predicted and published rate a GPU."""
    def one(p: Prediction) -> str:
        ours, theirs = per_gpu_rate(p), published_per_gpu_rate(p.run)
        return (f"{p.run.published.label}: predicted {ours:.0f} seq/s a GPU, published "
                f"{theirs:.0f} ({ours / theirs:.2f}x)")

    return ("A100 (NVIDIA's MLPerf 1xDGX A100 runs, fp16, 56 unpadded sequences a GPU; model "
            "scale's model, evals included): " + "; ".join(one(p) for p in predictions)
            + f" (tests/unit/test_model_scale.py holds it within {TOLERANCE:.0%})")


# ---- the command ---------------------------------------------------------------------------------

def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise UserError(f"expected a positive number, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configs", nargs="+", type=Path,
                   help=f"config files to model (default: the {CONFIGS} in the current folder, "
                        "as in the checkout)")
    p.add_argument("--step-ms", action="append", default=[], metavar="B=MS",
                   help="a measured micro-step (forward + backward) on one A100 at local batch B, "
                        "milliseconds, instead of the model's for the varlen runs of that "
                        "batch (repeatable)")
    p.add_argument("--optimizer-ms", help="a measured LAMB step on one A100, milliseconds "
                                          "(default: the model's)")
    p.add_argument("--nvlink-gbps", default=str(NVLINK_GBPS),
                   help=f"NVSwitch bandwidth a GPU and direction, GB/s (default {NVLINK_GBPS:g})")
    p.add_argument("--nic-gbit", default=str(NIC_GBIT),
                   help=f"one InfiniBand NIC, Gb/s a direction (default {NIC_GBIT:g}, HDR)")
    p.add_argument("--nics-per-node", default=str(NICS_PER_NODE),
                   help=f"NICs a node (default {NICS_PER_NODE})")
    p.add_argument("--alpha-nvlink-us", default=str(ALPHA_NVLINK_US),
                   help=f"latency a step on NVLink, us (default {ALPHA_NVLINK_US:g})")
    p.add_argument("--alpha-ib-us", default=str(ALPHA_NET_US),
                   help=f"latency a step on InfiniBand, us (default {ALPHA_NET_US:g})")
    p.add_argument("--algorithm", default="auto",
                   help="ring, tree or auto: the faster of the two for each all-reduce, as "
                        "NCCL's tuner picks (default auto)")
    p.add_argument("--topology", default="hierarchical",
                   help="hierarchical or flat (default hierarchical)")
    p.add_argument("--overlap", default="1.0",
                   help="fraction of the backward pass the all-reduce of the buckets but the "
                        "last can hide under, 0..1 (default 1: DDP launches each bucket as its "
                        "gradients are ready)")
    p.add_argument("--grad-dtype", default=None,
                   help="dtype of the all-reduced gradients: float32, bfloat16 or float16 "
                        "(default: the parameters', float32)")
    p.add_argument("--cluster", default="dgx",
                   help="dgx (the DGX A100 configs) or commodity: nodes of PCIe GPUs on Ethernet, "
                        "every GRAD_COMM mode, at one config's global batch (default dgx)")
    c = p.add_argument_group("--cluster commodity")
    commodity_only = [
        c.add_argument("--gpu", default=",".join(COMMODITY_GPUS),
                       help="GPUs, comma-separated; only those with a published BERT-large rate "
                            "in perfmodel/anchors.csv predict (default: all)"),
        c.add_argument("--nodes", default="4", help="node counts, comma-separated (default 4)"),
        c.add_argument("--gpus-per-node", default="8",
                       help="GPUs a node, comma-separated (default 8)"),
        c.add_argument("--ethernet-gbit", default=ETHERNET_GBIT,
                       help=f"one NIC a node, Gb/s, comma-separated (default {ETHERNET_GBIT})"),
        c.add_argument("--grad-comm", default=",".join(MODES),
                       help="GRAD_COMM modes, comma-separated (default: all)"),
        c.add_argument("--micro-batch", default=str(MICRO_BATCH),
                       help=f"sequences a micro-batch (default {MICRO_BATCH})"),
        c.add_argument("--powersgd-rank", default="4", help="POWERSGD_RANK (default 4)"),
        c.add_argument("--localsgd-period", default="8", help="LOCALSGD_PERIOD (default 8)"),
        c.add_argument("--samples-factor", action="append", default=[], metavar="MODE=X",
                       help="samples to converge of MODE against allreduce's (repeatable; "
                            "default: measured on the demo, SAMPLES_FACTOR)")]
    p.set_defaults(commodity_only=tuple((a.option_strings[0], a.dest, a.default)
                                        for a in commodity_only))


def _measured(args: argparse.Namespace) -> dict[int, float]:
    out = {}
    for item in args.step_ms:
        batch, sep, ms = item.partition("=")
        if not sep or not batch.isdigit() or int(batch) < 1:
            raise UserError(f"--step-ms {item!r}: expected B=MS (a local batch, milliseconds)")
        try:
            out[int(batch)] = _positive(ms) / 1e3
        except UserError as exc:
            raise UserError(f"--step-ms {item!r}: {exc}") from None
    return out


def _flag(name: str, text: str, conv=_positive):
    try:
        return conv(text)
    except UserError as exc:
        raise UserError(f"--{name}: {exc}") from None


def network(args: argparse.Namespace, gpus_per_node: int = 8) -> Network:
    if args.algorithm not in CHOICES:
        raise UserError(f"--algorithm {args.algorithm!r}: expected one of {', '.join(CHOICES)}")
    if args.topology not in TOPOLOGIES:
        raise UserError(f"--topology {args.topology!r}: expected one of {', '.join(TOPOLOGIES)}")
    nics = _flag("nics-per-node", args.nics_per_node)
    if nics != int(nics):
        raise UserError(f"--nics-per-node: expected a whole number, got {args.nics_per_node!r}")
    return Network(gpus_per_node, _flag("nvlink-gbps", args.nvlink_gbps) * 1e9,
                   _flag("nic-gbit", args.nic_gbit) * 1e9 / 8, int(nics),
                   _flag("alpha-nvlink-us", args.alpha_nvlink_us) * 1e-6,
                   _flag("alpha-ib-us", args.alpha_ib_us) * 1e-6, args.algorithm, args.topology)


def _overlap(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise UserError(f"--overlap {text!r}: expected a fraction between 0 and 1")
    return value


def _dtype(name: str | None):
    import torch

    if name is None:
        return None
    if name not in ("float32", "bfloat16", "float16"):
        raise UserError(f"--grad-dtype {name!r}: expected float32, bfloat16 or float16")
    return getattr(torch, name)


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def runs(args: argparse.Namespace) -> list[Run]:
    paths = args.configs or sorted(Path.cwd().glob(CONFIGS))
    if not paths:
        raise UserError(f"no {CONFIGS} in {Path.cwd()}: run it in the checkout, or name the "
                        "config files with --configs")
    for path in paths:
        if not path.is_file():
            raise UserError(f"{path}: no such config file")
    ours = sorted((config_run(p) for p in paths), key=lambda r: (r.gpus, r.global_batch))
    return ours + [published_run(p) for p in load_published()]


def run(args: argparse.Namespace) -> int:
    from bertperf.perfmodel import roofline

    if args.cluster not in CLUSTERS:
        raise UserError(f"--cluster {args.cluster!r}: expected one of {', '.join(CLUSTERS)}")
    if args.cluster == "commodity":
        return commodity(args)
    given = [flag for flag, dest, default in args.commodity_only
             if getattr(args, dest) != default]
    if given:
        raise UserError(f"{', '.join(given)}: only with --cluster commodity")

    measured, net, overlap = _measured(args), network(args), _overlap(args.overlap)
    dtype = _dtype(args.grad_dtype)
    optimizer_ms = None if args.optimizer_ms is None else _flag("optimizer-ms", args.optimizer_ms)
    todo = runs(args)
    buckets = gradient_buckets(dtype)
    params, embedding = parameters()
    grad_dtype = args.grad_dtype or str(params[0].dtype).removeprefix("torch.")

    def compute(r: Run) -> Compute:
        if r.batch in measured and not r.packed:
            ms = measured[r.batch]
            optimizer = optimizer_ms / 1e3 if optimizer_ms else modelled(1, False).optimizer
            return Compute(ms, 2 * ms / 3, optimizer, "measured")
        model = modelled(r.batch, r.packed)
        if optimizer_ms:
            return Compute(model.micro_step, model.backward, optimizer_ms / 1e3, model.source)
        return model

    predictions = [predict(r, compute(r), buckets, net, overlap) for r in todo]
    command = " ".join(["python -m bertperf", *sys.argv[1:]])
    print(f"SCALE MODEL (a model, not a measurement): `{command}`, {datetime.date.today()}, "
          f"computed on {platform.machine()} {platform.system()}")
    print(f"gradients: BERT-large's {sum(p.numel() for p in params):,} parameters in {grad_dtype} "
          f"= {sum(buckets) / 1e9:.3f} GB in {len(buckets)} DDP buckets of "
          f"{min(buckets) / 2**20:.1f}-{max(buckets) / 2**20:.1f} MiB (the last: the "
          f"embeddings, {embedding:,} parameters, never overlapped); overlap {overlap:g} of the "
          f"backward")
    print(f"network: {net.topology} {net.algorithm}; DGX A100 nodes of {net.gpus_per_node} GPUs, "
          f"NVSwitch {net.nvlink / 1e9:g} GB/s a GPU (alpha {net.alpha_nvlink * 1e6:g} us), "
          f"{net.nics_per_node} x {net.nic * 8 / 1e9:g} Gb/s InfiniBand a node = "
          f"{net.nic_per_gpu / 1e9:g} GB/s a GPU (alpha {net.alpha_net * 1e6:g} us)")
    gpu = next(g for g in roofline.GPUS if g.name == GPU)
    print(f"compute: one {GPU}, perfmodel/roofline.py's price of the trainer's bf16 step (Triton "
          f"kernels, FlatLamb; GEMMs at {gpu.matmul_efficiency:.0%} of the tensor peak, attention "
          f"at {gpu.attention_forward_efficiency:.0%}, memory at {gpu.memory_efficiency:.0%} of "
          "the bandwidth, calibrated on published kernel measurements: perfmodel/anchors.csv), or "
          "measured (--step-ms)")
    print("| config | GPUs | global batch | samples to converge | steps | compute ms | "
          "optimizer ms | all-reduce ms exposed (NVLink + IB) / total | step ms | evals | "
          "predicted time to train | published | predicted / published | dominant term |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in predictions:
        r, t = p.run, p.terms
        if r.published is None:
            published, ratio = "none at this GPU count and batch", "-"
        else:
            seconds = r.published.minutes * 60
            published = f"{_duration(seconds)} ({r.published.source})"
            ratio = f"{p.seconds_to_train / seconds:.2f}"
        print(f"| {r.label} | {r.gpus:,} | {r.global_batch:,} | {r.samples:,.0f} "
              f"({r.samples_source}) | {p.steps:,.0f} | {t['compute'] * 1e3:.1f} "
              f"({p.compute.source}) | {t['optimizer'] * 1e3:.1f} | "
              f"{p.exposed.total * 1e3:.1f} ({p.exposed.nvlink * 1e3:.1f} + "
              f"{p.exposed.network * 1e3:.1f}) / {p.comm.total * 1e3:.1f} | "
              f"{p.step_seconds * 1e3:.1f} | {p.evals:.1f} x {p.eval_seconds * 1e3:.0f} ms | "
              f"{_duration(p.seconds_to_train)} | {published} | {ratio} | {p.dominant} |")
    checked = [p for p in predictions  # the published runs' rows, not the configs'
               if p.run.samples_source == "its logs" and p.run.published.label in CALIBRATION]
    if checked:
        print(f"calibration check, with this run's flags: {describe_calibration(checked)}")
    print(f"\nall-reduce of the {len(buckets)} buckets, ms a step (none hidden), by topology and "
          "algorithm:")
    nodes = sorted({r.nodes for r in todo})
    print("| topology, algorithm | " + " | ".join(f"{n * net.gpus_per_node:,} GPUs" for n in nodes)
          + " |")
    print("|---|" + "---|" * len(nodes))
    for topology in TOPOLOGIES:
        for algorithm in ALGORITHMS:
            other = replace(net, algorithm=algorithm, topology=topology)
            cells = [sum((allreduce(b, n, other) for b in buckets), Comm()).total * 1e3
                     for n in nodes]
            print(f"| {topology}, {algorithm} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    return 0


def _list(name: str, text: str, conv=_positive) -> list:
    try:
        return [conv(item) for item in text.split(",")]
    except UserError as exc:
        raise UserError(f"--{name} {text!r}: {exc}") from None


def _whole(text: str) -> int:
    value = _positive(text)
    if value != int(value):
        raise UserError(f"expected a whole number, got {text!r}")
    return int(value)


def _mode(text: str) -> str:
    if text not in MODES:
        raise UserError(f"expected one of {', '.join(MODES)}")
    return text


def _days(seconds: float) -> str:
    if seconds < 7200:
        return _duration(seconds)
    return f"{seconds / 3600:.1f} h" if seconds < 2 * 86400 else f"{seconds / 86400:.1f} days"


def commodity(args: argparse.Namespace) -> int:
    """`model scale --cluster commodity`: every GRAD_COMM mode on nodes of PCIe GPUs joined by one
    Ethernet NIC a node, at a config's global batch."""
    from bertperf.perfmodel import roofline

    wanted = _list("gpu", args.gpu, str)
    unknown = [g for g in wanted if g not in COMMODITY_GPUS]
    if unknown:
        raise UserError(f"--gpu {unknown[0]!r}: expected one of {', '.join(COMMODITY_GPUS)}")
    nodes = _list("nodes", args.nodes, _whole)
    per_node = _list("gpus-per-node", args.gpus_per_node, _whole)
    gbits = _list("ethernet-gbit", args.ethernet_gbit)
    modes = _list("grad-comm", args.grad_comm, _mode)
    batch = _flag("micro-batch", args.micro_batch, _whole)
    rank = _flag("powersgd-rank", args.powersgd_rank, _whole)
    period = _flag("localsgd-period", args.localsgd_period, _whole)
    factors = dict(SAMPLES_FACTOR)
    for item in args.samples_factor:
        mode, sep, value = item.partition("=")
        if not sep or mode not in MODES:
            raise UserError(f"--samples-factor {item!r}: expected MODE=X, MODE one of "
                            f"{', '.join(MODES)}")
        factors[mode] = _flag("samples-factor", value)
    overlap = _overlap(args.overlap)
    if args.configs and len(args.configs) > 1:
        raise UserError("--configs: --cluster commodity takes one config (its global batch)")
    path = args.configs[0] if args.configs else Path.cwd() / COMMODITY_CONFIG
    if not path.is_file():
        raise UserError(f"{path}: no such config file (--configs names the one whose global "
                        "batch a commodity cluster keeps)")
    config = config_run(path)
    try:
        warmup = int(read_config(path).get("WARMUP_STEPS", "0"))
    except ValueError:
        raise UserError(f"{path}: WARMUP_STEPS is not a whole number") from None
    calibrated, refused = [], []
    for name in wanted:
        try:
            calibrated.append((COMMODITY_GPUS[name], slowdown(COMMODITY_GPUS[name])))
        except UserError as exc:
            refused.append(str(exc))
    if not calibrated:
        raise UserError("; ".join(refused))
    gbs = config.global_batch
    shapes = []
    for n, g in itertools.product(nodes, per_node):
        steps, left = divmod(gbs, n * g * batch)
        if left or not steps:
            raise UserError(f"{n} nodes x {g} GPUs x micro-batch {batch} does not divide "
                            f"{path.name}'s global batch {gbs:,} into whole micro-steps")
        shapes.append((n, g, steps))

    params = parameters()[0]
    total = sum(p.numel() * p.element_size() for p in params)
    anchors = roofline.anchors()
    command = " ".join(["python -m bertperf", *sys.argv[1:]])
    print(f"COMMODITY CLUSTER MODEL (model predictions, not measurements): `{command}`, "
          f"{datetime.date.today()}, computed on {platform.machine()} {platform.system()}")
    print(f"run: {path.name}'s global batch {gbs:,} (nodes x GPUs x micro-batch {batch} x "
          f"GRADIENT_STEPS), {config.samples:,.0f} samples to converge (MLPerf RCP {gbs}, for "
          "allreduce; x the mode's samples factor: "
          f"{', '.join(f'{m} {f:g}' for m, f in factors.items())}, "
          "measured on the demo by bench comm, not on BERT-large; compressed modes may need "
          f"more), evals every {config.eval_interval:,} samples; powersgd and localsgd start "
          f"after the {warmup} warm-up steps (plain all-reduce before)")
    a100 = anchors[SPEED_ANCHOR, roofline.A100]
    for gpu, k in calibrated:
        mine = anchors[SPEED_ANCHOR, gpu.name]
        print(f"compute on a {gpu.name}: the A100's (the trainer's traced varlen step, perfmodel/"
              f"roofline.py) x {k:.2f}, calibrated: {a100.value:g} / {mine.value:g} seq/s, "
              f"{mine.what} ({mine.source}; perfmodel/anchors.csv) (the datasheets' tensor peaks "
              f"alone: x {roofline.PEAKS[roofline.A100][0] / gpu.tensor_flops:.2f})")
    for line in refused:
        print(line)
    net = network(args)
    print(f"network: {net.topology} {net.algorithm}; in a node a ring over PCIe at each GPU's x16 "
          f"link (alpha {ALPHA_PCIE_US:g} us); across nodes one Ethernet NIC a node shared by its "
          f"GPUs (alpha {net.alpha_net * 1e6:g} us): reduce-scatter in the node, all-reduce of "
          "M/G a GPU across the nodes at NIC/G, all-gather in the node; BERT-large's "
          f"{total / 1e9:.3f} GB of fp32 gradients a step in DDP's buckets")
    print(f"paper: {PAPER}")
    print("| cluster | GRAD_COMM | MB a step across nodes (a GPU's collectives / each node's "
          "link) | compute ms | optimizer ms | all-reduce ms exposed (PCIe + Ethernet) / total | "
          "compression ms | step ms | samples to converge | steps (plain first) | "
          "predicted time to train | Lin et al. 2020 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    a100_step = modelled(batch, False)
    for (gpu, k), (n, g, micro_steps), gbit in itertools.product(calibrated, shapes, gbits):
        compute = Compute(a100_step.micro_step * k, a100_step.backward * k,
                          a100_step.optimizer * k, f"A100 x {k:.2f}")
        cluster = Network(g, gpu.pcie, gbit * 1e9 / 8, 1, ALPHA_PCIE_US * 1e-6,
                          net.alpha_net, net.algorithm, net.topology)
        run = replace(config, label=f"{n} x {g} {gpu.name}, {gbit:g} Gb/s Ethernet", nodes=n,
                      gpus_per_node=g, batch=batch, accumulation=micro_steps, packed=False,
                      packing_factor=1.0, published=None)
        for mode in modes:
            m = commodity_mode(run, compute, gpu, cluster, mode, overlap, rank, period, warmup,
                               factors[mode])
            p, t = m.prediction, m.prediction.terms
            wire = 2 * (n - 1) / n * m.world_bytes
            print(f"| {run.label} | {mode} | {m.world_bytes / 1e6:,.1f} / {wire / 1e6:,.1f} | "
                  f"{t['compute'] * 1e3:,.0f} | {t['optimizer'] * 1e3:.0f} | "
                  f"{p.exposed.total * 1e3:,.0f} ({p.exposed.nvlink * 1e3:,.0f} + "
                  f"{p.exposed.network * 1e3:,.0f}) / {p.comm.total * 1e3:,.0f} | "
                  f"{t['compression'] * 1e3:.0f} | {p.step_seconds * 1e3:,.0f} | "
                  f"{p.run.samples:,.0f} (x {factors[mode]:g}) | {p.steps:,.0f} ({m.start}) | "
                  f"{_days(m.seconds_to_train)} | 12 days (hardware not known) |")
    return 0
