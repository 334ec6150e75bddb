"""bertperf.optim: LAMB vs a numpy transcription of the reference formula, decay exclusions,
trust-ratio edge cases, the MLPerf LR schedule at hand-computed steps, clipping, fp16 loss-scale
skips, and the optimizer factory. All tensors are tiny; the file runs in a few seconds on CPU."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from bertperf.optim import (
    DynamicLossScaler,
    Lamb,
    LinearWarmupPolyDecay,
    clip_grad_norm_,
    clipped_step,
    is_no_decay,
    lr_at,
    make_optimizer,
    mlperf_hparams,
    param_groups,
    resolve_warmup,
    tf_reference_lr_at,
)
from bertperf.optim.groups import split_decay

torch.set_num_threads(1)


# ----------------------------------------------------------------------------------------------
# numpy reference, written from the formula (lamb_optimizer_v1.py / apex multi_tensor_lamb.cu)
# ----------------------------------------------------------------------------------------------
def ref_lamb_step(w, g, m, v, t, *, lr, b1, b2, eps, wd, adapt, bias_correction=True, grad_averaging=True):
    """One LAMB step for one tensor; returns (w, m, v). float64 numpy arrays."""
    m = b1 * m + ((1.0 - b1) if grad_averaging else 1.0) * g
    v = b2 * v + (1.0 - b2) * g * g
    m_hat = m / (1.0 - b1**t) if bias_correction else m
    v_hat = v / (1.0 - b2**t) if bias_correction else v
    u = m_hat / (np.sqrt(v_hat) + eps) + wd * w
    w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(u)
    r = w_norm / u_norm if (adapt and w_norm > 0 and u_norm > 0) else 1.0
    return w - lr * r * u, m, v


def _rng_tensors(seed: int, shapes, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]


@pytest.mark.parametrize("bias_correction,grad_averaging", [(True, True), (False, True), (True, False)])
def test_lamb_two_steps_match_numpy_reference(bias_correction, grad_averaging):
    shapes_decay = [(3, 4), (7,), (2, 3, 2)]
    shapes_nodecay = [(4,), (5,)]
    hp = dict(lr=0.05, b1=0.8, b2=0.95, eps=1e-6, wd=0.1)
    wd_params = [nn.Parameter(t) for t in _rng_tensors(0, shapes_decay)]
    nd_params = [nn.Parameter(t) for t in _rng_tensors(1, shapes_nodecay)]
    opt = Lamb(
        [{"params": wd_params, "weight_decay": hp["wd"], "layer_adaptation": True},
         {"params": nd_params, "weight_decay": 0.0, "layer_adaptation": False}],
        lr=hp["lr"], betas=(hp["b1"], hp["b2"]), eps=hp["eps"],
        bias_correction=bias_correction, grad_averaging=grad_averaging)

    ref = [[p.detach().numpy().copy(), np.zeros(p.shape), np.zeros(p.shape), wd_flag]
           for ps, wd_flag in ((wd_params, True), (nd_params, False)) for p in ps]
    params = wd_params + nd_params
    for t, seed in ((1, 10), (2, 11)):
        grads = _rng_tensors(seed, [p.shape for p in params])
        for p, gr in zip(params, grads):
            p.grad = gr.clone()
        opt.step()
        for i, gr in enumerate(grads):
            w, m, v, decayed = ref[i]
            ref[i][:3] = ref_lamb_step(
                w, gr.numpy(), m, v, t, lr=hp["lr"], b1=hp["b1"], b2=hp["b2"], eps=hp["eps"],
                wd=hp["wd"] if decayed else 0.0, adapt=decayed,
                bias_correction=bias_correction, grad_averaging=grad_averaging)
        for p, (w, m, v, _) in zip(params, ref):
            np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(opt.state[p]["exp_avg"].numpy(), m, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(opt.state[p]["exp_avg_sq"].numpy(), v, rtol=1e-12, atol=1e-14)
    assert [g["step"] for g in opt.param_groups] == [2, 2]


def test_lamb_first_step_closed_form():
    # Step 1 with bias correction: m^ = g, v^ = g*g, so u = g/|g| (eps=0, wd=0) = [1, -1];
    # r = ||w||/||u|| = 5/sqrt(2); w <- w - lr * r * u.
    w = nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
    w.grad = torch.tensor([0.5, -2.0], dtype=torch.float64)
    Lamb([w], lr=0.1, betas=(0.9, 0.999), eps=0.0, layer_adaptation=True).step()
    d = 0.1 * 5.0 / math.sqrt(2.0)
    torch.testing.assert_close(w.detach(), torch.tensor([3.0 - d, 4.0 + d], dtype=torch.float64))


def test_lamb_float32_many_tensors_matches_reference():
    shapes = [(16, 8), (8,), (3, 5, 2), (1,), (0,), (33,)]
    params = [nn.Parameter(t) for t in _rng_tensors(3, shapes, torch.float32)]
    w0 = [p.detach().double().numpy().copy() for p in params]
    grads = _rng_tensors(4, shapes, torch.float32)
    for p, gr in zip(params, grads):
        p.grad = gr
    Lamb(params, lr=2e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01).step()
    for p, w, gr in zip(params, w0, grads):
        exp, _, _ = ref_lamb_step(w, gr.double().numpy(), 0.0, 0.0, 1, lr=2e-3, b1=0.9, b2=0.999,
                                  eps=1e-6, wd=0.01, adapt=True)
        np.testing.assert_allclose(p.detach().double().numpy(), exp, rtol=1e-5, atol=1e-7)


def test_ratios_on_host_gives_identical_result():
    shapes = [(4, 3), (5,), (2, 2)]
    out = []
    for on_host in (False, True):
        params = [nn.Parameter(t) for t in _rng_tensors(6, shapes, torch.float32)]
        opt = Lamb(params, lr=1e-2, weight_decay=0.01, ratios_on_host=on_host)
        for seed in (7, 8):
            for p, g in zip(params, _rng_tensors(seed, shapes, torch.float32)):
                p.grad = g
            opt.step()
        out.append([p.detach().clone() for p in params])
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_op_count_does_not_grow_with_parameter_count():
    from torch.profiler import ProfilerActivity, profile

    def top_level_ops(n: int) -> list[str]:
        params = [nn.Parameter(torch.randn(8)) for _ in range(n)]
        for p in params:
            p.grad = torch.randn(8)
        opt = Lamb([{"params": params[: n // 2], "weight_decay": 0.01}, {"params": params[n // 2:]}], lr=1e-3)
        opt.step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            clip_grad_norm_(params, 1.0)
            opt.step()
        return sorted(e.name for e in prof.events() if e.name.startswith("aten::")
                      and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))

    small, large = top_level_ops(4), top_level_ops(40)
    assert small == large and "aten::_foreach_norm" in small


# ----------------------------------------------------------------------------------------------
# trust-ratio and gradient edge cases
# ----------------------------------------------------------------------------------------------
def test_zero_weight_gives_ratio_one():
    w = nn.Parameter(torch.zeros(4, dtype=torch.float64))
    w.grad = torch.tensor([1.0, -1.0, 2.0, 0.5], dtype=torch.float64)
    Lamb([w], lr=0.1, eps=0.0, weight_decay=0.01).step()
    # u = sign(g) + 0.01*0 ; ||w|| = 0 -> r = 1
    torch.testing.assert_close(w.detach(), -0.1 * torch.sign(w.grad))


def test_zero_grad_zero_decay_update_norm_zero_leaves_weight():
    w = nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64))
    w.grad = torch.zeros(2, dtype=torch.float64)
    Lamb([w], lr=0.1, weight_decay=0.0, layer_adaptation=True).step()  # ||u|| = 0 -> r = 1, u = 0
    torch.testing.assert_close(w.detach(), torch.tensor([1.0, 2.0], dtype=torch.float64))


def test_zero_grad_with_decay_shrinks_by_one_minus_lr():
    # g = 0: u = wd*w, r = ||w|| / (wd*||w||) = 1/wd, so w <- w - lr*(1/wd)*wd*w = (1 - lr) w.
    w = nn.Parameter(torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64))
    w.grad = torch.zeros(3, dtype=torch.float64)
    Lamb([w], lr=0.1, weight_decay=0.01).step()
    torch.testing.assert_close(w.detach(), 0.9 * torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64))


def test_no_adaptation_group_and_missing_grad():
    b = nn.Parameter(torch.tensor([100.0, -100.0], dtype=torch.float64))
    untouched = nn.Parameter(torch.ones(3, dtype=torch.float64))
    b.grad = torch.tensor([2.0, 3.0], dtype=torch.float64)
    opt = Lamb([{"params": [b, untouched], "weight_decay": 0.0}], lr=0.01, eps=0.0)
    opt.step()  # decay 0 -> apex rule: no trust ratio, plain lr * u = lr * sign(g)
    torch.testing.assert_close(b.detach(), torch.tensor([99.99, -100.01], dtype=torch.float64))
    torch.testing.assert_close(untouched.detach(), torch.ones(3, dtype=torch.float64))
    assert untouched not in opt.state


def test_fused_qkv_takes_its_trust_ratio_per_block():
    """BERT's q/k/v as one parameter pair marked lamb_row_blocks = 3 (bertperf.model.layers)
    steps exactly as three separate parameters (the TF reference's variables) with the same
    weights and gradients: moments, norms and trust ratio per block. Unmarked, one ratio for the
    whole tensor gives other weights (the blocks' norms differ by 100x)."""
    from bertperf.model import BertConfig
    from bertperf.model.layers import PROJECTIONS, BertSelfAttention

    config = BertConfig(vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16)
    torch.manual_seed(0)
    fused = BertSelfAttention(config).double()
    with torch.no_grad():
        fused.qkv.weight.mul_(torch.tensor([1.0, 10.0, 0.1], dtype=torch.float64)
                              .repeat_interleave(8)[:, None])
        fused.qkv.bias.normal_()
    assert fused.qkv.weight.lamb_row_blocks == fused.qkv.bias.lamb_row_blocks == 3
    unmarked = BertSelfAttention(config).double()
    unmarked.load_state_dict(fused.state_dict())
    for p in unmarked.qkv.parameters():
        del p.lamb_row_blocks
    separate = nn.ModuleDict({name: nn.Linear(8, 8).double() for name in PROJECTIONS})
    with torch.no_grad():
        for i, name in enumerate(PROJECTIONS):
            separate[name].weight.copy_(fused.qkv.weight.chunk(3)[i])
            separate[name].bias.copy_(fused.qkv.bias.chunk(3)[i])

    def weight_and_bias(model: nn.Module) -> list[list[nn.Parameter]]:
        """[[weights], [biases]]: the fused pair's or the separate blocks'."""
        if isinstance(model, BertSelfAttention):
            return [[model.qkv.weight], [model.qkv.bias]]
        return [[model[n].weight for n in PROJECTIONS], [model[n].bias for n in PROJECTIONS]]

    def run(model: nn.Module) -> list[torch.Tensor]:
        """3 LAMB steps with the same gradients for every model; the weights and biases after."""
        opt = Lamb(param_groups(model, 0.01), lr=0.05, betas=(0.9, 0.999), eps=1e-6)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            for params, shape in zip(weight_and_bias(model), ((24, 8), (24,))):
                grad = torch.randn(shape, generator=g, dtype=torch.float64)
                for p, part in zip(params, grad.chunk(len(params))):
                    p.grad = part.clone()
            opt.step()
        return [torch.cat([p.detach() for p in params]) for params in weight_and_bias(model)]

    expected = run(separate)
    for got, want in zip(run(fused), expected):
        torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-15)
    assert not torch.allclose(run(unmarked)[0], expected[0], rtol=1e-3, atol=0)


def test_lamb_state_dict_roundtrip_continues_identically():
    def run(split: bool):
        p = nn.Parameter(torch.tensor([1.0, 2.0, -1.5], dtype=torch.float64))
        opt = Lamb([p], lr=0.05, weight_decay=0.01)
        for k, g in enumerate(([0.3, -0.2, 0.1], [0.5, 0.4, -0.3])):
            if split and k == 1:
                sd = opt.state_dict()
                opt = Lamb([p], lr=0.05, weight_decay=0.01)
                opt.load_state_dict(sd)
            p.grad = torch.tensor(g, dtype=torch.float64)
            opt.step()
        return p.detach().clone(), opt.param_groups[0]["step"]

    (a, sa), (b, sb) = run(False), run(True)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert sa == sb == 2


def test_lamb_rejects_bad_hyperparameters():
    p = [nn.Parameter(torch.zeros(1))]
    for kw in ({"lr": -1.0}, {"betas": (1.0, 0.9)}, {"eps": -1.0}, {"weight_decay": -0.1}):
        with pytest.raises(ValueError):
            Lamb(p, **kw)


# ----------------------------------------------------------------------------------------------
# weight-decay exclusion by name
# ----------------------------------------------------------------------------------------------
class _Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(2))     # TF-style LayerNorm scale (NVIDIA list)
        self.beta = nn.Parameter(torch.zeros(2))     # TF-style LayerNorm offset
        self.alphabet = nn.Parameter(torch.ones(2))  # contains "beta" letters but is not "beta"


class _TinyBert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(10, 4)
        self.embeddings.LayerNorm = nn.LayerNorm(4)
        self.query = nn.Linear(4, 4)
        self.output = nn.Module()
        self.output.layer_norm = nn.LayerNorm(4)
        self.ln = nn.LayerNorm(4)                    # renamed LayerNorm: excluded by module type
        self.custom = _Custom()
        self.decoder = nn.Linear(4, 10)
        self.decoder.weight = self.embeddings.word_embeddings.weight  # tied
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)


def test_param_groups_exclude_bias_and_layernorm():
    model = _TinyBert()
    groups = param_groups(model, weight_decay=0.0166629)
    assert len(groups) == 2
    decay, no_decay = groups
    assert decay["param_names"] == ["embeddings.word_embeddings.weight", "query.weight", "custom.alphabet"]
    assert decay["weight_decay"] == 0.0166629 and decay["layer_adaptation"] is True
    assert sorted(no_decay["param_names"]) == sorted([
        "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias", "query.bias",
        "output.layer_norm.weight", "output.layer_norm.bias", "ln.weight", "ln.bias",
        "custom.gamma", "custom.beta", "decoder.bias"])
    assert no_decay["weight_decay"] == 0.0 and no_decay["layer_adaptation"] is False
    n_trainable = len([p for p in model.parameters() if p.requires_grad])
    assert len(decay["params"]) + len(no_decay["params"]) == n_trainable  # tied once, frozen out
    # name rule alone
    assert is_no_decay("bert.encoder.layer.3.attention.output.LayerNorm.weight")
    assert is_no_decay("cls.predictions.bias") and is_no_decay("x.layer_norm.weight")
    assert is_no_decay("bert.embeddings.LayerNorm.gamma") and is_no_decay("beta")
    assert not is_no_decay("bert.encoder.layer.3.intermediate.dense.weight")
    assert not is_no_decay("alphabetical.weight")
    # module rule can be switched off: then "ln.*" is decayed by name
    d, _ = split_decay(model, norm_types=())
    assert "ln.weight" in [n for n, _ in d]


# ----------------------------------------------------------------------------------------------
# LR schedule (s = completed optimizer steps + 1, NVIDIA's last_epoch)
# ----------------------------------------------------------------------------------------------
E = 1e-6  # NVIDIA's warm-up denominator epsilon

SCHEDULE_TABLE = [
    # (base_lr, warmup, total, start, s, expected)
    # v1.1 128x8x3x1: LR 0.002, WARMUP 100, START 0, MAX_STEPS 1141 -> offset 1
    (0.002, 100, 1141, 0, 1, 0.0),                                   # first step: lr 0
    (0.002, 100, 1141, 0, 51, 0.002 * 50 / (100 + E)),
    (0.002, 100, 1141, 0, 100, 0.002 * 99 / (100 + E)),             # last warm-up step
    (0.002, 100, 1141, 0, 101, 0.002 * (1 - 100 / 1141)),           # decay measured from 0
    (0.002, 100, 1141, 0, 1142, 0.0),                                # end of decay
    (0.002, 100, 1141, 0, 5000, 0.0),                                # past the end
    # 8x8x48x1: LR 1.5e-3, WARMUP 100, START -25, MAX_STEPS 1271 -> offset 0
    (1.5e-3, 100, 1271, -25, 1, 1.5e-3 * 26 / (100 + E)),            # starts at ~26 %
    (1.5e-3, 100, 1271, -25, 74, 1.5e-3 * 99 / (100 + E)),
    (1.5e-3, 100, 1271, -25, 75, 1.5e-3 * (1 - 75 / 1271)),          # jumps onto the decay line
    (1.5e-3, 100, 1271, -25, 1271, 0.0),
    # H100 8x8x72x1: LR 0.00258, WARMUP 200330, START -200000, MAX_STEPS 700
    (0.00258, 200330, 700, -200000, 1, 0.00258 * 200001 / (200330 + E)),
    (0.00258, 200330, 700, -200000, 329, 0.00258 * 200329 / (200330 + E)),
    (0.00258, 200330, 700, -200000, 330, 0.00258 * (1 - 330 / 700)),
    # GB200: WARMUP 170200, START -200000 -> no warm-up at all
    (0.002, 170200, 700, -200000, 1, 0.002 * (1 - 1 / 700)),
    # WARMUP 0, START 0 (1x8x56x1: LR 4.25e-4, MAX_STEPS 6700)
    (4.25e-4, 0, 6700, 0, 1, 4.25e-4),
    (4.25e-4, 0, 6700, 0, 3351, 4.25e-4 * 0.5),
    (4.25e-4, 0, 6700, 0, 6701, 0.0),
    # positive START 10, WARMUP 20 (no MLPerf config does this): negative before the start
    (1e-3, 20, 100, 10, 1, 1e-3 * -9 / (20 + E)),
    (1e-3, 20, 100, 10, 10, 0.0),
    (1e-3, 20, 100, 10, 20, 1e-3 * 10 / (20 + E)),
    (1e-3, 20, 100, 10, 30, 1e-3 * (1 - 30 / 100)),
]


@pytest.mark.parametrize("base,warmup,total,start,s,expected", SCHEDULE_TABLE)
def test_lr_at_table(base, warmup, total, start, s, expected):
    assert lr_at(s, base, warmup, total, start) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_lr_at_power_and_end_lr():
    # offset 1 -> p = (6 - 1)/10 = 0.5 ; (1e-3 - 1e-4) * 0.5**2 + 1e-4
    assert lr_at(6, 1e-3, 0, 10, 0, end_lr=1e-4, power=2.0) == pytest.approx(0.9e-3 * 0.25 + 1e-4, rel=1e-12)
    assert lr_at(50, 1e-3, 0, 10, 0, end_lr=1e-4, power=2.0) == pytest.approx(1e-4, rel=1e-12)


def test_nvidia_vs_tf_reference_offset():
    # START 0: identical to TF's schedule at global_step = s - 1 (up to the 1e-6 in the warm-up)
    for s in (1, 2, 50, 100, 101, 600, 1141, 1500):
        assert lr_at(s, 0.002, 100, 1141, 0) == pytest.approx(tf_reference_lr_at(s - 1, 0.002, 100, 1141, 0), rel=1e-7)
    # START != 0: NVIDIA is one step ahead of TF
    for s in (1, 50, 74, 75, 76, 1000, 1271):
        tf = tf_reference_lr_at(s, 1.5e-3, 100, 1271, -25)
        assert lr_at(s, 1.5e-3, 100, 1271, -25) == pytest.approx(tf, rel=1e-7)


def test_scheduler_sets_group_lrs_by_completed_steps():
    w = nn.Parameter(torch.ones(2))
    b = nn.Parameter(torch.ones(2))
    opt = Lamb([{"params": [w], "weight_decay": 0.01}, {"params": [b]}], lr=1.5e-3)
    sched = LinearWarmupPolyDecay(opt, warmup_steps=100, total_steps=1271, start_warmup_step=-25)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([lr_at(1, 1.5e-3, 100, 1271, -25)] * 2)
    for _ in range(74):
        w.grad = torch.zeros(2)
        opt.step()
        sched.step()
    assert sched.last_epoch == 74
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1.5e-3 * (1 - 75 / 1271)] * 2)
    hp = mlperf_hparams(opt, sched)
    assert hp == {
        "opt_name": "lamb", "opt_lamb_epsilon": 1e-6, "opt_lamb_beta_1": 0.9, "opt_lamb_beta_2": 0.999,
        "opt_lamb_weight_decay_rate": 0.01, "opt_base_learning_rate": 1.5e-3,
        "opt_learning_rate_training_steps": 1271, "opt_learning_rate_warmup_steps": 100,
        "num_warmup_steps": 100, "start_warmup_step": -25, "opt_lamb_learning_rate_decay_poly_power": 1.0}


def test_scheduler_warns_on_positive_start():
    opt = Lamb([nn.Parameter(torch.ones(1))], lr=1e-3)
    with pytest.warns(UserWarning, match="negative"):
        LinearWarmupPolyDecay(opt, warmup_steps=20, total_steps=100, start_warmup_step=10)


def test_resolve_warmup():
    assert resolve_warmup(0.0, -25, 1000, 0.1) == (100, 0)    # WARMUP_STEPS 0 -> proportion, start 0
    assert resolve_warmup("0.0", "0.0", 7100, 0.0) == (0, 0)  # run_and_time defaults
    assert resolve_warmup(100, -25, 1271) == (100, -25)
    assert resolve_warmup("200330", "-200000", 700) == (200330, -200000)
    with pytest.raises(ValueError):
        resolve_warmup(10.5, 0, 100)


# ----------------------------------------------------------------------------------------------
# clipping
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [10.0, 0.01])  # clipped / below the limit
def test_clip_matches_torch(scale):
    shapes = [(5, 3), (7,), (2, 2, 2)]
    grads = [g * scale for g in _rng_tensors(5, shapes, torch.float32)]
    ours = [nn.Parameter(torch.zeros(s)) for s in shapes]
    theirs = [nn.Parameter(torch.zeros(s)) for s in shapes]
    for a, b, g in zip(ours, theirs, grads):
        a.grad, b.grad = g.clone(), g.clone()
    n_ours = clip_grad_norm_(ours, 1.0)
    n_theirs = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    torch.testing.assert_close(n_ours, n_theirs, rtol=1e-6, atol=0)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-8)
    if scale == 10.0:
        assert float(clip_grad_norm_(ours, None)) == pytest.approx(1.0, rel=1e-5)


def test_clip_nonfinite_norm_reported_and_grads_untouched():
    g1 = torch.tensor([1.0, float("inf")])
    g2 = torch.tensor([3.0, 4.0])
    norm = clip_grad_norm_([g1, g2], 1.0)  # plain gradient tensors are accepted too
    assert not torch.isfinite(norm)
    torch.testing.assert_close(g2, torch.tensor([3.0, 4.0]))


class TwoRanks(Lamb):
    """Lamb as one of two ranks holding the same gradient shard would step: the global norm
    from both (ClippedOptimizer), and what the step was handed."""

    def step_grads(self):
        self.handed = super().step_grads()
        return self.handed

    def norm_over_ranks(self, norm):
        return norm * math.sqrt(2.0)

    def step(self, closure=None, *, ok=None):
        self.ok = ok


def test_clipped_step_asks_the_optimizer_its_grads_and_norm():
    """clipped_step clips what step_grads hands it, to the norm norm_over_ranks makes of their
    norm, and steps with the outcome."""
    w = nn.Parameter(torch.zeros(2))
    w.grad = torch.tensor([3.0, 4.0])
    opt = TwoRanks([w], lr=0.1)
    out = clipped_step(opt, max_grad_norm=1.0)
    assert out.grad_norm.item() == pytest.approx(5.0 * math.sqrt(2.0)) and opt.ok is out.ok
    assert opt.handed[0] is w.grad
    torch.testing.assert_close(w.grad, torch.tensor([3.0, 4.0]) / (5.0 * math.sqrt(2.0) + 1e-6))


# ----------------------------------------------------------------------------------------------
# fp16 dynamic loss scaling: skip on overflow
# ----------------------------------------------------------------------------------------------
def test_loss_scaler_skips_on_inf_then_steps():
    w = nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64))
    opt = Lamb([w], lr=0.1, weight_decay=0.01)
    scaler = DynamicLossScaler(init_scale=2.0**4, growth_interval=2)

    w.grad = torch.tensor([float("inf"), 1.0], dtype=torch.float64)
    out = clipped_step(opt, max_grad_norm=1.0, scaler=scaler)
    assert not out.ok and not torch.isfinite(out.grad_norm)
    assert out.loss_scale == 8.0 and scaler.skipped_steps == 1
    torch.testing.assert_close(w.detach(), torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert opt.param_groups[0]["step"] == 0
    assert not opt.state[w]["exp_avg"].any() and not opt.state[w]["exp_avg_sq"].any()

    # a good step: grads were produced from loss * 8; the optimizer sees the unscaled, clipped grad
    true_grad = torch.tensor([0.3, -0.4], dtype=torch.float64)  # norm 0.5 < 1: no clipping
    w.grad = true_grad * scaler.scale
    out = clipped_step(opt, max_grad_norm=1.0, scaler=scaler)
    assert out.ok and out.grad_norm.item() == pytest.approx(0.5)
    exp, _, _ = ref_lamb_step(np.array([1.0, 2.0]), true_grad.numpy(), 0.0, 0.0, 1,
                              lr=0.1, b1=0.9, b2=0.999, eps=1e-6, wd=0.01, adapt=True)
    np.testing.assert_allclose(w.detach().numpy(), exp, rtol=1e-12)
    w.grad = true_grad * scaler.scale
    clipped_step(opt, max_grad_norm=1.0, scaler=scaler)
    assert scaler.scale == 16.0 and scaler.growth_tracker == 0  # grew after 2 good steps
    assert opt.param_groups[0]["step"] == 2

    sd = scaler.state_dict()
    assert sd == {"scale": 16.0, "growth_tracker": 0, "skipped_steps": 1}
    s2 = DynamicLossScaler()
    s2.load_state_dict(sd)
    assert s2.state_dict() == sd


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_step_is_skipped_on_the_device(bad):
    """A NaN or inf gradient after some good steps: weights, moments, step counts and the LR
    schedule stay exactly where they were; the next good step goes on as if it had not been."""
    def run(skip_at: int | None):
        torch.manual_seed(0)
        model = _TinyBert()
        opt = make_optimizer("lamb", param_groups(model, 0.01), lr=1e-2)
        sched = LinearWarmupPolyDecay(opt, warmup_steps=2, total_steps=10)
        for k in range(4):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(k))
            model.query(x).pow(2).sum().backward()
            if k == skip_at:
                model.query.weight.grad[0, 0] = bad
            out = clipped_step(opt, 1.0)
            sched.step(out.ok)
            opt.zero_grad(set_to_none=True)
            if k == skip_at:  # the same step again, with good grads
                assert not out.ok
                model.query(x).pow(2).sum().backward()
                sched.step(clipped_step(opt, 1.0).ok)
                opt.zero_grad(set_to_none=True)
        return model, opt, sched

    clean, clean_opt, clean_sched = run(None)
    skipped, opt, sched = run(2)
    for a, b in zip(clean.parameters(), skipped.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert sched.last_epoch == clean_sched.last_epoch == 4
    assert [float(g["step"]) for g in opt.param_groups] == [4.0, 4.0]
    assert float(opt.param_groups[0]["lr"]) == float(clean_opt.param_groups[0]["lr"])


def test_scaled_fp16_loss_gradients_unscale_exactly():
    lin = nn.Linear(3, 1)
    x = torch.randn(4, 3)
    ref = nn.Linear(3, 1)
    ref.load_state_dict(lin.state_dict())
    ref(x).pow(2).mean().backward()
    scaler = DynamicLossScaler(init_scale=2.0**10)
    scaler.scale_loss(lin(x).pow(2).mean()).backward()
    scaler.unscale_([p.grad for p in lin.parameters()])
    for a, b in zip(lin.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_bf16_autocast_accumulation_clip_step_smoke():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    opt = make_optimizer("lamb", param_groups(model, 0.01), lr=1e-3, betas=(0.9, 0.999))
    sched = LinearWarmupPolyDecay(opt, warmup_steps=0, total_steps=10)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(8, 8), torch.randint(0, 2, (8,))
    ga = 2
    for xb, yb in zip(x.chunk(ga), y.chunk(ga)):  # gradient accumulation over 2 micro-batches
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(xb), yb) / ga
        loss.backward()
    out = clipped_step(opt, max_grad_norm=1.0, scaler=None)
    assert out.ok and torch.isfinite(out.grad_norm) and out.loss_scale is None
    sched.step(out.ok)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * (1 - 1 / 10))


# ----------------------------------------------------------------------------------------------
# factory
# ----------------------------------------------------------------------------------------------
def test_make_optimizer():
    model = _TinyBert()
    opt = make_optimizer("LAMB", param_groups(model, 0.01), lr=1e-3, eps=1e-6)
    assert isinstance(opt, Lamb) and [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    assert mlperf_hparams(opt)["opt_name"] == "lamb"
    assert isinstance(make_optimizer("lamb", model.parameters(), lr=1e-3), Lamb)
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer("sgd", model.parameters(), lr=1e-3)


def test_no_warnings_from_scheduler_construction():
    opt = Lamb([nn.Parameter(torch.ones(1))], lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LinearWarmupPolyDecay(opt, warmup_steps=10, total_steps=100, start_warmup_step=-5)


def test_the_optimizers_do_not_import_dynamo():
    """Lamb, FlatLamb and ShardedLamb built, stepped, zeroed, saved and loaded in a fresh process
    leave torch._dynamo unimported: torch.optim's wrappers would import it (2 CPU-seconds of a
    short run's start-up) though nothing compiles an optimizer."""
    import subprocess
    import sys
    code = """
import sys, torch
from bertperf.optim import FlatLamb, Lamb
from bertperf.optim.sharded_lamb import ShardedLamb
for cls in (Lamb, FlatLamb, ShardedLamb):
    w = torch.nn.Parameter(torch.ones(4))
    opt = cls([{"params": [w], "weight_decay": 0.01}], lr=0.1)
    w.grad = torch.ones(4)
    opt.step()
    opt.zero_grad(set_to_none=True)
    opt.load_state_dict(opt.state_dict())
print(sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]", run.stdout
