"""Layerwise training (LAYERWISE, open division): the encoder trained in stages of growing depth,
progressive stacking (Gong et al. 2019: every layer trains, new layers copied from the ones below)
or multi-stage layerwise training, MSLT (Yang et al. 2020: only a stage's new top layers train, the
layers below run forward only). The one owner of the stages and of what happens at a boundary
(docs/design.md, "The trainer's junction"):

- `Stages` is built with the model: the whole model is drawn as without LAYERWISE (so the initial
  weights, and a run without LAYERWISE, are unchanged), then its encoder keeps the first stage's
  layers (`StagedEncoder`, the same state-dict names); the layers above wait outside the model
  (not in its parameters, state dict, optimizer or DDP) until their stage.
- `Stages.before_step`, the loop's one call per step: at the first step after a stage's samples
  are trained, the next stage begins: its layers appended on top (LAYERWISE_INIT), the frozen
  parameters set requires_grad=False and their layers run under no_grad (LAYERWISE_TRAIN=new),
  the plan rebuilt by `parallelize` over the trained parameters (a new LAMB, flat or sharded,
  DDP, compile), LAMB's moments per LAYERWISE_OPTIMIZER, the LR schedule per LAYERWISE_SCHEDULE,
  the `layerwise_stage` MLPerf event logged.
- `StagePart`, a checkpoint part loaded before the model: the stage and the step it began at; a
  resumed run re-enters that stage (the model grown, the plan rebuilt) before the model, optimizer
  and schedule are loaded into it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from bertperf.config import RunConfig, layerwise_stages
from bertperf.model import BertForPreTraining
from bertperf.optim import LinearWarmupPolyDecay, resolve_warmup
from bertperf.mlperf.log import MLPerfLogger
from bertperf.train.checkpoint import Checkpointer, Progress
from bertperf.train.dist import Dist
from bertperf.train.parallel import Plan, parallelize


class Trainer(Protocol):
    """What a stage boundary reads and rebuilds of the run (train.loop.Trainer has it)."""

    dist: Dist
    device: torch.device
    plan: Plan
    scheduler: LinearWarmupPolyDecay
    scaler: Any
    log: MLPerfLogger
    progress: Progress
    checkpointer: Checkpointer

LAYER = "bert.encoder.layer."


@dataclass(frozen=True)
class Stage:
    """One stage of a run."""

    layers: int
    """The encoder's depth."""
    end: float
    """Samples trained (counted from the run's start) at which the next stage begins (inf: the
    last stage)."""
    train: str
    """"all" or "new" (only the layers this stage adds, the pooler and the heads)."""


def stages_of(cfg: RunConfig, full_depth: int) -> list[Stage]:
    """The run's stages; one stage of the whole model without LAYERWISE."""
    lw = cfg.layerwise
    if lw.layerwise is None:
        return [Stage(full_depth, math.inf, "all")]
    out, end = [], 0
    for i, (layers, samples, mode) in enumerate(layerwise_stages(lw.layerwise)):
        end = math.inf if samples is None else end + samples
        out.append(Stage(layers, end, "all" if i == 0 else mode or lw.layerwise_train))
    return out


def copy_sources(old: int, new: int) -> dict[int, int]:
    """{new layer: the layer it copies} when the encoder grows from `old` to `new` layers: the
    top k = min(old, new - old) layers, repeated in order (3 -> 6: 3,4,5 from 0,1,2; 6 -> 9:
    6,7,8 from 3,4,5)."""
    k = min(old, new - old)
    return {j: old - k + (j - old) % k for j in range(old, new)} if k > 0 else {}


class StagedEncoder(nn.Module):
    """BertEncoder's forward over the stage's layers (`layer`, as BertEncoder's, so parameter
    and state-dict names are the same): the bottom `frozen` of them under no_grad (no
    activations kept for a backward), the rest as usual."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(layers)
        self.frozen = 0

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        if self.frozen:
            with torch.no_grad():
                for layer in self.layer[:self.frozen]:
                    x = layer(x, cu_seqlens, max_seqlen)
        for layer in self.layer[self.frozen:]:
            x = layer(x, cu_seqlens, max_seqlen)
        return x


class Stages:
    """The run's stages and the one it is in (module docstring). Without LAYERWISE: one stage,
    the model untouched, `before_step` a comparison with infinity."""

    def __init__(self, cfg: RunConfig, core: BertForPreTraining) -> None:
        self.cfg, self.core = cfg, core
        self.staged = cfg.layerwise.layerwise is not None
        self.stages = stages_of(cfg, core.config.num_hidden_layers)
        self.index = 0
        self.began_at_step = 0
        """The optimizer steps done when the current stage began (LAYERWISE_SCHEDULE=restart's
        schedule counts from there)."""
        self.logged = not self.staged
        if self.staged:
            self.spare = list(core.bert.encoder.layer)
            """Every layer the model will have, drawn with the whole model."""
            core.bert.encoder = StagedEncoder(self.spare[:self.stages[0].layers])

    @property
    def stage(self) -> Stage:
        return self.stages[self.index]

    def before_step(self, trainer: Trainer) -> None:
        """The loop's call before each step: begin every stage whose turn has come (the plan,
        schedule and checkpoint parts of `trainer` replaced), and log the stage a run starts in
        at its first step."""
        while trainer.progress.samples >= self.stage.end:
            self.enter(trainer, self.index + 1, boundary=True)
            self._log(trainer)
        if not self.logged:
            self._log(trainer)

    def _log(self, trainer: Trainer) -> None:
        trainer.log.layerwise_stage(self.index + 1, self.stage.layers, self.stage.train,
                                    trainer.progress.step, trainer.progress.samples)
        self.logged = True

    def frozen_layers(self, index: int) -> int:
        """The layers stage `index` runs forward only: the earlier stage's, when it trains only
        new ones."""
        return self.stages[index - 1].layers if index and self.stages[index].train == "new" else 0

    def enter(self, trainer: Trainer, index: int, boundary: bool) -> None:
        """Make stage `index` the run's: grow the encoder, set what trains, rebuild the plan and
        the schedule. `boundary`: a live boundary (new layers initialised per LAYERWISE_INIT,
        moments per LAYERWISE_OPTIMIZER); else a resume, whose checkpoint then loads the
        weights, moments and schedule."""
        lw, core = self.cfg.layerwise, self.core
        encoder = core.bert.encoder
        old_depth, stage = len(encoder.layer), self.stages[index]
        carry = boundary and lw.layerwise_optimizer == "copy"
        saved = trainer.plan.optimizer.state_dict() if carry else None  # sharded: collective
        sources = copy_sources(old_depth, stage.layers) if lw.layerwise_init == "copy" else {}
        with torch.no_grad():
            for j in range(old_depth, stage.layers):
                encoder.layer.append(self.spare[j])
                if boundary and j in sources:
                    for dst, src in zip(encoder.layer[j].parameters(),
                                        encoder.layer[sources[j]].parameters()):
                        dst.copy_(src)
        frozen = self.frozen_layers(index)
        still = [core.bert.embeddings, *encoder.layer[:frozen]] if frozen else []
        frozen_params = {id(p) for m in still for p in m.parameters()}
        for p in core.parameters():
            p.grad = None
            p.requires_grad_(id(p) not in frozen_params)
            if id(p) in frozen_params:  # out of the last FlatLamb's buffer, which can go
                p.data = p.data.clone()
        encoder.frozen = frozen
        trainer.plan.release()
        plan = parallelize(core, self.cfg, trainer.dist, trainer.device, trainer.scaler,
                           trainer.plan.traffic)
        if saved is not None:
            plan.optimizer.load_state_dict(carried_moments(saved, plan.optimizer, sources))
        if boundary:
            self.began_at_step = trainer.progress.step
        scheduler = self._schedule(plan.optimizer, trainer.scheduler)
        trainer.plan, trainer.scheduler = plan, scheduler
        trainer.checkpointer.parts.update(optimizer=plan.optimizer, scheduler=scheduler)
        self.index = index

    def _schedule(self, optimizer: torch.optim.Optimizer,
                  old: LinearWarmupPolyDecay) -> LinearWarmupPolyDecay:
        """The stage's LR schedule: the run's going on (continue), or warm-up again from the
        stage's first step and the decay over the steps left (restart)."""
        o = self.cfg.optim
        warmup, start = resolve_warmup(o.warmup_steps, o.start_warmup_step, o.max_steps,
                                       o.warmup_proportion)
        if self.cfg.layerwise.layerwise_schedule == "restart":
            return LinearWarmupPolyDecay(optimizer, warmup, o.max_steps - self.began_at_step,
                                         start)
        new = LinearWarmupPolyDecay(optimizer, warmup, o.max_steps, start)
        new.load_state_dict(old.state_dict())
        return new

    def parts(self, trainer: Trainer, parts: dict[str, Any]) -> dict[str, Any]:
        """The checkpoint parts with this stage's (a LAYERWISE run: after the fingerprint,
        before the model, whose shape it sets); `parts` unchanged otherwise."""
        if not self.staged:
            return parts
        first = {"config": parts["config"], "layerwise": StagePart(self, trainer)}
        return {**first, **{k: v for k, v in parts.items() if k not in first}}


def carried_moments(saved: dict[str, Any], optimizer: torch.optim.Optimizer,
                    sources: dict[int, int]) -> dict[str, Any]:
    """`optimizer`'s state dict with LAYERWISE_OPTIMIZER=copy's moments from the last stage's
    `saved` one (Lamb's format, by parameter name): a parameter keeps its own, a new layer copied
    from another (`sources`) takes that layer's; the step count goes on. Moments the last
    optimizer did not hold (frozen or fresh layers) stay zero."""
    by_name, step = {}, None
    for group in saved["param_groups"]:
        step = group.get("step", step)
        for index, name in zip(group["params"], group["param_names"]):
            if index in saved["state"]:
                by_name[name] = saved["state"][index]
    state = optimizer.state_dict()
    state["state"] = {}
    for group in state["param_groups"]:
        if step is not None:
            group["step"] = step
        for index, name in zip(group["params"], group["param_names"]):
            source = name
            if name.startswith(LAYER):
                j, rest = name[len(LAYER):].split(".", 1)
                if int(j) in sources:
                    source = f"{LAYER}{sources[int(j)]}.{rest}"
            if source in by_name:
                state["state"][index] = {k: v.clone() for k, v in by_name[source].items()}
    return state


@dataclass
class StagePart:
    """The checkpoint part of a LAYERWISE run: the stage and the step it began at. Loading
    re-enters that stage (the encoder grown, the plan rebuilt; the model, optimizer and
    schedule parts loaded after it fill them)."""

    stages: Stages
    trainer: Trainer

    def state_dict(self) -> dict[str, int]:
        return {"stage": self.stages.index, "began_at_step": self.stages.began_at_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.stages.began_at_step = int(state["began_at_step"])
        index = int(state["stage"])
        if index != self.stages.index:
            self.stages.enter(self.trainer, index, boundary=False)
