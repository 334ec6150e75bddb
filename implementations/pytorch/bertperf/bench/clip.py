"""`python -m bertperf bench clip`: where gradient clipping sits against DDP's all-reduce, on W
gloo ranks of this machine (one process and one thread each), with a BERT of --config's shape
(dropout off) on synthetic batches (a different one per rank). Three ways to clip:

  after    DDP's own bucket all-reduces, then clipped_step clips the global norm of the averaged
           gradient (the trainer's default, CLIP_BEFORE_ALLREDUCE=0)
  bucket   bertperf.optim.bucket_clip: each rank clips each bucket before its all-reduce, in a
           DDP communication hook (CLIP_BEFORE_ALLREDUCE=1)
  global   each rank clips its whole gradient to the global norm, then all-reduces it (the order
           of the MLPerf TF reference; here backward under no_sync, then one all-reduce of the
           flattened gradient): the norm needs the whole backward first

Overlap (first table): a step is run twice (DDP rebuilds its buckets after the first), then once
under torch.profiler; rank 0's events give, in ms from the start of backward: when the first
all-reduce was launched (`c10d::allreduce_` on the main thread), when the last gradient was
accumulated (the last `torch::autograd::AccumulateGrad`: backward's computation is over), how
many of the all-reduces were launched before that, the time gloo's threads spent in all-reduces
(`gloo:all_reduce`) before it, and when the step's gradients were all reduced (the end of
backward with DDP's wait, or of the global clip's all-reduce): its distance from the last
gradient is the communication left exposed. On a CPU with fewer cores than ranks x 2 the
overlapped all-reduces compete with backward for the cores, so only the order of the events is
meaningful here, not the times.

Numerics (second table): for each --max-norm, every rank starts from the same weights and batch
(after one backward that lets DDP rebuild its buckets), and after and bucket each reduce and take
one LAMB step: the averaged gradient's global norm before clipping (what after clips), the norms
of the gradient each clipping hands to LAMB, the norm of their difference relative to after's,
their cosine (1: the same direction, only the length differs), and the largest difference of
the parameters after the step against the largest update of after. A max-norm no bucket
reaches gives the same bits. The third table shows why: each of rank 0's buckets with its share
of the elements (its threshold is max-norm * sqrt(share)), its share of the rank's squared
gradient norm, and the coefficient the hook applied.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import tempfile
from pathlib import Path

from bertperf.errors import UserError

MODES = ("after", "bucket", "global")
LR = 4e-4


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
    p.add_argument("--bucket-mb", type=float, default=None,
                   help="DDP's bucket_cap_mb (default: DDP's, as the trainer runs it: a 1 MiB "
                        "first bucket, 25 MiB after it)")
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


def _batch(args: argparse.Namespace, rank: int, vocab: int):
    """This rank's batch and the loss divisors (the step's masked tokens and sequences over all
    ranks, over the world size, as the trainer divides)."""
    import torch

    from bertperf.data.synthetic import synthetic_samples
    from bertperf.data.collate import collate_varlen
    from bertperf.model import UnpaddedBatch
    s = synthetic_samples(args.batch, seed=rank, max_seq_length=args.seq, max_pred=20,
                          vocab_size=vocab)
    masked = sum(len(synthetic_samples(args.batch, seed=r, max_seq_length=args.seq, max_pred=20,
                                       vocab_size=vocab).mlm_ids) for r in range(args.world))
    divisors = torch.tensor([masked, args.batch * args.world], dtype=torch.float64) / args.world
    return UnpaddedBatch.from_arrays(collate_varlen(s)).inputs(), divisors


class Trainee:
    """The model under DDP, LAMB, and one mode's backward-and-reduce and step."""

    def __init__(self, args: argparse.Namespace, mode: str, max_norm: float) -> None:
        from torch.nn.parallel import DistributedDataParallel

        from bertperf.optim import make_optimizer, param_groups
        from bertperf.optim.bucket_clip import clip_buckets_before_allreduce
        self.mode, self.max_norm, self.world = mode, max_norm, args.world
        self.core = _model(args)
        self.opt = make_optimizer("lamb", param_groups(self.core, 0.01), lr=LR)
        self.ddp = DistributedDataParallel(self.core, bucket_cap_mb=args.bucket_mb)
        self.hook = clip_buckets_before_allreduce(self.ddp, max_norm) if mode == "bucket" \
            else None

    def backward(self, inputs: dict, divisors) -> None:
        """Forward, backward and the gradients reduced (clipped by the hook, or by the global
        clip before its all-reduce)."""
        import torch
        import torch.distributed as dist
        from torch.profiler import record_function

        from bertperf.optim import clip_grad_norm_
        if self.mode != "global":
            with record_function("bench:backward+reduce"):
                self.ddp(**inputs, loss_divisors=divisors).loss.backward()
            return
        with self.ddp.no_sync():
            loss = self.ddp(**inputs, loss_divisors=divisors).loss
        with record_function("bench:backward+reduce"):
            loss.backward()
            grads = [p.grad for p in self.core.parameters()]
            clip_grad_norm_(grads, self.max_norm)
            flat = torch.cat([g.reshape(-1) for g in grads]).div_(self.world)
            dist.all_reduce(flat)
            torch._foreach_copy_(grads, [t.view_as(g) for t, g in
                                         zip(flat.split([g.numel() for g in grads]), grads)])

    def step(self):
        from bertperf.optim import clipped_step
        return clipped_step(self.opt, self.max_norm if self.mode == "after" else None)


def _overlap(events) -> dict:
    """The first table's columns from one profiled step's events (module docstring)."""
    main = [e for e in events if e.name == "bench:backward+reduce"]
    if not main:
        raise UserError("bench clip: the profiled step recorded no backward")
    start, end = main[0].time_range.start, main[0].time_range.end
    inside = [e for e in events if start <= e.time_range.start <= end]
    launched = sorted(e.time_range.start for e in inside if e.name == "c10d::allreduce_")
    grads_done = max(e.time_range.end for e in inside
                     if e.name == "torch::autograd::AccumulateGrad")
    gloo = [(e.time_range.start, e.time_range.end) for e in inside if e.name == "gloo:all_reduce"]
    overlapped = sum(max(0.0, min(b, grads_done) - a) for a, b in gloo)
    ms = 1e-3
    return {"allreduces": len(launched), "first": (launched[0] - start) * ms if launched else None,
            "grads_done": (grads_done - start) * ms,
            "before": sum(t < grads_done for t in launched),
            "overlapped": overlapped * ms, "gloo": sum(b - a for a, b in gloo) * ms,
            "reduced": (end - start) * ms}


def _numerics(args: argparse.Namespace, inputs: dict, divisors, max_norm: float) -> dict:
    """The second table's columns for one max-norm (module docstring)."""
    import torch

    from bertperf.optim import global_grad_norm
    out = {}
    for mode in ("after", "bucket"):
        t = Trainee(args, mode, max_norm)
        t.backward(inputs, divisors)  # DDP's first backward: one bucket; rebuilt after it
        t.opt.zero_grad()
        if t.hook is not None:  # bucket: the buckets the hook clips, for the third table
            hook = t.hook
            hook.record = []
        t.backward(inputs, divisors)
        before = [p.detach().clone() for p in t.core.parameters()]
        outcome = t.step()
        grads = [p.grad.clone() for p in t.core.parameters()]  # as LAMB took them
        out[mode] = {"norm": float(outcome.grad_norm), "grads": grads,
                     "handed": float(global_grad_norm(grads)), "before": before,
                     "params": [p.detach().clone() for p in t.core.parameters()]}
    a, b = out["after"], out["bucket"]
    diff = float(global_grad_norm([x - y for x, y in zip(a["grads"], b["grads"])]))
    x, y = (torch.cat([g.double().reshape(-1) for g in m["grads"]]) for m in (a, b))
    record = [(n, float(norm) ** 2, float(coef)) for n, norm, coef in hook.record]
    squares = sum(sq for _, sq, _ in record)
    return {"buckets": [(n, n / hook.total_numel, sq / squares, coef) for n, sq, coef in record],
            "norm": a["norm"], "after": a["handed"], "bucket": b["handed"],
            "rel": diff / max(a["handed"], 1e-30),
            "cos": float(x @ y / (x.norm() * y.norm()).clamp(min=1e-30)),
            "params": max(float((p - q).abs().max()) for p, q in zip(a["params"], b["params"])),
            "update": max(float((p - q).abs().max()) for p, q in zip(a["params"], a["before"]))}


def worker(rank: int, args: argparse.Namespace, store: str, queue) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=300))
    vocab = _model(args).config.vocab_size
    inputs, divisors = _batch(args, rank, vocab)
    overlap = {}
    for mode in MODES:
        t = Trainee(args, mode, 1.0)
        for _ in range(2):
            t.backward(inputs, divisors)
            t.step()
            t.opt.zero_grad()
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t.backward(inputs, divisors)
        t.step()
        overlap[mode] = _overlap(prof.events())
    numerics = [(m, _numerics(args, inputs, divisors, m)) for m in args.norms]
    if rank == 0:
        queue.put({"overlap": overlap, "numerics": numerics})
    dist.barrier()
    dist.destroy_process_group()


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
          f"{args.batch} sequences of up to {args.seq} tokens a rank; DDP bucket_cap_mb "
          f"{args.bucket_mb if args.bucket_mb is not None else 'default'}\n")
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
