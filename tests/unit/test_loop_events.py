"""The loop's events (train.loop.LoopEvents): run_loop tells them where it is, in order, with the
step counts, samples and accuracies it logs; `bench layerwise`'s Recorder times a LAYERWISE run
by them (a step per stage's depth, the frozen forward inside frozen stages only, the evals at the
log's samples)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.copy_task import make_dataset
from tests.support.mlperf_logs import events

STEPS = 16  # 8 samples a step


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("events")
    data = make_dataset(root / "data", n_train=64, n_eval=16)
    deep = root / "deep.json"
    deep.write_text(json.dumps({**json.loads(Path(data["BERT_CONFIG"]).read_text()),
                                "num_hidden_layers": 4}))
    return {**data, "BERT_CONFIG": str(deep), "BATCHSIZE": "4", "GRADIENT_STEPS": "2",
            "LR": "0.01", "MAX_STEPS": str(STEPS), "WARMUP_PROPORTION": "0.2",
            "EVAL_ITER_SAMPLES": "24", "TARGET_MLM_ACCURACY": "0.99",
            "SUBMISSION_DIVISION": "open", "SEED": "3", "LOG_FREQ": "0", "DATA_VERIFY": "none",
            "LAYERWISE": "2:40,3:24,4", "LAYERWISE_TRAIN": "new", "LOGDIR": str(root / "out")}


def accuracies(log: Path) -> list[tuple[int, float]]:
    return [(e["metadata"]["epoch_num"], e["value"]) for e in events(log)
            if e["key"] == "eval_accuracy"]


def test_the_loop_tells_its_events_in_order(env, tmp_path):
    from bertperf import config
    from bertperf.train import loop
    seen = []

    class Seen(loop.LoopEvents):
        def run_start(self, trainer):
            seen.append(("run_start", trainer.progress.step))

        def step_start(self):
            seen.append(("step_start",))

        def step_end(self, step, samples):
            seen.append(("step_end", step, samples))

        def eval_start(self):
            seen.append(("eval_start",))

        def eval_end(self, samples, accuracy):
            seen.append(("eval_end", samples, accuracy))

    log = tmp_path / "log.txt"
    assert loop.main(config.load({**env, "MLLOG_FILE": str(log)}), events=Seen()) == 0
    assert seen[0] == ("run_start", 0) and seen.count(("run_start", 0)) == 1
    steps = [e[1:] for e in seen if e[0] == "step_end"]
    assert steps == [(k, 8 * k) for k in range(1, STEPS + 1)]
    assert seen.count(("step_start",)) == STEPS
    assert [e[1:] for e in seen if e[0] == "eval_end"] == accuracies(log)
    for i, e in enumerate(seen[1:], 1):  # a step or an eval opens after the last one closed
        if e[0] in ("step_start", "eval_start"):
            assert seen[i - 1][0] in ("run_start", "step_end", "eval_end"), seen[i - 1:i + 1]
        if e[0] == "eval_start":
            assert seen[i - 1][0] == "step_end"



def test_the_evals_keep_their_grid_when_a_step_overshoots_it(env, tmp_path):
    """EVAL_ITER_SAMPLES=20 with 8 samples a step: an eval at the first step at or past each
    multiple of 20, not 20 samples after the last eval."""
    from bertperf import config
    from bertperf.train import loop
    log = tmp_path / "log.txt"
    settings = {k: v for k, v in env.items() if not k.startswith("LAYERWISE")}
    assert loop.main(config.load({**settings, "EVAL_ITER_SAMPLES": "20",
                                  "MLLOG_FILE": str(log)})) == 0
    assert [samples for samples, _ in accuracies(log)] == [24, 40, 64, 80, 104, 120]

def test_bench_layerwise_records_a_staged_run(env, tmp_path):
    from bertperf import config
    from bertperf.bench.layerwise import Recorder
    from bertperf.train import loop
    recorder = Recorder()
    log = tmp_path / "log.txt"
    assert loop.main(config.load({**env, "MLLOG_FILE": str(log)}), events=recorder) == 0
    assert [(depth, frozen) for depth, frozen, _, _ in recorder.steps] == \
        [(2, 0)] * 5 + [(3, 2)] * 3 + [(4, 3)] * 8
    for depth, frozen, seconds, frozen_seconds in recorder.steps:
        assert seconds > 0 and (frozen_seconds > 0) == (frozen > 0)
        assert frozen_seconds < seconds
    assert [(s, a) for s, a, _ in recorder.evals] == accuracies(log)
    at = [t for _, _, t in recorder.evals]
    assert at == sorted(at) and at[0] > 0
