"""Starting a real run from an initial checkpoint (INIT_CHECKPOINT), as MLPerf starts from
model.ckpt-28252: the TF fixture (written by real TensorFlow, tests/fixtures/tf_ckpt) is read
without TensorFlow, directly or after `convert-ckpt`; the sanity eval runs before run_start; a
config that does not fit the checkpoint is a one-line error before any training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bertperf.model.bert_config import BertConfig
from bertperf.benchmark import INIT_ACCURACY
from bertperf.train.warmstart import sanity_eval
from tests.support.copy_task import make_dataset
from tests.support.mlperf_logs import events
from tests.support.paths import PYTHONPATH, TF_CKPT as FIXTURE
from tests.support.runs import base_env

PREFIX = FIXTURE / "model.ckpt-7"


@pytest.fixture
def env(tmp_path) -> dict:
    data = make_dataset(tmp_path / "data", n_train=128, shards=1)  # ids < 32 < the fixture's 99
    data["BERT_CONFIG"] = str(FIXTURE / "bert_config.json")
    return {**base_env(data, tmp_path, 1), "MAX_STEPS": "2", "DATA_VERIFY": "none"}


def bertperf(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bertperf", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=180)


def test_run_starts_from_the_tf_checkpoint_and_from_its_conversion(env, tmp_path):
    first = bertperf(["train"], {**env, "INIT_CHECKPOINT": str(PREFIX)}, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "init checkpoint: mlm accuracy" in first.stderr
    converted = tmp_path / "init.pt"
    conv = bertperf(["convert-ckpt", "--tf-checkpoint", str(PREFIX), "--bert-config",
                     str(FIXTURE / "bert_config.json"), "--output", str(converted)],
                    {**env, "PYTHONPATH": PYTHONPATH}, tmp_path)
    assert conv.returncode == 0, conv.stderr
    second = bertperf(["train"], {**env, "INIT_CHECKPOINT": str(converted),
                                  "MLLOG_FILE": str(tmp_path / "second.txt")}, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    accuracy = [l for l in first.stderr.splitlines() if l.startswith("init checkpoint:")]
    assert accuracy == [l for l in second.stderr.splitlines() if l.startswith("init checkpoint:")]
    # the sanity eval is part of init, not an MLPerf eval
    keys = [e["key"] for e in events(tmp_path / "second.txt")]
    assert keys.index("init_stop") < keys.index("run_start") and "eval_accuracy" not in keys[
        :keys.index("run_start")]


def test_config_that_does_not_fit_the_checkpoint_is_named(env, tmp_path):
    config = json.loads((FIXTURE / "bert_config.json").read_text())
    config["hidden_size"] = 16
    config["intermediate_size"] = 32
    wider = tmp_path / "wider.json"
    wider.write_text(json.dumps(config))
    result = bertperf(["train"], {**env, "BERT_CONFIG": str(wider),
                                  "INIT_CHECKPOINT": str(PREFIX)}, tmp_path)
    assert result.returncode == 1
    errors = [l for l in result.stderr.splitlines() if l.startswith("bertperf: error:")]
    assert len(errors) == 1 and "model.ckpt-7" in errors[0], result.stderr[-2000:]
    assert not (tmp_path / "result_0.txt").exists()  # found before the MLPerf log opens


def test_missing_init_checkpoint_is_refused_at_config_time(env, tmp_path):
    result = bertperf(["train"], {**env, "INIT_CHECKPOINT": str(tmp_path / "nope")}, tmp_path)
    assert result.returncode == 1 and "INIT_CHECKPOINT" in result.stderr


@pytest.mark.parametrize("accuracy, warned", [(0.3409, False), (0.02, True), (0.72, True)])
def test_sanity_eval_warns_far_from_the_reference(accuracy, warned):
    warnings, reports = [], []
    sanity_eval(lambda: accuracy, BertConfig.large(), reports.append, warnings.append)
    assert bool(warnings) == warned and str(INIT_ACCURACY) in "".join(warnings or ["0.34085"])
    assert reports == [f"init checkpoint: mlm accuracy {accuracy:.5f} before training"]


def test_sanity_eval_does_not_judge_other_models():
    warnings: list[str] = []
    tiny = BertConfig(vocab_size=99, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=16)
    sanity_eval(lambda: 0.0, tiny, lambda line: None, warnings.append)
    assert warnings == []
