"""bertperf.optim.FlatLamb: Lamb's step over flat buffers. The same weights and moments as Lamb
(bit for bit on the CPU path, within 1e-6 on the Triton kernels under the interpreter), skipped
steps included; gradients accumulated in place into the flat buffer; clipping as one tensor's
ops; state dicts that load both ways. The trainer with FLAT_LAMB=1 is in test_checkpoint.py and
test_step_audits.py."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from bertperf.optim import (FlatLamb, Lamb, LinearWarmupPolyDecay, clipped_step, lr_at,
                            make_optimizer, param_groups)
from tests.support.lamb import assert_same_state, params_of, step_both, three_groups
from tests.support.models import tiny_bert
from tests.support.paths import PYTHONPATH


@pytest.mark.parametrize("path", ["plain", "triton"])
def test_flat_lamb_is_lamb(path, request):
    """6 steps, the third skipped, over three groups (decay + adaptation, neither, adaptation
    without decay) of a small BERT, whose fused q/k/v take their trust ratio per block."""
    if path == "triton":
        request.getfixturevalue("triton_path")
    flat = FlatLamb(three_groups(tiny_bert()), lr=3e-3)
    lamb = Lamb(three_groups(tiny_bert()), lr=3e-3)
    assert any(getattr(p, "lamb_row_blocks", 1) == 3 for p in params_of(flat))
    step_both(flat, lamb, 6, skip=2)
    assert_same_state(flat, lamb, exact=path == "plain")
    assert [float(g["step"]) for g in flat.param_groups] == [5.0] * 3
    assert [float(g["step"]) for g in lamb.param_groups] == [5.0] * 3


def test_row_blocks_are_separate_tensors():
    """A [3H, H] parameter and its bias marked lamb_row_blocks = 3 step as three [H, H] and
    three [H] parameters (the TF reference's q, k, v variables)."""
    torch.manual_seed(0)
    scales = torch.tensor([1.0, 10.0, 0.1]).repeat_interleave(4)[:, None]  # unequal block norms
    weight, bias = torch.randn(12, 4) * scales, torch.randn(12)
    fused = [nn.Parameter(weight.clone()), nn.Parameter(bias.clone())]
    for p in fused:
        p.lamb_row_blocks = 3
    separate = [nn.Parameter(t.clone()) for t in (*weight.chunk(3), *bias.chunk(3))]
    flat = FlatLamb([{"params": fused, "weight_decay": 0.01}], lr=0.05)
    lamb = Lamb([{"params": separate, "weight_decay": 0.01}], lr=0.05)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        grads = [torch.randn(12, 4, generator=g), torch.randn(12, generator=g)]
        for p, grad in zip(fused, grads):
            p.grad.copy_(grad)
        for q, grad in zip(separate, (*grads[0].chunk(3), *grads[1].chunk(3))):
            q.grad = grad.clone()
        flat.step()
        lamb.step()
    assert torch.equal(fused[0], torch.cat(separate[:3])) and \
        torch.equal(fused[1], torch.cat(separate[3:]))
    odd = nn.Parameter(torch.ones(12, 4))
    odd.lamb_row_blocks = 5
    with pytest.raises(RuntimeError):  # 12 rows do not make 5 blocks
        FlatLamb([odd])


def test_parameters_and_grads_are_views_of_flat_buffers():
    """Every parameter (a tied one once) and its .grad live in the flat buffers; the model's
    forward still sees the weights; zero_grad zeroes the buffer and keeps the views."""
    model = tiny_bert()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    opt = FlatLamb(param_groups(model, 0.01), lr=1e-3)
    weights, grads = opt._weights, opt.flat_grads()
    assert weights.numel() == grads.numel() == sum(p.numel() for p in model.parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
        assert p.untyped_storage().data_ptr() == weights.untyped_storage().data_ptr(), name
        assert p.grad.untyped_storage().data_ptr() == grads.untyped_storage().data_ptr(), name
    views = [p.grad for p in model.parameters()]
    grads.fill_(1.0)
    opt.zero_grad(set_to_none=True)
    assert not grads.any() and all(p.grad is v for p, v in zip(model.parameters(), views))


def test_gradient_accumulation_into_the_flat_buffer():
    """Two micro-batches backpropagated one after the other accumulate in place into the flat
    buffer: its views hold the sum of each micro-batch's gradients, the same tensors as before."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3))
    opt = FlatLamb(param_groups(model, 0.01), lr=1e-3)
    params = params_of(opt)
    views = [p.grad for p in params]
    batches = [torch.randn(4, 6, generator=torch.Generator().manual_seed(k)) for k in range(2)]
    per_batch = [torch.autograd.grad(model(x).pow(2).sum(), params) for x in batches]
    for x in batches:
        model(x).pow(2).sum().backward()
    assert all(p.grad is view for p, view in zip(params, views))
    assert torch.equal(opt.flat_grads(), torch.cat([(a + b).reshape(-1)
                                                    for a, b in zip(*per_batch)]))


DDP_SCRIPT = """
import sys, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from bertperf.optim import FlatLamb, param_groups
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3))
opt = FlatLamb(param_groups(model, 0.01), lr=1e-3)
ddp = DistributedDataParallel(model)  # as train/loop.py: after FlatLamb, bucket views off
params = [p for g in opt.param_groups for p in g["params"]]
views = [p.grad for p in params]
batches = [torch.randn(4, 6, generator=torch.Generator().manual_seed(k)) for k in range(2)]
for step in range(3):  # DDP rebuilds its buckets after the first
    sums = [a + b for a, b in zip(*[torch.autograd.grad(model(x).pow(2).sum(), params)
                                    for x in batches])]
    with ddp.no_sync():
        ddp(batches[0]).pow(2).sum().backward()
    ddp(batches[1]).pow(2).sum().backward()
    assert all(p.grad is view for p, view in zip(params, views)), step
    assert torch.equal(opt._grads, torch.cat([g.reshape(-1) for g in sums])), step
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
print("in place")
"""


def test_ddp_reduces_into_the_flat_buffer(tmp_path):
    """DDP as the trainer builds it (one gloo rank, in a process of its own): the first
    micro-batch under no_sync accumulates into the views, the second's reduced bucket is copied
    into them in place, step after step."""
    out = subprocess.run([sys.executable, "-c", DDP_SCRIPT, str(tmp_path / "store")],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": PYTHONPATH})
    # (torch 2.10's gloo prints its connections to stdout first)
    assert out.stdout.strip().splitlines()[-1:] == ["in place"], out.stderr[-2000:]


def test_a_replaced_grad_is_copied_back():
    """A .grad set to None or to a new tensor (code outside the trainer) goes back into the
    flat buffer, as zeros or its values, before the buffer is read."""
    model = nn.Linear(3, 2)
    opt = FlatLamb(model.parameters())
    model.weight.grad = torch.full((2, 3), 2.0)
    model.bias.grad = None
    flat = opt.flat_grads()
    assert flat.tolist() == [2.0] * 6 + [0.0] * 2
    assert model.weight.grad.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    model.bias.grad = torch.ones(2)
    opt.zero_grad()
    assert not flat.any() and model.bias.grad.untyped_storage().data_ptr() == \
        flat.untyped_storage().data_ptr()


def test_clipped_step_works_on_the_flat_buffer(monkeypatch):
    """clipped_step with FlatLamb: one nan_to_num_ (on the flat buffer), the norm of all the
    gradients, the same step as with Lamb within rounding (the norm is summed in another
    order); a non-finite gradient skips the step and leaves the buffer zero."""
    flat = FlatLamb(param_groups(tiny_bert(), 0.01), lr=1e-2)
    lamb = Lamb(param_groups(tiny_bert(), 0.01), lr=1e-2)
    g = torch.Generator().manual_seed(3)
    for p, q in zip(params_of(flat), params_of(lamb)):
        q.grad = torch.randn(p.shape, generator=g)
        p.grad.copy_(q.grad)
    calls = []
    real = torch.nan_to_num_
    monkeypatch.setattr(torch, "nan_to_num_", lambda t, *a: calls.append(t) or real(t, *a))
    outcome = clipped_step(flat, 1.0)
    assert len(calls) == 1 and calls[0] is flat.flat_grads()
    expected = clipped_step(lamb, 1.0)
    torch.testing.assert_close(outcome.grad_norm, expected.grad_norm, rtol=1e-6, atol=0)
    assert outcome.grad_norm > 1.0 and bool(outcome.ok)  # clipped
    assert_same_state(flat, lamb, exact=False)

    before = [p.detach().clone() for p in params_of(flat)]
    params_of(flat)[3].grad[0] = float("inf")
    outcome = clipped_step(flat, 1.0)
    assert not outcome.ok and not flat.flat_grads().any()
    assert all(torch.equal(p, b) for p, b in zip(params_of(flat), before))
    assert float(flat.param_groups[0]["step"]) == 1.0


@pytest.mark.parametrize("direction", ["flat to lamb", "lamb to flat"])
def test_state_dicts_load_both_ways(direction):
    """A state dict saved by one optimizer after 3 steps (through torch.save, with the model)
    loads into the other, which goes on bit for bit as the first would have."""
    first, second = (FlatLamb, Lamb) if direction == "flat to lamb" else (Lamb, FlatLamb)
    models = [tiny_bert() for _ in range(3)]
    opts = [first(param_groups(models[0], 0.01), lr=1e-2),
            first(param_groups(models[1], 0.01), lr=1e-2)]
    fresh = second(param_groups(models[2], 0.01), lr=1e-2)

    def steps(opt, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for _ in range(n):
            for p in params_of(opt):
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()

    for opt in opts:
        steps(opt, 3, seed=1)
    buffer = io.BytesIO()
    torch.save({"model": models[1].state_dict(), "opt": opts[1].state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    models[2].load_state_dict(saved["model"])
    fresh.load_state_dict(saved["opt"])
    steps(opts[0], 2, seed=2)
    steps(fresh, 2, seed=2)
    flat, lamb = (opts[0], fresh) if first is FlatLamb else (fresh, opts[0])
    assert_same_state(flat, lamb, exact=True)
    assert [float(g["step"]) for g in fresh.param_groups] == [5.0, 5.0]


def test_a_state_dict_without_moments_loads_zeros():
    """Lamb makes its moments at its first step: its state dict before one has none, and
    FlatLamb takes that as zero moments and count."""
    model = tiny_bert()
    opt = FlatLamb(param_groups(model, 0.01), lr=1e-2)
    opt.flat_grads().normal_()
    opt.step()
    assert opt._exp_avg.any()
    opt.load_state_dict(Lamb(param_groups(tiny_bert(), 0.01), lr=1e-2).state_dict())
    assert not opt._exp_avg.any() and not opt._exp_avg_sq.any()
    assert all(opt.state[p]["exp_avg"].untyped_storage().data_ptr() ==
               opt._exp_avg.untyped_storage().data_ptr() for p in model.parameters())
    assert all(float(Lamb.step_count(g, torch.device("cpu"))) == 0.0 for g in opt.param_groups)


@pytest.mark.parametrize("cls", [Lamb, FlatLamb])
def test_a_resume_gives_the_groups_device_lr_tensors(cls):
    """The optimizer's load_state_dict leaves the checkpoint's LR tensors in its groups (on CUDA,
    CPU tensors from the file; here meta tensors stand for a device other than the model's);
    the schedule's load_state_dict, after it, gives the groups tensors on the model's device
    again, holding the next step's LR."""
    opt = cls(param_groups(tiny_bert(), 0.01), lr=1e-2)
    sched = LinearWarmupPolyDecay(opt, 2, 10)
    opt.step()
    sched.step()
    saved = opt.state_dict()
    for group in saved["param_groups"]:
        group["lr"] = torch.empty((), dtype=torch.float64, device="meta")
    opt.load_state_dict(saved)
    assert all(g["lr"].is_meta for g in opt.param_groups)
    sched.load_state_dict(sched.state_dict())
    assert [float(g["lr"]) for g in opt.param_groups] == [pytest.approx(lr_at(2, 1e-2, 2, 10))] * 2
    opt.step()
    sched.step()
    assert [float(g["lr"]) for g in opt.param_groups] == [pytest.approx(lr_at(3, 1e-2, 2, 10))] * 2


def test_flat_lamb_refuses_what_one_step_cannot_do():
    with pytest.raises(ValueError, match="same lr"):
        FlatLamb([{"params": [nn.Parameter(torch.ones(2))], "lr": 0.1},
                  {"params": [nn.Parameter(torch.ones(2))]}], lr=0.2)
    with pytest.raises(ValueError, match="fp32"):
        FlatLamb([nn.Parameter(torch.ones(2, dtype=torch.float64))])
    opt = FlatLamb([{"params": [nn.Parameter(torch.ones(2))]},
                    {"params": [nn.Parameter(torch.ones(2))]}])
    state = opt.state_dict()
    state["param_groups"][1]["step"] = torch.tensor(3.0, dtype=torch.float64)
    with pytest.raises(ValueError, match="step counts differ"):
        opt.load_state_dict(state)
    assert isinstance(make_optimizer("flat_lamb", [nn.Parameter(torch.ones(2))], lr=0.1),
                      FlatLamb)
