"""bertperf.optim.ShardedLamb (ZeRO-1 LAMB) on 1, 2 and 4 gloo ranks against the replicated
optimizer (FlatLamb under DDP, as the trainer runs it): the same weights within 1e-6 after
steps with gradient accumulation, clipping, loss scaling and a skipped non-finite step; the
optimizer state per rank falling as 1/world_size; checkpoints (whole tensors) written at 2 ranks
resuming at 4 and at 1, into the sharded and the replicated optimizer, and back; gloo's
reduce-scatter and in-place all-gather as the module docstring states them; the trainer's
SHARDED_LAMB switch."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bertperf.errors import UserError
from bertperf.optim import (DynamicLossScaler, FlatLamb, Lamb, LinearWarmupPolyDecay, ShardedLamb,
                            clipped_step, param_groups)
from bertperf.optim.sharded_lamb import _all_gather, _reduce_scatter, shard_numel
from bertperf.train.dist import Dist
from tests.support.models import tiny_bert

STEPS, SAVED_AT, SKIPPED = 6, 3, 4  # steps of a run; the checkpoint's step; the non-finite step
GLOBAL, GA = 16, 2  # samples of a micro-batch over all ranks; micro-batches a step


def small_model() -> nn.Module:
    """197 parameters in 6 tensors, the first Linear's as 3 row blocks (as BERT's fused q/k/v):
    shards of 2 and 4 ranks cut tensors and blocks apart."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 12), nn.LayerNorm(12), nn.Tanh(), nn.Linear(12, 5))
    model[0].weight.lamb_row_blocks = model[0].bias.lamb_row_blocks = 3
    return model


def micro_batches(step: int, rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's part of step `step`'s GA micro-batches (the same global batch at any world
    size)."""
    g = torch.Generator().manual_seed(1000 + step)
    part = slice(rank * GLOBAL // world, (rank + 1) * GLOBAL // world)
    return [(torch.randn(GLOBAL, 8, generator=g)[part], torch.randn(GLOBAL, 5, generator=g)[part])
            for _ in range(GA)]


class Run:
    """A model, its optimizer ("sharded": ShardedLamb; "replicated": FlatLamb under DDP on more
    than one rank, Lamb on one), schedule and loss scaler, trained as the trainer does: GA
    micro-batches (DDP reducing on the last), the loss of a rank scaled so that the average over
    ranks is the global mean, clipped_step."""

    def __init__(self, kind: str, world: int) -> None:
        self.core = small_model()
        groups = param_groups(self.core, 0.01)
        cls = ShardedLamb if kind == "sharded" else FlatLamb if world > 1 else Lamb
        self.opt = cls(groups, lr=0.05)
        self.model = DistributedDataParallel(self.core) if kind == "replicated" and world > 1 \
            else self.core
        self.sched = LinearWarmupPolyDecay(self.opt, 2, STEPS)
        self.scaler = DynamicLossScaler(init_scale=2.0**4)

    def step(self, step: int, rank: int, world: int) -> None:
        micro = micro_batches(step, rank, world)
        for i, (x, y) in enumerate(micro):
            last = i == len(micro) - 1 or self.model is self.core
            with self.model.no_sync() if not last else torch.enable_grad():
                loss = (self.model(x) - y).square().sum() * world / (GLOBAL * GA)
                if step == SKIPPED and rank == world - 1:
                    loss = loss * float("inf")
                self.scaler.scale_loss(loss).backward()
        outcome = clipped_step(self.opt, 1.0, self.scaler)
        self.sched.step(outcome.ok)
        self.opt.zero_grad()

    def checkpoint(self) -> dict:
        return {"model": self.core.state_dict(), "optimizer": self.opt.state_dict(),
                "scheduler": self.sched.state_dict(), "scaler": self.scaler.state_dict()}

    def load(self, state: dict) -> None:
        self.core.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])

    def weights(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.core.parameters()]


def check_collectives(rank: int, world: int) -> bool:
    """ShardedLamb's reduce-scatter equals all_reduce's slice, its all-gather works in place (the
    input a slice of the output), on gloo, for a size that is not a round number."""
    size = 1_001
    x = torch.randn(size * world, generator=torch.Generator().manual_seed(rank))
    whole, shard = x.clone(), torch.empty(size)
    tdist.all_reduce(whole)
    _reduce_scatter(shard, x)
    gathered = torch.zeros(size * world)
    gathered[rank * size:(rank + 1) * size] = rank + 1
    _all_gather(gathered, gathered[rank * size:(rank + 1) * size])
    return torch.equal(shard, whole[rank * size:(rank + 1) * size]) and torch.equal(
        gathered, torch.arange(1.0, world + 1).repeat_interleave(size))


def train(rank: int, world: int, out: Path, resume: Path | None) -> dict:
    """Both optimizers side by side from scratch for STEPS steps (checkpoints at SAVED_AT), and
    with `resume`, a sharded run going on from that checkpoint. This rank's results."""
    runs = {kind: Run(kind, world) for kind in ("sharded", "replicated")}
    result: dict = {"state_nbytes": runs["sharded"].opt.state_nbytes()}
    for step in range(1, STEPS + 1):
        for kind, run in runs.items():
            run.step(step, rank, world)
            if step == SAVED_AT:
                state = run.checkpoint()  # every rank: the sharded state is gathered
                if rank == 0:
                    torch.save(state, out / f"{kind}_{world}.pt")
    for kind, run in runs.items():
        result[kind] = run.weights()
        result[f"{kind}_steps"] = float(run.opt.param_groups[0]["step"])
    if resume is not None:
        again = Run("sharded", world)
        again.load(torch.load(resume, weights_only=True))
        for step in range(SAVED_AT + 1, STEPS + 1):
            again.step(step, rank, world)
        result["resumed"] = again.weights()
    return result


def worker(rank: int, world: int, out: Path, resume: Path | None) -> None:
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{out / 'store'}", rank=rank,
                             world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        result = {**train(rank, world, out, resume), "collectives": check_collectives(rank, world)}
        everyone: list = [None] * world
        tdist.all_gather_object(everyone, result)
        if rank == 0:
            torch.save(everyone, out / f"result_{world}.pt")
    finally:
        Dist(rank, world).close()


def spawn(world: int, out: Path, resume: Path | None = None) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    mp.start_processes(worker, args=(world, out, resume), nprocs=world, start_method="spawn")
    return torch.load(out / f"result_{world}.pt", weights_only=False)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    """Results of every rank at world sizes 2 and 4 (the 4 ranks also resume from the 2 ranks'
    sharded checkpoint), and of one process without a process group; "folder": where the 2
    ranks' checkpoints are."""
    out = tmp_path_factory.mktemp("sharded")
    found = {2: spawn(2, out / "2"), 4: spawn(4, out / "4", out / "2" / "sharded_2.pt")}
    found[1] = [train(0, 1, out / "2", resume=None)]
    return {**found, "folder": out / "2"}


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_equals_replicated(results, world):
    """After 6 steps (GA 2, clipping, loss scaling, the 4th skipped for an inf on one rank) the
    sharded optimizer's weights are the replicated one's within 1e-6, the same on every rank,
    and the skipped step counted by neither."""
    ranks = results[world]
    for r in ranks:
        assert r["sharded_steps"] == r["replicated_steps"] == STEPS - 1
        assert all(torch.equal(a, b) for a, b in zip(r["sharded"], ranks[0]["sharded"]))
    worst = max_difference(ranks[0]["sharded"], ranks[0]["replicated"])
    assert worst <= 1e-6, worst
    assert max_difference(ranks[0]["sharded"], Run("sharded", 1).weights()) > 1e-2  # it trained


def test_one_rank_is_flat_lamb_bit_for_bit():
    """Without a process group (one rank) a ShardedLamb step is FlatLamb's, bit for bit: weights,
    moments, norms and the skipped step."""
    flat = FlatLamb(param_groups(tiny_bert(), 0.01), lr=3e-2)
    sharded = ShardedLamb(param_groups(tiny_bert(), 0.01), lr=3e-2)
    pairs = list(zip(*[[p for g in o.param_groups for p in g["params"]] for o in (flat, sharded)]))
    g = torch.Generator().manual_seed(0)
    for k in range(4):
        for p, q in pairs:
            grad = torch.randn(p.shape, generator=g)
            grad.view(-1)[0] = float("inf") if k == 2 else grad.view(-1)[0]
            p.grad.copy_(grad)
            q.grad.copy_(grad)
        a, b = clipped_step(flat, 1.0), clipped_step(sharded, 1.0)
        assert torch.equal(a.grad_norm, b.grad_norm) and bool(a.ok) == bool(b.ok) == (k != 2)
    assert all(torch.equal(p, q) for p, q in pairs)
    one, two = flat.state_dict(), sharded.state_dict()
    assert all(torch.equal(one["state"][i][k], two["state"][i][k])
               for i in one["state"] for k in ("exp_avg", "exp_avg_sq"))


def test_state_memory_falls_as_one_over_world_size(results):
    """Bytes of the moments each rank holds: 8 per parameter on one rank, 8 * ceil(197 / W) on
    W ranks (the last shard padded)."""
    numel = sum(p.numel() for p in small_model().parameters())
    for world in (1, 2, 4):
        per_rank = [r["state_nbytes"] for r in results[world]]
        assert per_rank == [8 * shard_numel(numel, world)] * world, (world, per_rank)
        assert per_rank[0] * world < 8 * numel + 8 * world
    assert results[1][0]["state_nbytes"] / results[4][0]["state_nbytes"] == pytest.approx(4, 0.02)


def test_checkpoint_of_two_ranks_resumes_at_four_and_one(results):
    """The 2 ranks' sharded checkpoint at step 3 holds whole tensors (Lamb's format); resumed by
    4 sharded ranks, by one ShardedLamb and by one Lamb, and a replicated checkpoint resumed by
    one ShardedLamb, each ends where the 2 ranks' uninterrupted run did, within 1e-6."""
    folder, reference = results["folder"], results[2][0]["sharded"]
    saved = torch.load(folder / "sharded_2.pt", weights_only=True)
    params = [p for g in param_groups(small_model(), 0.01) for p in g["params"]]
    assert len(saved["optimizer"]["state"]) == len(params)
    for i, p in enumerate(params):
        assert saved["optimizer"]["state"][i]["exp_avg"].shape == p.shape
    assert all(max_difference(r["resumed"], reference) <= 1e-6 for r in results[4])
    for kind, checkpoint in (("replicated", "sharded_2.pt"), ("sharded", "sharded_2.pt"),
                             ("sharded", "replicated_2.pt")):
        run = Run(kind, 1)
        run.load(torch.load(folder / checkpoint, weights_only=True))
        for step in range(SAVED_AT + 1, STEPS + 1):
            run.step(step, 0, 1)
        assert max_difference(run.weights(), reference) <= 1e-6, (kind, checkpoint)


def test_gloo_has_the_collectives(results):
    """The reduce-scatter and the in-place all-gather, as ShardedLamb uses them, give
    all_reduce's numbers on gloo at 2 and 4 ranks."""
    assert all(r["collectives"] for world in (2, 4) for r in results[world])


def test_the_switch_comes_from_the_environment(tmp_path, monkeypatch):
    """SHARDED_LAMB: off by default, 1 picks ShardedLamb and leaves the model without DDP; a bad
    value, or FLAT_LAMB=0 with it, is one line."""
    from bertperf import config
    from tests.support.copy_task import env_for
    env = env_for(tmp_path)
    assert config.load(env).optim.sharded_lamb is False
    assert config.load({**env, "SHARDED_LAMB": "1"}).optim.sharded_lamb is True
    with pytest.raises(UserError, match=r"^SHARDED_LAMB='maybe' is not a valid yes/no value"):
        config.load({**env, "SHARDED_LAMB": "maybe"})
    from bertperf.train.checks import prepare
    with pytest.raises(UserError, match="SHARDED_LAMB=1 .* FLAT_LAMB=0"):
        prepare(config.load({**env, "SHARDED_LAMB": "1", "FLAT_LAMB": "0"}))

    from bertperf.mlperf.log import MLPerfLogger
    from bertperf.train import loop
    cfg = prepare(config.load({**env, "SHARDED_LAMB": "1", "DEVICE": "cpu"}))
    trainer = loop.setup(loop.read_inputs(cfg), MLPerfLogger(tmp_path / "log.txt", rank=0,
                                                               echo=False))
    plan = trainer.plan
    assert isinstance(plan.optimizer, ShardedLamb) and plan.model is plan.core
