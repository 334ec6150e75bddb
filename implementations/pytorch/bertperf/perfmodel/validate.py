"""`python -m bertperf model validate`: perfmodel/cluster.py's time to train against every
published result of NVIDIA's MLPerf BERT code in perfmodel/results.csv, held out (a model, not a
measurement).

Each row is on one of four sides.
- calibration: NVIDIA's own 8-GPU result of a GPU and precision (a GPU NVIDIA never submitted:
  the first 8-GPU result of anyone), the one measurement of that GPU's rate with that code. A row
  uses its GPU's calibration of the latest round up to its own, else the earliest; a GPU and
  precision without one, another calibration times roofline's speedup (rate_for). Never judged.
- fit: the rows the three overheads (cluster.Overheads) are fitted on, by least squares of
  log(predicted / published).
- held-out: every other row, judged against TOLERANCE.
- unseen: a row the model cannot describe (why says why).

--split generation fits on NVIDIA's own A100 results and judges everything else: other
submitters' A100s, every H100, H200, B200 and GB200. --split round (leave one round out) fits,
once a round, on NVIDIA's results of every other round and judges that round's rows, so every
row but the calibrations and the unseen is held out once.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import itertools
import math
import platform
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from bertperf.errors import UserError
from bertperf.formats.outputs import claim
from bertperf.perfmodel import TOLERANCE, bert, cluster, gpus
from bertperf.perfmodel.network import Network
from bertperf.perfmodel.timing import duration

SPLITS = ("generation", "round")
FIT_GPUS = ("A100 40GB SXM", "A100 80GB SXM")
"""--split generation: the GPUs of the rows the overheads are fitted on (the CALIBRATOR's)."""
CALIBRATOR = "NVIDIA"
"""Whose single-node results calibrate a GPU's rate."""


def fits(r) -> bool:
    """--split generation: the overheads are fitted on this row (the CALIBRATOR's own A100
    results)."""
    return r.gpu in FIT_GPUS and r.organization == CALIBRATOR


def shape_of(r) -> cluster.Shape:
    """A published result's shape (a results.Result)."""
    fabric = Network(r.gpus_per_node, r.nvlink_gbps * 1e9, r.nic_gbit * 1e9 / 8,
                     r.nics_per_node, nvlink_domain=r.nvlink_domain, sharp=r.sharp)
    return cluster.Shape(r.gpu, r.nodes, fabric, r.batch, r.accumulation, r.packing_factor,
                         cluster.NVIDIA_OVERLAP_BLOCKS if r.overlap else 1)


def label(r) -> str:
    return f"{r.round} {r.organization} {r.system}"


def round_key(r) -> tuple[int, ...]:
    """A row's (or a round name's) round, in order."""
    name = r if isinstance(r, str) else r.round
    return tuple(int(x) for x in name[1:].split("."))


def calibration_rows(rows: list) -> dict[tuple[str, str], list]:
    """Each (GPU, precision)'s calibration rows by round: the CALIBRATOR's results on 8 of those
    GPUs, else (a GPU it never submitted) the first such result of anyone."""
    out: dict[tuple[str, str], list] = {}
    eight = sorted((r for r in rows if r.gpus == 8), key=lambda r: (round_key(r), r.organization))
    for r in eight:
        if r.organization == CALIBRATOR:
            out.setdefault((r.gpu, r.precision), []).append(r)
    for r in eight:
        out.setdefault((r.gpu, r.precision), [r])
    return out


def calibrator(r, calibrations: dict, key: tuple[str, str]):
    """The calibration row of `key` whose rate row `r` uses (the latest of its round or before,
    else the earliest), or None."""
    rows = calibrations.get(key, [])
    earlier = [c for c in rows if round_key(c) <= round_key(r)]
    return earlier[-1] if earlier else (rows[0] if rows else None)


@functools.cache
def rate_of(c, over: cluster.Overheads) -> float:
    """Calibration row `c`'s rate under `over`, worked out once (the fit asks at every row)."""
    return cluster.calibrated_rate(shape_of(c), over, c.samples, c.evals, c.minutes * 60)


REFERENCE = (gpus.A100, "fp16")
"""The calibration a GPU without one of its own (nor its kernels_like GPU) is scaled from, by
roofline's speedup."""


def rate_for(r, calibrations: dict, over: cluster.Overheads) -> tuple[float, str]:
    """The rate row `r`'s GPU runs at and where it comes from: its (GPU, precision)'s
    calibration; else that GPU's calibration in another precision, else that of the GPU whose
    kernel efficiencies it is priced at (gpus.Gpu.kernels_like: its precision first), else
    REFERENCE's, times the speedup between the two (bert.speedup: published BERT-large rates of
    both where there are, else roofline's); nan: none."""
    key = (r.gpu, r.precision)
    c = calibrator(r, calibrations, key)
    if c is not None:
        return rate_of(c, over), label(c)
    like = gpus.GPUS[r.gpu].calibrated_on if r.gpu in gpus.GPUS else r.gpu
    others = [k for k in calibrations if k[0] == r.gpu] + [(like, r.precision)] \
        + [k for k in calibrations if k[0] == like] + [REFERENCE]
    for other in others:
        speedup, how = bert.speedup(other, key)
        c = calibrator(r, calibrations, other)
        if speedup and c is not None:
            return rate_of(c, over) * speedup, \
                f"{label(c)} x {speedup:.2f} ({how}, {other[1]} to {r.precision})"
    return math.nan, f"no calibration for {r.gpu} at {r.precision}"


def unseen(r) -> str | None:
    """Why the model cannot describe row `r`, or None."""
    if r.gpu not in gpus.GPUS:
        return f"no datasheet figures of its GPU ({r.gpu}) in perfmodel/gpus.py"
    if r.division != "closed":
        return "open division: its own optimizer and code, not NVIDIA's closed recipe"
    if r.gpus > r.nvlink_domain and r.nics_per_node == 0:
        return "its network is not described (no NICs in its system description)"
    return None


def why(r, calibrations: dict) -> str | None:
    """Why row `r` gets no prediction, or None."""
    rate, source = rate_for(r, calibrations, cluster.Overheads(0.0, 0.0, 0.0))
    return unseen(r) or (source if math.isnan(rate) else None)


def predict_row(r, calibrations: dict, over: cluster.Overheads):
    if unseen(r):
        return None
    rate, _ = rate_for(r, calibrations, over)
    if math.isnan(rate):
        return None
    return cluster.predict(shape_of(r), rate, over, r.samples, r.evals)


def error(rows: list, calibrations: dict, over: cluster.Overheads) -> float:
    """Sum of squared log ratios of predicted to published over `rows`."""
    total = 0.0
    for r in rows:
        p = predict_row(r, calibrations, over)
        if p is None:  # no rate: the overheads alone take longer than a calibration row
            return math.inf
        total += math.log(p.seconds / (r.minutes * 60)) ** 2
    return total


START = cluster.Overheads(seconds=2e-3, sequences=4.0, run=1.0)
STEPS = cluster.Overheads(seconds=1e-3, sequences=2.0, run=0.5)
"""Where `fit`'s search starts and its first steps."""


def fit(rows: list, calibrations: dict) -> cluster.Overheads:
    """The overheads (each >= 0) minimising `error` over `rows`: a pattern search that moves
    one overhead at a time by its step while that lowers the error, and halves the steps when
    no move does, down to 1 % of the first ones."""
    names = ("seconds", "sequences", "run")
    best, steps = START, dict(zip(names, (getattr(STEPS, n) for n in names)))
    best_error = error(rows, calibrations, best)
    while max(steps[n] / getattr(STEPS, n) for n in names) > 0.01:
        moved = False
        for name, sign in itertools.product(names, (1, -1)):
            value = getattr(best, name) + sign * steps[name]
            if value < 0:
                continue
            trial = replace(best, **{name: value})
            trial_error = error(rows, calibrations, trial)
            if trial_error < best_error:
                best, best_error, moved = trial, trial_error, True
        if not moved:
            steps = {n: v / 2 for n, v in steps.items()}
    return best


@dataclass(frozen=True)
class Judged:
    row: object
    side: str
    """calibration, fit, held-out, or unseen (the model cannot describe it: `fitted_on` says
    why)."""
    fitted_on: str
    """What the overheads it was predicted with were fitted on."""
    over: cluster.Overheads
    prediction: cluster.Prediction | None

    @property
    def ratio(self) -> float:
        if self.prediction is None:
            return math.nan
        return self.prediction.seconds / (self.row.minutes * 60)


def sides(rows: list) -> tuple[dict, set[int], list]:
    """The calibrations of `rows`, the ids of the calibration rows, and the rows the model
    predicts (neither calibration nor unseen): the fit's and the judged rows are among these."""
    calibrations = calibration_rows(rows)
    calibrators = {id(c) for cs in calibrations.values() for c in cs}
    rest = [r for r in rows if id(r) not in calibrators and why(r, calibrations) is None]
    return calibrations, calibrators, rest


def judge(rows: list, split: str) -> list[Judged]:
    """Every row with its side and prediction under `split`."""
    calibrations, calibrators, rest = sides(rows)
    predicted = {id(r) for r in rest}
    none = cluster.Overheads(0.0, 0.0, 0.0)
    out = [Judged(r, "calibration", "-", none, None) for r in rows if id(r) in calibrators]
    out += [Judged(r, "unseen", why(r, calibrations), none, None) for r in rows
            if id(r) not in calibrators and id(r) not in predicted]
    if split == "generation":
        over = fit([r for r in rest if fits(r)], calibrations)
        return out + [Judged(r, "fit" if fits(r) else "held-out", f"{CALIBRATOR}'s A100 rows",
                             over, predict_row(r, calibrations, over)) for r in rest]
    for held in sorted({r.round for r in rest}, key=round_key):
        over = fit([r for r in rest if r.round != held and r.organization == CALIBRATOR],
                   calibrations)
        out += [Judged(r, "held-out", f"all rounds but {held}", over,
                       predict_row(r, calibrations, over)) for r in rest if r.round == held]
    return out


@functools.cache
def fitted(path: Path | None = None) -> tuple[list, dict, cluster.Overheads]:
    """The results table's rows (`path`, default the package's), their calibrations and the
    overheads fitted as --split generation fits them (on the CALIBRATOR's A100 rows): the model
    `plan` predicts with, worked out once a process."""
    from bertperf.perfmodel import results

    rows = results.load_results(path or results.RESULTS)
    calibrations, _, rest = sides(rows)
    return rows, calibrations, fit([r for r in rest if fits(r)], calibrations)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--split", default="generation", help=f"one of {', '.join(SPLITS)}: which "
                   "rows the overheads are fitted on and which are held out (default generation)")
    p.add_argument("--results", type=Path, default=None,
                   help="the results table (default: the package's perfmodel/results.csv)")
    p.add_argument("--plot", type=Path, default=None,
                   help="write a PNG of predicted against published time to train here")
    p.add_argument("--force", action="store_true",
                   help="replace --plot where it is an earlier PNG (never another file)")


def run(args: argparse.Namespace) -> int:
    from bertperf.perfmodel import results

    if args.split not in SPLITS:
        raise UserError(f"--split {args.split!r}: expected one of {', '.join(SPLITS)}")
    if args.plot:
        claim("--plot", args.plot, "model validate", inputs=[("--results", args.results)],
              force=args.force)
    table = args.results or results.RESULTS
    rows = results.load_results(table)
    judged = judge(rows, args.split)
    if not any(j.side == "held-out" for j in judged):
        raise UserError(f"{table}: {len(rows)} results, none held out under --split "
                        f"{args.split}: nothing to validate")
    command = " ".join(["python -m bertperf", *sys.argv[1:]])
    print(f"VALIDATION (a model, not a measurement): `{command}`, {datetime.date.today()}, "
          f"computed on {platform.machine()} {platform.system()}; {len(rows)} published results")
    for over, on in sorted({(j.over, j.fitted_on) for j in judged
                            if j.side in ("fit", "held-out")},
                           key=lambda x: x[1]):
        print(f"overheads fitted on {on}: {over.seconds * 1e3:.2f} ms and {over.sequences:.1f} "
              f"sequences' work a micro-step, {over.run:.2f} s a run")
    print("| result | GPUs | GPU | global batch | published | predicted | predicted / published "
          "| side | overheads fitted on | dominant term | evals: logged / modelled s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    order = sorted(judged, key=lambda j: (j.row.gpu, j.row.gpus, round_key(j.row)))
    for j in order:
        r, p = j.row, j.prediction
        logged = "-" if r.eval_seconds is None else f"{r.eval_seconds:.1f}"
        print(f"| {label(r)} | {r.gpus:,} | {r.gpu} | {r.global_batch:,} | "
              f"{duration(r.minutes * 60)} | "
              f"{'-' if p is None else duration(p.seconds)} | "
              f"{'-' if p is None else f'{j.ratio:.2f}'} | {j.side} | {j.fitted_on} | "
              f"{'-' if p is None else p.dominant} | "
              f"{logged} / {'-' if p is None else format(p.terms['evals'], '.1f')} |")
    held = [j for j in judged if j.side == "held-out"]
    outside = [j for j in held if not abs(j.ratio - 1) <= TOLERANCE]
    within = len(held) - len(outside)
    print(f"held out: {within} of {len(held)} within {TOLERANCE:.0%}" +
          (f"; outside: {', '.join(f'{label(j.row)} {j.ratio:.2f}' for j in outside)}"
           if outside else ""))
    if args.plot:
        plot(judged, args.plot, args.split)
        print(f"plot: {args.plot}")
    return 0


def plot(judged: list[Judged], path: Path, split: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bertperf.formats.files import atomic_output

    fig, ax = plt.subplots(figsize=(6.4, 6.0))
    marks = {"fit": "o", "held-out": "s"}
    gpus = sorted({j.row.gpu for j in judged if j.prediction is not None})
    colors = dict(zip(gpus, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for j in judged:
        if j.prediction is None:
            continue
        ax.scatter(j.row.minutes, j.prediction.seconds / 60, marker=marks[j.side],
                   color=colors[j.row.gpu], s=28, edgecolors="black", linewidths=0.4)
    low = min(j.row.minutes for j in judged if j.prediction is not None) / 1.5
    high = max(j.row.minutes for j in judged if j.prediction is not None) * 1.5
    ax.plot([low, high], [low, high], color="black", linewidth=0.8)
    for k in (1 - TOLERANCE, 1 + TOLERANCE):
        ax.plot([low, high], [low * k, high * k], color="grey", linewidth=0.6, linestyle="--")
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high),
           xlabel="published time to train, minutes (olympic mean of the logs)",
           ylabel="predicted, minutes (model)",
           title=f"perfmodel/cluster.py against MLPerf BERT results (--split {split})")
    for gpu in gpus:
        ax.scatter([], [], color=colors[gpu], label=gpu)
    for side, m in marks.items():
        ax.scatter([], [], marker=m, color="white", edgecolors="black", label=side)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
