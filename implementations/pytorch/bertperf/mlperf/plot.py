"""`python -m bertperf plot LOG`: a PNG of a run's training loss and masked-LM accuracy against
samples trained, read from its MLPerf log (`train_loss` events, which the trainer writes at every
progress line, and `eval_accuracy`; the checkers ignore unknown keys). `train --plot` writes the
same picture beside the log at the end of a run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bertperf.benchmark import TARGET_ACCURACY
from bertperf.errors import UserError
from bertperf.formats.files import atomic_output
from bertperf.formats.outputs import claim

TRAIN_LOSS = "train_loss"
"""Our extra MLPerf-log key: value = the step's loss; metadata samples_count, step, lr."""


def read_curves(log: Path) -> dict[str, list[tuple[float, float]]]:
    """{"loss": [(samples, loss)], "accuracy": [(samples, accuracy)]}."""
    if not log.is_file():
        raise UserError(f"{log}: no such MLPerf log")
    curves: dict[str, list] = {"loss": [], "accuracy": []}
    for line_no, line in enumerate(log.read_text(errors="replace").splitlines(), 1):
        if ":::MLLOG " not in line:
            continue
        try:
            event = json.loads(line.split(":::MLLOG ", 1)[1])
            key, value, meta = event["key"], event.get("value"), event.get("metadata", {})
            if key == TRAIN_LOSS:
                curves["loss"].append((meta["samples_count"], float(value)))
            elif key == "eval_accuracy":
                curves["accuracy"].append((meta["epoch_num"], float(value)))
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{log}:{line_no}: malformed MLLOG line ({exc})") from None
    if not curves["loss"] and not curves["accuracy"]:
        raise UserError(f"{log}: no train_loss or eval_accuracy events to plot")
    return curves


def plot_log(log: Path, png: Path, target: float | None = TARGET_ACCURACY) -> Path:
    """Draw the curves of `log` into `png` (written atomically)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = read_curves(log)
    fig, (ax_loss, ax_acc) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    if curves["loss"]:
        ax_loss.plot(*zip(*curves["loss"]), lw=1)
    ax_loss.set_ylabel("training loss (MLM + NSP)")
    ax_loss.set_title(log.name)
    ax_loss.grid(alpha=0.3)
    if curves["accuracy"]:
        ax_acc.plot(*zip(*curves["accuracy"]), marker="o", ms=3)
    if target is not None:
        ax_acc.axhline(target, color="tab:red", ls="--", lw=1, label=f"target {target}")
        ax_acc.legend(loc="lower right")
    ax_acc.set_ylabel("masked-LM accuracy (eval)")
    ax_acc.set_xlabel("samples trained")
    ax_acc.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_output(png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return png


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", type=Path, help="an MLPerf log written by `bertperf train`")
    p.add_argument("--output", type=Path, help="the PNG (default: LOG with .png appended)")
    p.add_argument("--target", type=float, default=TARGET_ACCURACY, help="accuracy line to draw")
    p.add_argument("--force", action="store_true",
                   help="replace the PNG where it is an earlier plot (never another file)")


def run(args: argparse.Namespace) -> int:
    out = claim("--output", args.output or args.log.with_name(args.log.name + ".png"), "plot",
                inputs=[("LOG", args.log)], force=args.force)
    png = plot_log(args.log, out, args.target)
    print(f"plot: {png}")
    return 0
