"""A LAMB step over flat fp32 buffers: every parameter tensor of the model is a slice of one
flat buffer (and so are its gradient and moments), so the whole step is a few kernel launches
(NVIDIA: apex's multi_tensor_lamb / DistributedFusedLAMB). The arithmetic is that of
bertperf.optim.lamb.Lamb, whose docstring states the formula and its sources; per tensor,
weight_decay and layer adaptation come from its parameter group."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from bertperf.kernels.backend import Kernels


class LambLayout:
    """Where each tensor lies in the flat buffers and how LAMB treats it: tensor i is
    buffer[offsets[i]:offsets[i+1]], with its weight decay and whether the trust ratio applies
    (Lamb.adapts of its group). The chunk tables tell the Triton kernels which tensor each
    program's BLOCK elements belong to; all tables live on `device`, built once."""

    BLOCK = 2048
    """Elements per Triton program."""

    def __init__(self, numels: Sequence[int], weight_decay: Sequence[float],
                 adapt: Sequence[bool], device: torch.device | str, block: int = BLOCK):
        if not len(numels) == len(weight_decay) == len(adapt):
            raise ValueError("LambLayout: numels, weight_decay and adapt differ in length")
        self.numels = [int(n) for n in numels]
        self.weight_decays = [float(wd) for wd in weight_decay]
        self.adapts = [bool(a) for a in adapt]
        self.block = block
        bounds = [0]
        for n in self.numels:
            bounds.append(bounds[-1] + n)
        self.bounds = bounds
        chunks = [math.ceil(n / block) for n in self.numels]
        first = [0]
        for c in chunks:
            first.append(first[-1] + c)
        self.offsets = torch.tensor(bounds, dtype=torch.int64, device=device)
        self.tensor_chunks = torch.tensor(first, dtype=torch.int32, device=device)
        self.chunk_tensor = torch.repeat_interleave(
            torch.arange(len(chunks), dtype=torch.int32), torch.tensor(chunks, dtype=torch.int64),
            output_size=first[-1]).to(device)  # a static size: built on fake tensors too
        self.weight_decay = torch.tensor(self.weight_decays, dtype=torch.float32, device=device)
        self.adapt = torch.tensor(self.adapts, dtype=torch.int8, device=device)

    @property
    def numel(self) -> int:
        """Elements of a flat buffer."""
        return self.bounds[-1]


def _coefficients(betas: tuple[float, float], step: int | Tensor, ok: Tensor | None,
                  bias_correction: bool, device: torch.device) -> Tensor:
    """fp32 [4] on `device`: the moments' decay factors (beta1, beta2; 1 where ok is False)
    and the bias corrections 1 - beta**max(step, 1) (1 without bias correction), computed in
    float64 on the device as Lamb does, with no host read."""
    beta1, beta2 = betas
    f64 = dict(dtype=torch.float64, device=device)
    if bias_correction:
        t = (step.to(**f64) if isinstance(step, Tensor)
             else torch.full((), float(step), **f64)).clamp(min=1.0)
        corrections = [1.0 - beta1**t, 1.0 - beta2**t]
    else:
        corrections = [torch.ones((), **f64)] * 2
    if ok is None:
        decays = [torch.full((), beta1, **f64), torch.full((), beta2, **f64)]
    else:
        okf = ok.to(**f64)
        decays = [1.0 + okf * (beta1 - 1.0), 1.0 + okf * (beta2 - 1.0)]
    return torch.stack(decays + corrections).float()


def lamb_step(layout: LambLayout, params: Tensor, grads: Tensor, exp_avg: Tensor,
              exp_avg_sq: Tensor, *, lr: float | Tensor, betas: tuple[float, float],
              eps: float, step: int | Tensor, ok: Tensor | None = None,
              bias_correction: bool = True, grad_averaging: bool = True,
              kernels: Kernels = Kernels()) -> None:
    """One LAMB step, in place on the flat fp32 buffers params, exp_avg and exp_avg_sq (grads:
    flat, any float dtype), as Lamb.step(ok=ok) does it. step: this step's count (the first is
    1; a skipped step does not count), an int or a 0-d tensor; lr: a float or a 0-d tensor;
    ok: None, or a 0-d bool tensor that is False for a step skipped on the device (weights and
    moments stay, given zero grads). Tensors on the buffers' device: no host read. Every tensor
    of the layout is updated (Lamb skips a parameter without a gradient; here its gradient is
    zero). Where kernels.use_triton(params): three Triton launches for all tensors
    (`lamb_step_triton`, launched by kernels.launchers["lamb.step"] where given); elsewhere
    `lamb_step_reference`."""
    hyper = dict(lr=lr, betas=betas, eps=eps, step=step, ok=ok, bias_correction=bias_correction,
                 grad_averaging=grad_averaging)
    if kernels.use_triton(params):
        lamb_step_triton(layout, params, grads, exp_avg, exp_avg_sq, **hyper,
                         launch=kernels.launchers.get("lamb.step"))
    else:
        lamb_step_reference(layout, params, grads, exp_avg, exp_avg_sq, **hyper)


def lamb_step_triton(layout: LambLayout, params: Tensor, grads: Tensor, exp_avg: Tensor,
                     exp_avg_sq: Tensor, *, lr: float | Tensor, betas: tuple[float, float],
                     eps: float, step: int | Tensor, ok: Tensor | None = None,
                     bias_correction: bool = True, grad_averaging: bool = True,
                     launch: Callable | None = None) -> None:
    """lamb_step's Triton kernels, launched by bertperf.kernels.triton.lamb.step (or `launch`,
    a stand-in with its signature)."""
    if launch is None:
        from bertperf.kernels.triton import lamb as kernels
        launch = kernels.step
    coef = _coefficients(betas, step, ok, bias_correction, params.device)
    if ok is not None:
        lr = lr * ok.to(torch.float64)
    lr = (lr.reshape(1).to(params.device, torch.float32) if isinstance(lr, Tensor)
          else torch.full((1,), lr, device=params.device, dtype=torch.float32))
    beta3 = 1.0 - betas[0] if grad_averaging else 1.0
    launch(layout, params, grads, exp_avg, exp_avg_sq, coef, lr, beta3, 1.0 - betas[1], eps)


@torch.no_grad()
def lamb_step_reference(layout: LambLayout, params: Tensor, grads: Tensor, exp_avg: Tensor,
                        exp_avg_sq: Tensor, *, lr: float | Tensor, betas: tuple[float, float],
                        eps: float, step: int | Tensor, ok: Tensor | None = None,
                        bias_correction: bool = True, grad_averaging: bool = True) -> None:
    """The same step one tensor at a time, each operation as bertperf.optim.lamb.Lamb rounds
    it."""
    decay1, decay2, bc1, bc2 = _coefficients(betas, step, ok, bias_correction, params.device)
    if ok is not None:
        lr = lr * ok.to(torch.float64)
    if isinstance(lr, Tensor):  # Lamb multiplies [n] ratios by it: in their dtype
        lr = lr.to(params.dtype)
    beta3 = 1.0 - betas[0] if grad_averaging else 1.0
    for i, (wd, adapt) in enumerate(zip(layout.weight_decays, layout.adapts)):
        part = slice(layout.bounds[i], layout.bounds[i + 1])
        w, m, v = params[part], exp_avg[part], exp_avg_sq[part]
        g = grads[part].to(w.dtype)
        m.mul_(decay1).add_(g, alpha=beta3)
        v.mul_(decay2).addcmul_(g, g, value=1.0 - betas[1])
        u = (v / bc2).sqrt_().add_(eps).reciprocal_().mul_(m).div_(bc1)
        if wd != 0.0:
            u.add_(w, alpha=wd)
        if adapt:
            w_norm, u_norm = w.norm(), u.norm()
            ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
            w.add_(u.mul_(ratio * -lr))
        elif isinstance(lr, Tensor):
            w.add_(u.mul_(-lr))
        else:
            w.add_(u, alpha=-float(lr))
