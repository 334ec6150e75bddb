"""The demo's pieces for real, shortened: data_prep/prepare_demo.sh on FOLDOC (the installed
dict-foldoc, or the .deb fetched with `apt-get download`), then config_CPU_1x2x32x1.sh through
run_and_time.sh for 10 steps (2 ranks); its open-division log passes the compliance checker, and
its checkpoint exports as `make demo` exports it, to a folder that transformers loads offline.
The full-length demo is `make demo` (measured in docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.demo import demo_env
from tests.support.mlperf_logs import checker, events
from tests.support.paths import ROOT

LOAD = """
import sys
from transformers import AutoModel, AutoTokenizer, BertForMaskedLM, BertForPreTraining
folder = sys.argv[1]
ids = AutoTokenizer.from_pretrained(folder)("A dictionary of computing.", return_tensors="pt")
for cls in (BertForPreTraining, BertForMaskedLM, AutoModel):
    model = cls.from_pretrained(folder).eval()
    print(type(model).__name__, tuple(model(**ids)[0].shape))
print(ids["input_ids"].tolist())
"""

pytestmark = pytest.mark.slow


def test_prepare_demo_and_a_short_demo_run(demo_data, tmp_path):
    out, prep = demo_data
    assert "12014 articles" in prep.stdout and "verify: " in prep.stdout
    assert "0 problem(s)" in prep.stdout

    run_env = demo_env(out, tmp_path / "results", MAX_SAMPLES_TERMINATION="640",
                       EVAL_ITER_START_SAMPLES="640", LOG_FREQ="5",
                       CHECKPOINT_DIR=str(tmp_path / "checkpoints"))
    run = subprocess.run(["bash", str(ROOT / "run_and_time.sh")], env=run_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    log = tmp_path / "results" / "result_1.txt"
    check = checker(log)
    assert "SUCCESS" in check.stderr, check.stderr[-3000:]
    ev = {e["key"]: e for e in events(log)}
    assert ev["submission_division"]["value"] == "open"
    assert ev["global_batch_size"]["value"] == 64 and ev["eval_samples"]["value"] == 2000
    assert ev["run_stop"]["metadata"]["status"] == "aborted"  # 10 steps: far from 0.13

    model = tmp_path / "model"
    export = subprocess.run([sys.executable, "-m", "bertperf", "export", "--checkpoint", "auto",
                             "--output", str(model)], env=run_env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert export.returncode == 0, export.stderr
    assert "2 layers of 128, 4,433,468 parameters" in export.stdout
    card = (model / "README.md").read_text()
    assert "run_stop aborted after 640 samples" in card and "on 2 rank(s)" in card
    pytest.importorskip("transformers")
    load = subprocess.run([sys.executable, "-c", LOAD, str(model)],
                          env={**run_env, "HF_HUB_OFFLINE": "1"}, capture_output=True,
                          text=True, timeout=120)
    assert load.returncode == 0, load.stderr[-3000:]
    assert load.stdout.splitlines() == [
        "BertForPreTraining (1, 7, 30522)", "BertForMaskedLM (1, 7, 30522)",
        "BertModel (1, 7, 128)", "[[101, 1037, 9206, 1997, 9798, 1012, 102]]"]
