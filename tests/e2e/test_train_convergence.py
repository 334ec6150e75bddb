"""The demo's job converges, packed rows as unpadded sequences do, and its numerics stay put: the
two runs of tests/support/loss_curve.py (the demo's data, model and LR schedule, 2 ranks, seed 1,
fp32, to masked-LM accuracy 0.10), one on the unpadded shards with Lamb and one on `prep pack`'s
rows with FlatLamb, each made when a test first reads it. The varlen run reaches the target where
the demo's seeds do, the packed run within 10 % of its samples, and each run's loss at every step
is its committed curve's (tests/fixtures/; `make loss-curve` rewrites them for a change meant to
move the numerics).

The packed run is in fp32, as its committed curve must be wherever the suite runs; the same
comparison in bf16 at the demo's own target is tests/gpu/test_convergence_gpu.py, part of `make
gpu-check`. Measurements with more seeds are in docs/performance.md. The runs are tagged with the
module's process tag and reaped when the module ends."""

from __future__ import annotations

import os

import pytest

from bertperf import reaper as bertperf_reaper
from tests.support import loss_curve, reaper

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(demo_data, tmp_path_factory):
    """run(name): that run, made the first time a test asks for it (one at a time, beside the
    unit tests); a process of theirs left after they have ended is killed and fails the module
    (as tests/conftest.py's no_process_outlives_its_test does a test's)."""
    tag = f"{os.getpid()}-convergence"
    started, finished = {}, {}

    def run(name: str) -> loss_curve.Run:
        if name not in finished:
            out = tmp_path_factory.mktemp(f"convergence_{name}")
            started[name] = (loss_curve.start(loss_curve.CURVES[name], demo_data[0], out,
                                              **{reaper.TAG: tag}), out)
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
        pytest.fail(f"{len(killed)} process(es) of the convergence runs outlived them and were "
                    "killed: " + "; ".join(f"pid {p.pid}: {p.command[:200]}" for p in killed),
                    pytrace=False)


def test_varlen_fp32_reaches_the_target(runs):
    """By 12,800 samples, where all ten seeds of the demo's result logs (results/) were past
    0.105."""
    run = runs("varlen")
    print(f"varlen: {run.samples} samples to {loss_curve.COMMON['TARGET_MLM_ACCURACY']}, "
          f"evals {run.accuracies}")
    assert run.status == "success" and run.samples <= 12_800


def test_packed_reaches_the_target_within_10_percent_of_the_samples(runs):
    varlen, packed = runs("varlen"), runs("packed_flat")
    print(f"samples to {loss_curve.COMMON['TARGET_MLM_ACCURACY']}: varlen {varlen.samples} "
          f"{varlen.accuracies}, packed {packed.samples} {packed.accuracies}")
    assert packed.status == "success" and packed.samples <= 1.1 * varlen.samples


@pytest.mark.parametrize("name", loss_curve.CURVES)
def test_the_loss_curve_is_the_committed_one(name, runs):
    curve = loss_curve.CURVES[name]
    want = loss_curve.committed(curve)
    assert want["settings"] == curve.settings, "the run's settings changed: make loss-curve"
    got = runs(name).losses
    moved = loss_curve.first_difference(got, want["losses"], want["rtol"])
    assert moved is None, (f"{name}, step {moved[0]}: loss {moved[1]!r}, the committed curve "
                           f"has {moved[2]!r} (beyond rtol {want['rtol']}); if the change is "
                           "meant to move the numerics, run `make loss-curve` and say why")


def test_the_comparison_sees_a_moved_step():
    curve = [10.0, 9.0, 8.0]
    assert loss_curve.first_difference(curve, curve) is None
    assert loss_curve.first_difference([10.0, 9.0 * (1 + 2 * loss_curve.RTOL), 8.0], curve)[0] == 2
    assert loss_curve.first_difference([10.0, float("nan"), 8.0], curve)[0] == 2
    assert loss_curve.first_difference(curve[:2], curve)[0] == 3
