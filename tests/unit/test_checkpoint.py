"""Checkpoints (bertperf.train.checkpoint): a run resumed from step k continues the uninterrupted
run's loss curve bitwise (tiny model with dropout, GA 2, prefetching loader, evals, an epoch
boundary), also across the two LAMBs (FLAT_LAMB=1 and 0), and bad checkpoints are one-line
errors naming the file."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.copy_task import make_dataset, tiny_bert_config
from tests.support.mlperf_logs import checker
from tests.support.paths import PYTHONPATH
from tests.support.tensorboard import curves

N = 20  # steps of the whole run; 64 training samples / 8 per step = 8 steps an epoch


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("ckdata")
    env = make_dataset(root / "data", n_train=64, n_eval=16)
    env["BERT_CONFIG"] = str(tiny_bert_config(root / "dropout_config.json", dropout=0.1))
    return env


def base_env(data: dict, out: Path, **extra: str) -> dict:
    return {**data, "BATCHSIZE": "4", "GRADIENT_STEPS": "2", "LR": "0.01", "MAX_STEPS": str(N),
            "WARMUP_PROPORTION": "0.2", "EVAL_ITER_SAMPLES": "24", "TARGET_MLM_ACCURACY": "0.99",
            "SUBMISSION_DIVISION": "open",
            "SEED": "3", "LOG_FREQ": "0", "LOGDIR": str(out), "MLLOG_FILE": str(out / "log.txt"),
            **extra}


def run(monkeypatch, env: dict) -> list[float]:
    """loop.main in this process; the per-step losses."""
    from bertperf import config
    from bertperf.train import loop
    losses: list[float] = []
    real = loop.train_step

    def recording(trainer, micro):
        result = real(trainer, micro)
        losses.append(float(result))
        return result

    monkeypatch.setattr(loop, "train_step", recording)
    assert loop.main(config.load(env)) == 0
    monkeypatch.setattr(loop, "train_step", real)
    return losses


def tensors(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, weights_only=True)
    out = {f"model.{k}": v for k, v in state["model"].items()}
    for i, s in state["optimizer"]["state"].items():
        out.update({f"opt.{i}.{k}": v for k, v in s.items() if isinstance(v, torch.Tensor)})
    return out


def test_resume_continues_the_same_loss_curve(tmp_path, monkeypatch, capsys, data):
    """A run resumed from its latest checkpoint (mid-epoch, between evals) and from step 8 (the
    end of epoch 0) trains on the uninterrupted run's curve, bitwise, to the same model; with
    TENSORBOARD=1 in the first run's folder, its curves are the uninterrupted run's, each step
    once (the second resume's steps 9 and 10, trained again, hide the first run's)."""
    from bertperf.train.checkpoint import file_name, newest_first
    board = {"TENSORBOARD": "1", "LOG_FREQ": "1"}
    full = run(monkeypatch, base_env(data, tmp_path / "a", CHECKPOINT_DIR=str(tmp_path / "ck_a"),
                                     **board))
    assert len(full) == N and len(set(full)) == N
    assert sorted(p.name for p in (tmp_path / "ck_a").iterdir()) == [file_name(N)]  # end only
    uninterrupted = curves(tmp_path / "a" / "log.txt.tensorboard")
    assert set(uninterrupted) == {"train/loss", "train/lr", "train/sequences_per_s",
                                  "train/tokens_per_s", "eval/mlm_accuracy"}
    assert [step for step, _ in uninterrupted["eval/mlm_accuracy"]] == list(range(3, N + 1, 3))
    assert uninterrupted["train/loss"] == [(s + 1, pytest.approx(loss, rel=1e-6))
                                           for s, loss in enumerate(full)]

    ck = tmp_path / "ck_b"
    half = run(monkeypatch, base_env(data, tmp_path / "b", CHECKPOINT_DIR=str(ck),
                                     CHECKPOINT_EVERY="4", MAX_SAMPLES_TERMINATION=str(N // 2 * 8),
                                     **board))
    assert half == full[:N // 2]
    assert sorted(p.name for p in ck.iterdir()) == [file_name(s) for s in (4, 8, 10)]
    assert newest_first(ck)[0] == ck / file_name(10)

    for resume_from, k, ck_out in (("auto", N // 2, ck),
                                   (str(ck / file_name(8)), 8, tmp_path / "ck_d")):
        rest = run(monkeypatch, base_env(data, tmp_path / "b", CHECKPOINT_DIR=str(ck_out),
                                         RESUME_FROM=resume_from, **board))
        assert rest == full[k:], (resume_from, rest, full[k:])  # bitwise: float == float
        final = ck_out / file_name(N)
        a, b = tensors(tmp_path / "ck_a" / file_name(N)), tensors(final)
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), name
        events = [json.loads(l.split(":::MLLOG ", 1)[1])
                  for l in (tmp_path / "b" / "log.txt").read_text().splitlines()]
        first_block = next(e for e in events if e["key"] == "block_start")
        assert first_block["metadata"]["samples_count"] == k * 8
        assert [e["value"] for e in events if e["key"] == "train_samples"] == [N * 8]
        # the log and the console say where the run goes on, and the log still passes
        source = ck / file_name(k)
        assert [(e["value"], e["metadata"]["step"], e["metadata"]["samples_count"])
                for e in events if e["key"] == "resumed"] == [(str(source), k, k * 8)]
        assert f"resuming from {source}: step {k}, {k * 8} samples trained" in \
            capsys.readouterr().err
        assert "SUCCESS" in checker(tmp_path / "b" / "log.txt").stderr
    joined = curves(tmp_path / "b" / "log.txt.tensorboard")
    assert [s for s, _ in joined["train/loss"]] == list(range(1, N + 1))
    for tag in ("train/loss", "train/lr", "eval/mlm_accuracy"):
        assert joined[tag] == uninterrupted[tag], tag


def test_a_checkpoint_of_the_previous_format_resumes_on_the_same_curve(tmp_path, monkeypatch,
                                                                       data):
    """Format 3 (the counters at the top level; a fingerprint without the settings marked since,
    LOADER_SPLIT and BALANCE, which then count with their defaults) resumes as today's does."""
    from bertperf.train.checkpoint import file_name
    ck, steps = tmp_path / "ck", "8"
    full = run(monkeypatch, base_env(data, tmp_path / "a", CHECKPOINT_DIR=str(ck),
                                     CHECKPOINT_EVERY="4", MAX_STEPS=steps))
    new = torch.load(ck / file_name(4), weights_only=True)
    old = {**{k: v for k, v in new.items() if k != "progress"}, **new["progress"],
           "format": "bertperf-checkpoint-3",
           "config": {k: v for k, v in new["config"].items()
                      if k not in ("LOADER_SPLIT", "BALANCE")}}
    torch.save(old, tmp_path / "old.pt")
    rest = run(monkeypatch, base_env(data, tmp_path / "b", MAX_STEPS=steps,
                                     RESUME_FROM=str(tmp_path / "old.pt")))
    assert len(full) == 8 and rest == full[4:]


def test_flat_lamb_trains_and_resumes_as_lamb(tmp_path, monkeypatch, data):
    """FLAT_LAMB=1 (FlatLamb) against FLAT_LAMB=0 (Lamb, the CPU default) over 6 steps of the
    real loop (dropout, GA 2, evals): with clipping off, the same losses and final checkpoint
    bit for bit, and a checkpoint of step 3 written with either resumes with the other, or
    itself, on that curve bit for bit; with clipping on (the global norm is summed in another
    order) the losses within 1e-6."""
    from bertperf.train import parallel
    from bertperf.train.checkpoint import file_name
    names = []
    real = parallel.make_optimizer
    monkeypatch.setattr(parallel, "make_optimizer", lambda name, *a, **k: names.append(name)
                        or real(name, *a, **k))
    steps = 6

    def env(out: str, flat: str, **extra: str) -> dict:
        return base_env(data, tmp_path / out, FLAT_LAMB=flat, MAX_STEPS=str(steps),
                        CHECKPOINT_DIR=str(tmp_path / out / "ck"), CHECKPOINT_EVERY="3",
                        **{"MAX_GRAD_NORM": "0", **extra})

    losses = {flat: run(monkeypatch, env(f"full{flat}", flat)) for flat in "01"}
    assert names == ["lamb", "flat_lamb"]
    assert len(losses["0"]) == steps and losses["0"] == losses["1"]
    final = tensors(tmp_path / "full0" / "ck" / file_name(steps))
    for out in ("full1", "resume10", "resume01", "resume11"):
        if out.startswith("resume"):
            saved, flat = out[-2:]
            rest = run(monkeypatch, env(out, flat, RESUME_FROM=str(
                tmp_path / f"full{saved}" / "ck" / file_name(3))))
            assert rest == losses["0"][3:], out
        got = tensors(tmp_path / out / "ck" / file_name(steps))
        assert got.keys() == final.keys() and all(torch.equal(got[k], final[k]) for k in got)
    clipped = [run(monkeypatch, env(f"clip{flat}", flat, MAX_GRAD_NORM="1")) for flat in "01"]
    assert clipped[0] != losses["0"]  # clipping changed the curve
    torch.testing.assert_close(clipped[1], clipped[0], rtol=1e-6, atol=0)


def cli(env: dict) -> subprocess.CompletedProcess:
    full = {**{k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")},
            **env, "PYTHONPATH": PYTHONPATH}
    return subprocess.run([sys.executable, "-m", "bertperf", "train"], env=full,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, data) -> Path:
    """A checkpoint after 2 steps of the tiny model (hidden size 32)."""
    root = tmp_path_factory.mktemp("saved")
    from bertperf import config
    from bertperf.train import loop
    env = base_env(data, root, CHECKPOINT_DIR=str(root / "ck"), MAX_SAMPLES_TERMINATION="16")
    assert loop.main(config.load(env)) == 0
    return root / "ck" / "ckpt_00000002.pt"


def test_wrong_shape_is_one_line_error_naming_the_file(tmp_path, data, saved):
    """Another model shape is told by the checkpoint's fingerprint (its BertConfig) before the
    run's log opens."""
    cfg = json.loads(Path(data["BERT_CONFIG"]).read_text())
    wider = tmp_path / "wider.json"
    wider.write_text(json.dumps({**cfg, "hidden_size": 48}))
    proc = cli(base_env({**data, "BERT_CONFIG": str(wider)}, tmp_path, RESUME_FROM=str(saved)))
    assert proc.returncode == 1
    lines = [l for l in proc.stderr.splitlines() if not l.startswith("warning: ")]
    assert lines == [f"bertperf: error: checkpoint {saved}: saved with model.hidden_size=32, this "
                     "run has 48; an exact resume needs the same settings"]
    assert not (tmp_path / "log.txt").exists()


def test_truncated_checkpoint_is_one_line_error(tmp_path, data, saved):
    cut = tmp_path / "cut.pt"
    blob = saved.read_bytes()
    cut.write_bytes(blob[:len(blob) // 2])
    proc = cli(base_env(data, tmp_path, RESUME_FROM=str(cut)))
    assert proc.returncode == 1
    lines = [l for l in proc.stderr.splitlines() if not l.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith(
        f"bertperf: error: checkpoint {cut}: damaged, cannot be read (truncated or corrupt: ")
    assert lines[0].endswith(")") and "If you are seeing this error" not in lines[0], lines[0]


def test_auto_resumes_from_the_newest_checkpoint_that_loads(tmp_path, monkeypatch, capsys,
                                                            data, saved):
    """RESUME_FROM=auto passes over a damaged newer checkpoint (a run killed while writing it,
    a disk that filled), says so once, and resumes from the newest one that loads; when none
    loads it is one line naming the folder and the newest."""
    from bertperf import config
    from bertperf.errors import UserError
    from bertperf.train import loop
    from bertperf.train.checkpoint import file_name
    ck = tmp_path / "ck"
    ck.mkdir()
    good = ck / file_name(2)
    good.write_bytes(saved.read_bytes())
    blob = saved.read_bytes()
    (ck / file_name(3)).write_bytes(blob[:len(blob) // 3])
    (ck / file_name(4)).write_bytes(b"not a checkpoint")
    capsys.readouterr()
    env = base_env(data, tmp_path / "out", CHECKPOINT_DIR=str(ck), RESUME_FROM="auto",
                   MAX_SAMPLES_TERMINATION="24")
    losses = run(monkeypatch, env)
    err = capsys.readouterr().err
    assert len(losses) == 1  # from step 2 (16 samples) to 24 samples
    said = [l for l in err.splitlines() if l.startswith("RESUME_FROM=auto: ")]
    assert len(said) == 1, err
    assert said[0].startswith(f"RESUME_FROM=auto: checkpoint {ck / file_name(4)}: cannot be "
                              "read (not a checkpoint of tensors: ")
    assert f"; checkpoint {ck / file_name(3)}: damaged, cannot be read" in said[0]
    assert said[0].endswith(f"; resuming from the newest checkpoint that loads, {good}")
    assert f"resuming from {good}: step 2, 16 samples trained" in err
    for name in (file_name(2), file_name(3)):
        (ck / name).write_bytes(b"damaged too")
    (ck / file_name(3)).unlink()
    with pytest.raises(UserError) as raised:
        loop.main(config.load(env))
    assert str(raised.value).startswith(f"RESUME_FROM=auto: none of the 2 checkpoints in {ck} "
                                        f"can be read (the newest: checkpoint {ck / file_name(4)}")


class FullDisk(io.FileIO):
    """A file on a disk with `room` bytes free: past them, writes fail as a full disk does."""

    room = 0

    def write(self, data) -> int:
        if len(data) > FullDisk.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        FullDisk.room -= len(data)
        return super().write(data)


def test_a_full_checkpoint_folder_stops_with_one_line_and_keeps_the_last(tmp_path, monkeypatch,
                                                                         data, saved):
    """The disk fills while the second checkpoint is written: one line naming the file, its
    folder and the cause (not torch's "unexpected pos"), no temporary left, and the first
    checkpoint still resumes."""
    from bertperf import config
    from bertperf.errors import UserError
    from bertperf.train import checkpoint, loop
    from bertperf.train.checkpoint import file_name
    FullDisk.room = int(saved.stat().st_size * 1.5)  # one checkpoint fits, two do not
    monkeypatch.setattr(checkpoint, "open", lambda path, mode: FullDisk(path, "w"),
                        raising=False)
    ck = tmp_path / "ck"
    env = base_env(data, tmp_path / "a", CHECKPOINT_DIR=str(ck), CHECKPOINT_EVERY="2")
    with pytest.raises(UserError) as err:
        loop.main(config.load(env))
    assert str(err.value) == (f"checkpoint {ck / file_name(4)}: cannot write: no space left on "
                              f"device (in {ck}); nothing under that name changed")
    assert sorted(p.name for p in ck.iterdir()) == [file_name(2)]
    monkeypatch.undo()
    log = (tmp_path / "a" / "log.txt").read_text()
    assert '"status": "aborted"' in log
    rest = run(monkeypatch, base_env(data, tmp_path / "b", CHECKPOINT_DIR=str(ck),
                                     RESUME_FROM="auto", MAX_SAMPLES_TERMINATION="24"))
    assert len(rest) == 1


def test_other_settings_and_missing_file_are_errors(tmp_path, monkeypatch, capsys, data, saved):
    from bertperf import config
    from bertperf.errors import UserError
    from bertperf.train import loop
    from bertperf.train.checks import prepare
    with pytest.raises(UserError, match=r"saved with BATCHSIZE=4, this run has 8") as err:
        loop.main(config.load(base_env(data, tmp_path, BATCHSIZE="8", RESUME_FROM=str(saved))))
    assert str(saved) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError, match="does not exist"):
        config.load(base_env(data, tmp_path, RESUME_FROM=str(tmp_path / "none.pt")))
    with pytest.raises(UserError, match="RESUME_FROM=auto needs CHECKPOINT_DIR"):
        prepare(config.load(base_env(data, tmp_path, RESUME_FROM="auto")))
    # auto with an empty folder: a fresh start, and it says so
    capsys.readouterr()
    losses = run(monkeypatch, base_env(data, tmp_path / "o", CHECKPOINT_DIR=str(tmp_path / "e"),
                                       RESUME_FROM="auto", MAX_SAMPLES_TERMINATION="16"))
    assert len(losses) == 2
    assert f"RESUME_FROM=auto: no checkpoint in {tmp_path / 'e'}; starting from scratch" in \
        capsys.readouterr().err
    log = (tmp_path / "o" / "log.txt").read_text()
    assert '"key": "resumed"' not in log and log.count('"key": "run_start"') == 1



def test_checkpoints_are_refused_before_the_log_opens(tmp_path, data, saved):
    """What can be told of RESUME_FROM's and INIT_CHECKPOINT's file before the run's MLPerf log
    opens is told then: an earlier log at that path stays as it was, none is written beside it."""
    from bertperf import config
    from bertperf.errors import UserError
    from bertperf.train import loop
    earlier = tmp_path / "log.txt"
    earlier.write_text(":::MLLOG an earlier run's log\n")
    cut = tmp_path / "cut.pt"
    cut.write_bytes(saved.read_bytes()[:4000])
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    cases = [({"RESUME_FROM": str(cut)}, f"checkpoint {cut}: damaged, cannot be read"),
             ({"RESUME_FROM": str(saved), "BATCHSIZE": "8"},
              f"checkpoint {saved}: saved with BATCHSIZE=4, this run has 8"),
             ({"RESUME_FROM": str(saved), "LAYERWISE": "1:8,2"},
              f"checkpoint {saved}: made without LAYERWISE, which this run sets to '1:8,2'; unset "
              "it to resume"),
             ({"RESUME_FROM": str(saved), "MAX_SAMPLES_TERMINATION": "16"},
              f"checkpoint {saved}: the run already ended there (step 2, 16 samples)"),
             ({"INIT_CHECKPOINT": str(junk)}, f"init checkpoint {junk}: cannot be read"),
             ({"INIT_CHECKPOINT": str(cut)}, f"init checkpoint {cut}: damaged, cannot be read")]
    for change, message in cases:
        with pytest.raises(UserError) as err:
            loop.main(config.load(base_env(data, tmp_path, **change)))
        assert str(err.value).startswith(message), change
        assert earlier.read_text() == ":::MLLOG an earlier run's log\n", change
        assert sorted(p.name for p in tmp_path.glob("log.txt*")) == ["log.txt"], change


def test_a_problem_found_after_the_log_opens_ends_it_aborted(tmp_path, capsys, data, saved):
    """A checkpoint whose settings match but whose model misses a tensor is found only when the
    model loads it, after the log opened: the log ends with run_stop aborted, and the earlier
    log at that path is kept beside it, which the console says."""
    from bertperf import config
    from bertperf.errors import UserError
    from bertperf.train import loop
    state = torch.load(saved, weights_only=True)
    del state["model"]["cls.predictions.bias"]
    bad = tmp_path / "bad.pt"
    torch.save(state, bad)
    earlier = tmp_path / "log.txt"
    earlier.write_text(":::MLLOG an earlier run's log\n")
    with pytest.raises(UserError) as err:
        loop.main(config.load(base_env(data, tmp_path, RESUME_FROM=str(bad))))
    assert str(err.value) == f"checkpoint {bad}: has no tensor cls.predictions.bias (a different " \
                             "model?)"
    assert (tmp_path / "log.txt.1").read_text() == ":::MLLOG an earlier run's log\n"
    assert f"MLPerf log {earlier}: the earlier log there is kept as {earlier}.1" in \
        capsys.readouterr().err
    events = [json.loads(l.split(":::MLLOG ", 1)[1]) for l in earlier.read_text().splitlines()]
    assert events[1]["key"] == "init_start" and "run_start" not in [e["key"] for e in events]
    assert (events[-1]["key"], events[-1]["metadata"]["status"]) == ("run_stop", "aborted")



@pytest.mark.parametrize("when, stop", [("step", 8), ("eval", 4), ("checkpoint write", 4)])
def test_the_preemption_warning_checkpoints_and_the_run_resumes_on_the_same_curve(
        tmp_path, monkeypatch, capsys, data, when, stop):
    """SIGUSR1 (Slurm's warning before the time limit or a preemption): twice, after steps 5
    and 6; in the eval after step 3; or while step 4's checkpoint (CHECKPOINT_EVERY=4) is
    written. The run stops at the next step the ranks agree on (PREEMPT_CHECK_EVERY=4), with
    that step's checkpoint (one: not written again where CHECKPOINT_EVERY just wrote it),
    run_stop aborted and its reason, and exit status 75; RESUME_FROM=auto then finishes it on
    the uninterrupted run's curve, to the same model, in a new log (the earlier one kept)."""
    import signal

    from bertperf import config
    from bertperf.errors import PREEMPTED
    from bertperf.train import checkpoint, loop
    from bertperf.train.checkpoint import file_name
    full = run(monkeypatch, base_env(data, tmp_path / "a", CHECKPOINT_DIR=str(tmp_path / "ck_a")))

    ck, out = tmp_path / "ck", tmp_path / "b"
    env = base_env(data, out, CHECKPOINT_DIR=str(ck), CHECKPOINT_EVERY="4",
                   PREEMPT_CHECK_EVERY="4")
    losses: list[float] = []
    real_step, real_eval, real_save = loop.train_step, loop.mlm_accuracy, \
        checkpoint.Checkpointer.save

    def warn():
        os.kill(os.getpid(), signal.SIGUSR1)

    def step(trainer, micro):
        result = real_step(trainer, micro)
        losses.append(float(result))
        if when == "step" and len(losses) in (5, 6):
            warn()
        return result

    def evaluate(*args, **kwargs):
        if when == "eval":
            warn()
        return real_eval(*args, **kwargs)

    def save(self, path):
        if when == "checkpoint write":
            warn()
        return real_save(self, path)

    with monkeypatch.context() as m:
        m.setattr(loop, "train_step", step)
        m.setattr(loop, "mlm_accuracy", evaluate)
        m.setattr(checkpoint.Checkpointer, "save", save)
        assert loop.main(config.load(env)) == PREEMPTED
    assert losses == full[:stop]
    assert sorted(p.name for p in ck.iterdir()) == [file_name(s) for s in range(4, stop + 1, 4)]
    stops = [json.loads(line.split(":::MLLOG ", 1)[1])["metadata"]
             for line in (out / "log.txt").read_text().splitlines() if '"run_stop"' in line]
    assert [(m["status"], m["reason"]) for m in stops] == [
        ("aborted", f"preempted, checkpoint at step {stop}")]
    assert f"run_stop: aborted, preempted, checkpoint at step {stop}" in capsys.readouterr().err

    rest = run(monkeypatch, {**env, "RESUME_FROM": "auto"})
    assert rest == full[stop:]
    a, b = tensors(tmp_path / "ck_a" / file_name(N)), tensors(ck / file_name(N))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    kept = [p for p in out.iterdir() if p.name.startswith("log.txt.")]
    assert len(kept) == 1 and f"preempted, checkpoint at step {stop}" in kept[0].read_text()
    for log in (kept[0], out / "log.txt"):  # the preempted run's log too
        assert "SUCCESS" in checker(log).stderr, checker(log).stderr[-2000:]


@pytest.mark.parametrize("grace, after, stop", [("60", 5, 8), ("0.000001", 5, None),
                                                ("60", 2, None)])
def test_a_sigterm_with_grace_checkpoints_when_one_fits(tmp_path, monkeypatch, data, grace, after,
                                                        stop):
    """SIGTERM with no warning before it (a time limit's or a preemption's kill, CHECKPOINT_GRACE
    seconds before SIGKILL): after step 5, with a checkpoint measured at step 4 and 60 s of
    grace, it is taken as the warning (a checkpoint at step 8, exit 75); with too little grace,
    or before any checkpoint has been timed (step 2), the run ends as a failure, as without."""
    import signal

    from bertperf import config
    from bertperf.errors import PREEMPTED, UserError
    from bertperf.train import dist, loop
    from bertperf.train.checkpoint import file_name
    ck = tmp_path / "ck"
    env = base_env(data, tmp_path / "out", CHECKPOINT_DIR=str(ck), CHECKPOINT_EVERY="4",
                   PREEMPT_CHECK_EVERY="4", CHECKPOINT_GRACE=grace)
    real, steps = loop.train_step, []

    def step(trainer, micro):
        result = real(trainer, micro)
        steps.append(result)
        if len(steps) == after:
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(loop, "train_step", step)
    if stop is None:
        with pytest.raises(UserError, match="stopped by SIGTERM"):
            loop.main(config.load(env))
        assert len(steps) == after
    else:
        assert loop.main(config.load(env)) == PREEMPTED
        assert len(steps) == stop and (ck / file_name(stop)).is_file()
    # the signal was that run's: a later loop in this process (a test's) does not see it
    dist.raise_if_terminated()
    assert not dist.warned()
