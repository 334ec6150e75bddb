"""LAMB with its state sharded over the data-parallel ranks (ZeRO stage 1) over FlatLamb's flat
buffers, as apex's DistributedFusedLAMB (docs/design.md, SHARDED_LAMB). Every rank holds the
whole model and its local gradient buffer (no DDP), padded to world_size * S elements (S =
shard_numel); rank r owns [r*S, (r+1)*S). A step (bertperf.optim.clip.clipped_step):
1. `step_grads` reduce-scatters the gradients, averaged over the ranks; 2. the global norm is
the shards' summed over the ranks (`norm_over_ranks`), clipped or skipped as usual; 3. the rank
updates its shard, with moments for it only, the trust ratios per whole tensor (or row block)
from one all-reduce of the shards' sums of squares; 4. the weights are all-gathered in place.
The weights agree with the replicated optimizer's within 1e-6 (bit for bit on one rank).
state_dict() is Lamb's format with whole tensors (a collective), loadable at any world size."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as tdist
from torch import Tensor

from bertperf.kernels.lamb import _coefficients
from bertperf.optim.flat_lamb import FlatLamb
from bertperf.optim.lamb import Lamb


# torch 2.13 renamed reduce_scatter_tensor and all_gather_into_tensor (the older names warn)
_reduce_scatter = getattr(tdist, "reduce_scatter_single", None) or tdist.reduce_scatter_tensor
_all_gather = getattr(tdist, "all_gather_single", None) or tdist.all_gather_into_tensor


def shard_numel(numel: int, world_size: int) -> int:
    """Elements each rank's shard holds when `numel` are split over `world_size` ranks (the last
    shard is padded with zeros)."""
    return -(-numel // world_size)


class ShardedLamb(FlatLamb):
    """FlatLamb with its moments and updates sharded over the ranks of `group` (module
    docstring). Arguments as FlatLamb's, and group: the process group (None: the default
    group when torch.distributed is initialized, else one rank). Every rank must build it over
    the same parameters, in the same order."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], *,
                 group: tdist.ProcessGroup | None = None, **options: Any) -> None:
        active = tdist.is_available() and tdist.is_initialized()
        self._group = group
        self.world_size = tdist.get_world_size(group) if active else 1
        self.rank = tdist.get_rank(group) if active else 0
        super().__init__(params, **options)

    # ---- layout ---------------------------------------------------------------------------

    def _buffer_numel(self) -> int:
        return shard_numel(self._layout.numel, self.world_size) * self.world_size

    def _make_moments(self) -> None:
        """The rank's shard of the moments, and where its parts of the tensors lie in it."""
        size = shard_numel(self._layout.numel, self.world_size)
        self._shard = slice(self.rank * size, (self.rank + 1) * size)
        self._exp_avg = torch.zeros(size, dtype=torch.float32, device=self._device)
        self._exp_avg_sq = torch.zeros_like(self._exp_avg)
        # the reduced gradients of the shard (one rank: the gradient buffer itself)
        self._shard_grads = self._grads if self.world_size == 1 else torch.zeros_like(self._exp_avg)
        # the segments: tensor i of the layout (a row block) meets the shard in [a, b)
        self._segments: list[tuple[int, int, int]] = []
        for i, (lo, hi) in enumerate(zip(self._layout.bounds, self._layout.bounds[1:])):
            a, b = max(lo, self._shard.start), min(hi, self._shard.stop)
            if a < b:
                self._segments.append((i, a - self._shard.start, b - self._shard.start))
        adapted = [i for i, _, _ in self._segments if self._layout.adapts[i]]
        self._adapted_index = torch.tensor(adapted, dtype=torch.int64, device=self._device)
        self._tensor_index = torch.tensor(
            [i for i, _, _ in self._segments], dtype=torch.int64, device=self._device)

    def state_nbytes(self) -> int:
        """Bytes of this rank's optimizer state tensors (its shards of exp_avg and
        exp_avg_sq)."""
        return self._exp_avg.nbytes + self._exp_avg_sq.nbytes

    # ---- communication --------------------------------------------------------------------

    def step_grads(self) -> list[Tensor]:
        """Reduce-scatter the local gradient buffer (module docstring, 1.): this rank's shard
        of the gradients averaged over ranks, a buffer clipped_step then unscales, clips and
        cleans in place. The local buffer is left divided by the world size."""
        grads = self.flat_grads()
        if self.world_size > 1:
            grads.mul_(1.0 / self.world_size)
            _reduce_scatter(self._shard_grads, grads, group=self._group)
        return [self._shard_grads]

    def norm_over_ranks(self, norm: Tensor) -> Tensor:
        """The global norm from this rank's shard's norm (a 0-d tensor): sqrt of the squares
        summed over ranks (one all-reduce of one number, in float64)."""
        if self.world_size == 1:
            return norm
        squares = norm.double().square()
        tdist.all_reduce(squares, group=self._group)
        return squares.sqrt().to(norm.dtype)

    def _gathered(self, shard: Tensor) -> Tensor:
        """The whole flat tensor (not padded) from every rank's shard of it."""
        if self.world_size == 1:
            return shard[:self._layout.numel]
        out = torch.empty(self._buffer_numel(), dtype=shard.dtype, device=shard.device)
        _all_gather(out, shard, group=self._group)
        return out[:self._layout.numel]

    # ---- step -----------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, *,  # type: ignore[override]
             ok: Tensor | None = None) -> float | None:
        """One LAMB update of this rank's shard, then the weights all-gathered (module
        docstring, 3. and 4.). The shard's gradients are `step_grads()`, as clipped_step
        leaves them; ok: a 0-d bool tensor, False for a step skipped on the device."""
        loss, counts = self._begin_step(closure, ok)
        self._update_shard(counts[0], ok)
        if self.world_size > 1:
            _all_gather(self._weights, self._weights[self._shard], group=self._group)
        return loss

    def _update_shard(self, step: Tensor, ok: Tensor | None) -> None:
        """bertperf.kernels.lamb.lamb_step_reference's arithmetic on the shard, the trust
        ratios' sums of squares completed over ranks."""
        first = self.param_groups[0]
        betas, layout = first["betas"], self._layout
        decay1, decay2, bc1, bc2 = _coefficients(betas, step, ok, first["bias_correction"],
                                                 self._device)
        lr = first["lr"]
        if ok is not None:
            lr = lr * ok.to(torch.float64)
        if isinstance(lr, Tensor):
            lr = lr.to(torch.float32)
        beta3 = 1.0 - betas[0] if first["grad_averaging"] else 1.0
        w, g = self._weights[self._shard], self._shard_grads
        m, v = self._exp_avg, self._exp_avg_sq
        m.mul_(decay1).add_(g, alpha=beta3)
        v.mul_(decay2).addcmul_(g, g, value=1.0 - betas[1])
        u = (v / bc2).sqrt_().add_(first["eps"]).reciprocal_().mul_(m).div_(bc1)
        ws = [w[a:b] for _, a, b in self._segments]
        us = [u[a:b] for _, a, b in self._segments]
        for decay in {layout.weight_decays[i] for i, _, _ in self._segments} - {0.0}:
            picked = [k for k, (i, _, _) in enumerate(self._segments)
                      if layout.weight_decays[i] == decay]
            torch._foreach_add_([us[k] for k in picked], [ws[k] for k in picked], alpha=decay)
        scale = self._scales(ws, us, lr)
        if scale is not None:
            torch._foreach_mul_(us, list(scale.unbind(0)))
            torch._foreach_add_(ws, us)
        elif isinstance(lr, Tensor):
            torch._foreach_mul_(us, -lr)
            torch._foreach_add_(ws, us)
        else:
            torch._foreach_add_(ws, us, alpha=-float(lr))

    def _scales(self, ws: list[Tensor], us: list[Tensor], lr: float | Tensor) -> Tensor | None:
        """Each segment's factor -lr * ratio (ratio 1 where its tensor is not adapted), one
        float32 per segment; None when no tensor of the model is adapted. The squares of the
        norms are summed over the ranks' segments of each tensor in float64 (one all-reduce),
        so a tensor within one shard gets exactly its own norms."""
        layout = self._layout
        if not any(layout.adapts):
            return None
        sums = torch.zeros(2, len(layout.numels), dtype=torch.float64, device=self._device)
        adapted = [k for k, (i, _, _) in enumerate(self._segments) if layout.adapts[i]]
        if adapted:
            for row, parts in enumerate((ws, us)):
                norms = torch._foreach_norm([parts[k] for k in adapted], 2)
                sums[row].index_add_(0, self._adapted_index,
                                     torch.stack(norms).double().square())
        if self.world_size > 1:
            tdist.all_reduce(sums, group=self._group)
        w_norm, u_norm = sums.sqrt().float().unbind(0)
        ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
        ratio = torch.where(layout.adapt.bool(), ratio, 1.0)
        return ratio[self._tensor_index] * -lr

    # ---- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Lamb's format with whole tensors (the moments all-gathered: a collective, every
        rank calls it; module docstring)."""
        state = Lamb.state_dict(self)
        m, v = self._gathered(self._exp_avg), self._gathered(self._exp_avg_sq)
        state["state"] = {i: {"exp_avg": a, "exp_avg_sq": b}
                          for i, (a, b) in enumerate(zip(self._views(m), self._views(v)))}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load Lamb's, FlatLamb's or ShardedLamb's state_dict, written at any world size: the
        groups' hyper-parameters and step counts, and this rank's shard of the moments (zeros
        for a parameter without state: Lamb makes them at its first step)."""
        Lamb.load_state_dict(self, state_dict)
        start = 0
        for p in self._params:
            a, b = max(start, self._shard.start), min(start + p.numel(), self._shard.stop)
            if a < b:
                loaded = self.state[p]
                for key, shard in (("exp_avg", self._exp_avg), ("exp_avg_sq", self._exp_avg_sq)):
                    part = shard[a - self._shard.start:b - self._shard.start]
                    if key in loaded:
                        part.copy_(loaded[key].reshape(-1)[a - start:b - start])
                    else:
                        part.zero_()
            start += p.numel()
        self.state.clear()
        counts = {float(g.get("step", 0.0)) for g in self.param_groups if g["params"]}
        if len(counts) > 1:
            raise ValueError(f"ShardedLamb: the groups' step counts differ ({sorted(counts)})")
