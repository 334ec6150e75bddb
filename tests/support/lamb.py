"""LAMB over flat buffers against Lamb: a model's parameters laid out as the kernels take them
(flat_setup), three parameter groups that cover every combination of decay and layer adaptation
(three_groups), the same random gradients stepped through two optimizers (step_both) and their
weights and moments compared (assert_same_state); on the CPU (test_kernels.py,
test_triton_kernels.py, test_flat_lamb.py) and on CUDA (tests/gpu/test_flat_lamb_gpu.py)."""

from __future__ import annotations

import torch
from torch import nn

from bertperf.kernels import LambLayout
from bertperf.optim import FlatLamb, Lamb, LinearWarmupPolyDecay, param_groups


def flat_setup(model: torch.nn.Module, block: int = LambLayout.BLOCK):
    """param_groups(model) as a LambLayout (a parameter marked lamb_row_blocks = n as n tensors,
    as Lamb takes it), the flat fp32 copies of the weights, zero moments."""
    groups = param_groups(model, 0.01)
    params = [p for g in groups for p in g["params"]]
    blocks = [(g, p.numel() // n) for g in groups for p in g["params"]
              for n in [getattr(p, "lamb_row_blocks", 1)] for _ in range(n)]
    layout = LambLayout([numel for _, numel in blocks], [g["weight_decay"] for g, _ in blocks],
                        [Lamb.adapts(g) for g, _ in blocks], "cpu", block)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    return groups, params, layout, [flat, torch.zeros_like(flat), torch.zeros_like(flat)]


def three_groups(model: nn.Module) -> list[dict]:
    """param_groups (decayed and adapted; bias/LayerNorm with neither) and a third group taken
    out of the first: no decay, but adapted."""
    decayed, plain = param_groups(model, 0.01)
    cut = len(decayed["params"]) // 2
    adapted = {"params": decayed["params"][cut:], "param_names": decayed["param_names"][cut:],
               "weight_decay": 0.0, "layer_adaptation": True}
    decayed["params"], decayed["param_names"] = decayed["params"][:cut], \
        decayed["param_names"][:cut]
    return [decayed, plain, adapted]


def params_of(opt: torch.optim.Optimizer) -> list[nn.Parameter]:
    return [p for group in opt.param_groups for p in group["params"]]


def assert_same_state(flat: FlatLamb, lamb: Lamb, exact: bool) -> None:
    """Weights and moments of the two optimizers' parameters equal (within 1e-6 unless
    exact)."""
    for p, q in zip(params_of(flat), params_of(lamb)):
        pairs = [(p, q)] + [(flat.state[p][k], lamb.state[q][k])
                            for k in ("exp_avg", "exp_avg_sq")]
        for a, b in pairs:
            if exact:
                assert torch.equal(a, b)
            else:
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def step_both(flat: FlatLamb, lamb: Lamb, steps: int, seed: int = 1, skip: int | None = None):
    """`steps` steps with the same random gradients (as clipped_step leaves them: zero on the
    step `skip`, which is skipped on the device), each optimizer under its own schedule."""
    scheds = [LinearWarmupPolyDecay(opt, 2, 10) for opt in (flat, lamb)]
    g = torch.Generator().manual_seed(seed)
    device = params_of(flat)[0].device
    for k in range(steps):
        ok = torch.tensor(k != skip, device=device)
        for p, q in zip(params_of(flat), params_of(lamb)):
            grad = torch.randn(p.shape, generator=g).to(device) * ok
            p.grad.copy_(grad)  # in place: the view of the flat buffer
            q.grad = grad.clone()
        for opt, sched in zip((flat, lamb), scheds):
            opt.step(ok=ok)
            sched.step(ok)
