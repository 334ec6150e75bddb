"""Packed rows converge as unpadded sequences do, and the demo's numerics stay put.

Convergence: the copy task (tests/support/copy_task.py) in files of 32 tokens, trained to MLPerf's
own target 0.720 on one rank as unpadded sequences and as `prep pack`'s rows, which hold two or
three of its sequences each: the packed run reaches the target within 20 % of the samples the
unpadded one needs (measured: 0.88x to 1.0x over three seeds; with attention across a whole row
instead of each sequence, 1.5x, or not within 8,000 samples). The demo's own convergence to its
target is measured by results/ (ten seeds) and, packed in bf16, by
tests/gpu/test_convergence_gpu.py.

Numerics: the two short runs of tests/support/loss_curve.py on the demo's data (one rank each,
started together), whose every step's loss and the eval's accuracy are their committed curve's
(tests/fixtures/; `make loss-curve` rewrites them for a change meant to move the numerics). The
runs are tagged with the module's process tag and reaped when the module ends."""

from __future__ import annotations

import os

import pytest

from bertperf import reaper as bertperf_reaper
from tests.support import loss_curve, reaper
from tests.support.copy_task import make_dataset, packed_copy
from tests.support.mlperf_logs import events
from tests.support.runs import train

pytestmark = pytest.mark.slow

ROW = 32
"""The copy task's files and packed rows: 32 tokens, two or three sequences of 10 to 16."""


def samples_to_target(data: dict, out, **env: str) -> tuple[int, list]:
    """One rank of the copy task to 0.720 (runs.train's recipe: 16 sequences a step, LR 0.02,
    an eval every 320 samples; at most 8,000): the samples of its last eval, or None if it
    stopped short."""
    run, log = train(out, data, MAX_SAMPLES_TERMINATION="8000", SUBMISSION_DIVISION="open",
                     MASKED_LM_PROB="0.4", OMP_NUM_THREADS="1", **env)
    assert run.returncode == 0, run.stderr[-3000:]
    evals = [(e["metadata"]["epoch_num"], round(e["value"], 3)) for e in events(log)
             if e["key"] == "eval_accuracy"]
    success = next(e["metadata"]["status"] for e in events(log) if e["key"] == "run_stop")
    return (evals[-1][0] if success == "success" else None), evals


def test_packed_rows_reach_the_target_within_20_percent_of_the_samples(tmp_path):
    """MASKED_LM_PROB 0.4 gives a packed row room for its sequences' masks (4 of 10 to 16
    tokens); the unpadded run does not read it."""
    data = make_dataset(tmp_path / "data", msl=ROW)
    varlen, varlen_evals = samples_to_target(data, tmp_path / "varlen")
    packed, packed_evals = samples_to_target(packed_copy(data, tmp_path / "packed", row=ROW),
                                             tmp_path / "packed_run", BATCHSIZE="7",
                                             PACKING_FACTOR="2.3")
    print(f"to 0.720: unpadded {varlen} samples {varlen_evals}, packed {packed} {packed_evals}")
    assert varlen is not None and packed is not None and packed <= 1.2 * varlen


@pytest.fixture(scope="module")
def curves(demo_data, tmp_path_factory):
    """The two loss curves' runs, started together the first time a test asks for one (one
    rank each); a process of theirs left after they have ended is killed and fails the module
    (as tests/conftest.py's no_process_outlives_its_test does a test's)."""
    tag = f"{os.getpid()}-loss-curves"
    started, finished = {}, {}

    def run(name: str) -> loss_curve.Run:
        if not started:
            for each, curve in loss_curve.CURVES.items():
                out = tmp_path_factory.mktemp(f"loss_curve_{each}")
                started[each] = (loss_curve.start(curve, demo_data[0], out,
                                                  **{reaper.TAG: tag}), out)
        if name not in finished:
            finished[name] = loss_curve.finish(*started[name])
        return finished[name]
    try:
        yield run
    finally:
        ended = all(process.poll() is not None for process, _ in started.values())
        for process, _ in started.values():
            if process.poll() is None:
                process.kill()
            process.wait()
        killed = bertperf_reaper.reap(reaper.TAG, tag)
    if killed and ended:
        pytest.fail(f"{len(killed)} process(es) of the loss curves' runs outlived them and were "
                    "killed: " + "; ".join(f"pid {p.pid}: {p.command[:200]}" for p in killed),
                    pytrace=False)


@pytest.mark.parametrize("name", loss_curve.CURVES)
def test_the_loss_curve_is_the_committed_one(name, curves):
    curve = loss_curve.CURVES[name]
    want = loss_curve.committed(curve)
    assert want["settings"] == curve.settings, "the run's settings changed: make loss-curve"
    run = curves(name)
    moved = loss_curve.first_difference(run.losses, want["losses"], want["rtol"])
    assert moved is None, (f"{name}, step {moved[0]}: loss {moved[1]!r}, the committed curve "
                           f"has {moved[2]!r} (beyond rtol {want['rtol']}); if the change is "
                           "meant to move the numerics, run `make loss-curve` and say why")
    assert run.accuracies == want["eval_accuracy"], (
        f"{name}: eval accuracy {run.accuracies}, the committed curve has "
        f"{want['eval_accuracy']}")
    assert run.status == "aborted"


def test_the_comparison_sees_a_moved_step():
    curve = [10.0, 9.0, 8.0]
    assert loss_curve.first_difference(curve, curve) is None
    assert loss_curve.first_difference([10.0, 9.0 * (1 + 2 * loss_curve.RTOL), 8.0], curve)[0] == 2
    assert loss_curve.first_difference([10.0, float("nan"), 8.0], curve)[0] == 2
    assert loss_curve.first_difference(curve[:2], curve)[0] == 3
