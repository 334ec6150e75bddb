"""`python -m bertperf model step`: BERT-large's training step on an A100 and an H100, predicted
(a model, not a measurement): the trainer's own bf16 step (train.loop.build_step and train_step)
traced on fake tensors as CUDA runs it and priced by perfmodel/roofline.py, as the code runs it
(varlen or packed, bertperf.kernels' Triton kernels and FlatLamb), without those kernels (and
with Lamb) and with each of them alone, and with COMPILE and USE_CUDA_GRAPH; on the H100 also
with the encoder's GEMMs in FP8. No data, nothing measured: a minute on a CPU.

The step priced is the single-H100 recipe's global batch of 448 sequences at MLPerf's length
quantiles: MODEL_ACCUMULATION micro-batches of MODEL_BATCH sequences (varlen) or packed rows.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import platform
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from bertperf.benchmark import MAX_PREDICTIONS, MAX_SEQ_LENGTH
from bertperf.errors import UserError
from bertperf.formats.packed import Packed
from bertperf.formats.samples import Samples, offsets_from_lengths, ranges
from bertperf.host import cpu_name
from bertperf.perfmodel import TOLERANCE
from bertperf.perfmodel.gpus import A100, H100, anchors

MODEL_BATCH = 56
MODEL_ACCUMULATION = {"varlen": 8, "packed": 4}
"""The step the model prices, the single-H100 recipe's global batch of 448 sequences: 8
micro-batches of 56 sequences (varlen) or 4 of 56 packed rows (packed)."""
MLPERF_PACKING = 1.999
"""Sequences a row in MLPerf's packed training data (NVIDIA's packing of the 156.7 M samples);
the model counts a packed row as this many sequences of MLPerf's mean size."""
MLPERF_LENGTH_QUANTILES = ((0.0, 8), (0.10, 48), (0.25, 84), (0.50, 204), (0.75, 484),
                           (0.766, 512), (1.0, 512))
"""(fraction, sequence length) of MLPerf's phase-2 Wikipedia samples (Graphcore's histogram of
one dupe pass: p10 48, p25 84, median 204, p75 484, 23.4 % at 512; mean 255.8)."""
MAX_SEQS_PER_ROW = 3
"""Sequences a packed row holds at most, as in MLPerf's packed data."""
LR, MAX_STEPS = 4.25e-4, 6700
"""The single-node recipe's LAMB learning rate and schedule (config_DGXA100_1x8x56x1.sh), which
the traced step is built with: the kernels of a step do not depend on them."""


GPUS = (A100, H100)
"""The GPUs priced by default (--gpu): the two with kernel measurements of their own."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The step it prices is fixed (module docstring); --gpu chooses the GPUs."""
    from bertperf.perfmodel import gpus

    p.add_argument("--gpu", default=",".join(GPUS),
                   help=f"GPUs, comma-separated, of {', '.join(gpus.GPUS)} (default: "
                        f"{','.join(GPUS)})")


def run(args: argparse.Namespace) -> int:
    import torch

    from bertperf.perfmodel import gpus

    chosen = [name.strip() for name in args.gpu.split(",")]
    unknown = [name for name in chosen if name not in gpus.GPUS]
    if unknown:
        raise UserError(f"--gpu {unknown[0]!r}: expected one of {', '.join(gpus.GPUS)}")
    print(f"model step, {datetime.date.today()}: {cpu_name()}, "
          f"{platform.machine()} {platform.system()}; torch {torch.__version__}, Python "
          f"{platform.python_version()}")
    print_model(chosen)
    return 0


# ---- the micro-batches ---------------------------------------------------------------------------

def mlperf_lengths(n: int) -> np.ndarray:
    """n sequence lengths at evenly spaced quantiles of MLPerf's length distribution."""
    q, length = zip(*MLPERF_LENGTH_QUANTILES)
    return np.rint(np.interp((np.arange(n) + 0.5) / n, q, length)).astype(np.int64)


def samples_of_lengths(lengths: np.ndarray, max_pred: int = MAX_PREDICTIONS) -> Samples:
    """Samples of these lengths with create_pretraining_data's mask count, round(0.15 L) in
    1..max_pred (token ids do not matter where they are used)."""
    counts = np.clip(np.rint(0.15 * lengths), 1, max_pred).astype(np.int64)
    offsets = offsets_from_lengths(lengths)
    return Samples(np.full(int(offsets[-1]), 999, dtype=np.int64), offsets, lengths // 2,
                   ranges(np.ones(len(lengths), dtype=np.int64), counts),
                   np.full(int(counts.sum()), 999, dtype=np.int64), offsets_from_lengths(counts),
                   np.zeros(len(lengths), dtype=np.int64))


def model_steps(batch: int = MODEL_BATCH) -> dict[str, Samples | Packed]:
    """The micro-batches the model prices: `batch` sequences at MLPerf's length quantiles
    (varlen); `batch` rows (packed): twice max(batch, 56) such sequences packed first-fit
    decreasing, up to 3 a row, the fullest max(batch, 56) rows kept (MLPerf's packed data fills
    its rows to 99.7 %) and `batch` of them taken evenly spaced (all of them at 56)."""
    pool = max(batch, MODEL_BATCH)
    lengths = sorted(mlperf_lengths(2 * pool).tolist(), reverse=True)
    rows: list[list[int]] = []
    for n in lengths:
        row = next((r for r in rows if sum(r) + n <= MAX_SEQ_LENGTH and len(r) < MAX_SEQS_PER_ROW),
                   None)
        if row is None:
            rows.append(row := [])
        row.append(n)
    kept = sorted(rows, key=sum, reverse=True)[:pool]
    rows = [kept[int((i + 0.5) * len(kept) / batch)] for i in range(batch)]
    packed = samples_of_lengths(np.array([n for r in rows for n in r]))
    return {"varlen": samples_of_lengths(mlperf_lengths(batch)),
            "packed": Packed.from_samples(packed, np.arange(len(packed)),
                                          np.array([len(r) for r in rows]))}


def loader_arrays(batch: Samples | Packed, masked_lm_prob: float) -> dict:
    """A micro-batch as the loader's arrays of one rank (collate_varlen, or collate_packed of
    fixed-shape rows), for train.loop.to_device."""
    from bertperf.data.collate import collate_packed, collate_varlen, max_masks_per_row

    if isinstance(batch, Packed):
        arrays = collate_packed(
            batch.batch(None, MAX_SEQ_LENGTH, MAX_SEQS_PER_ROW, MAX_PREDICTIONS),
            max_masks_per_row(MAX_SEQ_LENGTH, MAX_SEQS_PER_ROW, MAX_PREDICTIONS, masked_lm_prob))
    else:
        arrays = collate_varlen(batch)
    return {**arrays, "global_sequences": arrays["num_sequences"]}


# ---- the trace -----------------------------------------------------------------------------------

def trace_step(config, batch: Samples | Packed, fused: bool, build: Callable | None = None):
    """The kernels of the trainer's bf16 step on this micro-batch (a Packed: LAYOUT=packed; else
    varlen), train.loop.build_step and train_step as on one CUDA GPU with FUSED_KERNELS=1 (the
    Triton kernels and FlatLamb) or 0 (plain PyTorch and Lamb), traced on fake tensors as CUDA
    runs it (perfmodel/roofline.py: the step built with Kernels(fused, assume_cuda=True) and the
    launchers' stand-ins); the LAMB's class; the segment lengths its attention runs over. The
    traced micro-step adds its gradients to those already there, as all but the first of the
    trainer's micro-steps do. `build`: what builds the step instead of build_step, with its
    arguments (model layerwise's stages the model first)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils import _pytree as pytree

    from bertperf.config import RunConfig
    from bertperf.kernels import Kernels, backend
    from bertperf.model import BertForPreTraining
    from bertperf.perfmodel import roofline
    from bertperf.train import loop
    from bertperf.train.dist import Dist
    from bertperf.train.layout import LAYOUTS

    if fused and not backend.triton_installed():
        raise UserError("the step-time model traces the Triton kernels' path, which needs "
                        "Triton installed (pip install triton)")
    layout = "packed" if isinstance(batch, Packed) else "varlen"
    cfg = RunConfig()
    cfg = replace(cfg, data=replace(cfg.data, layout=layout),
                  optim=replace(cfg.optim, lr=LR, max_steps=MAX_STEPS),
                  train=replace(cfg.train, precision="bf16", device="cuda", fused_kernels=fused))
    arrays = loader_arrays(batch, cfg.data.masked_lm_prob)
    micro = loop.to_device(arrays, LAYOUTS[layout].batch_type, torch.device("cpu"))
    fake = FakeTensorMode()
    kernels = Kernels(fused, assume_cuda=True, launchers=roofline.STAND_INS)
    with fake, roofline.OnCuda():
        core = BertForPreTraining(config)
        trainer = (build or loop.build_step)(cfg, Dist(0, 1), torch.device("cpu"), core,
                                             kernels=kernels)
        micro = replace(micro, inputs=pytree.tree_map_only(torch.Tensor, fake.from_tensor,
                                                           micro.inputs),
                        counts=fake.from_tensor(micro.counts))
        calls = itertools.count()

        def run():
            loop.train_step(trainer, [micro])
            if next(calls) == 0:  # untraced: gradients to add to where zero_grad dropped them
                for p in core.parameters():
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)

        trace = roofline.trace(run)
    return trace, np.diff(arrays["cu_seqlens"]), type(trainer.plan.optimizer).__name__


# ---- the table -----------------------------------------------------------------------------------

def print_model(names: list[str]) -> None:
    """BERT-large's step on each GPU of `names` (module docstring), then, with the H100 among
    them, its rates beside NVIDIA's (the A100 check of the calibration is model scale's:
    scale.calibration)."""
    from bertperf.model import BertConfig
    from bertperf.model.flops import train_flops
    from bertperf.perfmodel import roofline

    chosen = [roofline.GPUS[name] for name in names]
    config = BertConfig.large()
    t0 = time.perf_counter()
    steps = model_steps()
    traces, optimizers, tokens = {}, {}, {}
    for layout, triton in (("varlen", False), ("varlen", True), ("packed", True)):
        trace, segments, optimizers[triton] = trace_step(config, steps[layout], triton)
        tokens[layout] = int(segments.sum())
        traces[layout, triton] = trace, roofline.flash_attention(
            trace.ops, segments, config.hidden_size, config.num_attention_heads)
    plain = traces["varlen", False][1]
    current, packed = traces["varlen", True][1], traces["packed", True][1]
    regions = sorted({op.region.rsplit(".", 1)[0] for op in plain
                      if op.region.startswith("kernels.") and not roofline.is_attention(op)})
    flat = [op for op in plain if op.phase != "optimizer"] \
        + [op for op in current if op.phase == "optimizer"]
    compiled = roofline.fuse_elementwise(packed)
    best = "packed + COMPILE=inductor + USE_CUDA_GRAPH=1"
    fp8 = f"{best}, encoder GEMMs in FP8 (roofline.fp8: modelled, not FP8=1's trace)"
    rows = [(f"varlen, plain PyTorch (no Triton kernels; {optimizers[False]})", "varlen", plain,
             False),
            *((f"varlen, plain + {r.removeprefix('kernels.')} in one kernel", "varlen",
               roofline.fuse_region(r)(plain), False) for r in regions),
            (f"varlen, plain + {optimizers[True]} (LAMB over one flat buffer)", "varlen", flat,
             False),
            ("varlen, Triton kernels", "varlen", current, False),
            ("packed (LAYOUT=packed), Triton kernels", "packed", packed, False),
            ("packed + COMPILE=inductor (ATen elementwise chains fused, not across the Triton "
             "kernels)", "packed", compiled, False),
            (best, "packed", compiled, True),
            (fp8, "packed", roofline.fp8(compiled, tokens["packed"]), True)]
    v, p = steps["varlen"], steps["packed"]
    print("\nstep-time MODEL for the GPU (a model, not a measurement): BERT-large, bf16 autocast, "
          "a step of 448 sequences as on one H100: "
          f"{MODEL_ACCUMULATION['varlen']} micro-batches of {MODEL_BATCH} sequences (varlen; "
          f"lengths at MLPerf's quantiles: mean {v.lengths.mean():.1f}, E[L^2] "
          f"{np.mean(v.lengths ** 2.0):,.0f}, {v.mlm_counts.mean():.1f} masked a sequence) or "
          f"{MODEL_ACCUMULATION['packed']} of {len(p)} rows (packed; filled to "
          f"{p.efficiency(MAX_SEQ_LENGTH):.1%} with such sequences, counted as "
          f"MLPerf's {MLPERF_PACKING} sequences a row)")
    print(f"the trainer's step traced on fake tensors ({time.perf_counter() - t0:.0f} s; host "
          f"syncs in it: {traces['varlen', True][0].syncs} varlen, "
          f"{traces['packed', True][0].syncs} packed, not priced), with the LAMB the trainer "
          f"takes (FLAT_LAMB=auto): {optimizers[False]} without the Triton kernels, "
          f"{optimizers[True]} with them; attention as FlashAttention-2 varlen; a kernel takes "
          "max(FLOPs / rate, bytes / bandwidth, launch), at fractions of the datasheet peaks "
          "calibrated on published kernel measurements (perfmodel/anchors.csv): "
          + "; ".join(f"{g.name} GEMMs {g.matmul_efficiency:.0%}"
                      + (f" (FP8 {g.fp8_efficiency:.0%} of its FP8 peak)" if g.fp8_flops else "")
                      + f", attention {g.attention_forward_efficiency:.0%} forward and "
                      f"{g.attention_backward_efficiency:.0%} backward, memory "
                      f"{g.memory_efficiency:.0%} of the bandwidth" for g in chosen)
          + f"; launch {roofline.LAUNCH_SECONDS * 1e6:.0f} us (CUDA graphs: "
          f"{roofline.GRAPH_LAUNCH_SECONDS * 1e6:.0f} us); MFU = model FLOP/s on real tokens / "
          "the GPU's dense bf16 peak")
    print("| GPU | step | kernels | GB moved | ms/step | seq/s | MFU | vs plain |")
    print("|---|---|---|---|---|---|---|---|")
    per_sequence = train_flops(config, v.lengths, int(v.mlm_counts.sum())) / len(v)
    sequences = {"varlen": len(v), "packed": MODEL_BATCH * MLPERF_PACKING}
    rates = {}
    for gpu in chosen:
        base = MODEL_ACCUMULATION["varlen"] * len(v) \
            / roofline.step_cost(plain, gpu, MODEL_ACCUMULATION["varlen"]).seconds
        for label, layout, ops, graphs in rows:
            if " + " in label and "plain" in label and gpu is not chosen[-1]:
                continue  # each kernel's share: on the last GPU only
            if "FP8" in label and not gpu.fp8_flops:
                continue
            cost = roofline.step_cost(ops, gpu, MODEL_ACCUMULATION[layout], graphs)
            rate = rates[gpu.name, label] = MODEL_ACCUMULATION[layout] * sequences[layout] \
                / cost.seconds
            mfu = rate * per_sequence / gpu.tensor_flops
            print(f"| {gpu.name} | {label} | {cost.launches:,} | {cost.bytes / 1e9:,.1f} | "
                  f"{cost.seconds * 1e3:,.1f} | {rate:,.0f} | {mfu:.0%} | {rate / base:.2f}x |")
    print("(a model, not a measurement: `make gpu-check` measures the real thing)")
    if H100 not in names:
        return
    nvidia = anchors()["mlperf_fp8", H100]
    h100, where = H100, nvidia.source.split(" (")[0]
    print("calibration checked on the A100 by `python -m bertperf model scale` (NVIDIA's MLPerf "
          "1xDGX A100 rows, the line under its table; tests/unit/test_model_scale.py holds it "
          f"within {TOLERANCE * 100:.0f} %); the H100 (bf16 and FP8 predicted, one "
          "GPU, no all-reduce or evals): "
          f"{rates[h100, best]:,.0f} seq/s bf16 as the code runs it ({best}); "
          f"{rates[h100, fp8]:,.0f} seq/s with "
          f"the encoder's GEMMs in FP8 (they and the cast/amax kernels FP8 adds are all it "
          f"changes); NVIDIA's MLPerf code on 8 H100s: {nvidia.value:,.0f} {nvidia.unit} "
          "measured (FP8 GEMMs and attention, packed, CUDA graphs; evals taken out; "
          f"{where})")
