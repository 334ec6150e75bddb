"""The committed loss curves (tests/support/loss_curve.py): the demo's model on the demo's data,
one rank on the unpadded shards with Lamb, and two ranks on the packed shards with FlatLamb,
compared step by step with their files in tests/fixtures/. A change meant to move the numerics
rewrites them (`make loss-curve`) in the same commit."""

from __future__ import annotations

import pytest

from tests.support import loss_curve


@pytest.mark.parametrize("name", loss_curve.CURVES)
def test_the_loss_curve_is_the_committed_one(name, demo_data, tmp_path):
    curve = loss_curve.CURVES[name]
    want = loss_curve.committed(curve)
    assert want["settings"] == curve.settings, "the run's settings changed: make loss-curve"
    got = loss_curve.run(curve, demo_data[0], tmp_path)
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
