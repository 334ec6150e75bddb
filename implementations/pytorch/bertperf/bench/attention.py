"""`python -m bertperf bench attention`: forward + backward time of the variable-length attention
paths on this machine's CPU (or CUDA with --device cuda), on batches shaped like the demo's
(64 sequences of 128-token FOLDOC samples, 2 heads of 64) and like BERT-large's (16 heads of
64, MLPerf-like lengths up to 512), with the training's attention dropout (--dropout). Every path
runs the same packed qkv: the per-sequence reference, the padded path, and the flash path where the
device takes it (CUDA sm80+ in fp16/bf16: --dtype, bfloat16 by default on CUDA). The table gives
the median of --repeat timings and the ratio to the reference."""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F  # noqa: N812

from bertperf.kernels import (flash_supported, varlen_attention_flash, varlen_attention_padded,
                              varlen_attention_reference)


SHAPES = {
    "demo: 64 seqs <=128, 2x64": (64, 128, 2, 64),
    "BERT-large: 16 seqs <=512, 16x64": (16, 512, 16, 64),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default: bfloat16 on CUDA, float32 elsewhere")
    p.add_argument("--dropout", type=float, default=0.1,
                   help="attention dropout (training: 0.1; 0 as in evaluation)")


def lengths_for(num: int, longest: int, gen: torch.Generator) -> torch.Tensor:
    """MLPerf-like lengths: about a quarter full, the rest spread below (at least 8 tokens)."""
    full = torch.rand(num, generator=gen) < 0.25
    spread = (torch.rand(num, generator=gen) * (longest - 8) + 8).long()
    return torch.where(full, torch.full_like(spread, longest), spread)


def time_path(fn, qkv, cu, m, dropout_p: float, repeat: int) -> float:
    times = []
    for _ in range(repeat + 1):
        leaf = qkv.detach().requires_grad_()
        if qkv.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn(leaf, cu, m, dropout_p).float().sum().backward()
        if qkv.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])  # the first is a warm-up


def run(args: argparse.Namespace) -> int:
    gen = torch.Generator().manual_seed(args.seed)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    paths = {"reference (per sequence)": varlen_attention_reference,
             "padded SDPA": varlen_attention_padded}
    if flash_supported(torch.empty(1, 1, 64, device=device, dtype=dtype)):
        paths["flash (varlen kernels)"] = varlen_attention_flash
    print(f"device {args.device}, {dtype}, dropout {args.dropout}, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, median of {args.repeat}")
    print("| batch | path | ms | vs reference |\n|---|---|---|---|")
    for label, (num, longest, heads, dim) in SHAPES.items():
        lengths = lengths_for(num, longest, gen)
        cu = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32).to(args.device)
        total, m = int(lengths.sum()), int(lengths.max())
        qkv = torch.randn(total, 3, heads, dim, generator=gen).to(device, dtype)
        base = None
        for name, fn in paths.items():
            try:
                ms = 1000 * time_path(fn, qkv, cu, m, args.dropout, args.repeat)
            except (RuntimeError, NotImplementedError) as exc:
                print(f"| {label} | {name} | n/a ({str(exc).splitlines()[0][:60]}) | |")
                continue
            base = base or ms
            print(f"| {label} | {name} | {ms:.1f} | {base / ms:.1f}x |")
    return 0
