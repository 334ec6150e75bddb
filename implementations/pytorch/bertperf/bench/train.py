"""`python -m bertperf bench train`: training speed of HuggingFace's BertForPreTraining and of
the trainer's own step with each of its switches on in turn, on the same samples in one process.

Every row starts from the same weights (bertperf's initialisation, in HF's names through
bertperf.model.hf) and trains with LAMB (gradients clipped at norm 1.0; a line under the table
names each row's LAMB) on the same batches of real samples from --data (unpadded or packed
shards; with packed shards a step is --batch rows and their sequences; --synthetic: MLPerf-like
lengths packed in order, no files): warm-up steps, then timed steps. Rows:

  HF              transformers.BertForPreTraining, SDPA attention, batches padded to
                  max_seq_length, the MLM head on every position (as a user runs it), fp32 and
                  under bf16 autocast; bertperf's Lamb at a constant LR
  bertperf        the trainer's step itself: train.loop.build_step and train_step (one
                  micro-batch a step, clipped LAMB, the LR schedule) with the row's switches set
                  as the trainer's settings: varlen (LAYOUT=varlen, FUSED_KERNELS=0), then
                  + bf16 (PRECISION), + packed (LAYOUT=packed), + fused kernels
                  (FUSED_KERNELS=1: bertperf.kernels' Triton kernels, and FlatLamb with them),
                  + compile (COMPILE=inductor), + CUDA graphs (USE_CUDA_GRAPH=1), + FP8
                  (FP8=1: the encoder's GEMMs in FP8, bf16 and sm_89+ only), each row
                  adding one switch to the one before. A switch the trainer refuses here
                  (train.allowed's rows on the settings and this machine: its own words), or
                  the data or the GPU does not allow, is shown as "not available (why)" and left
                  out of the rows after; a row that fails (any error: out of memory, a
                  compiler's) is "failed (error)", and the rows after keep its switch

Columns: sequences/s; real (unpadded) tokens/s; model TFLOP/s counted on real tokens
(model/flops.py: the same work for every row, whatever it pads); MFU against the dense matmul
rate measured first on the same device (the FFN's GEMM at a step's token count, in the row's
precision, best of three); peak memory (CUDA: max_memory_allocated; CPU: growth of the peak RSS);
the loss of the last step (every row should land close to the others); speed relative to HF at
the same precision measured before it. Rates are a step's mean work over the median step time.
Every row's batches are checked to hold the same sequences.

Each row's line is printed (and --report's file written) as soon as the row is measured, so a
run stopped part-way keeps the rows before. --rows measures some of the rows (the switches of
those left out still on in the rows after them).

Default: this machine's CPU, BERT-large's layer shapes with 2 layers, 8 sequences (rows) a step,
1 warm-up + 3 timed steps. `--config large --device cuda`: BERT-large, 56, 5 + 20 steps.
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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from bertperf.bench.loader import _rss_kb
from bertperf.config import RunConfig
from bertperf.data.collate import (collate_packed, collate_padded, collate_varlen,
                                   max_masks_per_row)
from bertperf.data.dataset import ShardDataset
from bertperf.data.order import EpochPlan
from bertperf.data.synthetic import synthetic_packed, synthetic_samples
from bertperf.errors import UserError
from bertperf.formats.files import unwritable
from bertperf.formats.packed import Packed
from bertperf.formats.samples import Samples
from bertperf.host import cpu_name

SWITCHES = ("varlen", "bf16", "packed", "fused kernels", "compile", "CUDA graphs", "FP8")
ROW_KEYS = ("hf", "varlen", "bf16", "packed", "kernels", "compile", "graphs", "fp8")
"""--rows' names: the HF rows, then the bertperf rows, one a switch in SWITCHES' order."""
LR, MAX_STEPS = 4.25e-4, 6700
"""LAMB's learning rate and the schedule's length, the single-node recipe's
(config_DGXA100_1x8x56x1.sh): over a bench's few steps the trainer's linear decay keeps the LR
within 0.5 % of LR."""
MAX_GRAD_NORM = 1.0
MAX_SEQS_PER_ROW, MASKED_LM_PROB = 3, 0.15
"""Packed rows as prep pack makes them; the masking rate of MLPerf's data (and --synthetic's)."""

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
    p.add_argument("--rows", default=",".join(ROW_KEYS),
                   help="the rows to measure, comma-separated (default: all): "
                        f"{', '.join(ROW_KEYS)}; the switches of those left out stay on in the "
                        "rows after them")
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
    source = f"{args.data} ({len(dataset)} {dataset.kind} shards; a step: {args.batch} {unit})"
    return steps, source, dataset.max_seq_length, dataset.max_pred


def digest(sequences) -> str:
    """A fingerprint of a step's sequences, independent of their order and layout."""
    return hashlib.sha1(b"|".join(sorted(np.asarray(s, dtype=np.int64).tobytes()
                                         for s in sequences))).hexdigest()


# ---- the trainer's step, as each bertperf row configures it -------------------------------------

def run_config(switches: tuple[str, ...], device: str) -> RunConfig:
    """The trainer's configuration of a bertperf row: its switches as the settings they are
    (PRECISION, LAYOUT, FUSED_KERNELS, COMPILE, USE_CUDA_GRAPH, FP8; FUSED_KERNELS=0 without the
    fused-kernels switch), the bench's LAMB (LR, MAX_STEPS, MAX_GRAD_NORM; the rest the
    trainer's defaults), DEVICE `device`."""
    cfg = RunConfig()
    return replace(
        cfg, data=replace(cfg.data, layout="packed" if "packed" in switches else "varlen"),
        optim=replace(cfg.optim, lr=LR, max_steps=MAX_STEPS, max_grad_norm=MAX_GRAD_NORM),
        train=replace(cfg.train, precision="bf16" if "bf16" in switches else "fp32",
                      device=device, fused_kernels="fused kernels" in switches,
                      compile="inductor" if "compile" in switches else "none",
                      use_cuda_graph="CUDA graphs" in switches,
                      fp8="1" if "FP8" in switches else "0"))


def mapped(f: Callable, tensors: dict) -> dict:
    """The dict with f applied to its tensors (the other values as they are)."""
    import torch

    return {k: f(v) if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}


def loader_arrays(step: Step, layout: str, max_seq_length: int,
                  max_pred: int) -> tuple[dict, str]:
    """A step's sequences as the loader's arrays of one micro-batch of one rank (collate_varlen,
    or collate_packed of fixed-shape rows), for train.loop.to_device; and the digest of the
    sequences they hold."""
    if layout == "packed":
        rows = Packed.from_samples(step.samples, np.arange(len(step.samples)), step.rows) \
            .batch(None, max_seq_length, MAX_SEQS_PER_ROW, max_pred)
        arrays = collate_packed(rows, max_masks_per_row(max_seq_length, MAX_SEQS_PER_ROW,
                                                        max_pred, MASKED_LM_PROB))
        sequences = (row[start:start + n] for row, starts, lengths in
                     zip(rows["input_ids"], rows["seq_starts"], rows["seq_lengths"])
                     for start, n in zip(starts, lengths) if n)
    else:
        arrays = collate_varlen(step.samples)
        sequences = (arrays["input_ids"][a:b] for a, b in itertools.pairwise(arrays["cu_seqlens"]))
    return {**arrays, "global_sequences": arrays["num_sequences"]}, digest(sequences)


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
    step: Callable
    """batch -> its loss: one optimizer step."""
    model: object
    optimizer: object
    batches: list
    """step's argument on the device, one per step."""
    digests: list[str]


def hf_row(bench: Bench, precision: str) -> Trainee:
    """transformers.BertForPreTraining with SDPA attention on padded batches, stepped by its own
    loop: forward under autocast, backward, bertperf's Lamb (weight decay 0.01, the trainer's
    betas and epsilon) clipped at MAX_GRAD_NORM, at the constant LR."""
    import torch
    import transformers

    from bertperf.model import to_hf_state_dict
    from bertperf.model.hf import hf_config
    from bertperf.optim import clipped_step, make_optimizer, param_groups

    c = bench.config
    model = transformers.BertForPreTraining(transformers.BertConfig.from_dict(
        hf_config(c), attn_implementation="sdpa"))
    model.load_state_dict(to_hf_state_dict(bench.initial, c), strict=True)
    batches, digests = [], []
    for step in bench.steps:
        p = collate_padded(step.samples, bench.max_seq_length, bench.max_pred)
        labels = np.full(p["input_ids"].shape, -100, dtype=np.int64)
        rows, slots = np.nonzero(p["masked_lm_positions"])
        labels[rows, p["masked_lm_positions"][rows, slots]] = p["masked_lm_ids"][rows, slots]
        batches.append(mapped(lambda t: t.to(bench.device), {
            "input_ids": torch.as_tensor(p["input_ids"]).long(),
            "attention_mask": torch.as_tensor(p["input_mask"]).long(),
            "token_type_ids": torch.as_tensor(p["segment_ids"]).long(),
            "labels": torch.as_tensor(labels),
            "next_sentence_label": torch.as_tensor(p["next_sentence_labels"]).long().reshape(-1)}))
        lengths = p["input_mask"].sum(1)
        digests.append(digest(row[:n] for row, n in zip(p["input_ids"], lengths)))
    model.to(bench.device).train()
    optimizer = make_optimizer("lamb", param_groups(model, 0.01), lr=LR)
    dtype = torch.bfloat16 if precision == "bf16" else None

    def step(batch: dict):
        with torch.autocast(bench.device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(**batch).loss
        loss.backward()
        clipped_step(optimizer, MAX_GRAD_NORM, None)
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return Trainee(step, model, optimizer, batches, digests)


def unavailable(bench: Bench, switches: tuple[str, ...]) -> str | None:
    """Why the row with these switches cannot run here, or None: what the data or the GPU does
    not allow, then the trainer's own refusals (train.allowed) of the row's settings on this
    machine."""
    import torch

    from bertperf.train import allowed

    if "bf16" in switches and bench.device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16"
    if "packed" in switches and bench.steps[0].rows is None:
        return "needs packed shards: prep pack"
    cfg = run_config(switches, bench.device.type)
    try:
        allowed.check(cfg, (allowed.SETTINGS, allowed.MACHINE))
    except UserError as exc:
        return str(exc)
    return None


def bertperf_row(bench: Bench, cfg: RunConfig) -> Trainee:
    """BertForPreTraining from the bench's weights, stepped by the trainer's step as `cfg`
    builds it (train.loop.build_step on one process, then train_step over one micro-batch)."""
    from bertperf.model import BertForPreTraining
    from bertperf.train import loop
    from bertperf.train.dist import Dist
    from bertperf.train.layout import LAYOUTS

    core = BertForPreTraining(bench.config)
    core.load_state_dict(bench.initial)
    core.to(bench.device).train()
    step = loop.build_step(cfg, Dist(0, 1), bench.device, core)
    batch_type = LAYOUTS[cfg.data.layout].batch_type
    batches, digests = [], []
    for s in bench.steps:
        arrays, seen = loader_arrays(s, cfg.data.layout, bench.max_seq_length, bench.max_pred)
        batches.append(loop.to_device(arrays, batch_type, bench.device))
        digests.append(seen)
    return Trainee(lambda micro: loop.train_step(step, [micro]), core, step.plan.optimizer,
                   batches, digests)


# ---- measuring -----------------------------------------------------------------------------------

@dataclass
class Result:
    label: str
    precision: str
    seconds: list[float] = field(default_factory=list)
    """Each timed step's time."""
    sequences: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    flops: list[float] = field(default_factory=list)
    """Each timed step's sequences, real tokens and model FLOPs."""
    peak_bytes: float = 0.0
    loss: float = float("nan")
    optimizer: str = ""
    """The LAMB's class (Lamb, FlatLamb)."""
    digests: tuple[str, ...] = ()
    missing: str | None = None
    """Why the row has no numbers: "not available (why)" or "failed (error)"."""

    def rate(self, per_step: list) -> float:
        """A step's mean amount (sequences, tokens, FLOPs) over the median step time (robust to
        a step slowed by other work on the machine)."""
        return float(np.mean(per_step)) / float(np.median(self.seconds))


class PeakMemory:
    """Peak memory of what runs between start() and peak(): CUDA's max_memory_allocated, or the
    growth of this process's peak RSS (reset through /proc/self/clear_refs)."""

    def __init__(self, device) -> None:
        self.device = device

    def start(self) -> None:
        import torch

        release(self.device)
        if self.device.type == "cuda":
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


def release(device) -> None:
    """Frees what the rows before left behind (their models, optimizers, compiled steps), on
    CUDA back to the device too."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(bench: Bench, label: str, precision: str, build) -> Result:
    """Build a row (NotAvailable: reported as such) and time its steps. Any error (out of
    memory, a compiler's or Triton's, a refusal) is the row's "failed" cell, and what the row
    allocated is freed, so that the rows after still run; an interrupt stops the bench."""
    import torch

    result = Result(label, precision)
    torch._dynamo.reset()  # an earlier row's compiled step lets go of its model
    memory = PeakMemory(bench.device)
    memory.start()
    torch.manual_seed(0)
    try:
        train_row(bench, build(), result)
    except NotAvailable as exc:
        return replace(result, missing=f"not available ({exc})")
    except Exception as exc:  # noqa: BLE001 (one row's failure, whatever it is)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        result = replace(result, missing=f"failed ({type(exc).__name__}: {first[:100]})")
    else:
        result.peak_bytes = memory.peak()
        return result
    release(bench.device)  # the error, and with it the row's frames, are gone here
    return result


def train_row(bench: Bench, t: Trainee, result: Result) -> None:
    """Train the row on every step, timing those after the warm-up, into `result`."""
    import torch

    from bertperf.model.flops import train_flops

    result.optimizer = type(t.optimizer).__name__

    def sync():
        if bench.device.type == "cuda":
            torch.cuda.synchronize(bench.device)

    for i, (batch, step) in enumerate(zip(t.batches, bench.steps)):
        s = step.samples
        sync()
        start = time.perf_counter()
        loss = t.step(batch)
        sync()
        if i >= bench.warmup:
            result.seconds.append(time.perf_counter() - start)
            result.sequences.append(len(s))
            result.tokens.append(int(s.lengths.sum()))
            result.flops.append(train_flops(bench.config, s.lengths, int(s.mlm_counts.sum())))
    result.loss = float(loss)
    result.digests = tuple(t.digests)


def matmul_rate(device, dtype, m: int, k: int, n: int, seconds: float = 0.5) -> float:
    """FLOP/s of an [m, k] x [k, n] matmul on the device: doubling runs of back-to-back
    matmuls until one takes at least `seconds`; the best of three such runs."""
    return max(_matmul_rate(device, dtype, m, k, n, seconds) for _ in range(3))


def _matmul_rate(device, dtype, m: int, k: int, n: int, seconds: float) -> float:
    import torch

    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    c = torch.mm(a, b)  # warm-up
    reps = 1
    while True:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b, out=c)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * m * k * n * reps / elapsed
        reps *= 2


def rows(bench: Bench, precisions: tuple[str, ...], keys=ROW_KEYS):
    """(label, precision, build) of the rows named in `keys` (ROW_KEYS), in order: HF in each
    precision, then bertperf with one more switch a row (the bf16 switch only when both
    precisions run); a row left out still adds its switch to the rows after it."""
    if "hf" in keys:
        for precision in precisions:
            yield "HF BertForPreTraining (SDPA, padded)", precision, \
                lambda precision=precision: hf_row(bench, precision)
    on: tuple[str, ...] = ("bf16",) if precisions == ("bf16",) else ()
    for switch, key in zip(SWITCHES, ROW_KEYS[1:]):
        if switch == "bf16" and len(precisions) == 1:
            continue
        why = unavailable(bench, (*on, switch))
        if why is None:
            on += (switch,)
        if key not in keys:
            continue
        label = "bertperf: varlen" if switch == "varlen" else f"bertperf: + {switch}"

        def build(switches=on, why=why):
            if why is not None:
                raise NotAvailable(why)
            return bertperf_row(bench, run_config(switches, bench.device.type))

        yield label, "bf16" if "bf16" in on else "fp32", build


# ---- the command -----------------------------------------------------------------------------------

def _gib(n: float) -> str:
    return "n/a" if math.isnan(n) else f"{n / 2**30:.2f} GiB"


def run(args: argparse.Namespace) -> int:
    keys = row_keys(args.rows)
    if args.report is not None:  # appended to, never replaced: only a path it cannot write
        if args.report.is_dir():
            raise UserError(f"--report {args.report}: is a folder, expected a file to append to")
        if why := unwritable(args.report.parent):
            raise UserError(f"--report {args.report}: cannot be written: {why}")
    command = " ".join(["python -m bertperf", *sys.argv[1:]])
    output = io.StringIO()
    with contextlib.ExitStack() as stack:
        streams = [sys.stdout, output]
        if args.report is not None:  # appended line by line: a run stopped part-way keeps them
            args.report.parent.mkdir(parents=True, exist_ok=True)
            report = stack.enter_context(args.report.open("a", buffering=1))
            report.write(f"`{command}`, {datetime.date.today()}:\n\n")
            stack.callback(report.write, "\n")
            streams.append(report)
        with contextlib.redirect_stdout(Tee(*streams)):
            measure_rows(args, keys)
    if args.report is not None:
        print(f"\nappended to {args.report}; for docs/performance.md:\n\n"
              f"`{command}` ({datetime.date.today()}):\n")
        print("\n".join(line for line in output.getvalue().splitlines() if line))
    return 0


def row_keys(text: str) -> frozenset[str]:
    """--rows' keys, checked before anything is measured."""
    keys = [key.strip() for key in text.split(",")]
    unknown = [key for key in keys if key not in ROW_KEYS]
    if unknown:
        raise UserError(f"--rows: no row {unknown[0]!r}; the rows: {', '.join(ROW_KEYS)}")
    return frozenset(keys)


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


def measure_rows(args: argparse.Namespace, keys: frozenset[str]) -> None:
    """The header lines and the table of the rows in `keys`, each row's line printed as soon
    as it is measured."""
    import torch

    from bertperf.model import BertConfig, BertForPreTraining

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device here")
    cuda = device.type == "cuda"
    config = BertConfig.named(args.config)
    layers = args.layers if args.layers is not None else (config.num_hidden_layers if cuda else 2)
    args.batch = args.batch if args.batch is not None else (56 if cuda else 8)
    warmup = args.warmup if args.warmup is not None else (5 if cuda else 1)
    timed = args.steps if args.steps is not None else (20 if cuda else 3)
    precision = args.precision or ("bf16" if cuda else "both")
    precisions = ("fp32", "bf16") if precision == "both" else (precision,)
    for flag, value, least in (("--layers", layers, 1), ("--batch", args.batch, 1),
                               ("--warmup", warmup, 0), ("--steps", timed, 1)):
        if value < least:
            raise UserError(f"{flag} must be at least {least}, got {value}")
    config = replace(config, num_hidden_layers=layers)

    steps, source, max_len, max_pred = load_steps(args, warmup + timed)
    torch.manual_seed(args.seed)
    initial = {k: v.clone() for k, v in BertForPreTraining(config).state_dict().items()}
    bench = Bench(config, device, steps, warmup, max_len, max_pred, initial)

    where = torch.cuda.get_device_name(device) if cuda else \
        f"{cpu_name()}, {torch.get_num_threads()} threads"
    import transformers
    print(f"bench train, {datetime.date.today()}: {where}; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, Python {platform.python_version()}")
    print(f"model: hidden {config.hidden_size}, {config.num_attention_heads} heads, intermediate "
          f"{config.intermediate_size}, {layers} layers; LAMB lr {LR} (bertperf rows: the "
          f"trainer's step and schedule, MAX_STEPS={MAX_STEPS}), clipping at {MAX_GRAD_NORM}; "
          f"dropout {config.hidden_dropout_prob}")
    timed_steps = [step.samples for step in steps[warmup:]]
    lengths = np.concatenate([s.lengths for s in timed_steps])
    print(f"data: {source}; {warmup} warm-up + {timed} timed steps a row, "
          f"{np.mean([len(s) for s in timed_steps]):.1f} sequences a step, mean length "
          f"{lengths.mean():.0f} of {max_len}, "
          f"{np.mean([s.mlm_counts.mean() for s in timed_steps]):.1f} masked a sequence")
    tokens = int(np.mean([s.lengths.sum() for s in timed_steps]))
    rate = {p: matmul_rate(device, torch.bfloat16 if p == "bf16" else torch.float32, tokens,
                           config.hidden_size, config.intermediate_size) for p in precisions}
    print("dense matmul rate (best of 3), [" + f"{tokens} x {config.hidden_size}] x "
          f"[{config.hidden_size} x {config.intermediate_size}]: "
          + ", ".join(f"{p} {r / 1e12:.2f} TFLOP/s" for p, r in rate.items()))

    memory = "peak memory" if cuda else "peak RSS growth"
    print(f"\n| row | precision | seq/s | real tokens/s | model TFLOP/s | MFU | {memory} | "
          "loss | vs HF |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    results, hf = [], {}
    for label, prec, build in rows(bench, precisions, keys):
        r = measure(bench, label, prec, build)
        if label.startswith("HF") and r.missing is None:
            hf[prec] = r
        print(table_row(r, hf.get(prec), rate[prec]), flush=True)
        results.append(r)
    ran = [r for r in results if r.missing is None]
    if not ran:
        return
    print_optimizers(results)
    if any(r.digests != ran[0].digests for r in ran):
        raise UserError("the rows did not train on the same sequences")
    print(f"every row trained on the same {sum(len(s.samples) for s in steps)} sequences in the same "
          f"{len(steps)} batches (digest {hashlib.sha1(''.join(ran[0].digests).encode()).hexdigest()[:12]})")


OPTIMIZERS = {"Lamb": "Lamb (per tensor, foreach ops)",
              "FlatLamb": "FlatLamb (one flat fp32 buffer, one kernels.lamb_step)"}


def print_optimizers(results: list[Result]) -> None:
    """The LAMB each row that ran stepped (the bertperf rows: the trainer's for the device)."""
    rows: dict[str, list[str]] = {}
    for r in results:
        if r.missing is None and r.label not in rows.setdefault(r.optimizer, []):
            rows[r.optimizer].append(r.label)
    print("LAMB: " + "; ".join(f"{OPTIMIZERS.get(name, name)} in {', '.join(labels)}"
                               for name, labels in rows.items()))


def table_row(r: Result, hf: Result | None, rate: float) -> str:
    """A row's line of the table: its speed against `hf` (the HF row of its precision measured
    before it, if any) and its MFU against the dense matmul `rate` of its precision."""
    if r.missing is not None:
        return f"| {r.label} | {r.precision} | {r.missing} | | | | | | |"
    seq = r.rate(r.sequences)
    ratio = f"{seq / hf.rate(hf.sequences):.2f}x" if hf else ""
    return (f"| {r.label} | {r.precision} | {seq:,.2f} | {r.rate(r.tokens):,.0f} | "
            f"{r.rate(r.flops) / 1e12:.3f} | {r.rate(r.flops) / rate:.0%} | "
            f"{_gib(r.peak_bytes)} | {r.loss:.4f} | {ratio} |")
