"""mlperf/rcp.py: the global batch sizes the RCP checker can judge, from the table inside the
installed mlperf_logging package, and the reference it judges each against."""

from __future__ import annotations

import pytest

from bertperf.errors import UserError
from bertperf.mlperf.rcp import (check_global_batch, nearest_point, point_for, reference_for,
                                 reference_points)


def test_every_rcp_batch_up_to_the_largest_is_allowed():
    points = reference_points()
    sizes = [p.bs for p in points]
    assert sizes == sorted(sizes) and sizes[-1] == 16384
    for bs in [1, sizes[0], *sizes, sizes[-1] - 1]:
        check_global_batch(bs)
    assert point_for(16384) is points[-1] and point_for(16383) is None


def test_a_batch_above_the_largest_rcp_is_one_line():
    with pytest.raises(UserError, match=r"^global batch size 16385 is above the largest BERT "
                       r"RCP \(16384, ruleset 5\.0\.0\)") as exc:
        check_global_batch(16385)
    assert "\n" not in str(exc.value)


def olympic(point) -> float:
    runs = sorted(point.samples_to_converge)
    return sum(runs[1:-1]) / (len(runs) - 2)


def test_the_reference_at_a_batch_is_the_checkers():
    """A kept row's olympic mean; between two kept rows, their means interpolated in the batch
    (the checker prunes 1536, so it judges 1536 between 448 and 4608); below the smallest kept
    row, that row; above the largest, the one-line error."""
    row = reference_for(16384)
    assert row.mean == pytest.approx(olympic(point_for(16384))) and row.how == "RCP row 16384"
    assert row.fewest < row.mean
    low, high = olympic(point_for(13056)), olympic(point_for(16384))
    between = reference_for(13888)
    assert between.mean == pytest.approx(low + (13888 - 13056) / (16384 - 13056) * (high - low))
    assert between.how == "interpolated between RCP rows 13056 and 16384"
    assert reference_for(1536).how == "interpolated between RCP rows 448 and 4608"
    small = reference_for(256)
    assert small.mean == pytest.approx(olympic(point_for(448))) and "below the smallest" in \
        small.how
    with pytest.raises(UserError, match="above the largest BERT RCP"):
        reference_for(16385)


def test_the_nearest_row_gives_a_batchs_hyperparameters():
    assert nearest_point(13888).bs == 13056 and nearest_point(16384).bs == 16384
    assert nearest_point(1).bs == 256 and nearest_point(4352).bs == 4096  # as near: the smaller
