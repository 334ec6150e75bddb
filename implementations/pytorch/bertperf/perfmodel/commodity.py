"""`python -m bertperf model commodity`: the trainer on a commodity cluster (a model, not a
measurement): N nodes of G PCIe GPUs at one config's global batch, every GRAD_COMM mode. In the
node a ring at the GPU's PCIe link, across nodes one Ethernet NIC a node shared by the G GPUs
(nics_per_node 1: M/G a GPU at NIC/G), hierarchical (perfmodel/network.py). Each mode is priced
by its family (train/comm.py's Mode facts): allreduce, its buckets in the mode's element bytes;
powersgd, P, Q and the tensors sent whole, and the compression's compute (powersgd_seconds);
localsgd, the node's own all-reduce and the parameters over all ranks every LOCALSGD_PERIOD
steps, amortised. A mode that waits (Mode.start) all-reduces plainly until the end of the
config's LR warm-up. A GPU's compute is the A100's times the ratio of the two GPUs' published
BERT-large rates with one code (anchors.csv, bert.SPEED_ANCHOR); a GPU without one, times the
ratio of roofline's prices of the trainer's step on the two (perfmodel/gpus.py's datasheets),
said so (bert.speedup).
Samples: the RCP's times the mode's samples factor (Mode.samples_factor).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import platform
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from bertperf.errors import UserError
from bertperf.perfmodel import gpus, scale
from bertperf.perfmodel.bert import (SPEED_ANCHOR, Compute, bucket_gradients, gradient_buckets,
                                     modelled, parameters, speedup)
from bertperf.perfmodel.network import ALPHA_PCIE_US, Comm, Network, allreduce

ETHERNET_GBIT = "10,25"
"""The default Ethernet rates, Gb/s a direction: 10GBASE and 25GBASE line rates (IEEE 802.3ae-2002
and 802.3by-2016). TCP/IP's headers (about 5 % at a 1,500-byte MTU) are not taken off."""
CONFIG = "config_DGXA100_8x8x48x1.sh"
"""The config whose global batch (3,072: its RCP row's samples apply) and warm-up a commodity
cluster keeps: nodes x GPUs a node x micro-batch x GRADIENT_STEPS = 3,072."""
MICRO_BATCH = 16
"""Sequences a micro-batch on a commodity GPU (unpadded: about the tokens of the 8 padded
sequences DeepLearningExamples runs on a V100 32GB in phase 2)."""
DEFAULT_GPUS = ("V100 32GB", "RTX 3090", "RTX A5000")
PAPER = ("Lin, Li and Pekhimenko, arXiv 2008.00177: BERT pre-trained in 12 days on an "
         "academic-size cluster of widely available GPUs (the abstract, the only public part, "
         "names no hardware; a full pre-training, not MLPerf's phase-2 run from the checkpoint "
         "to 0.72 MLM accuracy, so not the same work)")


def choices() -> list[str]:
    """The GPUs a commodity cluster is made of: perfmodel/gpus.py's PCIe cards (no DGX)."""
    return [name for name, g in gpus.GPUS.items() if g.network is None]


def slowdown(gpu: gpus.Gpu) -> tuple[float, str]:
    """How many times the A100's time the trainer's step takes on `gpu`, and how that is known
    (bert.speedup: published BERT-large rates of both, else roofline's ratio)."""
    k, how = speedup((gpu.name, "fp16"), (gpus.A100, "fp16"))
    if how == "roofline":
        return k, (f"derived: no published BERT-large rate of it ({SPEED_ANCHOR}), so "
                   "roofline's ratio of the trainer's step on the two GPUs' datasheets "
                   f"(perfmodel/gpus.py), its kernels at the {gpu.calibrated_on}'s measured "
                   "efficiencies")
    return k, f"calibrated: {how}"


def powersgd_split(grad, rank: int) -> tuple[int, int] | None:
    """(n, m) of a gradient PowerSGD compresses at `rank` (torch's powerSGD_hook: viewed as
    n = its first dimension by m, compressed where (n + m) r x 2 < n m); None if sent whole."""
    if grad.dim() < 2:
        return None
    n = grad.shape[0]
    m = grad.numel() // n
    return (n, m) if (n + m) * rank * 2 < n * m else None


def mode_messages(mode, rank: int) -> list[list[int]]:
    """Bytes of each all-reduce over all ranks a step of `mode` (a train.comm.Mode) once it has
    started, bucket by bucket: family allreduce, the bucket in the mode's element bytes;
    powersgd, its whole tensors, P and Q (three all-reduces a bucket); none for localsgd (the
    node's all-reduce and the periodic average are commodity_mode's)."""
    out = []
    for bucket in bucket_gradients():
        numel = sum(g.numel() for g in bucket)
        if mode.family == "allreduce":
            out.append([numel * mode.element_bytes])
        elif mode.family == "localsgd":
            out.append([])
        else:
            whole = p = q = 0
            for g in bucket:
                split = powersgd_split(g, rank)
                if split is None:
                    whole += g.numel()
                else:
                    p, q = p + split[0] * rank, q + split[1] * rank
            out.append([n * mode.element_bytes for n in (whole, p, q) if n])
    return out


def powersgd_seconds(gpu: gpus.Gpu, rank: int, itemsize: int) -> float:
    """Compressing and decompressing every gradient PowerSGD compresses, a step, priced by
    roofline on `gpu` (its datasheet at its kernels_like GPU's measured fractions): for each
    n x m gradient M (e = n m elements) torch's hook adds the error (reads M and the error,
    writes M), P = M Q (2 e r FLOPs), orthogonalises P (Gram-Schmidt, 4 n r^2 FLOPs, r
    launches), Q = M^T P (2 e r), M = P Q^T (2 e r) and the new error (reads both Ms, writes
    it); its matmuls in float32, at the float32 peak."""
    from bertperf.perfmodel import roofline

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
    return roofline.step_cost(ops, roofline.GPUS[gpu.name]).seconds


@dataclass(frozen=True)
class ModeRun:
    """A GRAD_COMM mode on a commodity cluster: its step once it has started, the plain step
    before (the warm-up), and the bytes it hands to collectives over all ranks a step."""

    mode: str
    step: scale.Step
    plain: scale.Step
    start: int
    """Steps of plain all-reduce before the mode starts (Mode.start: the warm-up)."""
    world_bytes: float

    @property
    def seconds_to_train(self) -> float:
        p = self.step.time
        return p.seconds + self.start * (self.plain.time.step_seconds - p.step_seconds)


def commodity_mode(run: scale.Run, compute: Compute, gpu: gpus.Gpu, net: Network, name: str,
                   overlap: float, rank: int, period: int, warmup: int,
                   factor: float) -> ModeRun:
    """GRAD_COMM `name` on the cluster `run` (its samples x `factor`), the network `net`, the
    config's LR warm-up ending at step `warmup`."""
    from bertperf.train.comm import MODES

    mode = MODES[name]
    net = replace(net, gpus_per_node=run.gpus_per_node)
    params = parameters()[0]
    full = [[b] for b in gradient_buckets()]
    ran = replace(run, samples=run.samples * factor,
                  samples_source=f"{run.samples_source} x {factor:g}")

    def buckets(messages: list[list[int]], nodes: int) -> list[Comm]:
        return [sum((allreduce(m, nodes, net) for m in bucket), Comm()) for bucket in messages]

    plain = scale.overlapped(ran, compute, buckets(full, run.nodes), overlap)
    if mode.family == "localsgd":
        parameters_bytes = sum(p.numel() * p.element_size() for p in params)
        average = allreduce(parameters_bytes, run.nodes, net).scaled(1 / period)
        step = scale.overlapped(ran, compute, buckets(full, 1), overlap, after=average)
        world = parameters_bytes / period
    else:
        messages = mode_messages(mode, rank)
        extra = powersgd_seconds(gpu, rank, mode.element_bytes) \
            if mode.family == "powersgd" else 0.0
        step = scale.overlapped(ran, compute, buckets(messages, run.nodes), overlap,
                                compression=extra)
        world = sum(map(sum, messages))
    return ModeRun(name, step, plain, mode.first_step(None, warmup), world)


# ---- the command ---------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    from bertperf.config import GRAD_COMMS

    p.add_argument("--configs", nargs=1, type=Path,
                   help=f"the config whose global batch and warm-up the cluster keeps (default: "
                        f"{CONFIG} in the current folder, as in the checkout)")
    p.add_argument("--gpu", default=",".join(DEFAULT_GPUS),
                   help=f"GPUs, comma-separated, of {', '.join(choices())} (default: "
                        f"{','.join(DEFAULT_GPUS)})")
    p.add_argument("--nodes", default="4", help="node counts, comma-separated (default 4)")
    p.add_argument("--gpus-per-node", default="8",
                   help="GPUs a node, comma-separated (default 8)")
    p.add_argument("--ethernet-gbit", default=ETHERNET_GBIT,
                   help=f"one NIC a node, Gb/s, comma-separated (default {ETHERNET_GBIT})")
    p.add_argument("--grad-comm", default=",".join(GRAD_COMMS),
                   help="GRAD_COMM modes, comma-separated (default: all)")
    p.add_argument("--micro-batch", default=str(MICRO_BATCH),
                   help=f"sequences a micro-batch (default {MICRO_BATCH})")
    p.add_argument("--powersgd-rank", default="4", help="POWERSGD_RANK (default 4)")
    p.add_argument("--localsgd-period", default="8", help="LOCALSGD_PERIOD (default 8)")
    p.add_argument("--samples-factor", action="append", default=[], metavar="MODE=X",
                   help="samples to converge of MODE against allreduce's (repeatable; "
                        "default: the mode's, measured on the demo)")
    p.add_argument("--overlap", default="1.0",
                   help="fraction of the backward pass the all-reduce of the buckets but the "
                        "last can hide under, 0..1 (default 1)")
    p.add_argument("--algorithm", default="auto",
                   help="ring, tree or auto: the faster of the two for each all-reduce, as "
                        "NCCL's tuner picks (default auto)")
    p.add_argument("--topology", default="hierarchical",
                   help="hierarchical or flat (default hierarchical)")
    p.add_argument("--alpha-ib-us", default=str(scale.ALPHA_NET_US),
                   help=f"latency a step on the network, us (default {scale.ALPHA_NET_US:g})")


def _list(name: str, text: str, conv=scale.positive) -> list:
    try:
        return [conv(item) for item in text.split(",")]
    except UserError as exc:
        raise UserError(f"--{name} {text!r}: {exc}") from None


def _whole(text: str) -> int:
    value = scale.positive(text)
    if value != int(value):
        raise UserError(f"expected a whole number, got {text!r}")
    return int(value)


def run(args: argparse.Namespace) -> int:
    """Every GRAD_COMM mode on nodes of PCIe GPUs joined by one Ethernet NIC a node, at a
    config's global batch."""
    from bertperf.config import GRAD_COMMS
    from bertperf.train.comm import MODES

    def _mode(text: str) -> str:
        if text not in GRAD_COMMS:
            raise UserError(f"expected one of {', '.join(GRAD_COMMS)}")
        return text

    def _gpu(text: str) -> gpus.Gpu:
        if text not in choices():
            raise UserError(f"expected one of {', '.join(choices())}")
        return gpus.GPUS[text]

    wanted = _list("gpu", args.gpu, _gpu)
    nodes = _list("nodes", args.nodes, _whole)
    per_node = _list("gpus-per-node", args.gpus_per_node, _whole)
    gbits = _list("ethernet-gbit", args.ethernet_gbit)
    modes = _list("grad-comm", args.grad_comm, _mode)
    batch = scale.flag("micro-batch", args.micro_batch, _whole)
    rank = scale.flag("powersgd-rank", args.powersgd_rank, _whole)
    period = scale.flag("localsgd-period", args.localsgd_period, _whole)
    factors = {name: MODES[name].samples_factor for name in GRAD_COMMS}
    for item in args.samples_factor:
        mode, sep, value = item.partition("=")
        if not sep or mode not in GRAD_COMMS:
            raise UserError(f"--samples-factor {item!r}: expected MODE=X, MODE one of "
                            f"{', '.join(GRAD_COMMS)}")
        factors[mode] = scale.flag("samples-factor", value)
    overlap = scale.overlap_of(args.overlap)
    net = scale.network_of(args.algorithm, args.topology, alpha_net_us=args.alpha_ib_us)
    path = args.configs[0] if args.configs else Path.cwd() / CONFIG
    if not path.is_file():
        raise UserError(f"{path}: no such config file (--configs names the one whose global "
                        "batch a commodity cluster keeps)")
    config = scale.config_run(path)
    try:
        warmup = int(scale.read_config(path).get("WARMUP_STEPS", "0"))
    except ValueError:
        raise UserError(f"{path}: WARMUP_STEPS is not a whole number") from None
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
    waits = [name for name in modes if MODES[name].start is not None]
    command = " ".join(["python -m bertperf", *sys.argv[1:]])
    print(f"COMMODITY CLUSTER MODEL (model predictions, not measurements): `{command}`, "
          f"{datetime.date.today()}, computed on {platform.machine()} {platform.system()}")
    print(f"run: {path.name}'s global batch {gbs:,} (nodes x GPUs x micro-batch {batch} x "
          f"GRADIENT_STEPS), {config.samples:,.0f} samples to converge (MLPerf RCP {gbs}, for "
          "allreduce; x the mode's samples factor: "
          f"{', '.join(f'{m} {factors[m]:g}' for m in modes)}, "
          "measured on the demo by bench comm, not on BERT-large; compressed modes may need "
          f"more), evals every {config.eval_interval:,} samples"
          + (f"; {', '.join(waits)} start after the {warmup} warm-up steps (plain all-reduce "
             "before)" if waits else ""))
    calibrated = []
    a100 = gpus.GPUS[gpus.A100]
    for gpu in wanted:
        k, how = slowdown(gpu)
        calibrated.append((gpu, k))
        print(f"compute on a {gpu.name}: the A100's (the trainer's traced varlen step, perfmodel/"
              f"roofline.py) x {k:.2f}, {how} (the datasheets' tensor peaks alone: x "
              f"{a100.tensor_flops / gpu.tensor_flops:.2f})")
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
        run_ = replace(config, label=f"{n} x {g} {gpu.name}, {gbit:g} Gb/s Ethernet", nodes=n,
                       gpus_per_node=g, batch=batch, accumulation=micro_steps, packed=False,
                       packing_factor=1.0, published=None)
        for mode in modes:
            m = commodity_mode(run_, compute, gpu, cluster, mode, overlap, rank, period, warmup,
                               factors[mode])
            s, p = m.step, m.step.time
            t = p.per_step
            wire = 2 * (n - 1) / n * m.world_bytes
            print(f"| {run_.label} | {mode} | {m.world_bytes / 1e6:,.1f} / {wire / 1e6:,.1f} | "
                  f"{t['compute'] * 1e3:,.0f} | {t['optimizer'] * 1e3:.0f} | "
                  f"{s.exposed.total * 1e3:,.0f} ({s.exposed.nvlink * 1e3:,.0f} + "
                  f"{s.exposed.network * 1e3:,.0f}) / {s.comm.total * 1e3:,.0f} | "
                  f"{t['compression'] * 1e3:.0f} | {p.step_seconds * 1e3:,.0f} | "
                  f"{p.samples:,.0f} (x {factors[mode]:g}) | {p.steps:,.0f} ({m.start}) | "
                  f"{scale.duration(m.seconds_to_train)} | 12 days (hardware not known) |")
    return 0
