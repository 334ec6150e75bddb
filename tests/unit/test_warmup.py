"""The compile warm-up (train.loop.warm_up): a compiled run compiles during init, before
run_start, and then trains exactly as without the warm-up."""

from __future__ import annotations

import json

import pytest

from tests.support.packed import packed_env  # noqa: F401


def run(env: dict, monkeypatch, warm: bool) -> tuple[list[float], dict, list[str]]:
    """loop.main in this process: (the losses of every step, dynamo's graph and frame counts
    at run_start and at the end, the MLPerf log's keys in order)."""
    import torch
    from torch._dynamo.utils import counters

    from bertperf import config
    from bertperf.train import loop
    torch._dynamo.reset()
    counters.clear()
    losses, seen = [], {}
    real_step = loop.train_step

    def recording(step, micro):
        loss = real_step(step, micro)
        losses.append(float(loss))
        return loss

    class Counted(loop.LoopEvents):
        def run_start(self, trainer):
            seen["run_start"] = dict(counters["stats"])
            monkeypatch.setattr(loop, "train_step", recording)

    if not warm:
        monkeypatch.setattr(loop, "warm_up", lambda trainer: None)
    assert loop.main(config.load(env), events=Counted()) == 0
    monkeypatch.undo()
    seen["end"] = dict(counters["stats"])
    log = env["MLLOG_FILE"]
    keys = [json.loads(line.split(":::MLLOG ", 1)[1])["key"] for line in open(log)]
    return losses, seen, keys


STAGED = {"LAYERWISE": "1:16,2:16:new,2:all", "LAYERWISE_EMBEDDINGS": "trained",
          "LAYERWISE_INIT": "fresh"}
"""Three stages in six steps: one layer, two with the first frozen (the second as drawn: the
warm-up must put it back), two training."""


@pytest.mark.parametrize("backend,staged", [("eager", False), ("aot_eager", False),
                                            ("aot_eager", True)])
def test_a_compiled_run_compiles_before_run_start_and_trains_the_same(packed_env, tmp_path,
                                                                      monkeypatch, backend,
                                                                      staged):
    """Every stage of a LAYERWISE run compiles in the warm-up, too (layerwise.Stages.rehearse)."""
    env = {**packed_env, "COMPILE": backend, "MAX_STEPS": "6", "LOG_FREQ": "1",
           "EVAL_ITER_START_SAMPLES": "40", "EVAL_ITER_SAMPLES": "40",
           **(STAGED if staged else {})}
    cold, cold_counts, _ = run({**env, "MLLOG_FILE": str(tmp_path / "cold.txt")}, monkeypatch,
                               warm=False)
    warm, warm_counts, keys = run({**env, "MLLOG_FILE": str(tmp_path / "warm.txt")},
                                  monkeypatch, warm=True)
    assert len(cold) == 6 and warm == cold  # bit for bit: the warm-up left no trace
    # without the warm-up the step compiles after run_start; with it, nothing does
    assert cold_counts["run_start"].get("unique_graphs", 0) == 0
    assert cold_counts["end"]["unique_graphs"] >= 1
    assert warm_counts["run_start"]["unique_graphs"] >= 1
    assert warm_counts["end"] == warm_counts["run_start"]
    if staged:  # the run went through every stage, each compiled in the warm-up
        assert keys.count("layerwise_stage") == 3
        assert warm_counts["run_start"]["unique_graphs"] >= 3
    assert keys.index("init_stop") < keys.index("run_start")
    assert "eval_accuracy" in keys[keys.index("run_start"):]
    assert not any(k in ("eval_accuracy", "block_start") for k in keys[:keys.index("run_start")])


def test_an_uncompiled_cpu_run_has_no_warm_up(packed_env, tmp_path, monkeypatch):
    from bertperf.train import loop
    called = []
    real = loop.train_step
    monkeypatch.setattr(loop, "train_step", lambda step, micro: called.append(1) or
                        real(step, micro))
    env = {**packed_env, "MAX_STEPS": "2", "MLLOG_FILE": str(tmp_path / "log.txt")}
    from bertperf import config
    assert loop.main(config.load(env)) == 0
    assert len(called) == 2  # the run's two steps only


def test_the_warm_up_puts_back_every_checkpoint_part(packed_env, tmp_path):
    """After warm_up (COMPILE=eager) every part the checkpointer saves (Trainer.parts) holds the
    state it held before, tensor for tensor."""
    import torch
    from torch._dynamo.utils import counters

    from bertperf.train import loop
    from tests.support.packed import trainer_for
    torch._dynamo.reset()
    counters.clear()
    trainer = trainer_for(packed_env, tmp_path, COMPILE="eager", MAX_STEPS="4")
    before = loop._to_host(trainer.checkpointer.states())
    loop.warm_up(trainer)
    after = loop._to_host(trainer.checkpointer.states())
    assert list(after) == list(before) and "optimizer" in after and "rng" in after

    def same(a, b) -> bool:
        if isinstance(a, torch.Tensor):
            return torch.equal(a, b)
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b
    assert counters["stats"]["unique_graphs"] >= 1  # the warm-up compiled its steps
    for name in before:
        assert same(before[name], after[name]), name
