"""`python -m bertperf model scale`: a performance model of the trainer on DGX A100 clusters (a
model, not a measurement; commodity clusters: perfmodel/commodity.py). From a single-GPU step
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

The all-reduce: perfmodel/network.py (NCCL's cost model), DGX A100 nodes of 8 GPUs on NVSwitch,
8 x 200 Gb/s InfiniBand a node (25 GB/s a GPU), hierarchical and the faster of ring and tree
by default.

Time to train = S / GBS steps x the step + S / interval evals, S the samples to converge: the
mean of MLPerf's reference convergence points for the config's global batch (ruleset 5.0.0,
mlperf/rcp.py), or for a published run the mean samples its logs trained. Not modelled: the
time between run_start and the first step, NCCL's kernels slowing the compute they overlap,
the spread of work across ranks (BALANCE), stragglers, SHARP.
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import subprocess
import sys
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from bertperf.benchmark import EVAL_SAMPLES
from bertperf.config import reference_eval_interval
from bertperf.errors import UserError
from bertperf.perfmodel import TOLERANCE
from bertperf.perfmodel.bert import Compute, gradient_buckets, modelled, parameters
from bertperf.perfmodel.gpus import A100
from bertperf.perfmodel.network import (ALGORITHMS, ALPHA_NET_US, ALPHA_NVLINK_US, CHOICES,
                                        NIC_GBIT, NICS_PER_NODE, NVLINK_GBPS, TOPOLOGIES, Comm,
                                        Network, allreduce)
from bertperf.perfmodel.timing import Prediction, duration

CONFIGS = "config_DGXA100_*x*.sh"
"""The config files modelled by default, in the current folder (the checkout's root)."""
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
class Step:
    """A run's step on every GPU, its parts, and its time to train (`time`)."""

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

    @cached_property
    def time(self) -> Prediction:
        """The run's time to train, term by term (TERMS)."""
        r = self.run
        steps, evals = r.samples / r.global_batch, r.samples / r.eval_interval
        per_step = (r.accumulation * self.compute.micro_step, self.compute.optimizer,
                    self.exposed.nvlink, self.exposed.network, self.compression)
        terms = {name: steps * seconds for name, seconds in zip(TERMS, per_step)}
        return Prediction(r.samples, r.global_batch, evals,
                          {**terms, "evals": evals * self.eval_seconds})


def predict(run: Run, compute: Compute, buckets: list[int], net: Network,
            overlap: float) -> Step:
    """The run's step and time to train (module docstring)."""
    net = replace(net, gpus_per_node=run.gpus_per_node)
    return overlapped(run, compute, [allreduce(b, run.nodes, net) for b in buckets], overlap)


def overlapped(run: Run, compute: Compute, buckets: list[Comm], overlap: float,
               after: Comm = Comm(), compression: float = 0.0) -> Step:
    """The run's step from each bucket's communication in all-reduce order (the buckets but the
    last under at most `overlap` of the backward), `after` the step's communication that
    nothing hides and `compression` its compression compute (module docstring)."""
    *early, last = buckets
    rest = sum(early, Comm())
    hidden = min(rest.total, overlap * compute.backward)
    exposed = last + after + (rest.scaled(1 - hidden / rest.total) if rest.total else rest)
    shares = math.ceil(math.ceil(EVAL_SAMPLES / run.gpus) / run.sequences_per_micro_batch)
    return Step(run, compute, rest + last + after, exposed, shares * compute.micro_step / 3,
                compression)


# ---- the calibration check -----------------------------------------------------------------------

CALIBRATION = ("v2.0 NVIDIA 1xDGX A100", "v2.1 NVIDIA 1xDGX A100")
"""The published runs the model's A100 prediction is checked against (tests/unit/
test_model_scale.py): NVIDIA's closed 1xDGX A100 runs, fp16 (the A100's fp16 and bf16 tensor
peaks are the same), 56 unpadded sequences a GPU, fused bias/GeLU/dropout/LayerNorm kernels and
fused attention (FMHA), no CUDA graphs (config_DGXA100_1x8x56x1.sh of their pytorch and
pytorch-22.09 folders): 300 and 304 sequences/s a GPU, evals included."""


def per_gpu_rate(p: Step) -> float:
    """Sequences/s a GPU over the whole run, evals included (how the result logs' rate is
    counted: samples / run time / GPUs)."""
    return p.run.samples / p.time.seconds / p.run.gpus


def published_per_gpu_rate(run: Run) -> float:
    return run.published.samples / (run.published.minutes * 60) / run.gpus


def calibration() -> list[Step]:
    """The model's predictions of the CALIBRATION runs: the trainer's varlen bf16 step with the
    Triton kernels and FlatLamb at their 56 sequences a GPU on the A100 (`modelled`), their 8
    GPUs' all-reduce, LAMB and evals, with model scale's defaults."""
    net = Network(8, NVLINK_GBPS * 1e9, NIC_GBIT * 1e9 / 8, NICS_PER_NODE)
    runs = [published_run(p) for p in load_published() if p.label in CALIBRATION]
    return [predict(r, modelled(r.batch, r.packed), gradient_buckets(), net, 1.0) for r in runs]


def describe_calibration(predictions: list[Step]) -> str:
    """One line: each CALIBRATION run's predicted and published rate a GPU."""
    def one(p: Step) -> str:
        ours, theirs = per_gpu_rate(p), published_per_gpu_rate(p.run)
        return (f"{p.run.published.label}: predicted {ours:.0f} seq/s a GPU, published "
                f"{theirs:.0f} ({ours / theirs:.2f}x)")

    return ("A100 (NVIDIA's MLPerf 1xDGX A100 runs, fp16, 56 unpadded sequences a GPU; model "
            "scale's model, evals included): " + "; ".join(one(p) for p in predictions)
            + f" (tests/unit/test_model_scale.py holds it within {TOLERANCE:.0%})")


# ---- the command ---------------------------------------------------------------------------------

def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise UserError(f"expected a positive number, got {text!r}")
    return value


def flag(name: str, text: str, conv=positive):
    """A flag's value by `conv`; a UserError naming the flag."""
    try:
        return conv(text)
    except UserError as exc:
        raise UserError(f"--{name}: {exc}") from None


def overlap_of(text: str) -> float:
    """--overlap: a fraction between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise UserError(f"--overlap {text!r}: expected a fraction between 0 and 1")
    return value


def network_of(algorithm: str, topology: str, gpus_per_node: int = 8,
               nvlink_gbps: str = str(NVLINK_GBPS), nic_gbit: str = str(NIC_GBIT),
               nics_per_node: str = str(NICS_PER_NODE),
               alpha_nvlink_us: str = str(ALPHA_NVLINK_US),
               alpha_net_us: str = str(ALPHA_NET_US)) -> Network:
    """The network the flags describe (a DGX A100 cluster's by default)."""
    if algorithm not in CHOICES:
        raise UserError(f"--algorithm {algorithm!r}: expected one of {', '.join(CHOICES)}")
    if topology not in TOPOLOGIES:
        raise UserError(f"--topology {topology!r}: expected one of {', '.join(TOPOLOGIES)}")
    nics = flag("nics-per-node", nics_per_node)
    if nics != int(nics):
        raise UserError(f"--nics-per-node: expected a whole number, got {nics_per_node!r}")
    return Network(gpus_per_node, flag("nvlink-gbps", nvlink_gbps) * 1e9,
                   flag("nic-gbit", nic_gbit) * 1e9 / 8, int(nics),
                   flag("alpha-nvlink-us", alpha_nvlink_us) * 1e-6,
                   flag("alpha-ib-us", alpha_net_us) * 1e-6, algorithm, topology)


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


def _measured(args: argparse.Namespace) -> dict[int, float]:
    out = {}
    for item in args.step_ms:
        batch, sep, ms = item.partition("=")
        if not sep or not batch.isdigit() or int(batch) < 1:
            raise UserError(f"--step-ms {item!r}: expected B=MS (a local batch, milliseconds)")
        try:
            out[int(batch)] = positive(ms) / 1e3
        except UserError as exc:
            raise UserError(f"--step-ms {item!r}: {exc}") from None
    return out


def _dtype(name: str | None):
    import torch

    if name is None:
        return None
    if name not in ("float32", "bfloat16", "float16"):
        raise UserError(f"--grad-dtype {name!r}: expected float32, bfloat16 or float16")
    return getattr(torch, name)


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

    measured, overlap = _measured(args), overlap_of(args.overlap)
    net = network_of(args.algorithm, args.topology, 8, args.nvlink_gbps, args.nic_gbit,
                     args.nics_per_node, args.alpha_nvlink_us, args.alpha_ib_us)
    dtype = _dtype(args.grad_dtype)
    optimizer_ms = None if args.optimizer_ms is None else flag("optimizer-ms", args.optimizer_ms)
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
    gpu = roofline.GPUS[A100]
    print(f"compute: one {A100}, perfmodel/roofline.py's price of the trainer's bf16 step (Triton "
          f"kernels, FlatLamb; GEMMs at {gpu.matmul_efficiency:.0%} of the tensor peak, attention "
          f"at {gpu.attention_forward_efficiency:.0%}, memory at {gpu.memory_efficiency:.0%} of "
          "the bandwidth, calibrated on published kernel measurements: perfmodel/anchors.csv), or "
          "measured (--step-ms)")
    print("| config | GPUs | global batch | samples to converge | steps | compute ms | "
          "optimizer ms | all-reduce ms exposed (NVLink + IB) / total | step ms | evals | "
          "predicted time to train | published | predicted / published | dominant term |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in predictions:
        r, t = p.run, p.time.per_step
        if r.published is None:
            published, ratio = "none at this GPU count and batch", "-"
        else:
            seconds = r.published.minutes * 60
            published = f"{duration(seconds)} ({r.published.source})"
            ratio = f"{p.time.seconds / seconds:.2f}"
        print(f"| {r.label} | {r.gpus:,} | {r.global_batch:,} | {r.samples:,.0f} "
              f"({r.samples_source}) | {p.time.steps:,.0f} | {t['compute'] * 1e3:.1f} "
              f"({p.compute.source}) | {t['optimizer'] * 1e3:.1f} | "
              f"{p.exposed.total * 1e3:.1f} ({p.exposed.nvlink * 1e3:.1f} + "
              f"{p.exposed.network * 1e3:.1f}) / {p.comm.total * 1e3:.1f} | "
              f"{p.time.step_seconds * 1e3:.1f} | {p.time.evals:.1f} x "
              f"{p.eval_seconds * 1e3:.0f} ms | {duration(p.time.seconds)} | {published} | "
              f"{ratio} | {p.time.dominant} |")
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
