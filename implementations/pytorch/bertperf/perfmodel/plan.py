"""`python -m bertperf plan`: the configurations MLPerf BERT can run on a cluster, each with its
predicted time to train, GPU-hours and the term that dominates (perfmodel/cluster.py with the
overheads `model validate` fits: a model, not a measurement), the fastest of the closed and of
the open division marked; --write writes them as config_<SYSTEM>_<n>x<g>x<b>x<a>.sh files that
`run_and_time.sh --check` takes.

Candidates: every global batch of MLPerf's RCP table the GPUs divide, and every global batch of
one micro-batch a step between the table's smallest and largest (or --global-batch), varlen
(sequences) and packed (rows of PACKING_FACTOR sequences; where both divide, the model prices
them the same and lists varlen), the largest micro-batch the GPU's memory holds (MAX_BATCH
scaled by memory) and the fewest micro-batches a step; SHARDED_LAMB 0 and 1 (with
GRAD_COMM=allreduce); each GRAD_COMM mode cluster.py prices (PRICED: allreduce and bf16, in the
division its Mode entry allows: both closed); in the open division LAYERWISE (LAYERWISE_RUN:
MSLT, its stages' steps traced and priced by `model layerwise`, about 20 s; --layerwise none
skips it), which the model takes to converge in normal training's samples, as `bench layerwise`
measured on the demo. Samples to converge: the RCP checker's reference at the batch
(mlperf/rcp.py reference_for: a row's olympic mean, or interpolated between the rows around it)
times the mode's samples factor (Mode.samples_factor); a config's hyperparameters: the nearest
RCP row's. The trainer's own traffic: fp32 gradients all-reduced in DDP's buckets (bf16: half
the bytes), the replicated LAMB
step on every GPU, or with SHARDED_LAMB the gradients reduce-scattered after the backward and
1/(N G) of LAMB a GPU. A GPU's rate is NVIDIA's MLPerf code's on it (model validate's
calibration): this trainer's own rate on a GPU has not been measured.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import math
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from bertperf.benchmark import CLOSED, OPEN, RULESET
from bertperf.errors import UserError
from bertperf.formats.outputs import claim
from bertperf.perfmodel import bert, cluster, gpus, network
from bertperf.perfmodel.timing import duration

MAX_BATCH = {"varlen": 56, "packed": 48}
"""The largest micro-batch a GPU with 80 GB trains (sequences; packed: rows): NVIDIA's A100 and
H100 single-node configs; scaled by the GPU's memory."""
PACKING_FACTOR = 2
PRICED = ("allreduce",)
"""The GRAD_COMM families (train/comm.py's Mode.family) cluster.py prices: every bucket reduced
in the mode's element bytes (PowerSGD and local SGD: `model commodity`). Of modes that price the
same (bf16 and fp16) plan lists the first."""
LAYERWISE_RUN = "mslt"
"""The LAYERWISE recipe priced in the open division: model layerwise's GPU_RUNS entry (bench
layerwise's three-stage MSLT scaled to 24 layers), with LAYERWISE_SCHEDULE=restart."""
LAYERWISE_BATCH = 56
"""The micro-batch the stages' steps are traced at (their ratios to the whole model's step are
taken to hold at every batch and on every GPU)."""
PRECISIONS = {"bf16": "fp16", "fp8": "fp8"}
"""PRECISION the config trains in -> the calibration it is priced on (16-bit: NVIDIA's fp16)."""
LATEST_ROUND = "v5.0"


@dataclass(frozen=True)
class Candidate:
    division: str
    layout: str
    global_batch: int
    batch: int
    accumulation: int
    grad_comm: str
    sharded: bool
    samples: float
    prediction: cluster.Prediction
    layerwise: str | None = None
    """LAYERWISE's value (None: the whole model trains)."""

    @property
    def seconds(self) -> float:
        return self.prediction.seconds


def rate(gpu: str, precision: str, calibrations: dict,
         over: cluster.Overheads) -> tuple[float, str]:
    """The GPU's rate (model validate's rate_for, as of the latest round: its own calibration,
    else another's times roofline's speedup between the two)."""
    from bertperf.perfmodel import validate

    if precision == "fp8" and not gpus.GPUS[gpu].fp8_flops:
        raise UserError(f"--gpu {gpu!r} --precision fp8: it has no FP8 tensor cores (FP8=1 "
                        f"needs one of {', '.join(fp8_gpus())})")
    row = SimpleNamespace(gpu=gpu, precision=PRECISIONS[precision], round=LATEST_ROUND)
    return validate.rate_for(row, calibrations, over)


def fp8_gpus() -> list[str]:
    return [name for name, g in gpus.GPUS.items() if g.fp8_flops]


@functools.cache
def layerwise_stages() -> tuple[str, tuple[tuple[float, float, float], ...]]:
    """LAYERWISE_RUN's LAYERWISE_TRAIN and, for each stage, (share of the samples, its step's
    compute against the whole model's, share of the parameters it trains): model layerwise's
    stage steps (the trainer's step with the model staged by train.layerwise), priced on the
    A100 at LAYERWISE_BATCH."""
    from bertperf.model import BertConfig
    from bertperf.perfmodel import layerwise

    config = BertConfig.large()
    train, stages = layerwise.GPU_RUNS[LAYERWISE_RUN]
    setting = layerwise.stage_setting(stages, [1] * len(stages))
    whole = layerwise.stage_step(config, LAYERWISE_BATCH, None, "all", 0)
    total = sum(p.numel() for p in whole.trained)
    out = []
    for index, (layers, share, mode) in enumerate(stages):
        last = layers == config.num_hidden_layers and (mode or train) == "all"
        step = whole if last else layerwise.stage_step(config, LAYERWISE_BATCH, setting, train,
                                                       index)
        out.append((share, step.compute.micro_step / whole.compute.micro_step,
                    sum(p.numel() for p in step.trained) / total))
    return train, tuple(out)


def layerwise_setting(samples: float) -> str:
    """LAYERWISE for LAYERWISE_RUN over `samples`."""
    from bertperf.perfmodel import layerwise

    _, stages = layerwise.GPU_RUNS[LAYERWISE_RUN]
    return layerwise.stage_setting(stages, [round(share * samples)
                                            for _, share, _ in stages[:-1]] + [0])


def split(per_gpu: int, largest: int) -> tuple[int, int] | None:
    """(micro-batch, micro-batches) of `per_gpu` sequences or rows a step: the fewest
    micro-batches of at most `largest` that divide it."""
    for steps in range(max(1, math.ceil(per_gpu / largest)), per_gpu + 1):
        if per_gpu % steps == 0:
            return per_gpu // steps, steps
    return None


def global_batches(world: int, largest: dict[str, int]) -> list[int]:
    """The global batches plan proposes on `world` GPUs: every RCP row's, and every batch of one
    micro-batch a step of at most `largest` (a layout's: sequences, or rows of PACKING_FACTOR),
    within the RCP checker's range (up to its largest row; below its smallest, only the rows'
    own batches: the checker judges a smaller one against the smallest)."""
    from bertperf.mlperf.rcp import reference_points

    rows = [p.bs for p in reference_points()]
    ones = {world * micro * packing
            for layout, packing in (("varlen", 1), ("packed", PACKING_FACTOR))
            for micro in range(1, largest[layout] + 1)}
    return sorted({*rows, *(b for b in ones if rows[0] <= b <= rows[-1])})


def candidates(gpu: str, nodes: int, fabric: network.Network, rate_: float,
               over: cluster.Overheads, divisions: tuple[str, ...],
               samples: float | None = None, global_batch: int | None = None,
               layerwise: bool = False) -> list[Candidate]:
    """Every configuration of the module docstring on this cluster (at `global_batch` only, if
    given, trained for `samples`, if given), priced."""
    from bertperf.config import reference_eval_interval
    from bertperf.mlperf.rcp import reference_for

    from bertperf.train.comm import MODES

    world = nodes * fabric.gpus_per_node
    memory = gpus.GPUS[gpu].memory_gb / 80
    largest = {layout: max(1, int(MAX_BATCH[layout] * memory)) for layout in MAX_BATCH}
    buckets = len(bert.gradient_buckets())
    priced, seen = [], set()
    for name, mode in MODES.items():  # one of each way of pricing
        key = (mode.family, mode.element_bytes, mode.division, mode.samples_factor)
        if mode.family in PRICED and key not in seen:
            seen.add(key)
            priced.append(name)
    ways = [(MODES[m].division, m, sharded, False) for m in priced
            for sharded in ((False, True) if not MODES[m].hooked else (False,))]
    if layerwise:
        ways += [(OPEN, m, False, True) for m in priced if not MODES[m].stateful]
    out = []
    for bs in [global_batch] if global_batch is not None else global_batches(world, largest):
        mean = None  # the RCP checker's reference, asked once a batch a layout divides
        for layout, packing in (("varlen", 1), ("packed", PACKING_FACTOR)):
            rows, left = divmod(bs, packing * world)
            if left or not rows:
                continue
            shape_split = split(rows, largest[layout])
            if shape_split is None:
                continue
            batch, accumulation = shape_split
            if samples is None and mean is None:
                mean = reference_for(bs).mean
            for division, mode, sharded, staged in ways:
                if division not in divisions:
                    continue
                shape = cluster.Shape(gpu, nodes, fabric, batch, accumulation, packing,
                                      blocks=1 if sharded else buckets,
                                      gradient_bytes=MODES[mode].element_bytes,
                                      optimizer_share=1 / world if sharded else 1.0)
                trained = samples or mean * MODES[mode].samples_factor
                evals = trained / reference_eval_interval(bs)
                if staged:
                    prediction = cluster.staged(shape, rate_, over, trained, evals,
                                                list(layerwise_stages()[1]))
                else:
                    prediction = cluster.predict(shape, rate_, over, trained, evals)
                out.append(Candidate(division, layout, bs, batch, accumulation, mode,
                                     sharded, trained, prediction,
                                     layerwise_setting(trained) if staged else None))
    seen, unique = set(), []
    for c in out:  # packed rows price as varlen sequences: keep the first of equal candidates
        key = (c.division, c.global_batch, c.grad_comm, c.sharded, c.batch * (
            PACKING_FACTOR if c.layout == "packed" else 1), c.accumulation, c.layerwise)
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return sorted(unique, key=lambda c: c.seconds)


def fabric_of(args: argparse.Namespace) -> network.Network:
    if args.network is None:
        args.network = gpus.GPUS[args.gpu].network
        if args.network is None:
            raise UserError(f"--gpu {args.gpu!r} comes in no DGX: name its --network (one of "
                            f"{', '.join(network.FABRICS)}, or custom)")
    if args.network not in network.FABRICS and args.network != "custom":
        raise UserError(f"--network {args.network!r}: expected one of "
                        f"{', '.join(network.FABRICS)} or custom")
    if args.network == "custom":
        if args.nic_gbit is None:
            raise UserError("--network custom needs --nic-gbit (and --nics-per-node, "
                            "--link-gbps)")
        base = network.FABRICS["pcie-10gbe"]
        fabric = replace(base, nic=_positive("nic-gbit", args.nic_gbit) * 1e9 / 8,
                         nics_per_node=int(_positive("nics-per-node", args.nics_per_node)),
                         nvlink=_positive("link-gbps", args.link_gbps) * 1e9,
                         alpha_net=_positive("latency-us", args.latency_us) * 1e-6,
                         sharp=False, name="custom")
    else:
        fabric = network.FABRICS[args.network]
    if args.gpus_per_node is not None:
        fabric = replace(fabric, gpus_per_node=int(_positive("gpus-per-node",
                                                             args.gpus_per_node)))
    return fabric


def _positive(name: str, text) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not 0 < value < math.inf:
        raise UserError(f"--{name} {text!r}: expected a number > 0")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", required=True,
                   help=f"the GPU: one of {', '.join(gpus.GPUS)}")
    p.add_argument("--gpus", required=True, help="GPUs in all")
    p.add_argument("--network", default=None,
                   help=f"one of {', '.join(network.FABRICS)}, or custom (then --nic-gbit, "
                        "--nics-per-node, --link-gbps, --latency-us) (default: the GPU's DGX or "
                        "rack, perfmodel/gpus.py)")
    p.add_argument("--gpus-per-node", default=None,
                   help="GPUs a node (default: the network's)")
    p.add_argument("--nic-gbit", default=None, help="custom: a NIC's Gb/s")
    p.add_argument("--nics-per-node", default="1", help="custom: NICs a node (default 1)")
    p.add_argument("--link-gbps", default=str(gpus.PCIE4_X16 / 1e9),
                   help="custom: the GPUs' link in a node, GB/s a direction (default PCIe 4.0 "
                        "x16)")
    p.add_argument("--latency-us", default=str(network.ALPHA_NET_US),
                   help="custom: microseconds a step of a ring on the network (default NCCL's)")
    p.add_argument("--precision", default="bf16",
                   help=f"bf16 (default) or fp8 (FP8=1; GPUs with FP8 tensor cores: "
                        f"{', '.join(fp8_gpus())})")
    p.add_argument("--division", default="both", help="closed, open or both (default)")
    p.add_argument("--global-batch", default=None,
                   help="only this global batch (up to the largest RCP row's)")
    p.add_argument("--samples", default=None,
                   help="with --global-batch: samples to converge (default: its RCP row's mean), "
                        "e.g. a published run's, to compare with it")
    p.add_argument("--layerwise", default=LAYERWISE_RUN,
                   help=f"{LAYERWISE_RUN} (default: price MSLT in the open division) or none")
    p.add_argument("--top", default="12", help="candidates printed (default 12)")
    p.add_argument("--system", default=None,
                   help="the SYSTEM of the config files' names (default: from the GPU)")
    p.add_argument("--write", type=Path, default=None, metavar="DIR",
                   help="write the fastest closed and open configs into DIR (it must hold "
                        "config_common.sh: the checkout's root)")
    p.add_argument("--force", action="store_true",
                   help="overwrite config files of the same name that plan wrote (never others)")


def run(args: argparse.Namespace) -> int:
    from bertperf.mlperf.rcp import reference_for
    from bertperf.perfmodel import validate

    if args.gpu not in gpus.GPUS:
        raise UserError(f"--gpu {args.gpu!r}: expected one of {', '.join(gpus.GPUS)}")
    if args.precision not in PRECISIONS:
        raise UserError(f"--precision {args.precision!r}: expected bf16 or fp8")
    divisions = {"closed": (CLOSED,), "open": (OPEN,), "both": (CLOSED, OPEN)}.get(args.division)
    if divisions is None:
        raise UserError(f"--division {args.division!r}: expected closed, open or both")
    if args.layerwise not in (LAYERWISE_RUN, "none"):
        raise UserError(f"--layerwise {args.layerwise!r}: expected {LAYERWISE_RUN} or none")
    fabric = fabric_of(args)
    world = int(_positive("gpus", args.gpus))
    nodes, left = divmod(world, fabric.gpus_per_node)
    if left or world != float(args.gpus):
        raise UserError(f"--gpus {args.gpus}: not a whole number of nodes of "
                        f"{fabric.gpus_per_node} GPUs (--gpus-per-node)")
    samples = None if args.samples is None else _positive("samples", args.samples)
    batch = None if args.global_batch is None else int(_positive("global-batch",
                                                                  args.global_batch))
    if samples is not None and batch is None:
        raise UserError("--samples needs --global-batch: every batch converges in its own "
                        "samples")
    top = int(_positive("top", args.top))
    reference = None if batch is None else reference_for(batch)  # above the largest: refused
    _, calibrations, over = validate.fitted()
    rate_, source = rate(args.gpu, args.precision, calibrations, over)
    found = candidates(args.gpu, nodes, fabric, rate_, over, divisions, samples, batch,
                       layerwise=args.layerwise != "none" and OPEN in divisions)
    if not found and divisions == (OPEN,) and args.layerwise == "none":
        raise UserError("--division open --layerwise none: every GRAD_COMM mode plan prices "
                        "runs in the closed division, so none is the open division's own (use "
                        "--division closed or both)")
    if not found:
        which = f"global batch {batch}" if batch else "the RCP checker's global batches"
        raise UserError(f"{world} GPUs divide none of {which} into whole micro-batches (RCP "
                        "rows: mlperf/rcp.py): try another --gpus")
    fastest = {d: next((c for c in found if c.division == d), None) for d in divisions}
    command = " ".join(["python -m bertperf", *sys.argv[1:]])
    print(f"PLAN (a model, not a measurement): `{command}`, {datetime.date.today()}")
    print(f"cluster: {nodes} x {fabric.gpus_per_node} {args.gpu} ({world} GPUs), "
          f"{fabric.name or 'custom'}: {fabric.nvlink / 1e9:g} GB/s a GPU in its "
          f"{fabric.domain}-GPU link domain, {fabric.nics_per_node} x "
          f"{fabric.nic * 8 / 1e9:g} Gb/s NICs a node{', SHARP' if fabric.sharp else ''}")
    print(f"rate: {rate_:,.0f} sequences/s a GPU at PRECISION={args.precision} ({source}; NVIDIA's "
          f"MLPerf code, not this trainer's, which no GPU has measured); overheads "
          f"{over.seconds * 1e3:.2f} ms + {over.sequences:.1f} sequences a micro-step, "
          f"{over.run:.2f} s a run (fitted by model validate on NVIDIA's A100 results)")
    print("samples to converge: " + ("--samples" if samples else
          "the RCP checker's reference at the batch (mlperf_logging's code, as the package "
          f"checker runs it, ruleset {RULESET}): "
          + (f"{reference.how}, {reference.mean:,.0f} (a submission's mean below "
             f"{reference.fewest:,.0f} fails its check)" if reference else "a row's olympic mean, or "
             "interpolated between the rows around it") + "; times the GRAD_COMM mode's samples "
          "factor (train/comm.py, measured on the demo)"))
    if any(c.layerwise for c in found):
        train, stages = layerwise_stages()
        print(f"LAYERWISE {LAYERWISE_RUN} (LAYERWISE_TRAIN={train}, restart): stages of "
              + ", ".join(f"{share:.0%} of the samples at {compute:.2f}x the step, "
                          f"{trained:.0%} of the parameters training"
                          for share, compute, trained in stages)
              + " (model layerwise); the same samples as normal training")
    print("| division | global batch | layout | micro-batch x steps | GRAD_COMM | SHARDED_LAMB | "
          "LAYERWISE | samples | step ms | time to train | GPU-hours | dominant term | |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in found[:top] + [f for f in fastest.values() if f and f not in found[:top]]:
        mark = f"fastest {c.division}" if fastest.get(c.division) is c else ""
        print(f"| {c.division} | {c.global_batch:,} | {c.layout} | {c.batch} x "
              f"{c.accumulation} | {c.grad_comm} | {int(c.sharded)} | "
              f"{LAYERWISE_RUN if c.layerwise else '-'} | {c.samples:,.0f} | "
              f"{c.prediction.step_seconds * 1e3:,.1f} | {duration(c.seconds)} | "
              f"{c.seconds * world / 3600:,.1f} | {c.prediction.dominant} | {mark} |")
    if args.write:
        system = args.system or "".join(ch for ch in args.gpu.split()[0] if ch.isalnum())
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]*", system):
            raise UserError(f"--system {system!r}: letters, digits and '-' only (it becomes "
                            "part of config_<SYSTEM>_<nodes>x<gpus>x<batch>x<accum>.sh)")
        chosen = [c for c in fastest.values() if c is not None]
        paths = [args.write / config_name(system, nodes, fabric.gpus_per_node, c)
                 for c in chosen]
        if not (args.write / "config_common.sh").is_file():
            raise UserError(f"--write {args.write}: no config_common.sh there (write into the "
                            "checkout's root, whose config files it sources)")
        for path in paths:  # every name checked before any file is written
            claim("--write", path, "plan", force=args.force)
        for c, path in zip(chosen, paths):
            write_config(path, gpu=args.gpu, nodes=nodes, fabric=fabric, c=c,
                         precision=args.precision, command=command)
            print(f"wrote {path} ({c.division}; check it: source it, then "
                  "./run_and_time.sh --check)")
    return 0


def config_name(system: str, nodes: int, per_node: int, c: Candidate) -> str:
    return (f"config_{system}_{nodes}x{per_node}x{c.batch}x{c.accumulation}"
            f"{'_pack' if c.layout == 'packed' else ''}{'_' + LAYERWISE_RUN if c.layerwise else ''}"
            f"{'_open' if c.division == OPEN else ''}"
            ".sh")


def write_config(path: Path, gpu: str, nodes: int, fabric: network.Network, c: Candidate,
                 precision: str, command: str) -> None:
    """The candidate as the config file `path` (beside a config_common.sh), written under a
    temporary name and renamed."""
    from bertperf.formats.files import atomic_output
    from bertperf.mlperf.rcp import nearest_point
    from bertperf.train.comm import MODES

    point = nearest_point(c.global_batch)
    unit = "rows" if c.layout == "packed" else "sequences"
    walltime = math.ceil(2 * c.seconds / 60) + 5
    lines = [
        "# shellcheck shell=bash",
        (f"# {nodes} node(s) x {fabric.gpus_per_node} {gpu} x {c.batch} {unit} x "
         f"{c.accumulation} accumulation = global batch {c.global_batch}"
         f"{f' ({PACKING_FACTOR} sequences a row)' if c.layout == 'packed' else ''}."),
        (f"# Written by `{command}` on {datetime.date.today()}: the {c.division} division's "
         f"fastest candidate, predicted {duration(c.seconds)} to train"),
        (f"# (a model, not a measurement). Hyperparameters: the ruleset {RULESET} RCP row BS "
         f"{point.bs}" + ("" if point.bs == c.global_batch else
                          " (the nearest row; tune them for this batch)")
         + ". WALLTIME: twice the prediction + 5 min a run."),
        f"export DGXNNODES={nodes}",
        f"export DGXNGPU={fabric.gpus_per_node}",
        f'export SUBMISSION_PLATFORM="${{DGXNNODES}}x{gpu}"',
        "# shellcheck source=config_common.sh",
        'source "$(dirname "${BASH_SOURCE[0]}")/config_common.sh"',
        "",
        f': "${{DATADIR_PHASE2:=/raid/datasets/bert/{"packed" if c.layout == "packed" else "unpadded"}}}"',
        "export DATADIR_PHASE2",
    ]
    if c.layout == "packed":
        lines += ["export LAYOUT=packed", f"export PACKING_FACTOR={PACKING_FACTOR}"]
    if precision == "fp8":
        lines += ["export FP8=1"]
    if c.division == OPEN:
        lines += ["export SUBMISSION_DIVISION=open"]
    if MODES[c.grad_comm].hooked:
        lines += [f"export GRAD_COMM={c.grad_comm}"]
    if c.layerwise:
        train, _ = layerwise_stages()
        lines += [f"export LAYERWISE={c.layerwise}", f"export LAYERWISE_TRAIN={train}",
                  "export LAYERWISE_SCHEDULE=restart"]
    if c.sharded:
        lines += ["export SHARDED_LAMB=1"]
    limit = math.ceil(1.5 * max(point.samples_to_converge) / 100_000) * 100_000
    lines += [
        "",
        f"export BATCHSIZE={c.batch}",
        f"export GRADIENT_STEPS={c.accumulation}",
        f"export LR={point.lr}",
        f"export MAX_STEPS={point.max_steps}",
        f"export WARMUP_STEPS={_number(point.warmup_steps)}",
        f"export START_WARMUP_STEP={_number(point.start_warmup_step)}",
        f"export OPT_LAMB_BETA_1={point.beta1}",
        f"export OPT_LAMB_BETA_2={point.beta2}",
        f"export WEIGHT_DECAY_RATE={point.weight_decay}",
        f"export MAX_SAMPLES_TERMINATION={limit}",
        "",
        ': "${NEXP:=10}"',
        f"WALLTIME_MINUTES={walltime}",
        "export WALLTIME=$(( NEXP * WALLTIME_MINUTES + 5 ))",
    ]
    with atomic_output(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)
