"""Faults around a real `python -m bertperf train`: each ends in a one-line error naming the file
or the rank, a non-zero exit, run_stop with status aborted where the run had started, and never
a hang (every launch has a wall-clock limit, DIST_TIMEOUT bounds each collective)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from tests.support.copy_task import (MAX_PRED, VOCAB, add_manifests, copy_task, make_dataset,
                                     packed_copy, tiny_bert_config)
from tests.support.net import free_port
from tests.support.runs import base_env, reaped

TRAIN = [sys.executable, "-m", "bertperf", "train"]
LAUNCH = [sys.executable, "-m", "bertperf", "launch"]


@pytest.fixture
def data(tmp_path) -> dict:
    """The copy-task data with manifests, as the prep stages write them."""
    return add_manifests(make_dataset(tmp_path / "data", n_train=256, shards=2))


def run(env: dict, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(TRAIN, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def keys(log: Path) -> list[tuple[str, dict]]:
    if not log.exists():
        return []
    return [(e["key"], e.get("metadata", {})) for e in
            (json.loads(l.split(":::MLLOG ", 1)[1]) for l in log.read_text().splitlines()
             if ":::MLLOG " in l)]


def error_line(stderr: str) -> str:
    lines = [l for l in stderr.splitlines() if l.startswith("bertperf: error:")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def test_corrupt_shard_is_named_before_the_run_starts(data, tmp_path):
    shard = Path(data["DATADIR_PHASE2"]) / "part_1.h5"
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 0xFF  # same size: only the md5 can tell
    shard.write_bytes(raw)
    result = run(base_env(data, tmp_path, 1), tmp_path)
    assert result.returncode == 1
    assert str(shard) in error_line(result.stderr) and "md5" in result.stderr
    assert "run_start" not in [k for k, _ in keys(tmp_path / "result_0.txt")]


def test_data_verify_size_skips_the_md5s(data, tmp_path):
    """A manifest md5 that disagrees with an intact shard: md5 mode refuses, size mode starts."""
    folder = Path(data["DATADIR_PHASE2"])
    doc = json.loads((folder / "MANIFEST.json").read_text())
    doc["files"]["part_0.h5"]["md5"] = "0" * 32
    (folder / "MANIFEST.json").write_text(json.dumps(doc))
    result = run(base_env(data, tmp_path, 1), tmp_path)
    assert result.returncode == 1 and "part_0.h5" in error_line(result.stderr)
    ok = run({**base_env(data, tmp_path, 1), "DATA_VERIFY": "size", "MAX_STEPS": "2"}, tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]


def test_truncated_shard_and_missing_shard(data, tmp_path):
    folder = Path(data["DATADIR_PHASE2"])
    with open(folder / "part_0.h5", "r+b") as f:
        f.truncate(1000)
    result = run(base_env(data, tmp_path, 1), tmp_path)
    assert result.returncode == 1 and "part_0.h5" in error_line(result.stderr)
    (folder / "part_0.h5").unlink()
    (folder / "part_1.h5").unlink()
    result = run(base_env(data, tmp_path, 1), tmp_path)
    assert result.returncode == 1 and str(folder) in error_line(result.stderr)


EARLIER = ":::MLLOG an earlier run's log\n"


def test_a_truncated_shard_leaves_an_earlier_log_alone(data, tmp_path):
    """Found before the MLPerf log opens: the earlier log at its path stays as it was, none is
    written beside it, and the console has the one error line."""
    log = tmp_path / "result_0.txt"
    log.write_text(EARLIER)
    shard = Path(data["DATADIR_PHASE2"]) / "part_1.h5"
    with open(shard, "r+b") as f:
        f.truncate(1000)
    result = run(base_env(data, tmp_path, 1), tmp_path)
    assert result.returncode == 1
    lines = [l for l in result.stderr.splitlines() if not l.startswith("warning: ")]
    assert lines == [error_line(result.stderr)]
    assert lines[0].startswith(f"bertperf: error: rank 0: {shard}: size 1000 != "), lines[0]
    assert log.read_text() == EARLIER and sorted(tmp_path.glob("result_0.txt*")) == [log]


@pytest.mark.parametrize("case", ["no manifest", "vocab", "eval format", "masked_lm_prob"])
def test_data_problems_are_found_before_the_log_opens(data, tmp_path, case):
    """Each is one error naming the file; an earlier log at the log's path stays as it was and
    none is written beside it (loop.main in this process)."""
    from bertperf import config
    from bertperf.errors import UserError
    from bertperf.train import loop
    log = tmp_path / "result_0.txt"
    log.write_text(EARLIER)
    folder = Path(data["DATADIR_PHASE2"])
    env, named = base_env(data, tmp_path, 1), folder / "part_0.h5"
    if case == "no manifest":  # every shard's header is read (not only the first)
        named = folder / "part_1.h5"
        with open(named, "r+b") as f:
            f.truncate(1000)
        (folder / "MANIFEST.json").unlink()
    elif case == "vocab":
        small = tmp_path / "small_vocab.json"
        small.write_text(json.dumps({**json.loads(Path(data["BERT_CONFIG"]).read_text()),
                                     "vocab_size": 8}))
        env["BERT_CONFIG"], named = str(small), Path(data["EVAL_FILE"])
    elif case == "eval format":
        env["EVAL_FILE"] = str(named)
    else:  # rows of up to 3 samples of 4 masked tokens; at 1 % a row would hold at most 3
        env = {**packed_copy(env, tmp_path / "packed"), "MASKED_LM_PROB": "0.01"}
        named = tmp_path / "packed" / "part_0.h5"
    with pytest.raises(UserError) as err:
        loop.main(config.load(env))
    assert str(named) in str(err.value) and "\n" not in str(err.value)
    assert log.read_text() == EARLIER and sorted(tmp_path.glob("result_0.txt*")) == [log]


def test_a_shard_damaged_past_the_checks_ends_the_log_aborted(data, tmp_path, capsys):
    """DATA_VERIFY=none: a truncated shard no check reads is found when the loader reads it,
    mid-run: the log ends with run_stop aborted, and the earlier log is kept beside it, said on
    the console."""
    from bertperf import config
    from bertperf.errors import UserError
    from bertperf.train import loop
    log = tmp_path / "result_0.txt"
    log.write_text(EARLIER)
    shard = Path(data["DATADIR_PHASE2"]) / "part_1.h5"
    with open(shard, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(UserError) as err:
        loop.main(config.load({**base_env(data, tmp_path, 1), "DATA_VERIFY": "none"}))
    assert str(shard) in str(err.value)
    assert (tmp_path / "result_0.txt.1").read_text() == EARLIER
    assert f"MLPerf log {log}: the earlier log there is kept as {log}.1" in capsys.readouterr().err
    assert "run_start" in [k for k, _ in keys(log)]
    assert [(k, m.get("status")) for k, m in keys(log)][-1] == ("run_stop", "aborted")


def test_truncated_eval_set_is_refused(data, tmp_path):
    """An eval file with fewer samples than its manifest recorded (cut by hand, same name)."""
    path = Path(data["EVAL_FILE"])
    with h5py.File(path, "r") as f:
        arrays = {k: f[k][()] for k in f}
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f[k] = v[:40]
    result = run({**base_env(data, tmp_path, 1), "DATA_VERIFY": "none"}, tmp_path)
    assert result.returncode == 1
    assert str(path) in error_line(result.stderr) and "40 eval samples" in result.stderr


def test_vocab_config_mismatch_is_named(data, tmp_path):
    config = json.loads(Path(data["BERT_CONFIG"]).read_text())
    config["vocab_size"] = 8  # the copy task's token ids go up to 35
    small = tmp_path / "small_vocab.json"
    small.write_text(json.dumps(config))
    result = run({**base_env(data, tmp_path, 1), "BERT_CONFIG": str(small)}, tmp_path)
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert "vocab_size 8" in line and data["EVAL_FILE"] in line


def test_position_table_shorter_than_the_samples(tmp_path):
    """max_position_embeddings 64 with 128-token shards: `train --check`, a real run and the loop's
    own setup each stop with one line naming both values and where each comes from."""
    from bertperf import config
    from bertperf.errors import UserError
    from bertperf.formats.padded import write_samples
    from bertperf.formats.unpadded import write_shard
    from bertperf.train import loop
    train = tmp_path / "train"
    train.mkdir()
    write_shard(train / "part_0.h5", copy_task(64, seed=1), 128, MAX_PRED)
    eval_file = tmp_path / "eval.hdf5"
    write_samples(eval_file, copy_task(16, seed=2), np.arange(16), 128, MAX_PRED, VOCAB)
    short = tiny_bert_config(tmp_path / "bert_config.json")
    short.write_text(json.dumps({**json.loads(short.read_text()), "max_position_embeddings": 64}))
    data = {"DATADIR_PHASE2": str(train), "EVAL_FILE": str(eval_file), "BERT_CONFIG": str(short)}
    env = {**base_env(data, tmp_path, 1), "DATA_VERIFY": "none"}
    expected = (f"BERT_CONFIG {short}: max_position_embeddings 64 is below the data's sequence "
                f"length 128 (max_seq_length of {train / 'part_0.h5'})")
    for argv in (TRAIN + ["--check"], TRAIN):
        result = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 1, result.stderr[-3000:]
        assert result.stderr.splitlines() == [f"bertperf: error: {expected}"], argv
    with pytest.raises(UserError) as err:
        loop.main(config.load(env))
    assert str(err.value) == expected


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_a_rank_that_dies_stops_the_job(data, tmp_path):
    """Rank 1 is killed (SIGKILL) mid-training; rank 0 must exit non-zero within seconds with an
    error naming its rank, and its MLPerf log must end with run_stop aborted."""
    port = str(free_port())
    env = {**base_env(data, tmp_path, 2), "MAX_STEPS": "100000", "EVAL_ITER_SAMPLES": "100000",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
    procs = [subprocess.Popen(TRAIN, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True) for r in range(2)]
    log = tmp_path / "result_0.txt"
    try:
        wait_for(lambda: "run_start" in [k for k, _ in keys(log)], 90, "run_start")
        time.sleep(1.0)
        os.killpg(procs[1].pid, signal.SIGKILL)
        t0 = time.monotonic()
        _, stderr = procs[0].communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert procs[0].returncode == 1, stderr[-3000:]
    assert error_line(stderr).startswith("bertperf: error: rank 0:")
    stops = [m for k, m in keys(log) if k == "run_stop"]
    assert stops == [{"status": "aborted"}] or stops[0].get("status") == "aborted"
    assert took < 60


def rank_pids(launcher: int) -> dict[int, int]:
    """{rank: pid} of the processes a launcher started, read from /proc (their RANK)."""
    from bertperf.train.launch import children
    ranks = {}
    for pid in children(launcher):
        env = dict(v.split(b"=", 1) for v in
                   Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in v)
        if b"RANK" in env:
            ranks[int(env[b"RANK"])] = pid
    return ranks


def test_launch_names_the_rank_that_died(data, tmp_path):
    """Under `bertperf launch` (torch.distributed's launcher), rank 1 is killed (SIGKILL): the
    survivor's own line may come first, but the last error line names rank 1 and its signal."""
    env = {**base_env(data, tmp_path, 2), "MAX_STEPS": "100000", "EVAL_ITER_SAMPLES": "100000"}
    log = tmp_path / "result_0.txt"
    with reaped(subprocess.Popen([*LAUNCH, "--nproc-per-node", "2", "train"], env=env,
                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, start_new_session=True)) as launcher:
        wait_for(lambda: "run_start" in [k for k, _ in keys(log)], 90, "run_start")
        time.sleep(1.0)
        ranks = rank_pids(launcher.pid)
        os.kill(ranks[1], signal.SIGKILL)
        output, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 1, output[-3000:]
    errors = [l for l in output.splitlines() if l.startswith("bertperf: error:")]
    assert errors[-1] == f"bertperf: error: rank 1 (local rank 1, pid {ranks[1]}) died: SIGKILL", \
        output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert [m.get("status") for k, m in keys(log) if k == "run_stop"] == ["aborted"]


def test_launch_quotes_the_rank_that_failed_first(data, tmp_path):
    """A shard only rank 1 hashes is corrupt: rank 0 fails after it ("on another rank"), and the
    last line quotes rank 1's own error; both before the MLPerf log opens, so an earlier log
    there stays as it was."""
    log = tmp_path / "result_0.txt"
    log.write_text(EARLIER)
    shard = Path(data["DATADIR_PHASE2"]) / "part_1.h5"
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 0xFF
    shard.write_bytes(raw)
    result = subprocess.run([*LAUNCH, "--nproc-per-node", "2", "train"],
                            env=base_env(data, tmp_path, 2), cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1
    last = [l for l in result.stderr.splitlines() if l.startswith("bertperf: error:")][-1]
    assert re.fullmatch(rf"bertperf: error: rank 1 \(local rank 1, pid \d+\) exited with status "
                        rf"1: rank 1: {re.escape(str(shard))}: md5 .*", last), last
    assert log.read_text() == EARLIER and sorted(tmp_path.glob("result_0.txt*")) == [log]


def test_sigterm_logs_an_aborted_run(data, tmp_path):
    """Slurm's time limit and the launchers stop a job with SIGTERM: the log still closes."""
    env = {**base_env(data, tmp_path, 1), "MAX_STEPS": "100000", "EVAL_ITER_SAMPLES": "100000"}
    proc = subprocess.Popen(TRAIN, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    log = tmp_path / "result_0.txt"
    try:
        wait_for(lambda: "run_start" in [k for k, _ in keys(log)], 90, "run_start")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    assert "SIGTERM" in error_line(stderr)
    assert [m.get("status") for k, m in keys(log) if k == "run_stop"] == ["aborted"]


def test_nothing_is_left_half_written(data, tmp_path):
    """A failing run leaves no temporary files in the checkpoint folder."""
    env = {**base_env(data, tmp_path, 1), "BERT_CONFIG": str(tmp_path / "missing.json")}
    result = run(env, tmp_path)
    assert result.returncode == 1 and "missing.json" in error_line(result.stderr)
    assert not list(tmp_path.rglob(".*.tmp-*"))



# ---- full disks (a small tmpfs, mounted as root) -----------------------------------------------

def test_a_full_logdir_stops_the_run_at_once(data, tmp_path, small_disk):
    """The MLPerf log's disk fills mid-run: the run stops at the line it cannot write with one
    line naming the log and "no space left on device", exit 1; logging's per-line tracebacks
    ("--- Logging error ---") never appear."""
    logdir = small_disk("logs", 8)
    env = {**base_env(data, tmp_path, 1), "LOGDIR": str(logdir),
           "MLLOG_FILE": str(logdir / "result_0.txt"), "MAX_STEPS": "100000",
           "EVAL_ITER_SAMPLES": "100000", "LOG_FREQ": "1", "CHECKPOINT_DIR": ""}
    result = run(env, tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert error_line(result.stderr) == (f"bertperf: error: MLPerf log {logdir / 'result_0.txt'}: "
                                         "cannot write: no space left on device; the run stops")
    assert "Logging error" not in result.stderr and "Traceback" not in result.stderr


def test_a_full_checkpoint_folder_stops_the_run_and_keeps_the_last(data, tmp_path, small_disk):
    """The checkpoint folder's disk fills: one line naming the checkpoint, its folder and the
    cause, exit 1, no temporary left, and the checkpoints written before still load."""
    from bertperf.train.checkpoint import newest_first
    probe = tmp_path / "probe"
    done = run({**base_env(data, probe, 1), "MAX_STEPS": "2", "CHECKPOINT_DIR": str(probe)},
               tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    size = newest_first(probe)[0].stat().st_size
    ck = small_disk("ck", (3 * size) // 1024 + 4)  # two fit, the third does not
    env = {**base_env(data, tmp_path / "run", 1), "CHECKPOINT_DIR": str(ck),
           "CHECKPOINT_EVERY": "1", "MAX_STEPS": "50"}
    result = run(env, tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    kept = newest_first(ck)
    assert 1 <= len(kept) <= 3 and not list(ck.glob(".*"))
    failed = ck / f"ckpt_{int(kept[0].name[5:13]) + 1:08d}.pt"
    assert error_line(result.stderr) == (f"bertperf: error: checkpoint {failed}: cannot write: "
                                         f"no space left on device (in {ck}); nothing under that "
                                         "name changed")
    for path in kept:
        assert torch.load(path, weights_only=True)["progress"]["step"] == int(path.name[5:13])


def test_a_damaged_checkpoint_is_said_once_by_two_ranks(data, tmp_path):
    """Both ranks of a job read the same damaged checkpoint: the damage is said once, by rank 0
    (rank 1 only fails after it), and the launcher's last line quotes it."""
    bad = tmp_path / "ckpt_00000004.pt"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    env = {**base_env(data, tmp_path, 2), "RESUME_FROM": str(bad)}
    result = subprocess.run([*LAUNCH, "--nproc-per-node", "2", "train"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.count(f"checkpoint {bad}: damaged, cannot be read") == 2, result.stderr
    errors = [l for l in result.stderr.splitlines() if l.startswith("bertperf: error:")]
    assert errors[-1].startswith("bertperf: error: rank 0 (local rank 0, pid ")
    assert errors[-1].endswith(f": checkpoint {bad}: damaged, cannot be read (truncated or "
                               "corrupt: PytorchStreamReader failed reading zip archive: "
                               "failed finding central directory)"), errors[-1]
