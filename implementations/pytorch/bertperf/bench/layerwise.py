"""`python -m bertperf bench layerwise`: layerwise training (LAYERWISE, bertperf.train.layerwise)
against normal training, the trainer itself run in this process on one CPU rank (--threads
threads), on the demo's data (`make demo`: FOLDOC, 128-token samples; --eval-samples of its
2,000-sample eval set, evenly spaced), with a BERT of --layers layers of width --hidden (dropout
0.1), the same data order, seed and LR schedule (--samples samples, warm-up the first 10 %) for
every run:

  normal    the whole model from the first step (seed --seed)
  normal2   the same at seed --seed + 1: with normal, the run-to-run spread (the verdict needs
            both)
  stacking  progressive stacking: half the layers, then all (LAYERWISE_TRAIN=all, the new
            layers copies of the trained ones, LAMB reset at the boundary), --stage samples
  mslt      multi-stage layerwise training: a third of the layers, then two thirds training
            only the new top third (the rest frozen: forward only; the word embeddings, tied to
            the MLM head's output projection, training: LAYERWISE_EMBEDDINGS=trained), --stage
            samples each, then the remaining samples with all the layers, the whole model
            training (LAYERWISE_TRAIN=new, copies, LAMB reset), the LR warm-up again at each
            boundary (LAYERWISE_SCHEDULE=restart)
  --runs only, factors changed:
  mslt_fresh          mslt, the new layers freshly initialised (LAYERWISE_INIT=fresh)
  mslt_continue       mslt, the one LR schedule continuing (LAYERWISE_SCHEDULE=continue)
  mslt_continue_copy  mslt_continue, LAMB's moments carried (LAYERWISE_OPTIMIZER=copy)
  mslt_4              mslt_continue, the last third also training alone (--stage samples)
                      before the whole model does: every stage adds layers that train alone
  mslt_4_restart, mslt_4_copy  mslt_4, LAYERWISE_SCHEDULE=restart or LAYERWISE_OPTIMIZER=copy
  mslt_4_frozen       mslt_4, the word embeddings frozen too (LAYERWISE_EMBEDDINGS=frozen: the
                      literal reading of the paper)

The data (--vocab): the demo's unpadded training shards and its eval samples as they are, or
with the vocabulary cut to the --vocab most frequent tokens of the training shards (ids below 104,
[PAD], [UNK], [CLS], [SEP], [MASK] among them, kept; every other token [UNK]; a masked-LM
prediction of a token outside it dropped), written to --out: a study model whose encoder is most
of the step and of the parameters (vocab_map, remapped). Default: the study of
docs/performance.md, 6 layers of 128 and a vocabulary of 4,096 (the encoder 1.2 M of the 1.8 M
parameters), batch 16, 16,000 samples (1,000 steps, warm-up 100), stages of 4,000, evals on
1,000 samples.

Clocks (--clock): the process's CPU time (`cpu`, default: what the run's own threads spent, the
loader's prefetch thread included; steadier than wall time on a machine other work shares), or
wall time. A run's training time is the clock's time in the training loop without its evals
(every --eval-every samples, on the whole eval set), read at the loop's events
(train.loop.LoopEvents); the step times are the loop's steps (train_step and its counting), and
the frozen forward the time from the embeddings' start to the last frozen layer's end inside a
step (forward hooks). First table, per run: samples and training seconds to --target (the first
eval at or above it), that time over normal training's (seed --seed), the accuracy at normal's
time-to-target (the last eval by then), the final accuracy and the total training time. Second
table, per stage: depth, trained layers, steps, median step time and the frozen forward's mean
share of it. Goal: the target in <= 0.7 x normal training's time, the final accuracy within the
two normal seeds' spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bertperf.errors import UserError
from bertperf.formats.outputs import claim, mark
from bertperf.host import cpu_name
from bertperf.train.loop import LoopEvents

GOAL = 0.7
VOCAB = 30522
"""The demo's (MLPerf's) vocabulary size."""
STUDY_VOCAB = 4096
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
POSITIVE = ("layers", "hidden", "batch", "samples", "stage", "eval_every", "eval_samples",
            "threads")
"""The whole-number flags that must be at least 1."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--demo", default="out/demo",
                   help="prepare_demo.sh's output folder (default out/demo, from make demo)")
    p.add_argument("--layers", type=int, default=6, help="encoder layers (default 6)")
    p.add_argument("--hidden", type=int, default=128, help="hidden size (default 128; 2 heads, "
                                                           "FFN 4x)")
    p.add_argument("--vocab", type=int, default=STUDY_VOCAB,
                   help=f"vocabulary: the {STUDY_VOCAB:,} most frequent tokens of the demo's "
                        f"(default; at least {KEPT_IDS + 1}), or its whole {VOCAB:,}")
    p.add_argument("--batch", type=int, default=16, help="sequences a step (default 16)")
    p.add_argument("--lr", type=float, default=0.01, help="LAMB's LR (default 0.01)")
    p.add_argument("--samples", type=int, default=16000,
                   help="samples each run trains (default 16,000)")
    p.add_argument("--stage", type=int, default=4000,
                   help="samples of each stage but the last (default 4,000)")
    p.add_argument("--eval-every", type=int, default=2000, help="samples between evals "
                                                                "(default 2,000)")
    p.add_argument("--eval-samples", type=int, default=1000,
                   help="eval samples, every k-th of the demo's 2,000 (default 1,000)")
    p.add_argument("--target", type=float, default=0.15,
                   help="the masked-LM accuracy timed (default 0.15: normal training's at 3/4 "
                        "of the default run)")
    p.add_argument("--seed", type=int, default=1,
                   help="seed of every run (default 1); normal2 runs at --seed + 1")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--clock", choices=CLOCKS, default="cpu",
                   help="training time as the process's CPU time (default) or wall time")
    p.add_argument("--runs", default="normal,normal2,stacking,mslt",
                   help="which runs, comma-separated (module docstring; default normal, normal2, "
                        "stacking, mslt)")
    p.add_argument("--out", default=None, help="folder for the runs' MLPerf logs (default: a "
                                               "temporary one)")


def schedules(layers: int, stage: int) -> dict[str, dict[str, str]]:
    """The runs' LAYERWISE settings (module docstring); the trainer's defaults where unnamed."""
    half, third = max(1, layers // 2), max(1, layers // 3)
    mslt_continue = {"LAYERWISE": f"{third}:{stage},{2 * third}:{stage},{layers}:all",
                     "LAYERWISE_TRAIN": "new"}
    mslt = {**mslt_continue, "LAYERWISE_SCHEDULE": "restart"}
    mslt_4 = {**mslt_continue,
              "LAYERWISE": f"{third}:{stage},{2 * third}:{stage},{layers}:{stage},{layers}:all"}
    return {
        "normal": {},
        "normal2": {},
        "stacking": {"LAYERWISE": f"{half}:{stage},{layers}", "LAYERWISE_TRAIN": "all"},
        "mslt": mslt,
        "mslt_fresh": {**mslt, "LAYERWISE_INIT": "fresh"},
        "mslt_continue": mslt_continue,
        "mslt_continue_copy": {**mslt_continue, "LAYERWISE_OPTIMIZER": "copy"},
        "mslt_4": mslt_4,
        "mslt_4_restart": {**mslt_4, "LAYERWISE_SCHEDULE": "restart"},
        "mslt_4_copy": {**mslt_4, "LAYERWISE_OPTIMIZER": "copy"},
        "mslt_4_frozen": {**mslt_4, "LAYERWISE_EMBEDDINGS": "frozen"},
    }


class Recorder(LoopEvents):
    """The clocks of one run, read at the loop's events and by forward hooks on the model
    (module docstring)."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now
        self.t0 = 0.0
        self.eval_seconds = 0.0
        self.evals: list[tuple[int, float, float]] = []  # samples, accuracy, training seconds
        self.steps: list[tuple[int, int, float, float]] = []  # depth, frozen, seconds, frozen s
        self.in_step = False
        self.step_began = self.eval_began = self.eval_at = 0.0
        self.frozen_start = self.frozen_seconds = 0.0
        self.encoder = None

    def clock(self) -> float:
        return self.now() - self.t0 - self.eval_seconds

    def run_start(self, trainer) -> None:
        core = trainer.plan.core
        self.encoder = core.bert.encoder
        layers = trainer.stages.spare if trainer.stages.staged else list(self.encoder.layer)

        def begin(module, args):
            self.frozen_start = self.now()

        def end(i):
            def hook(module, args, out):
                if self.in_step and getattr(self.encoder, "frozen", 0) == i + 1:
                    self.frozen_seconds += self.now() - self.frozen_start
            return hook
        core.bert.embeddings.register_forward_pre_hook(begin)
        for i, layer in enumerate(layers):
            layer.register_forward_hook(end(i))
        self.t0 = self.now()

    def step_start(self) -> None:
        self.frozen_seconds, self.in_step = 0.0, True
        self.step_began = self.now()

    def step_end(self, step: int, samples: int) -> None:
        seconds = self.now() - self.step_began
        self.in_step = False
        self.steps.append((len(self.encoder.layer), getattr(self.encoder, "frozen", 0), seconds,
                           self.frozen_seconds))

    def eval_start(self) -> None:
        self.eval_at = self.clock()
        self.eval_began = self.now()

    def eval_end(self, samples: int, accuracy: float) -> None:
        self.eval_seconds += self.now() - self.eval_began
        self.evals.append((samples, float(accuracy), self.eval_at))


KEPT_IDS = 104
"""Token ids the small vocabulary keeps as they are: [PAD] 0, the unused 1-99, [UNK] 100,
[CLS] 101, [SEP] 102, [MASK] 103."""
UNK = 100


def vocab_map(train: list, size: int) -> np.ndarray:
    """The study's smaller vocabulary as a map from the demo's token ids: ids below KEPT_IDS
    as they are, the `size` - KEPT_IDS tokens most frequent in the training samples `train`
    (input tokens and masked-LM labels; ties by id) to KEPT_IDS and up in that order, every
    other token to [UNK]."""
    counts = sum(np.bincount(np.concatenate([s.input_ids, s.mlm_ids]).astype(np.int64),
                             minlength=VOCAB) for s in train)
    counts[:KEPT_IDS] = -1
    order = np.argsort(-counts, kind="stable")[:size - KEPT_IDS]
    mapping = np.full(VOCAB, UNK, dtype=np.int64)
    mapping[:KEPT_IDS] = np.arange(KEPT_IDS)
    mapping[order] = np.arange(KEPT_IDS, size)
    return mapping


def remapped(s, mapping: np.ndarray):
    """Samples `s` in the small vocabulary: tokens mapped, the masked-LM predictions whose
    label falls outside it dropped (their inputs, [MASK] or a random token, stay)."""
    from bertperf.formats.samples import Samples, offsets_from_lengths
    labels = mapping[s.mlm_ids.astype(np.int64)]
    keep = labels != UNK
    sample = np.repeat(np.arange(len(s)), s.mlm_counts)
    counts = np.bincount(sample[keep], minlength=len(s))
    return Samples(mapping[s.input_ids.astype(np.int64)], s.offsets, s.b_starts,
                   s.mlm_positions[keep], labels[keep], offsets_from_lengths(counts), s.nsp)


def study_data(demo: Path, eval_count: int, size: int, out: Path) -> tuple[Path, Path]:
    """The runs' training folder and eval file in `out`: the demo's unpadded training shards
    and `eval_count` samples of its eval file (evenly spaced), in a vocabulary of the `size`
    most frequent tokens (vocab_map; `size` VOCAB: the demo's own, shards as they are)."""
    from bertperf.formats import unpadded
    from bertperf.formats.files import atomic_output
    from bertperf.formats.padded import read_samples, write_arrays
    from bertperf.formats.samples import Samples
    arrays = read_samples(demo / "hdf5" / "eval" / "eval_10k.hdf5")
    total = len(arrays["next_sentence_labels"])
    rows = np.linspace(0, total - 1, min(eval_count, total)).round().astype(np.int64)
    arrays = {k: v[rows] for k, v in arrays.items()}
    eval_file = out / "eval.hdf5"
    if size >= VOCAB:
        with atomic_output(eval_file) as tmp:
            write_arrays(tmp, arrays)
        return demo / "unpadded", eval_file
    shards = sorted((demo / "unpadded").glob("*.h5"))
    train = [unpadded.read_shard(f) for f in shards]
    mapping = vocab_map([s for s, _ in train], size)
    folder = out / f"unpadded_vocab{size}"
    folder.mkdir(exist_ok=True)
    for f, (s, meta) in zip(shards, train):
        with atomic_output(folder / f.name) as tmp:
            unpadded.write_shard(tmp, remapped(s, mapping), meta["max_seq_length"],
                                 meta["max_predictions_per_seq"])
    small = remapped(Samples.from_padded(arrays), mapping)
    max_pred = arrays["masked_lm_ids"].shape[1]
    with atomic_output(eval_file) as tmp:
        write_arrays(tmp, small.to_padded(arrays["input_ids"].shape[1], max_pred))
    return folder, eval_file


def one_run(name: str, settings: dict[str, str], args, out: Path, model: Path,
            data: tuple[Path, Path]) -> Recorder:
    """Train one run in this process; its clocks."""
    from bertperf import config
    from bertperf.train import loop
    steps = args.samples // args.batch
    seed = args.seed + (1 if name == "normal2" else 0)
    env = {"DATADIR_PHASE2": str(data[0]), "EVAL_FILE": str(data[1]),
           "BERT_CONFIG": str(model), "DEVICE": "cpu", "PRECISION": "fp32", "SEED": str(seed),
           "BATCHSIZE": str(args.batch), "LR": str(args.lr), "MAX_STEPS": str(steps),
           "WARMUP_STEPS": str(steps // 10), "EVAL_ITER_SAMPLES": str(args.eval_every),
           "EVAL_BATCHSIZE": "256", "MAX_SAMPLES_TERMINATION": str(args.samples),
           "SUBMISSION_DIVISION": "open", "TARGET_MLM_ACCURACY": "0.99", "LOG_FREQ": "0",
           "DATA_VERIFY": "none", "LOGDIR": str(out), "MLLOG_FILE": str(out / f"{name}.txt"),
           **settings}
    recorder = Recorder(CLOCKS[args.clock])
    loop.main(config.load(env), events=recorder)
    return recorder


def to_target(r: Recorder, target: float) -> tuple[int, float] | None:
    """(samples, training seconds) at the first eval at or above `target`."""
    return next(((s, t) for s, a, t in r.evals if a >= target), None)


def accuracy_at(r: Recorder, seconds: float) -> float | None:
    """The accuracy of the last eval at or before `seconds` of training."""
    got = [a for _, a, t in r.evals if t <= seconds + 1e-9]
    return got[-1] if got else None


def run(args: argparse.Namespace) -> int:
    demo = Path(args.demo)
    if not (demo / "unpadded").is_dir() or not (demo / "hdf5" / "eval" / "eval_10k.hdf5").is_file():
        raise UserError(f"{demo}: no demo data (unpadded/ and hdf5/eval/eval_10k.hdf5); make demo "
                        "prepares it")
    small = [f"--{name.replace('_', '-')}" for name in POSITIVE if getattr(args, name) < 1]
    if small:
        raise UserError(f"{', '.join(small)}: must be at least 1")
    if not KEPT_IDS < args.vocab <= VOCAB:
        raise UserError(f"--vocab: from {KEPT_IDS + 1} to {VOCAB}, not {args.vocab}")
    if args.layers < 3 or args.samples < 4 * args.stage:
        raise UserError("--layers must be at least 3 and --samples at least 4 x --stage")
    if args.samples < args.eval_every:
        raise UserError(f"--samples {args.samples}: fewer than --eval-every {args.eval_every}, so "
                        "no run would be evaluated")
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    plans = schedules(args.layers, args.stage)
    unknown = [n for n in names if n not in plans]
    if unknown or not names:
        raise UserError(f"--runs: some of {', '.join(plans)}, not {args.runs!r}")
    torch.set_num_threads(args.threads)
    if args.out is not None:
        claim("--out", args.out, "bench layerwise", inputs=[("--demo", demo)])
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_layerwise_"))
    mark(out, "bench layerwise")
    model = out / "bert_config.json"
    model.write_text(json.dumps({"vocab_size": args.vocab, "hidden_size": args.hidden,
                                 "num_hidden_layers": args.layers, "num_attention_heads": 2,
                                 "intermediate_size": 4 * args.hidden}))
    data = study_data(demo, args.eval_samples, args.vocab, out)
    print(f"{cpu_name()}, {torch.get_num_threads()} thread(s); torch {torch.__version__}; "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}\nBERT {args.layers} layers x "
          f"{args.hidden}, vocabulary {args.vocab}, batch {args.batch}, {args.samples} samples, "
          f"LR {args.lr}, evals every {args.eval_every} samples on {args.eval_samples} eval "
          f"samples, target {args.target}; {args.clock} clock; logs in {out}", flush=True)
    results = {}
    for name in names:
        print(f"{name}: {plans[name] or 'LAYERWISE unset'}", flush=True)
        results[name] = one_run(name, plans[name], args, out, model, data)
    base = results.get("normal")
    base_target = to_target(base, args.target) if base else None
    base_time = (base_target[1] if base_target else base.evals[-1][2]) if base else None
    print(f"\n| run | samples to {args.target} | training s to it | x normal | accuracy at "
          f"{f'{base_time:.0f} s' if base else 'normal time'} | final accuracy | training s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        got = to_target(r, args.target)
        at = accuracy_at(r, base_time) if base else None
        print(f"| {name} | {got[0] if got else 'not reached'} | "
              f"{f'{got[1]:.0f}' if got else '-'} | "
              f"{f'{got[1] / base_target[1]:.2f}' if got and base_target else '-'} | "
              f"{f'{at:.4f}' if at is not None else '-'} | {r.evals[-1][1]:.4f} | "
              f"{r.evals[-1][2]:.0f} |")
    print("\n| run | stage | layers (frozen) | steps | median step ms | frozen forward share |")
    print("|---|---:|---|---:|---:|---:|")
    for name, r in results.items():
        stages: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for depth, frozen, seconds, frozen_s in r.steps:
            stages.setdefault((depth, frozen), []).append((seconds, frozen_s))
        for i, ((depth, frozen), times) in enumerate(stages.items(), 1):
            step = statistics.median(s for s, _ in times)
            share = sum(f for _, f in times) / sum(s for s, _ in times)
            print(f"| {name} | {i} | {depth} ({frozen}) | {len(times)} | {step * 1000:.0f} | "
                  f"{share:.0%} |")
    print("\nEval curves (samples: accuracy @ training s):")
    for name, r in results.items():
        print(f"  {name}: " + ", ".join(f"{s}: {a:.4f} @ {t:.0f}" for s, a, t in r.evals))
    spread = [results[n].evals[-1][1] for n in ("normal", "normal2") if n in results]
    for name in results:
        if not name.startswith("normal") and base_target:
            got = to_target(results[name], args.target)
            ratio = got[1] / base_target[1] if got else float("inf")
            final = results[name].evals[-1][1]
            line = (f"{name}: {ratio:.2f} x normal's time to {args.target} (goal <= {GOAL}); "
                    f"final accuracy {final:.4f}")
            if len(spread) < 2:
                print(f"{line}; the goal not judged: normal's spread needs both normal and "
                      "normal2 in --runs")
            else:
                print(f"{line} against normal's {min(spread):.4f}-{max(spread):.4f}: goal "
                      f"{'met' if ratio <= GOAL and final >= min(spread) else 'not met'}")
    return 0
