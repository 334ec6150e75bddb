"""What a run may combine (bertperf.train.allowed): every row of REFUSED fires on its own case,
first; the values a setting takes alone (config.py's `choices`); the owners' tables keyed by
config's names."""

from __future__ import annotations

import pytest

from bertperf.errors import UserError
from tests.support.copy_task import env_for, packed_copy

OPEN = {"SUBMISSION_DIVISION": "open"}
PACKED = {"packed": "1"}  # marks a case run on the packed copy of the data

# row name -> (settings, facts a row reads stood in for this machine's, a variable its line names)
CASES = {
    "checkpoint_every_without_dir": ({"CHECKPOINT_EVERY": "10"}, {}, "CHECKPOINT_DIR"),
    "resume_auto_without_dir": ({"RESUME_FROM": "auto"}, {}, "CHECKPOINT_DIR"),
    "grad_comm_outside_open": ({"GRAD_COMM": "powersgd"}, {}, "GRAD_COMM"),
    "target_in_closed": ({"TARGET_MLM_ACCURACY": "0.5"}, {}, "TARGET_MLM_ACCURACY"),
    "layerwise_new_stage_adds_none": (
        {**OPEN, "LAYERWISE": "1:8,1:8,2", "LAYERWISE_TRAIN": "new"}, {}, "LAYERWISE"),
    "layerwise_outside_open": ({"LAYERWISE": "1:8,2"}, {}, "SUBMISSION_DIVISION"),
    "layout_not_in_folder": ({"LAYOUT": "packed"}, {}, "LAYOUT"),
    "layout_needs_global_batch_split": ({**PACKED, "LOADER_SPLIT": "shards"}, {},
                                        "LOADER_SPLIT"),
    "sharded_lamb_without_flat_lamb": ({"SHARDED_LAMB": "1", "FLAT_LAMB": "0"}, {}, "FLAT_LAMB"),
    "sharded_lamb_with_bucket_clip": ({"SHARDED_LAMB": "1", "CLIP_BEFORE_ALLREDUCE": "1"}, {},
                                      "CLIP_BEFORE_ALLREDUCE"),
    "compile_without_fixed_shapes": ({"COMPILE": "eager"}, {}, "COMPILE"),
    "cuda_graph_without_inductor": ({**PACKED, "USE_CUDA_GRAPH": "1", "COMPILE": "eager"}, {},
                                    "COMPILE"),
    "cuda_graph_on_cpu": ({**PACKED, "USE_CUDA_GRAPH": "1", "DEVICE": "cpu"}, {}, "DEVICE"),
    "fp8_without_bf16": ({"FP8": "emulate"}, {}, "PRECISION"),
    "cuda_graph_accumulating_per_tensor": (
        {**PACKED, "USE_CUDA_GRAPH": "1", "GRADIENT_STEPS": "2", "FLAT_LAMB": "0"}, {},
        "GRADIENT_STEPS"),
    "grad_comm_with_sharded_lamb": ({**OPEN, "GRAD_COMM": "bf16", "SHARDED_LAMB": "1"}, {},
                                    "SHARDED_LAMB"),
    "grad_comm_with_bucket_clip": ({**OPEN, "GRAD_COMM": "fp16", "CLIP_BEFORE_ALLREDUCE": "1"},
                                   {}, "CLIP_BEFORE_ALLREDUCE"),
    "stateful_grad_comm_with_layerwise": ({**OPEN, "GRAD_COMM": "localsgd",
                                           "LAYERWISE": "1:8,2"}, {}, "LAYERWISE"),
    "powersgd_with_fp16": ({**OPEN, "GRAD_COMM": "powersgd", "PRECISION": "fp16"}, {},
                           "PRECISION"),
    "powersgd_before_warmup_end": ({**OPEN, "GRAD_COMM": "powersgd", "WARMUP_STEPS": "10",
                                    "POWERSGD_START": "5"}, {}, "POWERSGD_START"),
    "localsgd_period_beyond_run": ({**OPEN, "GRAD_COMM": "localsgd", "LOCALSGD_PERIOD": "1000"},
                                   {}, "LOCALSGD_PERIOD"),
    "global_batch_without_rcp": ({"BERT_CONFIG": "large", "BATCHSIZE": "100000"}, {},
                                 "BATCHSIZE"),
    "warmup_past_max_steps": ({"WARMUP_STEPS": "50"}, {}, "WARMUP_STEPS"),
    "powersgd_rank_compresses_nothing": ({**OPEN, "GRAD_COMM": "powersgd",
                                          "POWERSGD_RANK": "100000"}, {}, "POWERSGD_RANK"),
    "layerwise_stages_outlast_run": ({**OPEN, "LAYERWISE": "1:1000000,2"}, {}, "MAX_STEPS"),
    "layerwise_last_not_whole_model": ({**OPEN, "LAYERWISE": "1:8,3"}, {}, "BERT_CONFIG"),
    "fp8_without_torchao": ({"FP8": "emulate", "PRECISION": "bf16"}, {"torchao": False}, "FP8"),
    "tensorboard_without_package": ({"TENSORBOARD": "1"}, {"tensorboard": False}, "TENSORBOARD"),
    "fp8_without_fp8_gpu": ({"FP8": "1", "PRECISION": "bf16"}, {"cuda": False}, "FP8=1"),
    "fused_kernels_on_cpu": ({"FUSED_KERNELS": "1", "DEVICE": "cpu"}, {}, "DEVICE=cpu"),
    "fused_kernels_without_triton": ({"FUSED_KERNELS": "1"}, {"triton": False}, "FUSED_KERNELS"),
    "cuda_without_device": ({"DEVICE": "cuda"}, {"cuda": False}, "DEVICE=cuda"),
    "rank_without_gpu": ({"DEVICE": "cuda"}, {"cuda": True, "gpus": 0}, "DEVICE=cuda"),
}


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    """The copy task's settings: on its unpadded shards, and on them packed."""
    root = tmp_path_factory.mktemp("allowed")
    env = env_for(root)
    return {"varlen": env, "packed": packed_copy(env, root / "packed")}


def facts_for(envs: dict, settings: dict, stand_ins: dict | None = None):
    from bertperf.config import load
    from bertperf.train.allowed import Facts
    from bertperf.train.layout import resolve
    settings = dict(settings)
    env = envs["packed" if settings.pop("packed", None) else "varlen"]
    facts = Facts(resolve(load({**env, **settings})))
    facts.__dict__.update(stand_ins or {})  # cached_property: what a row would have probed
    return facts


def test_every_row_has_a_case():
    from bertperf.train.allowed import REFUSED
    assert [row.name for row in REFUSED] == list(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_each_case_fires_its_row_first(envs, name):
    from bertperf.train.allowed import refusal
    settings, stand_ins, variable = CASES[name]
    facts = facts_for(envs, settings, stand_ins)
    row = refusal(facts)
    assert row is not None and row.name == name
    line = row.why(facts)
    assert variable in line and "\n" not in line


def test_a_plain_cpu_run_passes_and_probes_nothing(envs):
    """The copy task's defaults fire no row, and no row asked about CUDA, Triton, torchao or
    the model's shapes."""
    from bertperf.train.allowed import refusal
    facts = facts_for(envs, {})
    assert refusal(facts) is None
    assert not {"cuda", "gpus", "on_gpu", "triton", "torchao", "tensorboard", "fp8_problem",
                "compressing_rank"} & facts.__dict__.keys()


def test_check_says_the_first_row_that_fires(envs):
    """COMPILE on varlen batches and a warm-up past MAX_STEPS: the earlier row's line."""
    from bertperf.config import load
    from bertperf.train import allowed
    from bertperf.train.layout import resolve
    cfg = resolve(load({**envs["varlen"], "COMPILE": "eager", "WARMUP_STEPS": "50"}))
    with pytest.raises(UserError) as err:
        allowed.check(cfg)
    row = next(row for row in allowed.REFUSED if row.name == "compile_without_fixed_shapes")
    assert str(err.value) == row.why(allowed.Facts(cfg))


def test_cuda_graphs_accumulate_only_into_flat_lamb(envs, monkeypatch):
    """USE_CUDA_GRAPH with GRADIENT_STEPS > 1 takes FlatLamb's buffer: FLAT_LAMB=1, the sharded
    LAMB, or auto where FLAT_LAMB's auto rule takes FlatLamb on CUDA (FUSED_KERNELS not 0,
    Triton installed)."""
    from bertperf.kernels import backend
    from bertperf.train.allowed import refusal
    graphs = {**PACKED, "USE_CUDA_GRAPH": "1", "GRADIENT_STEPS": "2"}
    for extra, triton, fires in [({"FLAT_LAMB": "1"}, False, False),
                                 ({"SHARDED_LAMB": "1", "FUSED_KERNELS": "0"}, False, False),
                                 ({}, True, False), ({}, False, True),
                                 ({"FUSED_KERNELS": "0"}, True, True),
                                 ({"FLAT_LAMB": "0"}, True, True)]:
        monkeypatch.setattr(backend, "triton_installed", lambda t=triton: t)
        row = refusal(facts_for(envs, {**graphs, **extra}))
        assert (row is not None and row.name == "cuda_graph_accumulating_per_tensor") == fires, \
            (extra, triton)


def test_use_flat_lamb_is_flat_lambs_auto_rule(monkeypatch):
    from bertperf.kernels import backend
    from bertperf.optim import use_flat_lamb
    monkeypatch.setattr(backend, "triton_installed", lambda: True)
    assert use_flat_lamb(True, False, False) and not use_flat_lamb(False, True, True)
    assert use_flat_lamb(None, None, True) and use_flat_lamb(None, True, True)
    assert not use_flat_lamb(None, False, True) and not use_flat_lamb(None, None, False)
    monkeypatch.setattr(backend, "triton_installed", lambda: False)
    assert not use_flat_lamb(None, None, True) and use_flat_lamb(True, None, False)


def test_every_choice_is_checked_in_one_line(envs):
    """Each setting with `choices` refuses another value, naming its variable, every choice and
    the value."""
    from bertperf.config import load, section_fields
    with_choices = [f for _, f in section_fields() if f.metadata.get("choices")]
    assert {f.metadata["env"] for f in with_choices} >= {"LAYOUT", "GRAD_COMM", "DEVICE",
                                                        "LAYERWISE_TRAIN"}
    for f in with_choices:
        with pytest.raises(UserError) as err:
            load({**envs["varlen"], f.metadata["env"]: "bogus"})
        line = str(err.value)
        assert line.startswith(f"{f.metadata['env']} must be one of ") and "'bogus'" in line
        assert all(choice in line for choice in f.metadata["choices"])


def test_owners_tables_are_keyed_by_configs_names():
    from bertperf import config
    from bertperf.train import comm, layout
    assert tuple(layout.LAYOUTS) == config.LAYOUTS
    assert tuple(comm.MODES) == config.GRAD_COMMS


def test_a_mode_only_rounding_the_all_reduce_to_a_pre_approved_format_is_closed():
    """MLPerf's closed division pre-approves fp32, bf16 and fp16 (its rules' "Numerical
    formats"): the modes that only all-reduce in one of them run there; those that change the
    optimizer's arithmetic (PowerSGD's low rank and error feedback, local SGD's lone steps) are
    open-division methods."""
    from bertperf.train import comm
    assert {name for name, mode in comm.MODES.items() if mode.division == "closed"} == \
        {"allreduce", "bf16", "fp16"}
    assert all(mode.family == "allreduce" for mode in comm.MODES.values()
               if mode.division == "closed")


def test_stateful_modes_are_their_comm_classes():
    from bertperf.train import comm
    assert {name for name, mode in comm.MODES.items() if mode.stateful} == \
        {"powersgd", "powersgd_bf16", "localsgd"}
