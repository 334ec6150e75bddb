"""The committed loss curves (tests/support/loss_curve.py): the demo's model on the demo's data,
one rank on the unpadded shards with Lamb, and two ranks on the packed shards with FlatLamb,
compared step by step with their files in tests/fixtures/. A change meant to move the numerics
rewrites them (`make loss-curve`) in the same commit.

Both runs start together when the module's first test begins (the one-rank run leaves a core
free, which the two-rank run's ranks share), and each test waits for its own; the runs are
tagged with the module's process tag, reaped when the module ends."""

from __future__ import annotations

import os

import pytest

from bertperf import reaper as bertperf_reaper
from tests.support import loss_curve, reaper


@pytest.fixture(scope="module")
def runs(request, demo_data, tmp_path_factory):
    """name: (its process, its output folder) for every curve whose test was selected, all
    started at once; a process of theirs left after they have ended is killed and fails the
    module (as tests/conftest.py's no_process_outlives_its_test does a test's)."""
    tag = f"{os.getpid()}-loss-curves"
    started = {}
    try:
        for name, curve in loss_curve.CURVES.items():
            if not any(item.module is request.module and item.callspec.params.get("name") == name
                       for item in request.session.items if hasattr(item, "callspec")):
                continue
            out = tmp_path_factory.mktemp(f"loss_curve_{name}")
            started[name] = (loss_curve.start(curve, demo_data[0], out, **{reaper.TAG: tag}), out)
        yield started
    finally:
        ended = all(process.poll() is not None for process, _ in started.values())
        for process, _ in started.values():
            if process.poll() is None:
                process.kill()
            process.wait()
        killed = bertperf_reaper.reap(reaper.TAG, tag)
    if killed and ended:
        pytest.fail(f"{len(killed)} process(es) of the loss-curve runs outlived them and were "
                    "killed: " + "; ".join(f"pid {p.pid}: {p.command[:200]}" for p in killed),
                    pytrace=False)


@pytest.mark.parametrize("name", loss_curve.CURVES)
def test_the_loss_curve_is_the_committed_one(name, runs):
    curve = loss_curve.CURVES[name]
    want = loss_curve.committed(curve)
    assert want["settings"] == curve.settings, "the run's settings changed: make loss-curve"
    got = loss_curve.losses(curve, *runs[name])
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
