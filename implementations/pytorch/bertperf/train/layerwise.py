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
  parameters set requires_grad=False and their layers run under no_grad (LAYERWISE_TRAIN=new;
  the embeddings with them or, LAYERWISE_EMBEDDINGS=trained, all but the word embeddings),
  the plan rebuilt by `parallelize` over the trained parameters (a new LAMB, flat or sharded,
  DDP, compile), LAMB's moments per LAYERWISE_OPTIMIZER, the LR schedule per LAYERWISE_SCHEDULE,
  the `layerwise_stage` MLPerf event logged; it returns the new plan and schedule (a StagePlan)
  for the loop to take.
- `StagePart`, a checkpoint part loaded before the model: the stage and the step it began at; a
  resumed run re-enters that stage (the model grown, the plan rebuilt, the trainer handed them)
  before the model, optimizer and schedule are loaded into it.
- `Stages.rehearse`: the compile warm-up enters every stage in turn before the run starts, and
  goes back to the first (`enter` also shrinks the encoder).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch
from torch import nn

from bertperf.config import RunConfig, layerwise_stages
from bertperf.mlperf.log import MLPerfLogger
from bertperf.model import BertForPreTraining
from bertperf.model.bert_config import ENCODER_LAYER, layer_part
from bertperf.optim import DynamicLossScaler, LinearWarmupPolyDecay, run_schedule, warmup_end
from bertperf.train.checkpoint import Progress
from bertperf.train.dist import Dist
from bertperf.train.parallel import Plan, parallelize

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


def warnings(cfg: RunConfig, batch: int) -> list[str]:
    """What a valid LAYERWISE schedule does badly (train.checks.run_warnings; `batch`: the global
    batch): LAYERWISE_EMBEDDINGS=frozen where no stage trains only new layers (it acts in no
    stage); the first stage that freezes the layers below it (trains only new ones) when it
    begins before the LR warm-up ends: those layers froze having trained only below the peak
    LR (at the start of training, often before they learnt anything)."""
    if cfg.layerwise.layerwise is None:
        return []
    end, before = warmup_end(cfg.optim), 0
    stages = layerwise_stages(cfg.layerwise.layerwise)
    trains = [mode or cfg.layerwise.layerwise_train for _, _, mode in stages[1:]]
    if cfg.layerwise.layerwise_embeddings == "frozen" and "new" not in trains:
        return ["LAYERWISE_EMBEDDINGS=frozen: no stage trains only its new layers (LAYERWISE_TRAIN"
                f"={cfg.layerwise.layerwise_train}, no stage ending in :new), and only such a "
                "stage freezes the embeddings, so it has no effect"]
    for i, (_, samples, mode) in enumerate(stages):
        begins = -(-before // batch)  # the stage begins at the first step after `before` samples
        if i and (mode or cfg.layerwise.layerwise_train) == "new" and begins <= end:
            return [f"LAYERWISE={cfg.layerwise.layerwise!r}: stage {i + 1} freezes the "
                    f"{stages[i - 1][0]} layers below it at step {begins}, before the LR warm-up "
                    f"ends at step {end}: they froze having trained only below the peak LR "
                    "(longer stages, or a shorter warm-up)"]
        before += samples or 0
    return []


def frozen_parameters(core: BertForPreTraining, frozen: int, embeddings: str
                      ) -> list[nn.Parameter]:
    """What a stage that runs its bottom `frozen` layers forward only does not train: those
    layers and the embeddings (LAYERWISE_EMBEDDINGS=frozen), or those layers and every embedding
    parameter but the word embeddings, which the MLM head's tied output projection trains
    (trained); nothing when `frozen` is 0."""
    if not frozen:
        return []
    emb = core.bert.embeddings
    kept = [emb.word_embeddings.weight] if embeddings == "trained" else []
    return [*(p for p in emb.parameters() if all(p is not k for k in kept)),
            *(p for layer in core.bert.encoder.layer[:frozen] for p in layer.parameters())]


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


class StagePlan(NamedTuple):
    """A stage's plan and LR schedule, for the trainer to take."""

    plan: Plan
    scheduler: LinearWarmupPolyDecay


class Stages:
    """The run's stages and the one it is in (module docstring), for the model `core` trained
    on `dist` and `device`. Without LAYERWISE: one stage, the model untouched, `before_step` a
    comparison with infinity."""

    def __init__(self, cfg: RunConfig, core: BertForPreTraining, dist: Dist,
                 device: torch.device) -> None:
        self.cfg, self.core, self.dist, self.device = cfg, core, dist, device
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

    def before_step(self, progress: Progress, plan: Plan, scheduler: LinearWarmupPolyDecay,
                    scaler: DynamicLossScaler | None, log: MLPerfLogger) -> StagePlan | None:
        """The loop's call before each step, with the run's plan, schedule and loss scaler:
        begin every stage whose turn has come and return the last one's plan and schedule (None
        where the stage goes on); log each stage begun, and the stage a run starts in at its
        first step."""
        change = None
        while progress.samples >= self.stage.end:
            change = self.enter(self.index + 1, plan, scheduler, scaler, at_step=progress.step)
            plan, scheduler = change
            self._log(log, progress)
        if not self.logged:
            self._log(log, progress)
        return change

    def _log(self, log: MLPerfLogger, progress: Progress) -> None:
        log.layerwise_stage(self.index + 1, self.stage.layers, self.stage.train, progress.step,
                            progress.samples)
        self.logged = True

    def frozen_layers(self, index: int) -> int:
        """The layers stage `index` runs forward only: the earlier stage's, when it trains only
        new ones."""
        return self.stages[index - 1].layers if index and self.stages[index].train == "new" else 0

    def enter(self, index: int, plan: Plan, scheduler: LinearWarmupPolyDecay,
              scaler: DynamicLossScaler | None, at_step: int | None) -> StagePlan:
        """Make stage `index` the model's: grow the encoder, set what trains; its plan and
        schedule, rebuilt from the run's `plan` (released), `scheduler` and `scaler`.
        `at_step`: a live boundary after that many optimizer steps (new layers initialised per
        LAYERWISE_INIT, moments per LAYERWISE_OPTIMIZER); None: a resume, whose checkpoint then
        loads the weights, moments and schedule."""
        lw, core = self.cfg.layerwise, self.core
        encoder = core.bert.encoder
        old_depth, stage = len(encoder.layer), self.stages[index]
        boundary = at_step is not None
        carry = boundary and lw.layerwise_optimizer == "copy"
        saved = plan.optimizer.state_dict() if carry else None  # sharded: collective
        sources = copy_sources(old_depth, stage.layers) if lw.layerwise_init == "copy" else {}
        with torch.no_grad():
            for j in reversed(range(stage.layers, old_depth)):  # an earlier stage (warm-up's)
                del encoder.layer._modules[str(j)]  # (ModuleList's del: a compile guard fails)
            for j in range(old_depth, stage.layers):
                encoder.layer.append(self.spare[j])
                if boundary and j in sources:
                    for dst, src in zip(encoder.layer[j].parameters(),
                                        encoder.layer[sources[j]].parameters()):
                        dst.copy_(src)
        frozen = self.frozen_layers(index)
        frozen_params = {id(p) for p in frozen_parameters(core, frozen,
                                                          lw.layerwise_embeddings)}
        for p in core.parameters():
            p.grad = None
            p.requires_grad_(id(p) not in frozen_params)
            if id(p) in frozen_params:  # out of the last FlatLamb's buffer, which can go
                p.data = p.data.clone()
        encoder.frozen = frozen
        plan.release()
        new = parallelize(core, self.cfg, self.dist, self.device, scaler, plan.traffic,
                          kernels=plan.kernels)
        if saved is not None:
            new.optimizer.load_state_dict(carried_moments(saved, new.optimizer, sources))
        if boundary:
            self.began_at_step = at_step
        self.index = index
        return StagePlan(new, self._schedule(new.optimizer, scheduler))

    def rehearse(self, resume: Callable[[int], None], steps: Callable[[], None]) -> None:
        """The compile warm-up's tour (train.loop.warm_up): `steps()` in the current stage and
        in each later one, entered with `resume` as a checkpoint's stage is (no weights copied),
        so that every stage's plan compiles before the run starts; the layers that wait outside
        the model are put back as they were (the caller restores the rest, the stage among
        them, from Trainer.parts())."""
        steps()
        if not self.staged:
            return
        first, waiting = self.index, self.spare[self.stage.layers:]
        kept = [{k: v.clone() for k, v in layer.state_dict().items()} for layer in waiting]
        for index in range(first + 1, len(self.stages)):
            resume(index)
            steps()
        for layer, state in zip(waiting, kept):
            layer.load_state_dict(state)

    def _schedule(self, optimizer: torch.optim.Optimizer,
                  old: LinearWarmupPolyDecay) -> LinearWarmupPolyDecay:
        """The stage's LR schedule: the run's going on (continue), or warm-up again from the
        stage's first step and the decay over the steps left (restart)."""
        o = self.cfg.optim
        if self.cfg.layerwise.layerwise_schedule == "restart":
            return run_schedule(optimizer, o, o.max_steps - self.began_at_step)
        new = run_schedule(optimizer, o)
        new.load_state_dict(old.state_dict())
        return new


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
            part = layer_part(name)
            source = f"{ENCODER_LAYER}{sources[part[0]]}.{part[1]}" \
                if part and part[0] in sources else name
            if source in by_name:
                state["state"][index] = {k: v.clone() for k, v in by_name[source].items()}
    return state


@dataclass
class StagePart:
    """The checkpoint part of a LAYERWISE run: the stage and the step it began at. Loading
    calls `resume` with a stage the run is not in, which re-enters it (the encoder grown, the
    plan rebuilt, both handed to the trainer; the model, optimizer and schedule parts loaded
    after it fill them)."""

    stages: Stages
    resume: Callable[[int], None]

    def state_dict(self) -> dict[str, int]:
        return {"stage": self.stages.index, "began_at_step": self.stages.began_at_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.stages.began_at_step = int(state["began_at_step"])
        index = int(state["stage"])
        if index != self.stages.index:
            self.resume(index)
