"""300 steps of BERT-large from random weights on packed 512-token samples (make gpu-check's data:
a Wikipedia extract, or FOLDOC; tests/gpu/conftest.py), on the GPU, with the single-H100 recipe's
settings (config_DGXH100_1x1x*.sh; one micro-batch a step): the loss falls. Part of `make
gpu-check`, which appends the run's summary to its report ($GPU_CHECK_REPORT). Skipped without
CUDA."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from tests.support.paths import ROOT
from tests.support.scripts import LAUNCH_VARS, config_env

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

STEPS = 300
PROGRESS = re.compile(r"^step (\d+) samples (\d+) loss ([\d.]+) lr \S+ seq/s ([\d.]+) "
                      r"tokens/s (\d+)")


def bertperf(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bertperf", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)


def test_bert_large_loss_falls_in_300_steps(bert_large_data, tmp_path):
    from bertperf.formats import detect
    from bertperf.formats.packed import packed_meta

    packed_shards, eval_file = bert_large_data
    metas = [packed_meta(path) for path in detect.sample_files(packed_shards, "training")]
    per_row = sum(m["sequences"] for m in metas) / sum(m["rows"] for m in metas)
    (recipe,) = ROOT.glob("config_DGXH100_1x1x*.sh")
    env = {k: v for k, v in config_env(recipe).items() if k not in LAUNCH_VARS}
    env.update(DATADIR_PHASE2=str(packed_shards), LAYOUT="packed",
               EVAL_FILE=str(eval_file),
               PACKING_FACTOR=f"{per_row:.3f}",
               INIT_CHECKPOINT="", GRADIENT_STEPS="1", MAX_STEPS=str(STEPS), LR="1e-3",
               WARMUP_STEPS="30", LOG_FREQ="10", EVAL_ITER_START_SAMPLES="10000",
               EVAL_ITER_SAMPLES="10000", SUBMISSION_DIVISION="open",
               TARGET_MLM_ACCURACY="0.99", DEVICE="cuda", SEED="1", LOGDIR=str(tmp_path),
               MLLOG_FILE=str(tmp_path / "result.txt"))
    run = bertperf("train", env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    progress = [m.groups() for line in run.stderr.splitlines() if (m := PROGRESS.match(line))]
    assert progress and int(progress[-1][0]) == STEPS, run.stderr[-4000:]
    losses = [float(p[2]) for p in progress]
    first, last = losses[0], min(losses[-3:])
    accuracy = re.findall(r"mlm accuracy ([\d.]+)", run.stderr)
    summary = (f"`make gpu-check`, {torch.cuda.get_device_name()}: {STEPS} steps of BERT-large "
               f"from random weights, {env['BATCHSIZE']} packed rows a step ({packed_shards.parent.name}), "
               f"PRECISION={env['PRECISION']}: loss {first:.3f} at step {progress[0][0]} -> "
               f"{losses[-1]:.3f} at step {STEPS}"
               + (f", masked-LM accuracy {accuracy[-1]}" if accuracy else "")
               + f"; last interval {float(progress[-1][3]):,.0f} seq/s, "
               f"{int(progress[-1][4]):,} tokens/s")
    if os.environ.get("GPU_CHECK_REPORT"):
        with open(os.environ["GPU_CHECK_REPORT"], "a") as report:
            report.write(summary + "\n\n")
    print(summary)
    assert last < first - 1.0, summary
