"""FP8 (bertperf.model.fp8: torchao's float8 training, "tensorwise" recipe) proved on the CPU with
torchao's emulation (FP8=emulate): the recipe's numerics against an fp32 emulation written here,
on one linear layer and on a converted encoder layer, forward and backward; the packed micro-step
compiled into one graph with no break (eager and aot_eager backends); no host sync in the steps;
a short run whose loss falls and whose checkpoint loads into a model without FP8; and the
refusals (PRECISION, no FP8 GPU)."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch
from torch import nn

from tests.support.packed import HostReads, packed_env, trainer_for  # noqa: F401
from tests.support.paths import ROOT
from tests.support.scripts import config_env

pytest.importorskip("torchao")

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
SYNCS = ("item", "tolist", "__bool__", "__float__", "__int__")


def quantized(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The recipe's dynamic tensorwise scaling, written out: scale = the format's max / the
    tensor's amax (now, not from a history), t * scale saturated and cast to `dtype`, and back
    to fp32 divided by the scale (the dequantized values an FP8 GEMM multiplies)."""
    amax = t.detach().abs().max().double().clamp(min=1e-12)
    scale = (torch.finfo(dtype).max / amax).float()
    bits = (t.float() * scale).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype)
    return bits.float() / scale


class EmulatedMatmul(torch.autograd.Function):
    """x @ W^T with E4M3 x and W forward; backward E5M2 for the output gradient, E4M3 for x and
    W (the hybrid format); every product in fp32 of the dequantized values."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return quantized(x, E4M3) @ quantized(weight, E4M3).t()

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g = quantized(grad, E5M2)
        return g @ quantized(weight, E4M3), g.t() @ quantized(x, E4M3)


class EmulatedLinear(nn.Linear):
    """The reference layer: what bertperf.model.layers.gemm asks (`gemm`: no bias) and a module
    call (with bias), through EmulatedMatmul."""

    def gemm(self, x):
        return EmulatedMatmul.apply(x, self.weight)

    def forward(self, x):
        return self.gemm(x) + self.bias


def test_recipe_is_e4m3_forward_e5m2_gradients_dynamic_tensorwise():
    from bertperf.model import fp8
    from torchao.float8.config import ScalingGranularity, ScalingType
    c = fp8.recipe(emulate=True)
    for cast, dtype in ((c.cast_config_input, E4M3), (c.cast_config_weight, E4M3),
                        (c.cast_config_grad_output, E5M2)):
        assert (cast.scaling_type, cast.scaling_granularity, cast.target_dtype) == \
            (ScalingType.DYNAMIC, ScalingGranularity.TENSORWISE, dtype)


def test_torchao_is_imported_without_its_known_messages_and_only_those():
    """Importing torchao printed, on every FP8 run and `bench train`, that two of its extensions
    (MX formats, sm_90a CUTLASS: kernels of other recipes) failed to load and torch's deprecation
    of how it registers its enums: dropped while fp8 imports it, in a fresh interpreter (this
    one has imported torchao already); any other message of those loggers still shows."""
    import subprocess
    import sys

    from tests.support.paths import PYTHONPATH
    code = ("import logging\nfrom bertperf.model import fp8\nfp8.recipe(emulate=True)\n"
            "fp8.linear_class()\nlogging.getLogger('torchao').warning('Failed to load other')\n"
            "logging.getLogger('torch.utils._pytree').warning('%s is an Enum subclass', 'later')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": PYTHONPATH}, check=True)
    lines = run.stderr.splitlines()
    assert lines[0] == "Failed to load other" and lines[1].endswith("later is an Enum subclass")
    assert len(lines) == 2, run.stderr


@pytest.mark.parametrize("bias", [True, False], ids=["module_call", "gemm"])
def test_one_linear_matches_the_fp32_emulation(bias):
    """Random x [300, 96] (a few outliers, so the scale matters) and W [160, 96]: torchao's
    emulated FP8 layer, through a module call (with bias) and through `gemm` (without), equals
    the emulation above within rtol 1e-5 / atol 1e-5 x the output's largest value, forward and
    both gradients; and it does quantize: 0.1 % to 10 % relative (Frobenius) off the plain fp32
    layer."""
    from bertperf.model import fp8
    from bertperf.model.layers import gemm
    torch.manual_seed(0)
    plain = nn.Linear(96, 160)
    x = torch.randn(300, 96) * 3
    x[5, 7], x[100, 3] = 40.0, -25.0
    grad = torch.randn(300, 160) * 1e-3
    outs = {}
    for name, layer in (("fp8", fp8.linear_class().from_float(copy.deepcopy(plain),
                                                                fp8.recipe(emulate=True))),
                        ("ref", EmulatedLinear(96, 160)), ("fp32", copy.deepcopy(plain))):
        if name == "ref":
            layer.load_state_dict(plain.state_dict())
        xi = x.clone().requires_grad_()
        y = layer(xi) if bias else gemm(xi, layer)
        y.backward(grad)
        outs[name] = (y.detach(), xi.grad, layer.weight.grad)
    for got, want in zip(outs["fp8"], outs["ref"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    for got, exact in zip(outs["fp8"], outs["fp32"]):
        err = ((got - exact).norm() / exact.norm()).item()
        assert 1e-3 < err < 0.1, err


def test_a_converted_encoder_layer_matches_the_fp32_emulation():
    """A BertLayer (hidden 64, 4 heads, FFN 256; dropout off) converted by fp8.convert runs its
    4 GEMMs in FP8: the output and every parameter's and the input's gradient equal those of
    the same layer with EmulatedLinear in the 4 places, within rtol 1e-4 / atol 1e-4 x the
    tensor's largest value; the state dict keeps its names, shapes and fp32 dtypes."""
    from bertperf.model import fp8
    from bertperf.model.bert_config import BertConfig
    from bertperf.model.layers import BertEncoder
    config = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=1,
                        num_attention_heads=4, intermediate_size=256,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(1)
    plain = BertEncoder(config)
    keys = {k: (v.shape, v.dtype) for k, v in plain.state_dict().items()}
    converted, reference = copy.deepcopy(plain), copy.deepcopy(plain)
    assert fp8.convert(converted, emulate=True) == 4 and fp8.converted(converted) == 4
    assert fp8.convert(converted, emulate=True) == 0  # a LAYERWISE stage's new plan: no-op
    assert {k: (v.shape, v.dtype) for k, v in converted.state_dict().items()} == keys
    for path in fp8.ENCODER_LINEARS:
        *parents, leaf = path.split(".")
        parent = reference.layer[0].get_submodule(".".join(parents))
        old = getattr(parent, leaf)
        new = EmulatedLinear(old.in_features, old.out_features)
        new.load_state_dict(old.state_dict())
        setattr(parent, leaf, new)
    x = torch.randn(40, 64)
    cu_seqlens, grad = torch.tensor([0, 17, 40], dtype=torch.int32), torch.randn(40, 64)
    results = []
    for model in (converted, reference):
        xi = x.clone().requires_grad_()
        y = model(xi, cu_seqlens, 23)
        y.backward(grad)
        results.append([y.detach(), xi.grad] + [p.grad for p in model.parameters()])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_fp8_is_refused_without_bf16_and_without_an_fp8_gpu(packed_env, tmp_path):
    from bertperf.config import load
    from bertperf.errors import UserError
    from bertperf.train.checks import prepare
    base = {**packed_env, "MLLOG_FILE": str(tmp_path / "log.txt")}
    with pytest.raises(UserError, match="needs PRECISION=bf16"):
        prepare(load({**base, "FP8": "emulate", "PRECISION": "fp32"}))
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="sm_89 or newer"):
            prepare(load({**base, "FP8": "1", "PRECISION": "bf16"}))
    with pytest.raises(Exception):
        load({**base, "FP8": "maybe"})
    assert load(base).train.fp8 == "0" and load({**base, "FP8": "yes"}).train.fp8 == "1"


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_fp8_packed_step_compiles_to_one_graph_without_host_syncs(packed_env, tmp_path,
                                                                  monkeypatch, backend):
    """FP8=emulate, PRECISION=bf16, COMPILE=<backend>: 6 steps of the real loop (12 calls of the
    compiled micro-step, forward and backward) make one graph, no graph break, no recompile;
    the 8 encoder linears run in FP8; and, outside the reports' reads, no
    Tensor.item/tolist/__bool__/__float__/__int__ (a host sync on CUDA) during the steps."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from bertperf.model import fp8
    from bertperf.train import loop
    torch._dynamo.reset()
    counters.clear()
    trainer = trainer_for(packed_env, tmp_path, FP8="emulate", PRECISION="bf16",
                          COMPILE=backend, MAX_STEPS="6", LOG_FREQ="3")
    assert fp8.converted(trainer.plan.core) == 8
    reads = HostReads(monkeypatch, SYNCS)
    syncs, reports = reads.syncs, reads.reports
    with torch._dynamo.config.patch(error_on_recompile=True):
        stop = loop.run_loop(trainer, report=lambda line: None)
    assert (stop.status, len(reports)) == ("aborted", 2)
    assert all(np.isfinite(r.loss) for r in reports)
    assert syncs == []
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.slow
def test_fp8_run_learns_and_its_checkpoint_loads_without_fp8(packed_env, tmp_path):
    """FP8=emulate, PRECISION=bf16: 40 steps on the packed shards; the loss of the last 10
    steps' report is below the first's; the checkpoint at the end holds the model under the
    names, shapes and dtypes (fp32) of a model without FP8, which loads it (ModelWeights, as a
    resume does) and then holds the FP8 model's weights bit for bit."""
    from bertperf.model import BertForPreTraining, fp8
    from bertperf.model.bert_config import BertConfig
    from bertperf.train import checkpoint, loop
    trainer = trainer_for(packed_env, tmp_path, FP8="emulate", PRECISION="bf16",
                          MAX_STEPS="40", LOG_FREQ="10", LR="0.004",
                          CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    lines = []
    stop = loop.run_loop(trainer, report=lines.append)
    assert stop.status == "aborted"
    losses = [float(line.split(" loss ")[1].split()[0]) for line in lines]
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.1, losses
    saved = checkpoint.read(checkpoint.newest_first(tmp_path / "ckpt")[0])["model"]
    plain = BertForPreTraining(BertConfig.named(packed_env["BERT_CONFIG"]))
    assert fp8.converted(plain) == 0
    want = {k: (tuple(v.shape), v.dtype) for k, v in plain.state_dict().items()}
    assert {k: (tuple(v.shape), v.dtype) for k, v in saved.items()} == want
    assert {v.dtype for v in saved.values() if v.is_floating_point()} == {torch.float32}
    checkpoint.ModelWeights(plain).load_state_dict(saved)
    for name, tensor in trainer.plan.core.state_dict().items():
        torch.testing.assert_close(plain.state_dict()[name], tensor.cpu(), rtol=0, atol=0)


def test_the_h100_configs_say_fp8_and_the_a100_ones_do_not():
    """An H100 config exports FP8=0 (off until a GPU run proves it) unless the caller set it; an
    A100 config exports no FP8 (refused below sm_89)."""
    base = {k: v for k, v in os.environ.items() if k != "FP8"}
    for path in sorted(ROOT.glob("config_DGXH100_*x*.sh")):
        assert config_env(path, base)["FP8"] == "0", path
        assert config_env(path, {**base, "FP8": "1"})["FP8"] == "1", path
    a100 = sorted(ROOT.glob("config_DGXA100_*x*.sh"))
    assert a100 and not any("FP8" in config_env(path, base) for path in a100)


@pytest.mark.slow
def test_a_layerwise_stage_converts_its_new_layers(packed_env, tmp_path):
    """FP8=emulate with LAYERWISE=2:40,4 (a 4-layer model): the first stage's plan converts its
    2 layers, the second stage's new plan the 2 layers it adds (16 linears in FP8 at the end),
    and the run's losses stay finite."""
    import json

    from bertperf.model import fp8
    from bertperf.train import loop
    config = json.loads(open(packed_env["BERT_CONFIG"]).read())
    deep = tmp_path / "deep.json"
    deep.write_text(json.dumps({**config, "num_hidden_layers": 4}))
    trainer = trainer_for(packed_env, tmp_path, FP8="emulate", PRECISION="bf16",
                          BERT_CONFIG=str(deep), LAYERWISE="2:40,4", MAX_STEPS="6",
                          LOG_FREQ="1")
    assert fp8.converted(trainer.plan.core) == 8
    lines = []
    loop.run_loop(trainer, report=lines.append)
    assert len(trainer.plan.core.bert.encoder.layer) == 4
    assert fp8.converted(trainer.plan.core) == 16
    assert all(np.isfinite(float(line.split(" loss ")[1].split()[0])) for line in lines)
