"""The demo's two committed loss curves: short fixed-seed runs of the demo's job (FOLDOC, 128-token
samples, the tiny BERT, config_CPU_1x2x32x1.sh's LR and optimizer settings, fp32, dropout on), one
rank of 32 sequences each, 40 steps with the warm-up ending at step 20, then one eval;
tests/e2e/test_train_convergence.py compares every step's loss and the eval's accuracy with the
curve's file in tests/fixtures/:

  varlen          the unpadded shards, the per-tensor Lamb (loss_curve.json)
  packed_flat     the packed shards (LAYOUT=packed), 18 rows (about 32 sequences), FlatLamb
                  (loss_curve_packed_flat.json)

A change meant to move the numerics rewrites the files in the same commit and says why:

    make loss-curve        # prepares the demo's data in out/demo if needed, then runs this
    python -m tests.support.loss_curve --demo out/demo
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.demo import pack
from tests.support.mlperf_logs import events
from tests.support.paths import PYTHONPATH, ROOT
from tests.support.scripts import LAUNCH_VARS

FIXTURES = ROOT / "tests" / "fixtures"

COMMON = {
    "BERT_CONFIG": "tiny", "DEVICE": "cpu", "PRECISION": "fp32", "SEED": "1",
    "GRADIENT_STEPS": "1", "LR": "0.02", "MAX_STEPS": "600", "WARMUP_STEPS": "20",
    "EVAL_BATCHSIZE": "256", "LOG_FREQ": "1", "SUBMISSION_DIVISION": "open",
    "TARGET_MLM_ACCURACY": "0.10", "EVAL_ITER_START_SAMPLES": "1280", "EVAL_ITER_SAMPLES": "1280",
    "MAX_SAMPLES_TERMINATION": "1280", "DATA_VERIFY": "size", "OMP_NUM_THREADS": "1",
}
"""What both runs set: the demo's model, LR, optimizer, seed and eval batch
(config_CPU_1x2x32x1.sh), a loss at every step, 40 steps of 32 sequences (1,280 samples) with the
warm-up over the first 20 (the demo's 50 would leave the decay untested in 40), and the eval of
the 2,000 samples at the end, far below the target 0.10 (the run stops, aborted, at its sample
cap)."""


@dataclass(frozen=True)
class Curve:
    """One run and its committed curve: the run's settings, data and file."""

    file: str
    """Its file in tests/fixtures/."""
    settings: dict[str, str]
    """The run's variables (with COMMON)."""
    packed: bool = False
    """The demo's shards packed into 128-token rows (tests.support.demo.pack), else unpadded."""

    @property
    def path(self) -> Path:
        return FIXTURES / self.file


CURVES = {
    "varlen": Curve("loss_curve.json", {**COMMON, "BATCHSIZE": "32"}),
    "packed_flat": Curve("loss_curve_packed_flat.json", {
        **COMMON, "BATCHSIZE": "18", "PACKING_FACTOR": "1.76", "LAYOUT": "packed",
        "FLAT_LAMB": "1"}, packed=True),
}
"""varlen: 32 sequences a step, the demo's per-rank batch. packed_flat: 18 packed rows a step
(18 x 1.76: about 32 sequences), FlatLamb."""


@dataclass(frozen=True)
class Run:
    """What a finished run gives: the loss at each step, the samples trained when it stopped,
    its eval accuracies (4 decimals) and its run_stop status."""

    losses: list[float]
    samples: int
    accuracies: list[float]
    status: str


RTOL = 1e-5
"""How far a step's loss may move (relative) before the curve counts as changed (docs/design.md,
"Tests": what it was measured against)."""


def start(curve: Curve, demo: Path, out: Path, **env: str) -> subprocess.Popen:
    """`curve`'s run on the demo's data in `demo` (prepare_demo.sh's output folder) started in
    the background, one rank, its MLPerf log into `out`; `env` on top of the environment (a
    test's process tag). `finish` waits for it."""
    out.mkdir(parents=True, exist_ok=True)
    data = pack(demo) if curve.packed else demo / "unpadded"
    env = {**{k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}, **env,
           **curve.settings, "DATADIR_PHASE2": str(data),
           "EVAL_FILE": str(demo / "hdf5" / "eval" / "eval_10k.hdf5"),
           "LOGDIR": str(out), "MLLOG_FILE": str(out / "result_0.txt"), "PYTHONPATH": PYTHONPATH}
    train = [sys.executable, "-m", "bertperf", "train"]
    with (out / "stderr.txt").open("w") as stderr:
        return subprocess.Popen(train, env=env, cwd=out, stdout=subprocess.DEVNULL,
                                stderr=stderr)


def finish(process: subprocess.Popen, out: Path) -> Run:
    """The run `start` started into `out`, read from its MLPerf log once it has ended."""
    try:
        process.wait(timeout=600)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    if process.returncode != 0:
        raise RuntimeError("the loss curve's run failed:\n"
                           + (out / "stderr.txt").read_text()[-3000:])
    log = events(out / "result_0.txt")
    found = {e["metadata"]["step"]: e["value"] for e in log if e["key"] == "train_loss"}
    return Run(losses=[found[step] for step in range(1, len(found) + 1)],
               samples=next(e["value"] for e in log if e["key"] == "train_samples"),
               accuracies=[round(e["value"], 4) for e in log if e["key"] == "eval_accuracy"],
               status=next(e["metadata"]["status"] for e in log if e["key"] == "run_stop"))


def first_difference(got: list[float], want: list[float], rtol: float = RTOL
                     ) -> tuple[int, float, float] | None:
    """(step, got, wanted) of the first step whose loss is more than `rtol` from the committed
    one; None when the whole curve agrees."""
    if len(got) != len(want):
        return min(len(got), len(want)) + 1, float("nan"), float("nan")
    for step, (a, b) in enumerate(zip(got, want), start=1):
        if not abs(a - b) <= rtol * abs(b):
            return step, a, b
    return None


def committed(curve: Curve) -> dict:
    return json.loads(curve.path.read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", type=Path, required=True,
                   help="prepare_demo.sh's output folder (make demo's out/demo)")
    p.add_argument("--curves", default=",".join(CURVES),
                   help=f"which curves to rewrite (default all: {','.join(CURVES)})")
    p.add_argument("--fixtures", type=Path, default=FIXTURES, help="the folder to write them in")
    args = p.parse_args()
    demo = args.demo.resolve()
    names = args.curves.split(",")
    started = {name: start(CURVES[name], demo, demo / "loss_curve" / name) for name in names}
    for name in names:  # together, as the test runs them: one rank each
        run = finish(started[name], demo / "loss_curve" / name)
        doc = {"settings": CURVES[name].settings, "rtol": RTOL, "losses": run.losses,
               "eval_accuracy": run.accuracies}
        path = args.fixtures / CURVES[name].file
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{path}: {name}, {len(run.losses)} steps, loss {run.losses[0]:.4f} -> "
              f"{run.losses[-1]:.4f}, eval accuracy {run.accuracies} ({run.status})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
