"""Training on packed shards (LAYOUT=packed, `prep pack`'s bertperf-packed/1): a 2-rank run equals a
1-rank run over the same global batches of rows, and the MLPerf log counts what MLPerf counts:
samples are the sequences trained (samples_count, eval epoch_num, train_samples), the logged
global_batch_size is the rows per step times PACKING_FACTOR; the log passes the compliance
checker. The rows hold 1 to 3 short sequences each, with unequal mask counts."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertperf.data.synthetic import synthetic_packed, synthetic_samples
from bertperf.formats.packed import read_packed, write_packed
from bertperf.formats.padded import write_samples
from tests.support.mlperf_logs import checker
from tests.support.net import free_port
from tests.support.packed import tiny_config
from tests.support.paths import PYTHONPATH
from tests.support.runs import RANK_VARS, launch

L, MAX_PRED, VOCAB = 64, 6, 1100
ROWS, GA, STEPS = 8, 2, 30  # rows per step over all ranks


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("packed_train")
    (root / "train").mkdir()
    for i in range(2):
        s = synthetic_samples(300, 60 + i, 24, MAX_PRED, VOCAB)  # sequences of 8..24 tokens
        write_packed(root / "train" / f"part_{i:05d}.h5", synthetic_packed(s, L), L, MAX_PRED, 3)
    write_samples(root / "eval.hdf5", synthetic_samples(64, 9, L, MAX_PRED, VOCAB),
                  np.arange(64), L, MAX_PRED, VOCAB)
    return {"DATADIR_PHASE2": str(root / "train"), "EVAL_FILE": str(root / "eval.hdf5"),
            "BERT_CONFIG": str(tiny_config(root / "bert_config.json", 0.0))}


def env_for(data: dict, out: Path, world: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    return {**env, **data, "PYTHONPATH": PYTHONPATH, "BATCHSIZE": str(ROWS // GA // world),
            "GRADIENT_STEPS": str(GA), "LR": "0.005", "MAX_STEPS": str(STEPS), "SEED": "2",
            "EVAL_ITER_SAMPLES": "150", "TARGET_MLM_ACCURACY": "0.99", "LOG_FREQ": "1",
            "SUBMISSION_DIVISION": "open", "DATA_VERIFY": "none", "PACKING_FACTOR": "2.5",
            "MLLOG_FILE": str(out / "result_0.txt"), "LOGDIR": str(out),
            "CHECKPOINT_DIR": str(out / "ckpt"), "DIST_TIMEOUT": "60", "OMP_NUM_THREADS": "1"}


def run(data: dict, out: Path, world: int) -> dict:
    out.mkdir()
    train = [sys.executable, "-m", "bertperf", "train"]
    port = str(free_port())
    cmds = [(train, {**env_for(data, out, world), "RANK": str(r), "WORLD_SIZE": str(world),
                     "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
            for r in range(world)]
    for rc, text in launch(cmds, out):
        assert rc == 0, text[-4000:]
    log = [json.loads(line.split(":::MLLOG ", 1)[1])
           for line in (out / "result_0.txt").read_text().splitlines()]
    state = torch.load(out / "ckpt" / f"ckpt_{STEPS:08d}.pt", weights_only=True)
    return {"log": log, "model": state["model"], "path": out / "result_0.txt"}


def sequences_per_step(data: dict) -> list[int]:
    """The sequences of each step's GA micro-batches, in the loader's order (the 1-rank run's)."""
    from bertperf.data.dataset import ShardDataset
    from bertperf.data.loader import ShardLoader
    loader = ShardLoader(ShardDataset.from_folder(data["DATADIR_PHASE2"]), ROWS // GA, seed=2,
                         prefetch=0, split="global_batch")
    counts = []
    while len(counts) < STEPS * GA:
        counts += [int(b["num_sequences"]) for b in loader]
    return [sum(counts[i:i + GA]) for i in range(0, STEPS * GA, GA)]


def test_packed_two_ranks_equal_one_and_the_log_counts_sequences(data, tmp_path):
    one, two = run(data, tmp_path / "one", 1), run(data, tmp_path / "two", 2)
    worst = max(float((one["model"][k] - two["model"][k]).abs().max()) for k in one["model"])
    assert worst < 1e-5, f"final parameters differ by up to {worst:.3g}"
    per_step = sequences_per_step(data)
    rows = sum(len(read_packed(p)[0]) for p in sorted(Path(data["DATADIR_PHASE2"]).iterdir())
               if p.suffix == ".h5")
    assert sum(per_step) > 1.5 * ROWS * STEPS and rows < 600  # 1 to 3 sequences a row
    for result in (one, two):
        log = result["log"]
        values = {e["key"]: e["value"] for e in log}
        assert values["global_batch_size"] == round(ROWS * 2.5)
        assert values["train_samples"] == sum(per_step)
        evals = [e["metadata"]["epoch_num"] for e in log if e["key"] == "eval_accuracy"]
        trained = np.cumsum(per_step)
        expected, nxt = [], 150
        for s in trained:  # an eval at the first step whose sequences reach the next 150
            if s >= nxt:
                expected.append(int(s))
                while nxt <= s:
                    nxt += 150
        assert evals == expected
        stops = [e["metadata"]["samples_count"] for e in log if e["key"] == "block_stop"]
        assert stops[-1] == sum(per_step)
    assert [e["value"] for e in one["log"] if e["key"] == "eval_accuracy"] == \
        [e["value"] for e in two["log"] if e["key"] == "eval_accuracy"]
    assert "SUCCESS" in checker(one["path"]).stderr
