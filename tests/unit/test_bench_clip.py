"""`bench clip`: the overlap table read from a step's profiler events (backward's all-reduces only,
not the loss divisors' before it), and the command on 3 gloo ranks stepping the trainer's own
step with CLIP_BEFORE_ALLREDUCE=0 and 1."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from bertperf.bench.clip import _overlap
from bertperf.errors import UserError


def event(name: str, start: float, end: float) -> SimpleNamespace:
    """A profiler event as _overlap reads it (times in us)."""
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end))


def test_overlap_counts_backward_from_its_first_node():
    events = [event("bench:train_step", 0, 1000),
              event("c10d::allreduce_", 5, 6), event("gloo:all_reduce", 6, 8),  # the divisors
              event("DistributedDataParallel.forward", 10, 90),
              event("autograd::engine::evaluate_function: NllLossBackward0", 100, 110),
              event("torch::autograd::AccumulateGrad", 200, 210),
              event("c10d::allreduce_", 300, 301), event("gloo:all_reduce", 310, 350),
              event("torch::autograd::AccumulateGrad", 390, 400),
              event("c10d::allreduce_", 450, 451), event("gloo:all_reduce", 460, 600),
              event("torch.distributed.ddp.reducer::copy_bucket_to_grad", 600, 610),
              event("torch.distributed.ddp.reducer::copy_bucket_to_grad", 610, 620),
              event("Optimizer.step#Lamb.step", 650, 900)]
    o = _overlap(events)
    assert (o["allreduces"], o["before"]) == (2, 1)
    assert o["first"] == pytest.approx(0.2) and o["grads_done"] == pytest.approx(0.3)
    assert o["overlapped"] == pytest.approx(0.04) and o["gloo"] == pytest.approx(0.18)
    assert o["reduced"] == pytest.approx(0.52)


def test_overlap_needs_a_ddp_backward():
    with pytest.raises(UserError, match="no DDP backward"):
        _overlap([event("bench:train_step", 0, 10), event("c10d::allreduce_", 1, 2)])
    with pytest.raises(UserError, match="recorded nothing"):
        _overlap([])


@pytest.mark.slow
def test_bench_clip_shows_the_overlap_and_the_difference(tmp_path):
    """3 ranks, a BERT of width 128 (2.2 MB of gradients: DDP's default 1 MiB first bucket and
    a second): under after and bucket one all-reduce a bucket, the first before the last
    gradient; a max-norm nothing reaches changes no bit (the hook averages as DDP does, times
    1/3), a small one changes the step and clips both buckets."""
    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps({"vocab_size": 1100, "hidden_size": 128, "num_hidden_layers": 2,
                                  "num_attention_heads": 2, "intermediate_size": 512}))
    out = subprocess.run([sys.executable, "-m", "bertperf", "bench", "clip", "--ranks", "3",
                          "--config", str(config), "--seq", "32", "--batch", "4",
                          "--max-norm", "1e9,0.01"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    tables, buckets = out.stdout.split("The buckets")
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line.split("|")
            for line in tables.splitlines() if line.startswith("| 3 |")}
    assert {mode for _, mode in rows if mode in ("after", "bucket", "global")} == \
        {"after", "bucket"}, out.stdout
    buckets = [line.split("|") for line in buckets.splitlines() if line.startswith("| 3 | 0.01 |")]
    assert len(buckets) == 2 and all(float(b[7]) < 1 for b in buckets), out.stdout
    for mode in ("after", "bucket"):
        row = rows["3", mode]
        assert int(row[3]) == len(buckets), out.stdout
        assert int(row[6].split(" of ")[0]) >= 1, out.stdout
        assert float(row[4]) < float(row[5]) <= float(row[8]), out.stdout
    same, clipped = rows["3", "1e+09"], rows["3", "0.01"]
    assert same[3] == clipped[3] == same[4] == same[5], out.stdout
    assert float(same[6]) == 0 and same[8].strip().startswith("0 /"), out.stdout
    assert float(clipped[4]) == 0.01 and float(clipped[6]) > 1e-3, out.stdout
