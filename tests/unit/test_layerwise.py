"""Layerwise training (LAYERWISE, bertperf.train.layerwise) on one CPU rank: the settings' one-line
errors, what a stage trains (frozen layers absent from gradients, the optimizer and its flat
buffer; their forward keeps no graph), the stage events in a log that passes the compliance
checker, a resume in the middle of a stage and across a boundary (the same losses bit for bit),
and the packed layout compiled once per stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.copy_task import make_dataset
from tests.support.mlperf_logs import checker, events
from tests.support.packed import packed_env  # noqa: F401

N = 16  # steps; 8 samples a step, 64 training samples: 8 steps an epoch
DEPTH = 4


def deep_config(path: Path, layers: int = DEPTH, dropout: float = 0.1) -> Path:
    path.write_text(json.dumps({"vocab_size": 32, "hidden_size": 32, "num_hidden_layers": layers,
                                "num_attention_heads": 2, "intermediate_size": 64,
                                "max_position_embeddings": 16, "hidden_dropout_prob": dropout,
                                "attention_probs_dropout_prob": dropout}))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("lwdata")
    env = make_dataset(root / "data", n_train=64, n_eval=16)
    env["BERT_CONFIG"] = str(deep_config(root / "deep.json"))
    return env


def base_env(data: dict, out: Path, **extra: str) -> dict:
    return {**data, "BATCHSIZE": "4", "GRADIENT_STEPS": "2", "LR": "0.01", "MAX_STEPS": str(N),
            "WARMUP_PROPORTION": "0.2", "EVAL_ITER_SAMPLES": "24", "TARGET_MLM_ACCURACY": "0.99",
            "SUBMISSION_DIVISION": "open", "SEED": "3", "LOG_FREQ": "0", "LOGDIR": str(out),
            "MLLOG_FILE": str(out / "log.txt"), "LAYERWISE": "2:40,3:24,4",
            "DATA_VERIFY": "none", **extra}


def run(monkeypatch, env: dict, inspect=None) -> list[float]:
    """loop.main in this process: the per-step losses; `inspect(trainer)` after every step."""
    from bertperf import config
    from bertperf.train import loop
    losses: list[float] = []
    real = loop.train_step

    def recording(trainer, micro):
        result = real(trainer, micro)
        losses.append(float(result))
        if inspect is not None:
            inspect(trainer)
        return result

    monkeypatch.setattr(loop, "train_step", recording)
    assert loop.main(config.load(env)) == 0
    monkeypatch.setattr(loop, "train_step", real)
    return losses


@pytest.mark.parametrize("extra, message", [
    ({"LAYERWISE": "2,4"}, "LAYERWISE='2,4': stage 1 '2' is not LAYERS:SAMPLES[:all|new]"),
    ({"LAYERWISE": "2:x,4"}, "stage 1 '2:x' is not LAYERS:SAMPLES[:all|new]"),
    ({"LAYERWISE": "3:8,2:8,4"}, "stage 2 has fewer layers (2) than the one before (3)"),
    ({"LAYERWISE": "2:8,4:8"}, "stage 2 '4:8' is not LAYERS[:all|new]"),
    ({"LAYERWISE": "2:0,4"}, "needs at least 1 layer and 1 sample"),
    ({"LAYERWISE": "2:8,2:8,4", "LAYERWISE_TRAIN": "new"},
     "stage 2 trains only new layers and adds none (2 after 2); end it in :all"),
    ({"LAYERWISE_TRAIN": "some"}, "LAYERWISE_TRAIN must be one of all, new, not 'some'"),
    ({"LAYERWISE_INIT": "zero"}, "LAYERWISE_INIT must be one of copy, fresh, not 'zero'"),
    ({"LAYERWISE_OPTIMIZER": "x"}, "LAYERWISE_OPTIMIZER must be one of reset, copy, not 'x'"),
    ({"LAYERWISE_SCHEDULE": "x"}, "LAYERWISE_SCHEDULE must be one of continue, restart"),
    ({"SUBMISSION_DIVISION": "closed", "TARGET_MLM_ACCURACY": "0.72"},
     "LAYERWISE is an open-division method: set SUBMISSION_DIVISION=open (not closed)"),
    ({"LAYERWISE": "2:8,3"}, "LAYERWISE='2:8,3': the last stage must be the whole model, "
                             "BERT_CONFIG"),
])
def test_bad_settings_are_one_line_errors(tmp_path, data, extra, message):
    from bertperf import config
    from bertperf.errors import UserError
    from bertperf.train.checks import prepare
    with pytest.raises(UserError) as err:
        prepare(config.load(base_env(data, tmp_path, **extra)))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_stage_longer_than_the_run_is_refused(tmp_path, data):
    """Stages before the last that outlast MAX_STEPS leave the whole model untrained: refused
    (an error, not a warning: the last stage must be the whole model, and MAX_STEPS, unlike
    MAX_SAMPLES_TERMINATION, cannot grow on a resume). 16 steps of 8: the last stage begins at
    the step after its samples, so 120 samples before it still give it step 16."""
    from bertperf import config
    from bertperf.errors import UserError
    from bertperf.train.checks import prepare
    with pytest.raises(UserError) as err:
        prepare(config.load(base_env(data, tmp_path, LAYERWISE="1:1000000,4")))
    assert str(err.value) == (
        "LAYERWISE='1:1000000,4': the stages before the last take 1000000 samples, but "
        "MAX_STEPS=16 steps of 8 end the run before the last stage, the whole model, trains a "
        "step (at most 120 samples before it)")
    with pytest.raises(UserError, match="the stages before the last take 121 samples"):
        prepare(config.load(base_env(data, tmp_path, LAYERWISE="2:100,3:21,4")))
    prepare(config.load(base_env(data, tmp_path, LAYERWISE="2:100,3:20,4")))
    # a run stopped early by MAX_SAMPLES_TERMINATION (to be resumed) may end inside a stage
    prepare(config.load(base_env(data, tmp_path, MAX_SAMPLES_TERMINATION="8")))


def test_copy_sources_stack_the_top_layers():
    from bertperf.train.layerwise import copy_sources
    assert copy_sources(3, 6) == {3: 0, 4: 1, 5: 2}
    assert copy_sources(6, 12) == {6: 0, 7: 1, 8: 2, 9: 3, 10: 4, 11: 5}
    assert copy_sources(6, 9) == {6: 3, 7: 4, 8: 5}
    assert copy_sources(2, 7) == {2: 0, 3: 1, 4: 0, 5: 1, 6: 0}
    assert copy_sources(4, 4) == {}


def by_name(optimizer) -> dict[str, dict]:
    """An optimizer's state by parameter name (Lamb's state_dict format)."""
    state = optimizer.state_dict()
    return {name: state["state"][i] for g in state["param_groups"]
            for i, name in zip(g["params"], g["param_names"]) if i in state["state"]}


def test_mslt_trains_only_new_layers_and_logs_its_stages(tmp_path, monkeypatch, data):
    """LAYERWISE_TRAIN=new, LAYERWISE_EMBEDDINGS=frozen: after each boundary the embeddings and
    the old layers have no gradient, are not in the optimizer (nor in FlatLamb's flat buffer)
    and their outputs carry no autograd graph; a new layer is a copy of the top one, its
    moments its source's; the checkpoint parts are the stage's optimizer and schedule, the
    stage's part before the model; the log marks the three stages and passes the compliance
    checker."""
    from bertperf.train import layerwise
    seen, outputs, boundaries = [], {}, []
    real_enter = layerwise.Stages.enter

    def enter(stages, index, plan, scheduler, scaler, at_step):
        before = by_name(plan.optimizer)
        entered = real_enter(stages, index, plan, scheduler, scaler, at_step)
        layers = stages.core.bert.encoder.layer
        new, source = len(layers) - 1, len(layers) - 2
        prefix = "bert.encoder.layer."
        for (name, p), q in zip(layers[new].named_parameters(), layers[source].parameters()):
            assert torch.equal(p, q), name
        after = by_name(entered.plan.optimizer)
        for name in after:
            if name.startswith(f"{prefix}{new}."):
                src = name.replace(f"{prefix}{new}.", f"{prefix}{source}.")
                assert torch.equal(after[name]["exp_avg"], before[src]["exp_avg"]), name
                assert after[name]["exp_avg"].abs().sum() > 0
        boundaries.append(sorted(after) == sorted(
            n for n, p in stages.core.named_parameters() if p.requires_grad))
        return entered

    def inspect(trainer):
        core, opt = trainer.plan.core, trainer.plan.optimizer
        encoder = core.bert.encoder
        assert isinstance(encoder, layerwise.StagedEncoder)
        parts = trainer.checkpointer.parts()
        assert list(parts)[:3] == ["config", "layerwise", "model"]
        assert parts["optimizer"] is opt and parts["scheduler"] is trainer.scheduler
        if not outputs:
            for i, layer in enumerate(trainer.stages.spare):
                layer.register_forward_hook(
                    lambda m, args, out, i=i: outputs.__setitem__(i, out.requires_grad))
        trained = {n for n, p in core.named_parameters() if p.requires_grad}
        with_grad = {n for n, p in core.named_parameters() if p.grad is not None}
        in_opt = {n for g in opt.param_groups for n in g["param_names"]}
        numel = sum(p.numel() for p in core.parameters() if p.requires_grad)
        seen.append((len(encoder.layer), encoder.frozen, trained, in_opt, with_grad,
                     opt._weights.numel() == numel, dict(outputs)))
        outputs.clear()
        outputs[-1] = True

    monkeypatch.setattr(layerwise.Stages, "enter", enter)
    out = tmp_path / "out"
    losses = run(monkeypatch, base_env(data, out, LAYERWISE_TRAIN="new", FLAT_LAMB="1",
                                       LAYERWISE_OPTIMIZER="copy",
                                       LAYERWISE_EMBEDDINGS="frozen"), inspect)
    assert len(losses) == N and boundaries == [True, True]
    assert [(d, f) for d, f, *_ in seen] == [(2, 0)] * 5 + [(3, 2)] * 3 + [(4, 3)] * 8
    for step, (depth, frozen, trained, in_opt, with_grad, flat, graph) in enumerate(seen):
        assert in_opt == trained and with_grad <= trained and flat
        if step:  # the hooks are there from the second step
            assert graph == {-1: True, **{i: i >= frozen for i in range(depth)}}
        if frozen:
            assert not any(n.startswith("bert.embeddings.") for n in trained)
            assert not any(n.startswith(f"bert.encoder.layer.{i}.") for i in range(frozen)
                           for n in trained)
            assert all(any(n.startswith(f"bert.encoder.layer.{i}.") for n in trained)
                       for i in range(frozen, depth))
            assert {"cls.predictions.bias", "bert.pooler.dense.weight"} <= trained
        else:
            assert "bert.embeddings.word_embeddings.weight" in trained
    log = events(out / "log.txt")
    stages = [(e["value"], e["metadata"]["layers"], e["metadata"]["trained"],
               e["metadata"]["step"], e["metadata"]["samples_count"])
              for e in log if e["key"] == "layerwise_stage"]
    assert stages == [(1, 2, "all", 0, 0), (2, 3, "new", 5, 40), (3, 4, "new", 8, 64)]
    assert "SUCCESS" in checker(out / "log.txt").stderr


@pytest.mark.parametrize("options", [
    {"LAYERWISE_TRAIN": "new", "LAYERWISE_INIT": "copy", "LAYERWISE_OPTIMIZER": "copy",
     "LAYERWISE_SCHEDULE": "restart"},
    {"LAYERWISE_TRAIN": "all", "LAYERWISE_INIT": "fresh", "LAYERWISE_OPTIMIZER": "reset",
     "LAYERWISE_SCHEDULE": "continue"},
], ids=["mslt", "stacking"])
def test_resume_in_a_stage_and_across_boundaries_gives_the_same_losses(tmp_path, monkeypatch,
                                                                       data, options):
    """Checkpoints at steps 4 (stage 1; its boundary comes at step 5), 6 (in stage 2) and 8
    (stage 2 done, stage 3 begins at the next step): each resumes to the uninterrupted run's
    losses and final weights and moments, bit for bit (dropout on)."""
    from bertperf.train.checkpoint import file_name
    full = run(monkeypatch, base_env(data, tmp_path / "a", CHECKPOINT_DIR=str(tmp_path / "ck_a"),
                                     **options))
    assert len(full) == N and len(set(full)) == N
    ck = tmp_path / "ck_b"
    half = run(monkeypatch, base_env(data, tmp_path / "b", CHECKPOINT_DIR=str(ck),
                                     CHECKPOINT_EVERY="2", MAX_SAMPLES_TERMINATION="72",
                                     **options))
    assert half == full[:9]
    end = torch.load(tmp_path / "ck_a" / file_name(N), weights_only=True)
    assert end["layerwise"] == {"stage": 2, "began_at_step": 8}
    for k in (4, 6, 8):
        out = tmp_path / f"r{k}"
        rest = run(monkeypatch, base_env(data, out, CHECKPOINT_DIR=str(tmp_path / f"ck_{k}"),
                                         RESUME_FROM=str(ck / file_name(k)), **options))
        assert rest == full[k:], k  # bitwise: float == float
        again = torch.load(tmp_path / f"ck_{k}" / file_name(N), weights_only=True)
        for name, tensor in end["model"].items():
            assert torch.equal(tensor, again["model"][name]), name
        for i, state in end["optimizer"]["state"].items():
            for key, tensor in state.items():
                assert torch.equal(tensor, again["optimizer"]["state"][i][key]), (i, key)
        assert again["scheduler"] == end["scheduler"]
        assert "SUCCESS" in checker(out / "log.txt").stderr


def test_a_checkpoint_of_other_stages_is_refused_in_one_line(tmp_path, monkeypatch, data):
    from bertperf import config
    from bertperf.errors import UserError
    from bertperf.train import loop
    from bertperf.train.checkpoint import file_name
    run(monkeypatch, base_env(data, tmp_path / "a", CHECKPOINT_DIR=str(tmp_path / "ck"),
                              MAX_SAMPLES_TERMINATION="48"))  # 6 steps: stage 3 never reached
    env = base_env(data, tmp_path / "b", LAYERWISE="3:40,4",
                   RESUME_FROM=str(tmp_path / "ck" / file_name(6)))
    with pytest.raises(UserError) as err:
        loop.main(config.load(env))
    assert "saved with LAYERWISE='2:40,3:24,4', this run has '3:40,4'" in str(err.value)
    with pytest.raises(UserError) as err:  # the setting named, not the model's first tensor
        loop.main(config.load({**env, "LAYERWISE": ""}))
    assert str(err.value) == (f"checkpoint {tmp_path / 'ck' / file_name(6)}: made with "
                              "LAYERWISE='2:40,3:24,4', which this run leaves unset; set it to "
                              "resume")


def test_packed_compiled_run_compiles_once_per_stage(packed_env, tmp_path, monkeypatch):
    """LAYOUT=packed with COMPILE=aot_eager and MSLT: the step compiles once for each stage, all
    of them during init (the warm-up goes through every stage and back to the first), none in
    the run; the frozen layers run in the graph under no_grad."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    env = {**packed_env, "BERT_CONFIG": str(packed_deep(Path(packed_env["BERT_CONFIG"]),
                                                         tmp_path / "deep.json")),
           "COMPILE": "aot_eager", "MAX_STEPS": "8", "LOG_FREQ": "1", "LAYERWISE": "2:40,4",
           "LAYERWISE_TRAIN": "new", "MLLOG_FILE": str(tmp_path / "log.txt")}
    losses = run(monkeypatch, env, lambda trainer: graphs.append(
        (len(trainer.plan.core.bert.encoder.layer), counters["stats"]["unique_graphs"])))
    assert len(losses) == 2 * 3 + 8 and torch.isfinite(torch.tensor(losses)).all()
    warm, steps = graphs[:6], graphs[6:]  # the warm-up: 3 steps a stage
    assert [d for d, _ in warm] == [2, 2, 2, 4, 4, 4] and warm[0][1] < warm[3][1]
    depths = [d for d, _ in steps]
    assert depths[0] == 2 and depths[-1] == 4 and depths == sorted(depths)
    assert {g for _, g in steps} == {warm[-1][1]}  # nothing compiled after the warm-up


def packed_deep(config: Path, path: Path) -> Path:
    """tests.support.packed's tiny config with DEPTH layers."""
    path.write_text(json.dumps({**json.loads(config.read_text()), "num_hidden_layers": DEPTH}))
    return path


@pytest.fixture
def gloo_group(tmp_path):
    """A one-process gloo group (DDP and the sharded LAMB need one)."""
    import torch.distributed as tdist

    from bertperf.train.dist import Dist
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                             world_size=1)
    yield
    Dist(0, 1).close()


@pytest.mark.parametrize("reduction, embeddings", [("allreduce", "frozen"),
                                                    ("reduce_scatter", "frozen"),
                                                    ("allreduce", "trained")])
def test_frozen_layers_are_in_no_ddp_bucket_nor_sharded_state(tmp_path, monkeypatch, data,
                                                              gloo_group, reduction, embeddings):
    """Through DDP (forced on one gloo rank) every bucket the reducer all-reduces holds only the
    stage's trained parameters, and DDP's reducer holds only theirs (with
    LAYERWISE_EMBEDDINGS=trained too: the word embeddings get their gradient, from the head,
    every step); with SHARDED_LAMB=1 (reduce-scatter, no DDP) the sharded flat buffer holds only
    theirs too."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from bertperf.train import layerwise, loop, parallel
    monkeypatch.setattr(parallel, "reduction_for",
                        lambda cfg, world_size: parallel.REDUCTIONS[reduction])
    reduced, checked = [], []
    real_parallelize = parallel.parallelize

    def parallelize(core, *args, **kwargs):
        plan = real_parallelize(core, *args, **kwargs)
        names = {id(p): n for n, p in core.named_parameters()}

        def recording(state, bucket):
            reduced.append([names[id(p)] for p in bucket.parameters()])
            return allreduce_hook(state, bucket)
        if reduction == "allreduce":
            plan.model.register_comm_hook(None, recording)
        return plan

    def inspect(trainer):
        core, plan = trainer.plan.core, trainer.plan
        trained = {n for n, p in core.named_parameters() if p.requires_grad}
        if reduction == "allreduce":
            ddp = plan.model._get_ddp_logging_data()  # what DDP's reducer holds
            numel = sum(p.numel() for p in core.parameters() if p.requires_grad)
            assert ddp["num_parameter_tensors"] == len(trained)
            assert ddp["total_parameter_size_bytes"] == 4 * numel
            assert reduced and all(set(b) <= trained for b in reduced)
            assert set().union(*map(set, reduced)) == trained
            reduced.clear()
        else:
            assert type(plan.optimizer).__name__ == "ShardedLamb"
            assert plan.optimizer._layout.numel == sum(
                p.numel() for p in core.parameters() if p.requires_grad)
        checked.append(frozenset(trained))

    for module in (loop, layerwise):
        monkeypatch.setattr(module, "parallelize", parallelize)
    extra = {"SHARDED_LAMB": "1"} if reduction == "reduce_scatter" else {}
    losses = run(monkeypatch, base_env(data, tmp_path / "out", LAYERWISE_TRAIN="new",
                                       LAYERWISE_OPTIMIZER="copy",
                                       LAYERWISE_EMBEDDINGS=embeddings, **extra), inspect)
    assert len(losses) == N and len(set(checked)) == 3  # three stages, three trained sets


def test_trained_embeddings_learn_from_the_head_alone(tmp_path, monkeypatch, data):
    """LAYERWISE_EMBEDDINGS=trained: in the frozen stages the word embeddings (the MLM decoder's
    tied matrix) train and change every step; the position and segment embeddings, their
    LayerNorm and the frozen layers neither train nor change, and no autograd graph reaches the
    frozen layers."""
    frozen_names = tuple(f"bert.embeddings.{n}." for n in ("position_embeddings",
                                                         "token_type_embeddings", "LayerNorm"))
    seen, last = [], {}

    def inspect(trainer):
        core, encoder = trainer.plan.core, trainer.plan.core.bert.encoder
        params = dict(core.named_parameters())
        trained = {n for n, p in params.items() if p.requires_grad}
        now = {n: p.detach().clone() for n, p in params.items()}
        if encoder.frozen and last:
            below = [n for n in now if n.startswith(frozen_names) or any(
                n.startswith(f"bert.encoder.layer.{i}.") for i in range(encoder.frozen))]
            assert below and not trained & set(below)
            assert all(torch.equal(now[n], last[n]) for n in below)
            word = "bert.embeddings.word_embeddings.weight"
            assert word in trained and not torch.equal(now[word], last[word])
        seen.append(encoder.frozen)
        last.clear()
        last.update(now)

    run(monkeypatch, base_env(data, tmp_path / "out", LAYERWISE_TRAIN="new",
                              LAYERWISE_EMBEDDINGS="trained"), inspect)
    assert seen == [0] * 5 + [2] * 3 + [3] * 8


def test_layers_frozen_before_the_warmup_ends_draw_a_warning(tmp_path, data):
    """A stage that freezes the layers below it before the LR warm-up ends is legal but warned
    about, naming the stage, its step and the warm-up's end; after it, or stacking, is not."""
    from bertperf.config import load
    from bertperf.train.checks import prepare, run_warnings
    env = base_env(data, tmp_path, LAYERWISE_TRAIN="new", WARMUP_PROPORTION="0",
                   WARMUP_STEPS="6")  # the first boundary at step 5 (40 samples of 8)
    (line,) = [w for w in run_warnings(prepare(load(env))) if w.startswith("LAYERWISE=")]
    assert "stage 2" in line and "step 5" in line and "step 6" in line
    for later in ({**env, "WARMUP_STEPS": "4"}, {**env, "LAYERWISE_TRAIN": "all"}):
        assert not any(w.startswith("LAYERWISE=") for w in run_warnings(prepare(load(later))))


def test_frozen_embeddings_where_no_stage_trains_new_layers_alone_draw_a_warning(tmp_path, data):
    """LAYERWISE_EMBEDDINGS=frozen acts only in a stage that trains its new layers alone: with
    LAYERWISE_TRAIN=all and no stage ending in :new it is warned about; with one, it is not."""
    from bertperf.config import load
    from bertperf.train.checks import prepare, run_warnings
    env = base_env(data, tmp_path, LAYERWISE_TRAIN="all", LAYERWISE_EMBEDDINGS="frozen")
    (line,) = [w for w in run_warnings(prepare(load(env))) if "LAYERWISE_EMBEDDINGS" in w]
    assert line.startswith("LAYERWISE_EMBEDDINGS=frozen: no stage trains only its new layers")
    stages = env["LAYERWISE"].split(",")
    for trains_new in ({**env, "LAYERWISE_TRAIN": "new"},
                       {**env, "LAYERWISE": ",".join([*stages[:-1], stages[-1] + ":new"])}):
        assert not any("LAYERWISE_EMBEDDINGS" in w
                       for w in run_warnings(prepare(load(trains_new))))


def test_bench_schedules_are_valid_layerwise_settings():
    """`bench layerwise`'s staged runs parse, add layers and end with the whole model."""
    from bertperf.bench.layerwise import schedules
    from bertperf.config import layerwise_stages
    for layers in (3, 6, 12):
        for name, settings in schedules(layers, 100).items():
            if settings:
                stages = layerwise_stages(settings["LAYERWISE"])
                assert stages[-1][0] == layers and len(stages) >= 2, (name, stages)



def test_stage_modes_parse_with_spaces():
    """A stage's :new or :all is read as written, with spaces around it or not."""
    from bertperf.config import layerwise_stages
    assert layerwise_stages("3:1000, 6:1000: new,6 : all") == [
        (3, 1000, None), (6, 1000, "new"), (6, None, "all")]
