"""`python -m bertperf model results FOLDER...`: the published MLPerf BERT results a folder of
result_*.txt logs holds, one CSV line a folder (a header first): its runs, MLPerf's olympic mean
time to train, the mean samples trained, the time and count of the evals and their interval,
the global batch. load_results reads RESULTS, the table of such rows with the systems and configs
they ran (recomputed from mlcommons/training_results_v*, whose `source` names the commit and
folder).

Olympic mean: each run's run_stop - run_start, a run that did not converge (run_stop's status not
success) infinitely slow; the fastest and the slowest dropped, the mean of the rest. A result
with a non-converged run left after that has no time (a UserError). Samples a converged run
trained: its `train_samples` event, else run_stop's epoch_num or samples_count, else the last
eval_accuracy's epoch_num.
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bertperf.benchmark import DIVISIONS
from bertperf.errors import UserError

FIELDS = ("division", "runs", "converged", "samples", "minutes", "eval_seconds", "evals",
          "eval_interval", "global_batch", "accumulation")
"""The columns of `model results` after the folder: summarize's keys but eval_marked, which
leaves eval_seconds empty when the logs have no eval_start/eval_stop."""


def _value(events: list[dict], key: str, default=None):
    """The value of the last `key` event, or `default`."""
    found = [e for e in events if e.get("key") == key]
    return found[-1].get("value", default) if found else default


def _meta(event: dict, *names: str):
    """The first of `names` in an event's metadata that is a number, or None."""
    meta = event.get("metadata") or {}
    return next((meta[n] for n in names if isinstance(meta.get(n), (int, float))), None)


def _run(path: Path) -> dict:
    """One result log's run: its minutes (inf unconverged), samples, evals and batch."""
    from bertperf.mlperf.check import log_events

    try:
        events = log_events(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if not events:
        raise UserError(f"{path}: no :::MLLOG lines (a Git LFS pointer or not a result log)")
    first = {}
    for e in events:
        first.setdefault(e.get("key"), e)
    stops = [e for e in events if e.get("key") == "run_stop"]
    if "run_start" not in first or not stops:
        raise UserError(f"{path}: no {'run_start' if 'run_start' not in first else 'run_stop'} "
                        "event: not a complete result log")
    start, stop = first["run_start"], stops[-1]
    try:
        minutes = (float(stop["time_ms"]) - float(start["time_ms"])) / 60000
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{path}: run_start or run_stop has no time_ms") from None
    converged = (stop.get("metadata") or {}).get("status") == "success"
    accuracies = [e for e in events if e.get("key") == "eval_accuracy"]
    samples = _value(events, "train_samples")
    if not isinstance(samples, (int, float)):
        samples = _meta(stop, "epoch_num", "samples_count")
    if samples is None and accuracies:
        samples = _meta(accuracies[-1], "epoch_num")
    if converged and samples is None:
        raise UserError(f"{path}: no samples trained (train_samples, run_stop's epoch_num or an "
                        "eval_accuracy's)")
    eval_seconds, opened = 0.0, None
    eval_stops = 0
    for e in events:
        if e.get("key") == "eval_start":
            opened = e
        elif e.get("key") == "eval_stop":
            eval_stops += 1
            if opened is not None:
                eval_seconds += (float(e["time_ms"]) - float(opened["time_ms"])) / 1000
                opened = None
    points = [_meta(e, "epoch_num") for e in accuracies]
    steps = Counter(round(b - a) for a, b in itertools.pairwise(points)
                    if a is not None and b is not None and b > a)
    return {
        "minutes": minutes if converged else math.inf, "converged": converged,
        "samples": samples, "eval_seconds": eval_seconds, "eval_marked": eval_stops > 0,
        "evals": eval_stops or len(accuracies),
        "eval_interval": steps.most_common(1)[0][0] if steps else 0,
        "global_batch": _value(events, "global_batch_size"),
        "accumulation": _value(events, "gradient_accumulation_steps", 1),
        "division": _value(events, "submission_division"),
    }


def summarize(folder: Path) -> dict:
    """One result folder's result_*.txt logs summarised (FIELDS, and eval_marked: whether the
    logs mark their evals with eval_start/eval_stop; eval_seconds is 0 where they do not)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: " + ("is a file, not a result folder (<org>/results/<system>/"
                                         "bert)" if folder.exists() else "no such folder"))
    logs = sorted(folder.glob("result_*.txt"), key=lambda p: (len(p.name), p.name))
    if len(logs) < 3:
        raise UserError(f"{folder}: {len(logs)} result_*.txt logs; an olympic mean needs 3 or more")
    runs = [_run(log) for log in logs]
    for name in ("global_batch", "accumulation", "division"):
        values = {r[name] for r in runs}
        if len(values) > 1:
            raise UserError(f"{folder}: its logs disagree on {name}: {sorted(map(str, values))}")
    if not isinstance(runs[0]["global_batch"], int) or runs[0]["global_batch"] <= 0:
        raise UserError(f"{folder}: no global_batch_size event with a whole number")
    kept = sorted(r["minutes"] for r in runs)[1:-1]
    if math.inf in kept:
        failed = sum(r["minutes"] == math.inf for r in runs)
        raise UserError(f"{folder}: {failed} of its {len(runs)} runs did not converge: the "
                        "olympic mean drops one as the slowest, the rest leave no time to train")
    converged = [r for r in runs if r["converged"]]
    return {
        "division": runs[0]["division"] or "",
        "runs": len(runs),
        "converged": len(converged),
        "samples": sum(r["samples"] for r in converged) / len(converged),
        "minutes": sum(kept) / len(kept),
        "eval_seconds": sum(r["eval_seconds"] for r in runs) / len(runs),
        "eval_marked": all(r["eval_marked"] for r in runs),
        "evals": sum(r["evals"] for r in runs) / len(runs),
        "eval_interval": Counter(r["eval_interval"] for r in runs).most_common(1)[0][0],
        "global_batch": runs[0]["global_batch"],
        "accumulation": runs[0]["accumulation"],
    }


def format_summary(summary: dict) -> list[str]:
    """summarize's FIELDS as RESULTS writes them: samples whole, minutes to 3 decimals,
    eval_seconds to 1 (empty when the logs do not mark the evals), evals to 1."""
    s = summary
    return [s["division"], str(s["runs"]), str(s["converged"]), str(round(s["samples"])),
            f"{s['minutes']:.3f}", f"{s['eval_seconds']:.1f}" if s["eval_marked"] else "",
            f"{s['evals']:.1f}", str(s["eval_interval"]), str(s["global_batch"]),
            str(s["accumulation"])]


# ---- the table ----------------------------------------------------------------------------------

PRECISIONS = ("fp16", "bf16", "fp8")
SOURCE = re.compile(r"mlcommons/training_results_(v\d+\.\d+)@[0-9a-f]{12}:(\S+)/results/(\S+)/bert")
"""A row's source: the repository and round, the snapshot's commit (12 hex digits), the folder."""


@dataclass(frozen=True)
class Result:
    """A published MLPerf BERT result: the system, the config and what its logs say. A row of
    RESULTS."""

    round: str
    """The MLPerf Training round, v1.0 ..."""
    organization: str
    """The submitter's folder in the round's repository."""
    system: str
    """The system's folder under <organization>/results."""
    division: str
    """closed or open."""
    nodes: int
    gpus_per_node: int
    gpu: str
    """The GPU's name as the model's tables spell it (perfmodel/gpus.py: the model says which it
    knows; test_model_cluster checks every row's)."""
    nvlink_domain: int
    """GPUs joined by NVLink/NVSwitch (a PCIe node's GPUs: all of its GPUs, on PCIe)."""
    nvlink_gbps: float
    """That fabric's bandwidth a GPU and direction, GB/s (PCIe 4.0 x16: 31.5)."""
    nics_per_node: int
    """Compute-fabric NICs a node (0: unknown or none)."""
    nic_gbit: float
    """Gb/s a NIC (0: unknown or none)."""
    batch: int
    """The micro-batch a GPU: sequences, or packed rows."""
    accumulation: int
    """Micro-batches a step (gradient accumulation)."""
    packed: bool
    packing_factor: float
    """Sequences a packed row (1 unpacked)."""
    global_batch: int
    """Sequences a step, as the log's global_batch_size says."""
    precision: str
    """One of PRECISIONS."""
    sharp: bool
    """The config asks Slurm for SHARP (SBATCH_NETWORK=sharp): the all-reduce across nodes
    reduced in the InfiniBand switches."""
    overlap: bool
    """The config overlaps the gradient reductions with the backward (--dwu-overlap-reductions,
    the `_clipafter` configs: clipping after the all-reduce)."""
    runs: int
    converged: int
    samples: int
    """Mean samples the converged runs trained."""
    minutes: float
    """MLPerf's olympic mean time to train."""
    eval_seconds: float | None
    """Mean seconds a run spent in its evals; None: the logs do not mark them."""
    evals: float
    """Mean evals a run."""
    eval_interval: int
    """Samples between evals (0: fewer than two evals)."""
    source: str
    """mlcommons/training_results_<round>@<commit>:<organization>/results/<system>/bert."""
    config: str
    """The config file the runs used, a path in the same repository."""

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


RESULTS = Path(__file__).with_name("results.csv")
"""The published results (load_results), one a row, the fields of Result as columns."""


def _whole(low: int) -> tuple[Callable, Callable, str]:
    return int, lambda v: v >= low, f"a whole number >= {low}"


def _number(low: float) -> tuple[Callable, Callable, str]:
    return float, lambda v: low <= v < math.inf, f"a number >= {low:g}"


_YES_NO = ({"yes": True, "no": False}.__getitem__, lambda v: True, "yes or no")
_NAME = (str, lambda v: bool(v) and v == v.strip() and "/" not in v, "a name")
_COLUMNS: dict[str, tuple[Callable, Callable, str]] = {  # column: (parser, test, what it must be)
    "round": (str, re.compile(r"v\d+\.\d+").fullmatch, "a round like v2.0"),
    "organization": _NAME, "system": _NAME,
    "division": (str, DIVISIONS.__contains__, f"one of {', '.join(DIVISIONS)}"),
    "nodes": _whole(1), "gpus_per_node": _whole(1),
    "gpu": (str, re.compile(r"[A-Z]+\d+ \d+GB( SXM| PCIe)?").fullmatch,
            "a GPU like A100 80GB SXM"),
    "nvlink_domain": _whole(1), "nvlink_gbps": _number(1e-9),
    "nics_per_node": _whole(0), "nic_gbit": _number(0),
    "batch": _whole(1), "accumulation": _whole(1),
    "packed": _YES_NO,
    "packing_factor": _number(1), "global_batch": _whole(1),
    "precision": (str, PRECISIONS.__contains__, f"one of {', '.join(PRECISIONS)}"),
    "sharp": _YES_NO, "overlap": _YES_NO,
    "runs": _whole(3), "converged": _whole(0), "samples": _whole(1),
    "minutes": _number(1e-9),
    "eval_seconds": (lambda t: None if t == "" else float(t),
                     lambda v: v is None or 0 <= v < math.inf, "empty or a number >= 0"),
    "evals": _number(0), "eval_interval": _whole(0),
    "source": (str, SOURCE.fullmatch, "mlcommons/training_results_vX.Y@<12 hex>:<folder>"),
    "config": (str, lambda v: bool(v) and not v.startswith("/"), "a path in the repository"),
}


def _inconsistency(r: Result) -> str | None:
    """What a row says against itself, or None."""
    rows = r.gpus * r.batch * r.accumulation * r.packing_factor
    if abs(rows - r.global_batch) > 1e-3 * r.global_batch:
        return (f"nodes x gpus_per_node x batch x accumulation x packing_factor = {rows:g}, "
                f"not global_batch {r.global_batch}")
    if r.packed != (r.packing_factor != 1):
        return f"packed {'yes' if r.packed else 'no'} with packing_factor {r.packing_factor:g}"
    if not r.runs - 1 <= r.converged <= r.runs:
        return f"{r.converged} of {r.runs} runs converged: an olympic mean needs runs - 1"
    source = SOURCE.fullmatch(r.source)
    if source.groups() != (r.round, r.organization, r.system):
        return f"source {r.source} is not {r.round}'s {r.organization}/results/{r.system}"
    return None


def load_results(path: Path = RESULTS) -> list[Result]:
    """The results of a results table; a UserError naming the line and the column of what is
    malformed, or the line of a row that contradicts itself."""
    import csv

    with Path(path).open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0] != list(_COLUMNS):
        raise UserError(f"{path}: line 1 must name the columns {','.join(_COLUMNS)}")
    out = []
    for line, row in enumerate(rows[1:], 2):
        if len(row) != len(_COLUMNS):
            raise UserError(f"{path}: line {line} has {len(row)} cells, not {len(_COLUMNS)}")
        values = {}
        for (name, (parse, test, what)), text in zip(_COLUMNS.items(), row):
            try:
                values[name] = parse(text)
                good = test(values[name])
            except (KeyError, ValueError):
                good = False
            if not good:
                raise UserError(f"{path}: line {line}: {name} {text!r} is not {what}")
        result = Result(**values)
        problem = _inconsistency(result)
        if problem:
            raise UserError(f"{path}: line {line}: {problem}")
        out.append(result)
    return out


# ---- the command --------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folders", nargs="+", type=Path, metavar="FOLDER",
                   help="a result folder: <org>/results/<system>/bert with its result_*.txt")


def run(args: argparse.Namespace) -> int:
    import csv
    import sys

    rows = [[str(folder)] + format_summary(summarize(folder)) for folder in args.folders]
    out = csv.writer(sys.stdout, lineterminator="\n")  # every folder read before a line
    out.writerow(("folder",) + FIELDS)
    out.writerows(rows)
    return 0
