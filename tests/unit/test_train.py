"""The trainer: accumulation, eval accuracy, schedule and MLPerf-log wiring, config (tiny model, CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertperf.formats.samples import Samples
from tests.support.copy_task import MSL, VOCAB, copy_task, env_for, make_dataset, packed_copy
from tests.support.scripts import LAUNCH_VARS


# ---- config ------------------------------------------------------------------------------------

def test_config_env_then_flags(tmp_path):
    from bertperf.config import load
    cfg = load(env_for(tmp_path, GRADIENT_STEPS="2", OPT_LAMB_BETA_1="0.6"),
               {"train.batch_size": "8", "optim.lr": "0.5"})
    assert (cfg.train.batch_size, cfg.train.gradient_steps, cfg.optim.lr, cfg.optim.beta1) == \
        (8, 2, 0.5, 0.6)
    assert cfg.optim.beta2 == 0.999 and cfg.optim.weight_decay == 0.01  # run_and_time defaults
    assert cfg.train.max_samples_termination == 14_000_000 and cfg.train.target_accuracy == 0.72
    assert cfg.rows_per_step == 16
    assert cfg.first_eval(16) == cfg.eval_interval(16) == 150_000


def test_reference_eval_interval():
    from bertperf.config import reference_eval_interval
    assert [reference_eval_interval(g) for g in (256, 448, 3072, 4608, 8192, 13888)] == \
        [150_000, 150_000, 175_000, 200_000, 225_000, 300_000]


@pytest.mark.parametrize("change, message", [
    ({"BATCHSIZE": ""}, "BATCHSIZE is required"),
    ({"EVAL_FILE": "/nonexistent/eval.hdf5"}, "/nonexistent/eval.hdf5"),
    ({"PRECISION": "fp8"}, "PRECISION must be one of"),
    ({"GRADIENT_STEPS": "x"}, "GRADIENT_STEPS='x' is not a valid int"),
    ({"LAYOUT": "rows"}, "LAYOUT must be one of varlen, packed"),
    ({"COMPILE": "tvm"}, "COMPILE must be one of"),
    ({"MASKED_LM_PROB": "0"}, "MASKED_LM_PROB must be in"),
    ({"FLAT_LAMB": "maybe"}, "FLAT_LAMB='maybe' is not a valid auto or yes/no value"),
    ({"LR": "-1"}, r"^LR must be > 0 \(0 would train nothing\), got -1.0$"),
    ({"LR": "0"}, r"^LR must be > 0 \(0 would train nothing\), got 0.0$"),
    ({"LR": "nan"}, "LR must be > 0"),
    ({"OPT_LAMB_BETA_1": "2"}, r"^OPT_LAMB_BETA_1 must be in \[0, 1\), got 2.0$"),
    ({"OPT_LAMB_BETA_2": "1"}, r"^OPT_LAMB_BETA_2 must be in \[0, 1\), got 1.0$"),
    ({"EPSILON": "-1"}, "^EPSILON must be > 0, got -1.0$"),
    ({"WEIGHT_DECAY_RATE": "-1"}, "^WEIGHT_DECAY_RATE must be >= 0, got -1.0$"),
    ({"MAX_GRAD_NORM": "-1"}, "MAX_GRAD_NORM must be >= 0"),
    ({"WARMUP_STEPS": "2.5"}, "WARMUP_STEPS must be a whole number of steps >= 0, got 2.5"),
    ({"WARMUP_PROPORTION": "1.5"}, r"WARMUP_PROPORTION must be in \[0, 1\]"),
    ({"INIT_LOSS_SCALE": "0"}, "INIT_LOSS_SCALE must be > 0"),
    ({"EVAL_ITER_SAMPLES": "0"}, "EVAL_ITER_SAMPLES must be at least 1 sample, got 0"),
    ({"MAX_SAMPLES_TERMINATION": "0"}, "MAX_SAMPLES_TERMINATION must be at least 1 sample"),
    ({"LOG_FREQ": "-1"}, "LOG_FREQ must be >= 0 steps"),
    ({"DEVICE": "gpu"}, "^DEVICE must be one of auto, cuda, cpu, not 'gpu'$"),
    ({"DIST_TIMEOUT": "0"}, "^DIST_TIMEOUT must be a number of seconds > 0, got 0.0$"),
    ({"DIST_TIMEOUT": "soon"}, "DIST_TIMEOUT='soon' is not a valid float"),
    ({"MASTER_PORT": "70000"}, "^MASTER_PORT must be a TCP port, 1-65535, got 70000$"),
    ({"SEED": "-1"}, r"^SEED must be in \[0, 2\*\*32 - 1\] \(what numpy's and torch's generators "
                     r"both take\), got -1$"),
    ({"SEED": str(2**32)}, r"^SEED must be in \[0, 2\*\*32 - 1\] .*, got 4294967296$"),
    ({"SEED": str(2**64 + 1)}, r"^SEED must be in \[0, 2\*\*32 - 1\]"),
])
def test_config_errors_are_one_line(tmp_path, change, message):
    from bertperf.config import load
    from bertperf.errors import UserError
    with pytest.raises(UserError, match=message) as err:
        load(env_for(tmp_path, **change))
    assert "\n" not in str(err.value)


def test_a_path_of_the_wrong_kind_is_said_so(tmp_path):
    """A setting naming a file where a folder is expected, or the reverse, says what the path is
    and what is expected (not "does not exist")."""
    from bertperf.config import load
    from bertperf.errors import UserError
    env = env_for(tmp_path)
    a_file = Path(env["EVAL_FILE"])
    for change, message in [
        ({"DATADIR_PHASE2": str(a_file)},
         f"training data folder {a_file} (DATADIR_PHASE2 / --train-dir) is a file, not a folder"),
        ({"EVAL_FILE": str(tmp_path)},
         f"eval file {tmp_path} (EVAL_FILE / --eval-file) is a folder, not a file"),
        ({"RESUME_FROM": str(tmp_path)},
         f"checkpoint {tmp_path} (RESUME_FROM / --resume-from) is a folder, not a file "
         "(RESUME_FROM=auto takes the newest checkpoint in CHECKPOINT_DIR)"),
    ]:
        with pytest.raises(UserError) as err:
            load({**env, **change})
        assert str(err.value) == message


def test_an_output_folder_that_is_a_file_is_named(tmp_path):
    """LOGDIR, MLLOG_FILE's folder or CHECKPOINT_DIR naming a file, or a path through one: one
    line naming the setting, from train.checks.prepare (so `train --check` too)."""
    from bertperf.config import load
    from bertperf.errors import UserError
    from bertperf.train.checks import prepare
    env = env_for(tmp_path)
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for change, message in [
        ({"LOGDIR": str(a_file)}, f"LOGDIR {a_file}: is a file, not a folder"),
        ({"MLLOG_FILE": str(a_file / "r.txt")},
         f"MLLOG_FILE {a_file / 'r.txt'}: cannot be written: {a_file} is a file, not a folder"),
        ({"CHECKPOINT_DIR": str(a_file / "ck")},
         f"CHECKPOINT_DIR {a_file / 'ck'}: cannot be made: {a_file} is a file"),
    ]:
        with pytest.raises(UserError) as err:
            prepare(load({**env, **change}))
        assert str(err.value) == message


def test_plot_never_replaces_a_file_that_is_not_its_png(tmp_path):
    """PLOT=1 draws into <MLPerf log>.png: an earlier PNG there is redrawn, any other file
    refused before the run."""
    from bertperf.config import load
    from bertperf.errors import UserError
    from bertperf.train.checks import prepare
    env = env_for(tmp_path, PLOT="1", MLLOG_FILE=str(tmp_path / "result.txt"))
    png = tmp_path / "result.txt.png"
    png.write_text("the user's notes")
    with pytest.raises(UserError) as err:
        prepare(load(env))
    assert str(err.value) == (f"PLOT=1's {png}: exists and is not a file plot wrote: name "
                              "another output")
    png.write_bytes(b"\x89PNG\r\n\x1a\n an earlier curve")
    prepare(load(env))


def test_a_read_only_checkpoint_dir_is_refused_before_the_run(tmp_path, small_disk):
    """CHECKPOINT_DIR on a read-only file system (its first checkpoint would come at the end of
    the run): refused before the data is read and before the MLPerf log opens."""
    from bertperf.config import load
    from bertperf.errors import UserError
    from bertperf.train import loop
    ro = small_disk("ro", 64, read_only=True)
    with pytest.raises(UserError) as err:
        loop.main(load(env_for(tmp_path, CHECKPOINT_DIR=str(ro / "ck"))))
    assert str(err.value) == (f"CHECKPOINT_DIR {ro / 'ck'}: cannot be made: {ro} is on a "
                              "read-only file system")
    assert not (tmp_path / "out").exists()


def test_the_plan_takes_the_lamb_flat_lamb_says(tmp_path):
    """FLAT_LAMB: auto (the default) takes FlatLamb where the kernels take their Triton path
    (CUDA tensors, Triton installed: not these CPU ones, unless the kernels assume CUDA); 1 and
    0 decide. SHARDED_LAMB takes the sharded one, which reduces the gradients itself. The plan
    sets its kernels on the model and on FlatLamb."""
    from bertperf.config import load
    from bertperf.kernels import Kernels, backend
    from bertperf.model import BertConfig, BertForPreTraining
    from bertperf.model.layers import UsesKernels
    from bertperf.optim import FlatLamb, Lamb, ShardedLamb
    from bertperf.train.dist import Dist
    from bertperf.train.parallel import parallelize
    env = env_for(tmp_path)
    assert load(env).optim.flat_lamb is None

    def plan(kernels=None, **extra: str):
        core = BertForPreTraining(BertConfig.named("tiny"))
        return parallelize(core, load({**env, **extra}), Dist(0, 1), torch.device("cpu"), None,
                           kernels=kernels)

    kinds = [type(plan(FLAT_LAMB=v).optimizer) for v in ("auto", "1", "0")]
    assert kinds == [Lamb, FlatLamb, Lamb]
    sharded = plan(SHARDED_LAMB="1")
    assert type(sharded.optimizer) is ShardedLamb and sharded.reduction.name == "reduce_scatter"
    assert sharded.model is sharded.core and sharded.max_grad_norm == 1.0
    cuda = Kernels(assume_cuda=True)
    auto = FlatLamb if backend.triton_installed() else Lamb
    assert [type(plan(cuda, FLAT_LAMB=v).optimizer) for v in ("auto", "1", "0")] == \
        [auto, FlatLamb, Lamb]
    flat = plan(cuda, FLAT_LAMB="1")
    assert flat.kernels is cuda and flat.optimizer.kernels is cuda
    assert {m.kernels for m in flat.core.modules() if isinstance(m, UsesKernels)} == {cuda}
    assert plan(FUSED_KERNELS="0").kernels == Kernels(False)


@pytest.mark.parametrize("change, message", [
    ({"LAYOUT": "packed"}, "LAYOUT=packed, but .* holds unpadded shards"),
    ({"COMPILE": "eager"}, "COMPILE and USE_CUDA_GRAPH need LAYOUT=packed"),
    ({"USE_CUDA_GRAPH": "1", "DEVICE": "cpu"}, "COMPILE and USE_CUDA_GRAPH need LAYOUT=packed"),
    ({"SHARDED_LAMB": "1", "FLAT_LAMB": "0"}, "SHARDED_LAMB=1 shards FlatLamb's flat buffer"),
    ({"SHARDED_LAMB": "1", "CLIP_BEFORE_ALLREDUCE": "1"}, "SHARDED_LAMB=1 replaces"),
])
def test_refused_combinations_are_one_line(tmp_path, change, message):
    """What the layout and the parallelism plan refuse, said by train.checks.prepare (which
    `train` and `train --check` run before anything is written)."""
    from bertperf.config import load
    from bertperf.errors import UserError
    from bertperf.train.checks import prepare
    with pytest.raises(UserError, match=message) as err:
        prepare(load(env_for(tmp_path, **change)))
    assert "\n" not in str(err.value)
    assert prepare(load(env_for(tmp_path / "again"))).data.layout == "varlen"


@pytest.mark.parametrize("change, message", [
    ({"USE_CUDA_GRAPH": "1", "DEVICE": "cpu"}, "^USE_CUDA_GRAPH=1 needs a CUDA device, not "
                                               "DEVICE=cpu$"),
    ({"USE_CUDA_GRAPH": "1", "COMPILE": "eager"}, "^USE_CUDA_GRAPH=1 replays inductor's code: "
                                                  r"COMPILE=eager cannot go with it \(use none"),
    ({"USE_CUDA_GRAPH": "1", "GRADIENT_STEPS": "2", "FLAT_LAMB": "0"},
     "^USE_CUDA_GRAPH=1 with GRADIENT_STEPS=2 accumulates gradients across graph replays"),
    ({"USE_CUDA_GRAPH": "1", "GRADIENT_STEPS": "2", "FUSED_KERNELS": "0"},
     "only FlatLamb's preallocated gradient buffer survives"),
])
def test_cuda_graphs_refused_on_packed_rows_too(tmp_path, change, message):
    """With the fixed shapes CUDA graphs need, what they still cannot go with."""
    from bertperf.config import load
    from bertperf.errors import UserError
    from bertperf.train.checks import prepare
    env = packed_copy(env_for(tmp_path), tmp_path / "packed")
    with pytest.raises(UserError, match=message):
        prepare(load({**env, **change}))


def test_nvidia_packed_files_are_named_for_conversion(tmp_path):
    from bertperf.data.synthetic import synthetic_packed
    from bertperf.config import load
    from bertperf.errors import UserError
    from bertperf.formats import nvidia
    from bertperf.formats.unpadded import read_shard
    from bertperf.train.layout import resolve
    env = env_for(tmp_path)
    train = Path(env["DATADIR_PHASE2"])
    for shard in sorted(train.glob("*.h5")):
        rows = synthetic_packed(read_shard(shard)[0], MSL)
        nvidia.write_packed(train / f"part_{shard.stem}", rows)
        shard.unlink()
    with pytest.raises(UserError, match="a nvidia-packed file; training reads unpadded shards "
                                        r"\(prep unpad\) or packed ones \(prep pack\)"):
        resolve(load(env))


def test_packed_layout_needs_the_global_batch_split(tmp_path):
    from bertperf.config import load
    from bertperf.errors import UserError
    from bertperf.train.checks import prepare
    from bertperf.train.layout import layout_of, resolve
    env = packed_copy(env_for(tmp_path), tmp_path / "packed")
    cfg = resolve(load(env))
    assert cfg.data.layout == "packed"
    assert layout_of(cfg).global_batch_size(cfg) == 2 * cfg.rows_per_step
    with pytest.raises(UserError, match="needs LOADER_SPLIT=global_batch"):
        prepare(load({**env, "LOADER_SPLIT": "shards"}))


@pytest.mark.parametrize("env, expected", [
    ({}, (0, 1, 0)),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, (3, 4, 1)),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "5", "SLURM_STEP_ID": "0"},
     (5, 8, 5)),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, (1, 2, 0)),
])
def test_dist_config_from_launchers(env, expected):
    from bertperf.config import DistConfig
    d = DistConfig.from_env({**env, "MASTER_PORT": "1234"})
    assert (d.rank, d.world_size, d.local_rank, d.master_port) == (*expected, 1234)


def test_train_help_lists_every_setting_with_its_variable_and_default():
    """`train --help` as a user reads it: every setting under its flag with a sentence about
    it, its variable and its default where it has one; and each flag the help shows sets that
    setting (the parser's destination is the field load() reads)."""
    import argparse
    import re
    import subprocess
    import sys

    from bertperf.config import doc, tunables
    from bertperf.train.cli import add_arguments, default_text
    out = subprocess.run([sys.executable, "-m", "bertperf", "train", "--help"],
                         capture_output=True, text=True, check=True).stdout
    helps = {}  # flag -> its help, whitespace removed (argparse wraps lines)
    for chunk in re.split(r"\n  (?=--)", out):
        flag, *rest = chunk.split(None, 1)
        helps[flag] = "".join("".join(rest).split())
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    listed = list(tunables())
    assert len(listed) > 50
    for section, f in listed:
        flag, env, default = "--" + f.name.replace("_", "-"), f.metadata["env"], \
            default_text(f.default)
        assert len(doc(f).split()) >= 3, f.name
        assert "".join(doc(f).split()) in helps[flag], f.name
        assert f"(env{env}" + (f";default{default})" if default else ")") in helps[flag], flag
        assert {k: v for k, v in vars(parser.parse_args([flag, "7"])).items() if k != "check"} \
            == {f"{section}.{f.name}": "7"}, flag


def test_dist_settings_have_flags_and_units_in_the_help():
    """The rendezvous settings are listed with their variables, defaults and units, and their
    flags win over the variables as every setting's do."""
    import subprocess
    import sys

    from bertperf.config import DistConfig
    out = subprocess.run([sys.executable, "-m", "bertperf", "train", "--help"],
                         capture_output=True, text=True, check=True).stdout
    flat = " ".join(out.split())
    assert ("--dist-timeout DIST_TIMEOUT Seconds a collective may wait for the other ranks "
            "before the job fails, naming the ranks gone silent. (env DIST_TIMEOUT; default "
            "1800.0)") in flat
    assert "--master-port MASTER_PORT TCP port of that store, 1-65535. (env MASTER_PORT; " \
        "default 29500)" in flat
    assert "--warmup-steps WARMUP_STEPS Linear warm-up, in optimizer steps" in flat
    assert "--max-samples-termination MAX_SAMPLES_TERMINATION The run aborts once this many " \
        "samples (sequences)" in flat
    env = {"DIST_TIMEOUT": "60", "MASTER_PORT": "1234"}
    assert (DistConfig.from_env(env).dist_timeout, DistConfig.from_env(env).master_port) == \
        (60.0, 1234)


@pytest.mark.parametrize("flags, port, timeout, every", [
    ([], 1234, 60, 5.0),
    (["--master-port", "4321", "--dist-timeout", "16"], 4321, 16, 2.0),
])
def test_the_dist_settings_are_what_the_process_group_gets(tmp_path, monkeypatch, flags, port,
                                                           timeout, every):
    """`train` as rank 1 of 2 (RANK/WORLD_SIZE as an srun script sets them): the process group
    joins the store at MASTER_PORT and lets a collective wait DIST_TIMEOUT seconds, and the
    heartbeat that names silent ranks beats every eighth of it (5 s at most); --master-port and
    --dist-timeout win over the variables there. (Flags over variables for every setting, in the
    loaded config: test_config_env_then_flags.)"""
    import datetime

    from bertperf.__main__ import main
    from bertperf.train import dist, loop
    for key in LAUNCH_VARS:
        monkeypatch.delenv(key, raising=False)
    env = env_for(tmp_path, DIST_TIMEOUT="60", MASTER_PORT="1234", RANK="1", WORLD_SIZE="2",
                  MASTER_ADDR="10.1.2.3")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    joined, beats = [], []
    monkeypatch.setattr(dist.tdist, "init_process_group", lambda **kw: joined.append(kw))
    monkeypatch.setattr(dist._heartbeat, "start", lambda *args, every: beats.append((*args, every)))
    # the run, up to where its setup joins the job (loop.setup calls dist.init the same way)
    monkeypatch.setattr(loop, "main", lambda cfg: dist.init(cfg.dist, torch.device("cpu")) and 0)
    assert main(["train", *flags]) == 0
    assert joined == [{"backend": "gloo", "init_method": f"tcp://10.1.2.3:{port}", "rank": 1,
                       "world_size": 2, "timeout": datetime.timedelta(seconds=timeout)}]
    assert beats == [(1, 2, every)]


def test_a_grad_comm_modes_setting_without_the_mode_draws_a_warning(tmp_path):
    """POWERSGD_RANK or LOCALSGD_PERIOD changed while GRAD_COMM is a mode that does not read
    it: one warning naming the setting and the modes that read it; at its default, or with its
    mode, none."""
    from bertperf.config import load
    from bertperf.train import checks
    env = env_for(tmp_path, EVAL_ITER_SAMPLES="200", SUBMISSION_DIVISION="open")
    warned = checks.run_warnings(checks.prepare(load({**env, "POWERSGD_RANK": "8",
                                                      "LOCALSGD_PERIOD": "2"})))
    assert warned == [
        "LOCALSGD_PERIOD=2 with GRAD_COMM=allreduce: only localsgd read it, so it has no effect",
        "POWERSGD_RANK=8 with GRAD_COMM=allreduce: only powersgd, powersgd_bf16 read it, so it "
        "has no effect"]
    with_mode = {**env, "POWERSGD_RANK": "8", "GRAD_COMM": "powersgd", "WORLD_SIZE": "2"}
    assert not any("POWERSGD_RANK" in w for w in checks.run_warnings(checks.prepare(load(
        with_mode))))


def test_settings_that_run_badly_draw_a_warning(tmp_path, monkeypatch):
    """LR above 1 (a diverging run), and bf16/fp16 on a CPU that emulates those matmuls (the
    slowdown measured there); fp32, and a CPU that has the instructions, draw none."""
    from bertperf.config import load
    from bertperf.train import checks

    def load(env, load=load):
        return checks.prepare(load(env))

    env = env_for(tmp_path, EVAL_ITER_SAMPLES="200")  # 50 steps of 4: an eval at the last
    assert checks.run_warnings(load({**env, "LR": "1e9"})) == [
        "LR=1e+09 is above 1: LAMB moves every tensor by LR times its own norm a step, so this "
        "run will diverge (MLPerf's recipes use 1e-4 to 4e-3)"]
    measured = []
    monkeypatch.setattr(checks, "matmul_slowdown", lambda dtype: measured.append(dtype) or 31.4)
    bf16 = load({**env, "PRECISION": "bf16", "DEVICE": "cpu"})
    assert checks.run_warnings(bf16) == [
        "PRECISION=bf16 on this CPU: its bf16 matmuls measured 31x slower than fp32's (no "
        "instructions for them; emulated), so this run will be several times slower than in "
        "fp32 (PRECISION=fp32)"]
    assert measured == [torch.bfloat16]
    assert checks.run_warnings(load({**env, "DEVICE": "cpu"})) == []
    monkeypatch.setattr(checks, "matmul_slowdown", lambda dtype: 0.6)
    assert checks.run_warnings(load({**env, "PRECISION": "fp16", "DEVICE": "cpu"})) == []


def test_misspelt_variables_and_lone_layerwise_options_draw_a_hint(tmp_path, monkeypatch,
                                                                   capsys):
    """A variable named like a setting but none (difflib), and LAYERWISE's options without
    LAYERWISE: one warning line each, from `train` and `train --check`, also before an error they
    may explain. Warnings, not errors: a shell carries other programs' variables and earlier
    runs' ones (LAYERWISE unset for a baseline, its options still exported), and a misspelling
    of an optional setting leaves a valid run. Settings' own names, empty variables and the
    launchers' and shells' variables draw none."""
    from bertperf.__main__ import main
    from bertperf.config import environment_warnings
    env = env_for(tmp_path)
    assert environment_warnings({**env, "BATCHSZIE": "8", "GRAD_COMMS": "bf16",
                                 "LAYERWIZE": "1:8,2"}) == [
        "BATCHSZIE is not a setting; did you mean BATCHSIZE?",
        "GRAD_COMMS is not a setting; did you mean GRAD_COMM?",
        "LAYERWIZE is not a setting; did you mean LAYERWISE?"]
    assert environment_warnings({
        **env, "EVAL_BATCHSIZE": "8", "BATCHSZIE": "", "RANK": "0", "WORLD_SIZE": "1",
        "LOCAL_RANK": "0", "SLURM_PROCID": "0", "OMPI_COMM_WORLD_SIZE": "1",
        "OMP_NUM_THREADS": "1", "DGXNGPU": "2", "PATH": "/bin", "LAYERWISE": "1:8,2",
        "LAYERWISE_TRAIN": "new"}) == []
    assert environment_warnings({**env, "LAYERWISE_TRAIN": "new"},
                                {"layerwise.layerwise_init": "fresh"}) == [
        "LAYERWISE_INIT, LAYERWISE_TRAIN without LAYERWISE: ignored (the whole model trains from "
        "the first step)"]
    for key, value in {**env, "BATCHSIZE": "", "BATCHSZIE": "4",
                       "MLLOG_FILE": str(tmp_path / "log.txt")}.items():
        monkeypatch.setenv(key, value)
    assert main(["train", "--check"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "warning: BATCHSZIE is not a setting; did you mean BATCHSIZE?",
        "bertperf: error: BATCHSIZE is required (environment variable or flag)"]
    monkeypatch.setenv("BATCHSIZE", "4")
    monkeypatch.setenv("LAYERWISE_INIT", "fresh")
    assert main(["train", "--check"]) == 0
    assert capsys.readouterr().err.splitlines()[:2] == [
        "warning: BATCHSZIE is not a setting; did you mean BATCHSIZE?",
        "warning: LAYERWISE_INIT without LAYERWISE: ignored (the whole model trains from the "
        "first step)"]


def test_matmul_slowdown_tells_an_emulating_cpu():
    """The probe agrees with the CPU's flags: x86 without avx512_bf16 or amx_bf16 emulates
    bf16 matmuls, far slower than fp32 (60x on the 2-core AVX2 EPYC the suite runs on)."""
    import platform

    from bertperf.train.checks import SLOW_PRECISION, matmul_slowdown
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the bf16 flags are read for x86 CPUs")
    flags = next(l for l in Path("/proc/cpuinfo").read_text().splitlines()
                 if l.startswith("flags")).split()
    has_bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
    assert (matmul_slowdown(torch.bfloat16) > SLOW_PRECISION) == (not has_bf16)


def test_a_run_that_ends_before_its_first_eval_draws_a_warning(tmp_path):
    """A warning, not an error: such runs are legal and made on purpose (the committed loss
    curve, a checkpoint test's first half, a timing run), but a run that logs no eval has no
    MLPerf result, and `--check` would otherwise promise an eval the run never reaches. It
    names the cap that ends the run first."""
    from bertperf.config import load
    from bertperf.train.checks import prepare, run_warnings
    env = env_for(tmp_path, EVAL_ITER_START_SAMPLES="320", EVAL_ITER_SAMPLES="320")
    assert run_warnings(prepare(load({**env, "MAX_SAMPLES_TERMINATION": "10"}))) == [
        "MAX_SAMPLES_TERMINATION=10 ends the run at step 3, after 12 samples, before its first "
        "eval at 320 (EVAL_ITER_START_SAMPLES, EVAL_ITER_SAMPLES): the run will log no eval, so "
        "no MLPerf result"]
    assert run_warnings(prepare(load(env))) == [
        "MAX_STEPS=50 ends the run at step 50, after 200 samples, before its first eval at 320 "
        "(EVAL_ITER_START_SAMPLES, EVAL_ITER_SAMPLES): the run will log no eval, so no MLPerf "
        "result"]
    assert run_warnings(prepare(load({**env, "EVAL_ITER_START_SAMPLES": "200"}))) == []


def test_settings_the_run_would_not_use_are_refused(tmp_path):
    """A warm-up that ends at or after MAX_STEPS (the LR never reaches its peak), and an eval set
    of another max_seq_length than the training shards (a padded file says its own; NVIDIA's
    variable-length one is read, and a longer sample tells): one line from `prepare`, before
    any log; the limits themselves pass."""
    from bertperf.config import load
    from bertperf.data.synthetic import synthetic_samples
    from bertperf.errors import UserError
    from bertperf.formats import nvidia
    from bertperf.formats.padded import write_samples
    from bertperf.train.checks import prepare
    env = env_for(tmp_path)
    model = Path(env["BERT_CONFIG"])  # positions for 32 tokens: the data's length decides
    model.write_text(json.dumps({**json.loads(model.read_text()), "max_position_embeddings": 32}))
    with pytest.raises(UserError) as err:
        prepare(load({**env, "WARMUP_STEPS": "100", "MAX_STEPS": "20"}))
    assert str(err.value) == (
        "the LR warm-up (WARMUP_STEPS=100, START_WARMUP_STEP=0, WARMUP_PROPORTION=0) ends at step "
        "100, not before MAX_STEPS=20: the LR would never reach its peak, LR=0.01")
    for warmup in ({"WARMUP_STEPS": "20"}, {"WARMUP_PROPORTION": "1"},
                   {"WARMUP_STEPS": "25", "START_WARMUP_STEP": "-5"}):
        with pytest.raises(UserError, match="ends at step 20, not before MAX_STEPS=20"):
            prepare(load({**env, "MAX_STEPS": "20", **warmup}))
    prepare(load({**env, "WARMUP_STEPS": "19", "MAX_STEPS": "20"}))

    samples = copy_task(8, seed=3)
    write_samples(tmp_path / "eval32.hdf5", samples, np.arange(8), 2 * MSL, 4, VOCAB)
    with pytest.raises(UserError) as err:
        prepare(load({**env, "EVAL_FILE": str(tmp_path / "eval32.hdf5")}))
    train = Path(env["DATADIR_PHASE2"])
    assert str(err.value) == (
        f"EVAL_FILE {tmp_path / 'eval32.hdf5'} has max_seq_length 32, but the training shards' "
        f"is 16 ({train / 'part_0.h5'}): make both with one max_seq_length")
    nvidia.write_varlen(tmp_path / "nvidia.hdf5", samples)
    prepare(load({**env, "EVAL_FILE": str(tmp_path / "nvidia.hdf5")}))
    nvidia.write_varlen(tmp_path / "nvidia32.hdf5", synthetic_samples(8, 3, 2 * MSL, 4, VOCAB))
    with pytest.raises(UserError, match=r"nvidia32.hdf5 holds sequences of 32 tokens, but the "
                                        r"training shards' max_seq_length is 16 "):
        prepare(load({**env, "EVAL_FILE": str(tmp_path / "nvidia32.hdf5")}))


@pytest.mark.parametrize("change, message", [
    ({"LR": "-1"}, "LR must be > 0"),
    ({"SEED": "-1"}, "SEED must be in [0, 2**32 - 1]"),
    ({"OPT_LAMB_BETA_1": "2"}, "OPT_LAMB_BETA_1 must be in [0, 1)"),
    ({"DEVICE": "cuda"}, "DEVICE=cuda needs a CUDA device, and torch "),
])
def test_settings_that_crashed_every_rank_stop_before_any_log(tmp_path, monkeypatch, capsys,
                                                              change, message):
    """The settings `--check` passed and then every rank crashed on: one line from `train` and
    from `train --check`, exit 1, and no MLPerf log written."""
    from bertperf.__main__ import main
    if "DEVICE" in change and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    env = {**env_for(tmp_path, **change), "MLLOG_FILE": str(tmp_path / "log.txt")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for args in ([], ["--check"]):
        assert main(["train", *args]) == 1
        err = capsys.readouterr().err
        assert err.splitlines() == [err.strip()] and err.startswith(f"bertperf: error: {message}")
    assert not (tmp_path / "log.txt").exists()


# ---- the step ----------------------------------------------------------------------------------

def trainer_for_step(ga: int, seed: int = 0):
    """The Step train_step uses, by hand: float64 tiny model, LAMB, schedule."""
    from dataclasses import replace

    from bertperf.config import RunConfig, TrainConfig
    from bertperf.model import BertConfig, BertForPreTraining
    from bertperf.optim import LinearWarmupPolyDecay, make_optimizer, param_groups
    from bertperf.train.dist import Dist
    from bertperf.train.loop import Step
    from bertperf.train.parallel import REDUCTIONS, Plan
    torch.manual_seed(seed)
    model = BertForPreTraining(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, intermediate_size=64,
                                          max_position_embeddings=MSL, hidden_dropout_prob=0.0,
                                          attention_probs_dropout_prob=0.0)).double()
    from bertperf.model import forward_loss
    opt = make_optimizer("lamb", param_groups(model, 0.01), lr=0.01)
    cfg = replace(RunConfig(), train=TrainConfig(batch_size=16 // ga, gradient_steps=ga))
    plan = Plan(REDUCTIONS["none"], model, model, opt, forward_loss, None)
    return Step(cfg, Dist(0, 1), torch.device("cpu"), plan, LinearWarmupPolyDecay(opt, 0, 10),
                None)


def batches_of(samples: Samples, size: int):
    """MicroBatches of `size` samples, as the loop's DeviceBatches hands them out."""
    from bertperf.data.collate import collate_varlen
    from bertperf.model import BatchCounts, UnpaddedBatch
    from bertperf.train.loop import MicroBatch
    for start in range(0, len(samples), size):
        arrays = {**collate_varlen(samples.take(np.arange(start, start + size))),
                  "global_sequences": size}
        host = BatchCounts.from_arrays(arrays)
        yield MicroBatch(UnpaddedBatch.from_arrays(arrays).inputs(),
                         torch.tensor([host.masked, host.sequences], dtype=torch.float64), host)


def test_accumulation_equals_one_big_batch():
    """4 micro-batches of 4 == one batch of 16 (every sample has 4 masks, so the per-micro-batch
    mean losses average to the big batch's mean): same parameters after two steps, float64."""
    from bertperf.train.loop import train_step
    data = copy_task(32, seed=3)
    big, acc = trainer_for_step(1), trainer_for_step(4)
    losses = {}
    for trainer, size in ((big, 16), (acc, 4)):
        batches = batches_of(data, size)
        losses[size] = [float(train_step(trainer, [next(batches) for _ in range(16 // size)]))
                        for _ in range(2)]
    assert np.allclose(losses[16], losses[4], rtol=1e-12)
    for (name, p), q in zip(big.plan.core.named_parameters(), acc.plan.core.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)
    assert big.scheduler.last_epoch == 2


# ---- eval --------------------------------------------------------------------------------------

class ConstantPredictor(torch.nn.Module):
    """Predicts token `word` at every masked position."""

    def __init__(self, word: int):
        super().__init__()
        self.word = word

    def forward(self, masked_lm_positions, **_):
        from types import SimpleNamespace
        logits = torch.zeros(len(masked_lm_positions), VOCAB)
        logits[:, self.word] = 1.0
        return SimpleNamespace(mlm_logits=logits)


def test_mlm_counts_by_hand():
    from bertperf.train.evaluation import mlm_counts
    logits = torch.tensor([[0.0, 1, 0], [2, 0, 0], [0, 0, 3], [0, 5, 0]])
    assert mlm_counts(logits, torch.tensor([1, 0, 1, 2])).tolist() == [2.0, 4.0]


def test_eval_accuracy_over_the_whole_file_and_shards(tmp_path):
    import contextlib

    from bertperf.train.dist import Dist
    from bertperf.train.evaluation import load_eval_share, mlm_accuracy
    env = make_dataset(tmp_path)
    labels = copy_task(64, seed=2).mlm_ids
    word = int(np.bincount(labels).argmax())
    whole, total = load_eval_share(Path(env["EVAL_FILE"]), 0, 1)
    acc = mlm_accuracy(ConstantPredictor(word), whole, 10, Dist(0, 1), torch.device("cpu"),
                       contextlib.nullcontext)
    assert total == 64 and acc == pytest.approx(np.mean(labels == word))
    shares = [load_eval_share(Path(env["EVAL_FILE"]), r, 3)[0] for r in range(3)]
    assert sum(len(s) for s in shares) == 64
    assert sum(int((s.mlm_ids == word).sum()) for s in shares) == int((labels == word).sum())



def test_eval_reads_the_device_once(tmp_path, monkeypatch):
    """mlm_accuracy of a tiny BERT over the 64 eval samples in batches of 10 (7 batches): the
    counts stay on the device and the only host read of a tensor is the summed counts' tolist,
    once per eval; the accuracy is the one counted batch by batch on the host, and the model is
    back in training mode."""
    import contextlib

    from bertperf.model import BertConfig, BertForPreTraining
    from bertperf.train.dist import Dist
    from bertperf.train.evaluation import eval_batches, load_eval_share, mlm_accuracy
    env = make_dataset(tmp_path)
    samples, _ = load_eval_share(Path(env["EVAL_FILE"]), 0, 1)
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=32,
                                          max_position_embeddings=MSL)).eval()
    with torch.no_grad():
        hits = [(model(**b).mlm_logits.argmax(-1) == b["masked_lm_ids"]).numpy()
                for b in eval_batches(samples, 10, torch.device("cpu"))]
    expected = np.concatenate(hits).mean()
    reads = []
    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            reads.append(_name)
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    model.train()
    accuracies = [mlm_accuracy(model, samples, 10, Dist(0, 1), torch.device("cpu"),
                               contextlib.nullcontext) for _ in range(2)]
    assert reads == ["tolist", "tolist"]
    assert accuracies == [pytest.approx(expected)] * 2 and model.training


def test_eval_copies_are_pinned_and_asynchronous_on_cuda(tmp_path, monkeypatch):
    """For a CUDA device each eval batch is pinned and copied non_blocking (a copy from pageable
    memory waits for the device), on the CPU copied as it is; mlm_counts on (fake) CUDA tensors
    makes no host-to-device copy (its total is filled in on the device)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from bertperf.model import UnpaddedBatch
    from bertperf.train.evaluation import eval_batches, load_eval_share, mlm_counts
    samples, _ = load_eval_share(Path(make_dataset(tmp_path)["EVAL_FILE"]), 0, 1)
    calls = []
    monkeypatch.setattr(UnpaddedBatch, "pin_memory", lambda b: calls.append("pin") or b)
    monkeypatch.setattr(UnpaddedBatch, "to", lambda b, device, non_blocking=False:
                        calls.append((device.type, non_blocking)) or b)
    for device, per_batch in (("cuda", ["pin", ("cuda", True)]), ("cpu", [("cpu", False)])):
        calls.clear()
        assert len(list(eval_batches(samples, 10, torch.device(device)))) == 7
        assert calls == per_batch * 7

    copies = []

    class HostToDevice(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            if {t.device.type for t in tensors} == {"cpu", "cuda"}:
                copies.append(str(func))
            return out

    with FakeTensorMode():
        logits = torch.empty(7, VOCAB, device="cuda")
        labels = torch.empty(7, dtype=torch.int32, device="cuda")
        with HostToDevice():
            counts = mlm_counts(logits, labels)
    assert copies == [] and (counts.device.type, counts.dtype) == ("cuda", torch.float64)

# ---- init wiring -------------------------------------------------------------------------------

def test_setup_logs_hyperparameters_and_schedule(tmp_path):
    from bertperf.config import load
    from bertperf.mlperf.log import MLPerfLogger
    from bertperf.optim import lr_at
    from bertperf.train.checks import prepare
    from bertperf.train.loop import read_inputs, setup, train_step
    cfg = prepare(load(env_for(tmp_path, GRADIENT_STEPS="2", WARMUP_PROPORTION="0.1",
                               PREFETCH="0")))
    log_path = tmp_path / "log.txt"
    trainer = setup(read_inputs(cfg), MLPerfLogger(log_path, echo=False))
    lines = [json.loads(l.split(":::MLLOG ", 1)[1]) for l in log_path.read_text().splitlines()]
    values = {l["key"]: l["value"] for l in lines}
    assert values["global_batch_size"] == 8 and values["gradient_accumulation_steps"] == 2
    assert values["opt_learning_rate_warmup_steps"] == 5 and values["eval_samples"] == 64
    assert values["opt_base_learning_rate"] == 0.01 and values["max_sequence_length"] == MSL
    batches = trainer.batches
    for k in range(3):
        assert float(trainer.plan.optimizer.param_groups[0]["lr"]) == \
            pytest.approx(lr_at(k + 1, 0.01, 5, 50))
        train_step(trainer, [next(batches) for _ in range(2)])
    assert batches.state_dict()["position"] == 3 * 2 * 4  # GA micro-batches of BATCHSIZE a step
    assert trainer.loader.position == 3 * 2 * 4 + 4  # and one micro-batch copied ahead



def test_a_skipped_step_leaves_the_lr_schedule_where_it_was(tmp_path):
    """A step whose gradient is not finite is skipped: no parameter moves and the schedule does
    not count it, so the next step has the LR the skipped one had."""
    from bertperf.config import load
    from bertperf.mlperf.log import MLPerfLogger
    from bertperf.optim import lr_at
    from bertperf.train.checks import prepare
    from bertperf.train.loop import read_inputs, setup, train_step
    cfg = prepare(load(env_for(tmp_path, WARMUP_STEPS="5", PREFETCH="0")))
    trainer = setup(read_inputs(cfg), MLPerfLogger(tmp_path / "log.txt", echo=False))
    optimizer, core = trainer.plan.optimizer, trainer.plan.core
    train_step(trainer, [next(trainer.batches)])
    before = [p.detach().clone() for p in core.parameters()]
    poison = next(core.parameters()).register_hook(lambda g: torch.full_like(g, float("nan")))
    train_step(trainer, [next(trainer.batches)])
    poison.remove()
    assert all(torch.equal(a, p) for a, p in zip(before, core.parameters()))
    assert trainer.scheduler.last_epoch == 1
    assert float(optimizer.param_groups[0]["lr"]) == pytest.approx(lr_at(2, 0.01, 5, 50))
    train_step(trainer, [next(trainer.batches)])
    assert trainer.scheduler.last_epoch == 2

def test_dist_config_launchers_and_loader_split(tmp_path):
    from bertperf.config import DistConfig, load
    from bertperf.errors import UserError
    torchrun = DistConfig.from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                                    "TORCHELASTIC_RUN_ID": "none", "MASTER_PORT": "29555"})
    assert (torchrun.rank, torchrun.world_size, torchrun.launcher_store) == (1, 2, True)
    srun = DistConfig.from_env({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
                                "SLURM_STEP_ID": "0", "MASTER_ADDR": "node0",
                                "DIST_TIMEOUT": "30"})
    assert (srun.rank, srun.world_size, srun.local_rank, srun.master_addr, srun.dist_timeout,
            srun.launcher_store) == (3, 4, 1, "node0", 30.0, False)
    mpi = DistConfig.from_env({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"})
    assert (mpi.rank, mpi.world_size, mpi.launcher_store) == (0, 2, False)
    env = env_for(tmp_path)
    assert load(env).data.loader_split == "global_batch"
    assert load({**env, "LOADER_SPLIT": "shards"}).data.loader_split == "shards"
    with pytest.raises(UserError, match="LOADER_SPLIT"):
        load({**env, "LOADER_SPLIT": "rows"})


def test_tf32_on_cuda_only():
    """fp32 matmuls run in TF32 on a CUDA device; the CPU's settings are left alone."""
    from bertperf.train.loop import use_tf32
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = matmul.allow_tf32, cudnn.allow_tf32
    try:
        matmul.allow_tf32 = cudnn.allow_tf32 = False
        use_tf32(torch.device("cpu"))
        assert not matmul.allow_tf32 and not cudnn.allow_tf32
        use_tf32(torch.device("cuda", 0))
        assert matmul.allow_tf32 and cudnn.allow_tf32
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before


def test_step_lines_say_the_share_done_and_an_eta():
    """A progress line's tail: the share of the steps to the run's cap and the time left at the
    interval's measured seconds a step (evals not counted)."""
    from bertperf.train.loop import eta
    assert eta(30, 120, 2.0) == "25.0% of 120 steps, ETA 0:03:00"
    assert eta(1, 4000, 3.6) == "0.0% of 4000 steps, ETA 3:59:56"
    assert eta(120, 120, 2.0).endswith("ETA 0:00:00")
