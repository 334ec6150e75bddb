"""`python -m bertperf bench train`: training speed of HuggingFace's BertForPreTraining and of
bertperf with each of its switches on in turn, on the same samples in one process; then a
step-time model for the GPU (bench/roofline.py), which is a model, not a measurement.

Every row starts from the same weights (bertperf's initialisation, in HF's names through
bertperf.model.hf) and trains with LAMB (gradients clipped at norm 1.0) on the same batches of
real samples from --data (unpadded or packed shards; --synthetic: MLPerf-like lengths, no files):
warm-up steps, then timed steps. Rows:

  HF              transformers.BertForPreTraining, SDPA attention, batches padded to
                  max_seq_length, the MLM head on every position (as a user runs it), fp32 and
                  under bf16 autocast
  bertperf        varlen (unpadded), then + bf16, + packed, + fused kernels, + compile,
                  + CUDA graphs, each row adding one switch to the one before; a switch the code
                  or the device does not have is shown as "not available (why)" and skipped

Columns: sequences/s; real (unpadded) tokens/s; model TFLOP/s counted on real tokens
(bench/flops.py: the same for every row, whatever it pads); MFU against the dense matmul rate
measured first on the same device (the FFN's GEMM at the batch's token count, in the row's
precision); peak memory (CUDA: max_memory_allocated; CPU: growth of the peak RSS); the loss of
the last step (every row should land close to the others); speed relative to HF at the same
precision. Every row's batches are checked to hold the same sequences.

Default: this machine's CPU, BERT-large's layer shapes with 2 layers, 8 sequences a step,
1 warm-up + 3 timed steps. `--config large --device cuda`: BERT-large, 56 sequences, 5 + 20 steps.

The model's table prices the bertperf step's kernels, traced on fake tensors for BERT-large at
56 sequences a micro-batch and 8 micro-batches a step (config_DGXH100_1x1x56x8.sh), with
MLPerf's sequence lengths, on an A100 and an H100 (docs/performance.md).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gc
import hashlib
import io
import itertools
import math
import platform
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bertperf.bench.flops import train_flops
from bertperf.bench.loader import _rss_kb, synthetic_packed, synthetic_samples
from bertperf.data.collate import collate_padded, collate_varlen
from bertperf.data.dataset import ShardDataset
from bertperf.data.order import EpochPlan
from bertperf.errors import UserError
from bertperf.formats.samples import Samples, offsets_from_lengths, ranges

SWITCHES = ("varlen", "bf16", "packed", "fused kernels", "compile", "CUDA graphs")
LR = 4.25e-4
"""LAMB's learning rate (MLPerf's reference at batch 448), constant."""
MAX_GRAD_NORM = 1.0
MODEL_BATCH, MODEL_ACCUMULATION = 56, 8
"""The step the model prices: config_DGXH100_1x1x56x8.sh (56 sequences, 8 micro-batches)."""
MLPERF_LENGTH_QUANTILES = ((0.0, 8), (0.10, 48), (0.25, 84), (0.50, 204), (0.75, 484),
                           (0.766, 512), (1.0, 512))
"""(fraction, sequence length) of MLPerf's phase-2 Wikipedia samples (Graphcore's histogram of
one dupe pass: p10 48, p25 84, median 204, p75 484, 23.4 % at 512; mean 255.8)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", type=Path,
                     help="folder of unpadded or packed training shards (prep unpad / prep pack)")
    src.add_argument("--synthetic", action="store_true",
                     help="synthetic samples with MLPerf-like lengths (bench.loader) instead")
    p.add_argument("--config", default="large",
                   help="model shape: large, base, tiny or a bert_config.json (default large)")
    p.add_argument("--layers", type=int,
                   help="transformer layers (default: 2 on the CPU, the config's on CUDA)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--batch", type=int,
                   help="sequences a step (packed shards: rows); default 8 on the CPU, 56 on CUDA")
    p.add_argument("--warmup", type=int, help="untimed steps a row (default 1 CPU, 5 CUDA)")
    p.add_argument("--steps", type=int, help="timed steps a row (default 3 CPU, 20 CUDA)")
    p.add_argument("--precision", choices=("both", "fp32", "bf16"),
                   help="rows in fp32, bf16 or both (bf16 switched on after varlen); default "
                        "both on the CPU, bf16 on CUDA")
    p.add_argument("--seed", type=int, default=1, help="weights, dropout and sample order")
    p.add_argument("--report", type=Path,
                   help="also append the output, with the command and the date, to this file "
                        "and print the lines for docs/performance.md (make gpu-check)")


class NotAvailable(Exception):
    """A row this code or device cannot run; the message says why."""


# ---- samples -------------------------------------------------------------------------------------

@dataclass
class Step:
    """The sequences of one step, the same for every row."""

    samples: Samples
    rows: np.ndarray | None
    """Packed data: how many of the sequences (in order) each row holds; None for unpadded
    shards."""


def load_steps(args: argparse.Namespace, count: int) -> tuple[list[Step], str, int, int]:
    """`count` steps of --batch samples (packed data: rows), a description of their source, and
    max_seq_length / max_predictions_per_seq."""
    if args.synthetic:
        max_len, max_pred = 512, 76
        rows = synthetic_packed(synthetic_samples(3 * count * args.batch, args.seed, max_len,
                                                  max_pred))
        if len(rows) < count * args.batch:
            raise UserError("too few synthetic rows")  # 3 samples a row at most
        parts = [rows.take(np.arange(i * args.batch, (i + 1) * args.batch)) for i in range(count)]
        steps = [Step(p.to_samples(), p.seqs_per_row) for p in parts]
        return steps, "synthetic samples (MLPerf-like lengths), packed in order", max_len, max_pred
    dataset = ShardDataset.from_folder(args.data)
    plan = EpochPlan(dataset.counts, args.seed, 0)
    unit = "rows" if dataset.packed else "samples"
    if plan.length < count * args.batch:
        raise UserError(f"{args.data}: {plan.length} {unit}, the benchmark needs "
                        f"{count} steps x {args.batch}")
    steps = []
    for i in range(count):
        refs = plan.refs(i * args.batch, (i + 1) * args.batch)
        if dataset.packed:
            parts = [dataset.reader(shard).rows.take(rows) for shard, rows in refs]
            steps.append(Step(Samples.concat([p.to_samples() for p in parts]),
                              np.concatenate([p.seqs_per_row for p in parts])))
        else:
            parts = [dataset.take(shard, rows) for shard, rows in refs]
            steps.append(Step(Samples.concat(parts), None))
    dataset.close()
    return steps, f"{args.data} ({len(dataset)} {dataset.kind} shards; a step: {args.batch} " \
        f"{unit})", dataset.max_seq_length, dataset.max_pred


def mlperf_lengths(n: int) -> np.ndarray:
    """n sequence lengths at evenly spaced quantiles of MLPerf's length distribution."""
    q, length = zip(*MLPERF_LENGTH_QUANTILES)
    return np.rint(np.interp((np.arange(n) + 0.5) / n, q, length)).astype(np.int64)


def samples_of_lengths(lengths: np.ndarray, max_pred: int = 76) -> Samples:
    """Samples of these lengths with create_pretraining_data's mask count, round(0.15 L) in
    1..max_pred (token ids do not matter where they are used)."""
    counts = np.clip(np.rint(0.15 * lengths), 1, max_pred).astype(np.int64)
    offsets = offsets_from_lengths(lengths)
    return Samples(np.full(int(offsets[-1]), 999, dtype=np.int64), offsets, lengths // 2,
                   ranges(np.ones(len(lengths), dtype=np.int64), counts),
                   np.full(int(counts.sum()), 999, dtype=np.int64), offsets_from_lengths(counts),
                   np.zeros(len(lengths), dtype=np.int64))


def digest(sequences) -> str:
    """A fingerprint of a step's sequences, independent of their order and layout."""
    return hashlib.sha1(b"|".join(sorted(np.asarray(s, dtype=np.int64).tobytes()
                                         for s in sequences))).hexdigest()


# ---- the step every row times ------------------------------------------------------------------

def train_step(model, inputs: dict, optimizer, device_type: str, dtype):
    """Forward (the model computes the loss), backward, clipped LAMB step; the loss (a tensor,
    not read back here). dtype: the autocast dtype, None for float32."""
    import torch

    from bertperf.optim import clipped_step

    with torch.autocast(device_type, dtype=dtype, enabled=dtype is not None):
        loss = model(**inputs).loss
    loss.backward()
    clipped_step(optimizer, MAX_GRAD_NORM, None)
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def lamb(model):
    from bertperf.optim import make_optimizer, param_groups

    return make_optimizer("lamb", param_groups(model, 0.01), lr=LR)


# ---- rows ----------------------------------------------------------------------------------------

@dataclass
class Bench:
    """What every row shares."""

    config: object
    device: object
    steps: list[Step]
    warmup: int
    max_seq_length: int
    max_pred: int
    initial: dict
    """The weights every row starts from (bertperf's names)."""


@dataclass
class Trainee:
    model: object
    optimizer: object
    batches: list[dict]
    """Model inputs on the device, one per step."""
    digests: list[str]
    dtype: object


def _on(device, arrays: dict) -> dict:
    import torch

    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in arrays.items()}


def hf_row(bench: Bench, precision: str) -> Trainee:
    """transformers.BertForPreTraining with SDPA attention on padded batches."""
    import torch
    import transformers

    from bertperf.model import to_hf_state_dict

    c = bench.config
    model = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size,
        hidden_act=c.hidden_act, hidden_dropout_prob=c.hidden_dropout_prob,
        attention_probs_dropout_prob=c.attention_probs_dropout_prob,
        max_position_embeddings=c.max_position_embeddings, type_vocab_size=c.type_vocab_size,
        layer_norm_eps=c.layer_norm_eps, initializer_range=c.initializer_range,
        attn_implementation="sdpa"))
    model.load_state_dict(to_hf_state_dict(bench.initial, c), strict=True)
    batches, digests = [], []
    for step in bench.steps:
        p = collate_padded(step.samples, bench.max_seq_length, bench.max_pred)
        labels = np.full(p["input_ids"].shape, -100, dtype=np.int64)
        rows, slots = np.nonzero(p["masked_lm_positions"])
        labels[rows, p["masked_lm_positions"][rows, slots]] = p["masked_lm_ids"][rows, slots]
        batches.append(_on(bench.device, {
            "input_ids": torch.as_tensor(p["input_ids"]).long(),
            "attention_mask": torch.as_tensor(p["input_mask"]).long(),
            "token_type_ids": torch.as_tensor(p["segment_ids"]).long(),
            "labels": torch.as_tensor(labels),
            "next_sentence_label": torch.as_tensor(p["next_sentence_labels"]).long().reshape(-1)}))
        lengths = p["input_mask"].sum(1)
        digests.append(digest(row[:n] for row, n in zip(p["input_ids"], lengths)))
    model.to(bench.device).train()
    return Trainee(model, lamb(model), batches, digests, _dtype(precision))


def _dtype(precision: str):
    import torch

    return torch.bfloat16 if precision == "bf16" else None


def unavailable(bench: Bench, switch: str) -> str | None:
    """Why a switch cannot be on for this run, or None."""
    import torch

    cuda = bench.device.type == "cuda"
    if switch == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16"
    if switch == "packed":
        return "the model takes no packed batches yet"
    if switch == "fused kernels":
        return "kernels/ has no fused kernels yet"
    if switch == "compile":
        return "the training step has no compile switch yet"
    if switch == "CUDA graphs":
        return "the training step has no CUDA-graph switch yet" if cuda else "CUDA only"
    return None


def bertperf_row(bench: Bench, switches: tuple[str, ...]) -> Trainee:
    """BertForPreTraining with these switches on (those of SWITCHES that are available)."""
    from bertperf.model import BertForPreTraining, UnpaddedBatch

    model = BertForPreTraining(bench.config)
    model.load_state_dict(bench.initial)
    batches, digests = [], []
    for step in bench.steps:
        arrays = collate_varlen(step.samples)
        batches.append(_on(bench.device, UnpaddedBatch.from_arrays(arrays).inputs()))
        cu = arrays["cu_seqlens"]
        digests.append(digest(arrays["input_ids"][a:b] for a, b in itertools.pairwise(cu)))
    model.to(bench.device).train()
    return Trainee(model, lamb(model), batches, digests,
                   _dtype("bf16" if "bf16" in switches else "fp32"))


# ---- measuring -----------------------------------------------------------------------------------

@dataclass
class Result:
    label: str
    precision: str
    seconds: float = 0.0
    sequences: int = 0
    tokens: int = 0
    flops: float = 0.0
    peak_bytes: float = 0.0
    loss: float = float("nan")
    digests: tuple[str, ...] = ()
    missing: str | None = None
    """Why the row did not run."""


class PeakMemory:
    """Peak memory of what runs between start() and peak(): CUDA's max_memory_allocated, or the
    growth of this process's peak RSS (reset through /proc/self/clear_refs)."""

    def __init__(self, device) -> None:
        self.device = device

    def start(self) -> None:
        import torch

        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed memory back to the system first
        except (OSError, AttributeError):
            pass
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS (Linux)
            self.base = _rss_kb()[0] * 1024
        except OSError:
            self.base = None

    def peak(self) -> float:
        import torch

        if self.device.type == "cuda":
            return float(torch.cuda.max_memory_allocated(self.device))
        return float("nan") if self.base is None else _rss_kb()[1] * 1024 - self.base


def measure(bench: Bench, label: str, precision: str, build) -> Result:
    """Build a row (NotAvailable: reported as such) and time its steps."""
    import torch

    result = Result(label, precision)
    memory = PeakMemory(bench.device)
    memory.start()
    torch.manual_seed(0)
    try:
        t = build()
    except NotAvailable as exc:
        return replace(result, missing=str(exc))

    def sync():
        if bench.device.type == "cuda":
            torch.cuda.synchronize(bench.device)

    for i, (batch, step) in enumerate(zip(t.batches, bench.steps)):
        s = step.samples
        sync()
        start = time.perf_counter()
        loss = train_step(t.model, batch, t.optimizer, bench.device.type, t.dtype)
        sync()
        if i >= bench.warmup:
            result.seconds += time.perf_counter() - start
            result.sequences += len(s)
            result.tokens += int(s.lengths.sum())
            result.flops += train_flops(bench.config, s.lengths, int(s.mlm_counts.sum()))
    result.loss = float(loss)
    result.peak_bytes = memory.peak()
    result.digests = tuple(t.digests)
    del t
    return result


def matmul_rate(device, dtype, m: int, k: int, n: int, seconds: float = 0.5) -> float:
    """FLOP/s of an [m, k] x [k, n] matmul on the device, repeated for at least `seconds`."""
    import torch

    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    reps, elapsed = 0, 0.0
    (a @ b).sum().item()  # warm-up
    start = time.perf_counter()
    while elapsed < seconds:
        c = a @ b
        reps += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
    del c
    return 2.0 * m * k * n * reps / elapsed


def rows(bench: Bench, precisions: tuple[str, ...]):
    """(label, precision, build) of every row, in order: HF in each precision, then bertperf
    with one more switch a row (the bf16 switch only when both precisions run)."""
    for precision in precisions:
        yield "HF BertForPreTraining (SDPA, padded)", precision, \
            lambda precision=precision: hf_row(bench, precision)
    on: tuple[str, ...] = ("bf16",) if precisions == ("bf16",) else ()
    for switch in SWITCHES:
        if switch == "bf16" and len(precisions) == 1:
            continue
        why = unavailable(bench, switch)
        if why is None:
            on += (switch,)
        label = "bertperf: varlen" if switch == "varlen" else f"bertperf: + {switch}"

        def build(switches=on, why=why):
            if why is not None:
                raise NotAvailable(why)
            return bertperf_row(bench, switches)

        yield label, "bf16" if "bf16" in on else "fp32", build


# ---- the model -------------------------------------------------------------------------------------

def trace_bertperf(config, samples: Samples, dtype):
    """The bertperf training step's kernels on these samples (bench/roofline.py), on fake
    tensors."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from bertperf.bench import roofline
    from bertperf.model import BertForPreTraining, UnpaddedBatch

    fake = FakeTensorMode()
    with fake:
        model = BertForPreTraining(config)
        optimizer = lamb(model)
    inputs = {k: fake.from_tensor(v) if isinstance(v, torch.Tensor) else v
              for k, v in UnpaddedBatch.from_arrays(collate_varlen(samples)).inputs().items()}
    with fake:
        return roofline.trace(lambda: train_step(model, inputs, optimizer, "cpu", dtype))


def print_model() -> None:
    """The second table: BERT-large's step on each GPU, as the code runs it and with each
    fusion (bench/roofline.py)."""
    import torch

    from bertperf.bench import roofline
    from bertperf.model import BertConfig

    config = BertConfig.large()
    lengths = mlperf_lengths(MODEL_BATCH)
    samples = samples_of_lengths(lengths)
    t0 = time.perf_counter()
    trace = trace_bertperf(config, samples, torch.bfloat16)
    ops = roofline.flash_attention(trace.ops, lengths, config.hidden_size,
                                   config.num_attention_heads)
    useful = MODEL_ACCUMULATION * train_flops(config, lengths, int(samples.mlm_counts.sum()))
    sequences = MODEL_ACCUMULATION * MODEL_BATCH
    print(f"\nstep-time MODEL for the GPU (a model, not a measurement): BERT-large, "
          f"{MODEL_ACCUMULATION} micro-batches of {MODEL_BATCH} sequences a step, unpadded, "
          f"bf16 autocast; lengths at MLPerf's quantiles (mean {lengths.mean():.1f}, "
          f"E[L^2] {np.mean(lengths.astype(float) ** 2):,.0f}, "
          f"{samples.mlm_counts.mean():.1f} masked a sequence)")
    print(f"the bertperf step's kernels traced on fake tensors in "
          f"{time.perf_counter() - t0:.1f} s: {len(trace.ops):,} kernels a micro-batch and "
          f"optimizer step, {trace.syncs} host syncs (not priced); attention as FlashAttention "
          f"varlen; kernel time = max(FLOPs / rate, bytes / bandwidth, launch cost), matmuls at "
          f"{roofline.MATMUL_EFFICIENCY:.0%} of the tensor peak, memory at "
          f"{roofline.MEMORY_EFFICIENCY:.0%} of the bandwidth, launch "
          f"{roofline.LAUNCH_SECONDS * 1e6:.0f} us (CUDA graphs: "
          f"{roofline.GRAPH_LAUNCH_SECONDS * 1e6:.0f} us); model TFLOP/s on real tokens "
          f"{useful / 1e12:.1f} TFLOP a step")
    print("| GPU | step | kernels | GB moved | ms/step | seq/s | MFU | saves ms |")
    print("|---|---|---|---|---|---|---|---|")
    for gpu in roofline.GPUS:
        base = None
        for sc in roofline.scenarios(ops):
            cost = roofline.step_cost(sc.transform(ops), gpu, sc.launch, MODEL_ACCUMULATION)
            base = base or cost.seconds
            mfu = useful / cost.seconds / (gpu.tensor_flops * roofline.MATMUL_EFFICIENCY)
            print(f"| {gpu.name} | {sc.label} | {cost.launches:,} | {cost.bytes / 1e9:,.1f} | "
                  f"{cost.seconds * 1e3:,.1f} | {sequences / cost.seconds:,.0f} | {mfu:.0%} | "
                  f"{(base - cost.seconds) * 1e3:,.1f} |")
    print("(a model, not a measurement: `make gpu-check` measures the real thing)")


# ---- the command -----------------------------------------------------------------------------------

def _gib(n: float) -> str:
    return "n/a" if math.isnan(n) else f"{n / 2**30:.2f} GiB"


def run(args: argparse.Namespace) -> int:
    output = io.StringIO()
    with contextlib.redirect_stdout(Tee(sys.stdout, output)):
        measure_rows(args)
        measured = output.getvalue()
        print_model()
    if args.report is not None:
        command = " ".join(["python -m bertperf", *sys.argv[1:]])
        args.report.parent.mkdir(parents=True, exist_ok=True)
        with args.report.open("a") as f:
            f.write(f"`{command}`, {datetime.date.today()}:\n\n{output.getvalue()}\n")
        print(f"\nappended to {args.report}; for docs/performance.md:\n\n"
              f"`{command}` ({datetime.date.today()}):\n")
        print("\n".join(line for line in measured.splitlines() if line))
    return 0


class Tee(io.TextIOBase):
    """Writes to several streams at once."""

    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def measure_rows(args: argparse.Namespace) -> None:
    """The header lines and the measured table."""
    import torch

    from bertperf.model import BertConfig, BertForPreTraining

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device here")
    cuda = device.type == "cuda"
    config = BertConfig.named(args.config)
    layers = args.layers or (config.num_hidden_layers if cuda else 2)
    config = replace(config, num_hidden_layers=layers)
    args.batch = args.batch or (56 if cuda else 8)
    warmup = 5 if cuda and args.warmup is None else (1 if args.warmup is None else args.warmup)
    timed = args.steps or (20 if cuda else 3)
    precision = args.precision or ("bf16" if cuda else "both")
    precisions = ("fp32", "bf16") if precision == "both" else (precision,)
    if timed < 1 or warmup < 0 or args.batch < 1:
        raise UserError("--steps and --batch must be at least 1, --warmup at least 0")

    steps, source, max_len, max_pred = load_steps(args, warmup + timed)
    torch.manual_seed(args.seed)
    initial = {k: v.clone() for k, v in BertForPreTraining(config).state_dict().items()}
    bench = Bench(config, device, steps, warmup, max_len, max_pred, initial)

    where = torch.cuda.get_device_name(device) if cuda else \
        f"{_cpu_name()}, {torch.get_num_threads()} threads"
    import transformers
    print(f"bench train, {datetime.date.today()}: {where}; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, Python {platform.python_version()}")
    print(f"model: hidden {config.hidden_size}, {config.num_attention_heads} heads, intermediate "
          f"{config.intermediate_size}, {layers} layers; LAMB lr {LR}, clipping at "
          f"{MAX_GRAD_NORM}; dropout {config.hidden_dropout_prob}")
    timed_steps = [step.samples for step in steps[warmup:]]
    lengths = np.concatenate([s.lengths for s in timed_steps])
    print(f"data: {source}; {warmup} warm-up + {timed} timed steps a row, "
          f"{np.mean([len(s) for s in timed_steps]):.1f} sequences a step, mean length "
          f"{lengths.mean():.0f} of {max_len}, "
          f"{np.mean([s.mlm_counts.mean() for s in timed_steps]):.1f} masked a sequence")
    tokens = int(np.mean([s.lengths.sum() for s in timed_steps]))
    rate = {p: matmul_rate(device, torch.bfloat16 if p == "bf16" else torch.float32, tokens,
                           config.hidden_size, config.intermediate_size) for p in precisions}
    print("dense matmul rate, [" + f"{tokens} x {config.hidden_size}] x "
          f"[{config.hidden_size} x {config.intermediate_size}]: "
          + ", ".join(f"{p} {r / 1e12:.2f} TFLOP/s" for p, r in rate.items()))

    results = []
    for label, prec, build in rows(bench, precisions):
        results.append(measure(bench, label, prec, build))
    print_table(results, rate, cuda)
    ran = [r for r in results if r.missing is None]
    if any(r.digests != ran[0].digests for r in ran):
        raise UserError("the rows did not train on the same sequences")
    print(f"every row trained on the same {sum(len(s.samples) for s in steps)} sequences in the same "
          f"{len(steps)} batches (digest {hashlib.sha1(''.join(ran[0].digests).encode()).hexdigest()[:12]})")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


def print_table(results: list[Result], rate: dict[str, float], cuda: bool) -> None:
    hf = {r.precision: r for r in results if r.label.startswith("HF") and r.missing is None}
    memory = "peak memory" if cuda else "peak RSS growth"
    print(f"\n| row | precision | seq/s | real tokens/s | model TFLOP/s | MFU | {memory} | "
          "loss | vs HF |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if r.missing is not None:
            print(f"| {r.label} | {r.precision} | not available ({r.missing}) | | | | | | |")
            continue
        tflops = r.flops / r.seconds / 1e12
        base = hf.get(r.precision)
        ratio = f"{r.sequences / r.seconds / (base.sequences / base.seconds):.2f}x" if base else ""
        print(f"| {r.label} | {r.precision} | {r.sequences / r.seconds:,.2f} | "
              f"{r.tokens / r.seconds:,.0f} | {tflops:.3f} | "
              f"{r.flops / r.seconds / rate[r.precision]:.0%} | {_gib(r.peak_bytes)} | "
              f"{r.loss:.4f} | {ratio} |")
