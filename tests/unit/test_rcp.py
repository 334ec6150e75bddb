"""mlperf/rcp.py: the global batch sizes the RCP checker can judge, from the table inside the
installed mlperf_logging package."""

from __future__ import annotations

import pytest

from bertperf.errors import UserError
from bertperf.mlperf.rcp import check_global_batch, point_for, reference_points


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
