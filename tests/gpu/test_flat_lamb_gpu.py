"""FlatLamb on CUDA, its Triton kernels compiled: Lamb's weights and moments within 1e-6 over 6
steps of a small BERT's three parameter groups, a step skipped on the device among them (the
CPU tests run these kernels interpreted). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from bertperf.optim import FlatLamb, Lamb
from tests.support.lamb import assert_same_state, step_both, three_groups
from tests.support.models import tiny_bert

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_flat_lamb_is_lamb_on_cuda():
    flat = FlatLamb(three_groups(tiny_bert().cuda()), lr=3e-3)
    lamb = Lamb(three_groups(tiny_bert().cuda()), lr=3e-3)
    step_both(flat, lamb, 6, skip=2)
    assert_same_state(flat, lamb, exact=False)
    assert [float(g["step"]) for g in flat.param_groups] == [5.0] * 3
