"""`python -m bertperf bench clip`: where gradient clipping sits against DDP's all-reduce, on W
gloo ranks of this machine (one process and one thread each), with a BERT of --config's shape
(dropout off) on synthetic batches (a different one per rank). Every rank steps the trainer's own
step (train.loop.build_step and train_step: one micro-batch, Lamb at 4e-4, fp32 on the CPU) in
its two ways to clip:

  after    DDP's own bucket all-reduces, then the step clips the global norm of the averaged
           gradient (CLIP_BEFORE_ALLREDUCE=0, the default)
  bucket   bertperf.optim.bucket_clip: each rank clips each bucket before its all-reduce, in a
           DDP communication hook (CLIP_BEFORE_ALLREDUCE=1)

The MLPerf TF reference's order (each rank clips its whole gradient, then one all-reduce) is not
a trainer setting, so it is not measured here. DDP's buckets are the trainer's (DDP's default
caps: a 1 MiB first bucket, 25 MiB after it).

Overlap (first table): the step is run twice (DDP rebuilds its buckets after the first), then once
under torch.profiler; rank 0's events give, in ms from the start of backward (the autograd
engine's first node): when the first of backward's all-reduces was launched (`c10d::allreduce_`
on the main thread; the step's all-reduce of the loss divisors, before the forward, is not
counted), when the last gradient was accumulated (the last `torch::autograd::AccumulateGrad`:
backward's computation is over), how many of the all-reduces were launched before that, the time
gloo's threads spent in them (`gloo:all_reduce`) before it, and when the step's gradients were all
reduced (DDP's last `copy_bucket_to_grad`, after its wait): its distance from the last gradient is
the communication left exposed. On a CPU with fewer cores than ranks x 2 the overlapped
all-reduces compete with backward for the cores, so only the order of the events is meaningful
here, not the times.

Numerics (second table): for each --max-norm, every rank starts from the same weights and batch
(after one step that lets DDP rebuild its buckets, the weights, LAMB and the schedule put back),
and after and bucket each take one step: the norm of the averaged gradient (the step's with
MAX_GRAD_NORM=0: what after clips), the norms of the gradient each clipping hands to LAMB (read
by an optimizer step pre-hook), the norm of their difference relative to after's, their cosine
(1: the same direction, only the length differs), and the largest difference of the parameters
after the step against the largest update of after. A max-norm no bucket reaches gives the same
bits. The third table shows why: each of rank 0's buckets with its share of the elements (its
threshold is max-norm * sqrt(share)), its share of the rank's squared gradient norm, and the
coefficient the hook applied (train.parallel.Plan.hook_state's record).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import os
import platform
import tempfile
from pathlib import Path

from bertperf.errors import UserError

MODES = {"after": False, "bucket": True}
"""Each way to clip and its CLIP_BEFORE_ALLREDUCE."""
LR, MAX_STEPS = 4e-4, 1000
"""LAMB's learning rate; the schedule's length (its linear decay keeps the few steps' LR within
0.3 % of LR)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", default="2,4",
                   help="gloo ranks to run, comma-separated (default 2,4)")
    p.add_argument("--config", default="tiny",
                   help="BERT shape (a name of bertperf.model.bert_config.NAMED or a "
                        "bert_config.json; default tiny: 2 layers of 128)")
    p.add_argument("--layers", type=int, default=None,
                   help="transformer layers instead of the config's")
    p.add_argument("--batch", type=int, default=8, help="sequences a rank (default 8)")
    p.add_argument("--seq", type=int, default=128, help="max sequence length (default 128)")
    p.add_argument("--max-norm", default="1e9,1.0,0.3",
                   help="MAX_GRAD_NORM values of the numerics table (default 1e9,1.0,0.3)")


def _numbers(text: str, kind: type, flag: str) -> list:
    try:
        out = [kind(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} {text!r}: comma-separated numbers expected") from None
    if not out or min(out) <= 0:
        raise UserError(f"{flag} {text!r}: positive numbers expected")
    return out


# ---- one rank --------------------------------------------------------------------------------

def _model(args: argparse.Namespace):
    import torch

    from bertperf.model import BertConfig, BertForPreTraining
    config = dataclasses.replace(BertConfig.named(args.config), hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0)
    if args.layers is not None:
        config = dataclasses.replace(config, num_hidden_layers=args.layers)
    config = dataclasses.replace(config, max_position_embeddings=max(args.seq, 8))
    torch.manual_seed(0)
    return BertForPreTraining(config)


def run_config(args: argparse.Namespace, clip_before_allreduce: bool, max_norm: float):
    """The trainer's settings for one way to clip: CLIP_BEFORE_ALLREDUCE, MAX_GRAD_NORM (0: no
    clipping), LR, MAX_STEPS, BATCHSIZE, LAYOUT=varlen, PRECISION=fp32, DEVICE=cpu,
    FUSED_KERNELS=0, FLAT_LAMB=0; the rest the trainer's defaults."""
    from bertperf.config import RunConfig
    cfg = RunConfig()
    return dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, layout="varlen"),
        optim=dataclasses.replace(cfg.optim, lr=LR, max_steps=MAX_STEPS, max_grad_norm=max_norm,
                                  clip_before_allreduce=clip_before_allreduce, flat_lamb=False),
        train=dataclasses.replace(cfg.train, batch_size=args.batch, precision="fp32",
                                  device="cpu", fused_kernels=False))


def _micro(args: argparse.Namespace, rank: int, vocab: int):
    """This rank's micro-batch on the CPU, as the trainer's loader hands it over."""
    import torch

    from bertperf.data.collate import collate_varlen
    from bertperf.data.synthetic import synthetic_samples
    from bertperf.train import loop
    from bertperf.train.layout import LAYOUTS
    arrays = collate_varlen(synthetic_samples(args.batch, seed=rank, max_seq_length=args.seq,
                                              max_pred=20, vocab_size=vocab))
    return loop.to_device({**arrays, "global_sequences": args.batch * args.world},
                          LAYOUTS["varlen"].batch_type, torch.device("cpu"))


def _step(args: argparse.Namespace, dist, clip_before_allreduce: bool, max_norm: float):
    """The trainer's step around a fresh model of the bench's weights."""
    import torch

    from bertperf.train import loop
    return loop.build_step(run_config(args, clip_before_allreduce, max_norm), dist,
                           torch.device("cpu"), _model(args))


def _overlap(events) -> dict:
    """The first table's columns from one profiled step's events (module docstring)."""
    main = [e for e in events if e.name == "bench:train_step"]
    if not main:
        raise UserError("bench clip: the profiled step recorded nothing")
    first, last = main[0].time_range.start, main[0].time_range.end
    inside = [e for e in events if first <= e.time_range.start <= last]
    backward = [e.time_range.start for e in inside
                if e.name.startswith("autograd::engine::evaluate_function")]
    grads = [e.time_range.end for e in inside if e.name == "torch::autograd::AccumulateGrad"]
    copies = [e.time_range.end for e in inside
              if e.name == "torch.distributed.ddp.reducer::copy_bucket_to_grad"]
    if not (backward and grads and copies):
        raise UserError("bench clip: the profiled step recorded no DDP backward")
    start, grads_done = min(backward), max(grads)
    launched = sorted(e.time_range.start for e in inside
                      if e.name == "c10d::allreduce_" and e.time_range.start >= start)
    gloo = [(e.time_range.start, e.time_range.end) for e in inside
            if e.name == "gloo:all_reduce" and e.time_range.start >= start]
    overlapped = sum(max(0.0, min(b, grads_done) - a) for a, b in gloo)
    ms = 1e-3
    return {"allreduces": len(launched), "first": (launched[0] - start) * ms if launched else None,
            "grads_done": (grads_done - start) * ms,
            "before": sum(t < grads_done for t in launched),
            "overlapped": overlapped * ms, "gloo": sum(b - a for a, b in gloo) * ms,
            "reduced": (max(copies) - start) * ms}


def _stepped(args: argparse.Namespace, dist, micro, clip_before_allreduce: bool,
             max_norm: float) -> dict:
    """One trainer step from the bench's weights (after a first step, undone, that lets DDP
    rebuild its buckets): the gradients LAMB took, the parameters before and after, and the
    bucket hook's record (None without the hook)."""
    from bertperf.train import loop
    step = _step(args, dist, clip_before_allreduce, max_norm)
    plan = step.plan
    saved = [copy.deepcopy(part.state_dict()) for part in (plan.core, plan.optimizer,
                                                          step.scheduler)]
    loop.train_step(step, [micro])
    for part, state in zip((plan.core, plan.optimizer, step.scheduler), saved):
        part.load_state_dict(state)
    hook = plan.hook_state
    if hook is not None:
        hook.record = []
    taken = []
    handle = plan.optimizer.register_step_pre_hook(
        lambda opt, a, kw: taken.extend(g.clone() for g in opt.step_grads()))
    before = [p.detach().clone() for p in plan.core.parameters()]
    loop.train_step(step, [micro])
    handle.remove()
    out = {"grads": taken, "before": before,
           "params": [p.detach().clone() for p in plan.core.parameters()],
           "record": None if hook is None else
           [(n, float(norm) ** 2, float(coef)) for n, norm, coef in hook.record],
           "total": None if hook is None else hook.total_numel}
    plan.release()
    return out


def _numerics(args: argparse.Namespace, dist, micro, averaged: float, max_norm: float) -> dict:
    """The second and third tables' columns for one max-norm (module docstring)."""
    import torch

    from bertperf.optim import global_grad_norm
    a, b = (_stepped(args, dist, micro, MODES[mode], max_norm) for mode in MODES)
    handed = {m: float(global_grad_norm(s["grads"])) for m, s in zip(MODES, (a, b))}
    diff = float(global_grad_norm([x - y for x, y in zip(a["grads"], b["grads"])]))
    x, y = (torch.cat([g.double().reshape(-1) for g in s["grads"]]) for s in (a, b))
    squares = sum(sq for _, sq, _ in b["record"])
    return {"buckets": [(n, n / b["total"], sq / squares, coef) for n, sq, coef in b["record"]],
            "norm": averaged, "after": handed["after"], "bucket": handed["bucket"],
            "rel": diff / max(handed["after"], 1e-30),
            "cos": float(x @ y / (x.norm() * y.norm()).clamp(min=1e-30)),
            "params": max(float((p - q).abs().max()) for p, q in zip(a["params"], b["params"])),
            "update": max(float((p - q).abs().max()) for p, q in zip(a["params"], a["before"]))}


def worker(rank: int, args: argparse.Namespace, store: str, queue) -> None:
    import torch
    import torch.distributed as tdist
    from torch.profiler import ProfilerActivity, profile, record_function

    from bertperf.optim import global_grad_norm
    from bertperf.train import loop
    from bertperf.train.dist import Dist
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                             world_size=args.world, timeout=datetime.timedelta(seconds=300))
    dist = Dist(rank, args.world)
    micro = _micro(args, rank, _model(args).config.vocab_size)
    overlap = {}
    for mode, clip_before in MODES.items():
        step = _step(args, dist, clip_before, 1.0)
        for _ in range(2):
            loop.train_step(step, [micro])
        tdist.barrier()
        with profile(activities=[ProfilerActivity.CPU]) as prof, \
                record_function("bench:train_step"):
            loop.train_step(step, [micro])
        overlap[mode] = _overlap(prof.events())
        step.plan.release()
    averaged = float(global_grad_norm(_stepped(args, dist, micro, False, 0.0)["grads"]))
    numerics = [(m, _numerics(args, dist, micro, averaged, m)) for m in args.norms]
    if rank == 0:
        queue.put({"overlap": overlap, "numerics": numerics})
    dist.close()


# ---- the command -------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    import torch
    import torch.multiprocessing as mp
    worlds = _numbers(args.ranks, int, "--ranks")
    args.norms = _numbers(args.max_norm, float, "--max-norm")
    if min(worlds) < 2 or args.batch < 1 or args.seq < 8:
        raise UserError("--ranks must be at least 2, --batch at least 1, --seq at least 8")
    model = _model(args)
    params = sum(p.numel() for p in model.parameters())
    print(f"bench clip, {datetime.date.today()}: {platform.machine()} {platform.system()}, "
          f"{os.cpu_count()} cores; torch {torch.__version__}, gloo, one thread a rank; "
          f"BERT {args.config} ({model.config.num_hidden_layers} layers, {params:,} parameters), "
          f"{args.batch} sequences of up to {args.seq} tokens a rank; the trainer's step, DDP's "
          "default buckets\n")
    context = mp.get_context("spawn")
    results = {}
    for world in worlds:
        queue = context.SimpleQueue()
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(worker, args=(argparse.Namespace(**vars(args), world=world),
                                             str(Path(tmp) / "store"), queue),
                               nprocs=world, start_method="spawn")
        results[world] = queue.get()
    print("Overlap (rank 0, ms from the start of backward):\n")
    print("| ranks | clipping | all-reduces | first launched | last gradient | launched before "
          "it | gloo all-reduce ms before it / total | all reduced |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for world, r in results.items():
        for mode in MODES:
            o = r["overlap"][mode]
            first = f"{o['first']:.1f}" if o["first"] is not None else "-"
            print(f"| {world} | {mode} | {o['allreduces']} | {first} | {o['grads_done']:.1f} | "
                  f"{o['before']} of {o['allreduces']} | {o['overlapped']:.1f} / "
                  f"{o['gloo']:.1f} | {o['reduced']:.1f} |")
    print("\nNumerics (one step from the same weights and batches; after vs bucket):\n")
    print("| ranks | max norm | norm of the averaged gradient | norm LAMB gets: after | bucket | "
          "relative difference | cosine | max param difference / max update |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for world, r in results.items():
        for max_norm, n in r["numerics"]:
            print(f"| {world} | {max_norm:g} | {n['norm']:.4g} | {n['after']:.4g} | "
                  f"{n['bucket']:.4g} | {n['rel']:.3g} | {n['cos']:.4f} | "
                  f"{n['params']:.3g} / {n['update']:.3g} |")
    print("\nThe buckets of rank 0 under bucket, in the order the hook saw them:\n")
    print("| ranks | max norm | bucket | elements | share of elements | share of the squared "
          "norm | coefficient |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for world, r in results.items():
        for max_norm, n in r["numerics"]:
            for i, (numel, share, energy, coef) in enumerate(n["buckets"]):
                print(f"| {world} | {max_norm:g} | {i} | {numel:,} | {share:.3f} | {energy:.3f} "
                      f"| {coef:.4g} |")
    return 0
