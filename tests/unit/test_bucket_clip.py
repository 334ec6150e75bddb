"""Clipping before the all-reduce (bertperf.optim.bucket_clip, CLIP_BEFORE_ALLREDUCE) on 2 gloo
ranks: the hook's reduced gradients equal each rank's buckets clipped by hand and averaged (with
accumulation and a loss scale, in DDP's one first-step bucket and in its rebuilt buckets), a
non-finite bucket on one rank skips the step on both; the trainer (setup and train_step) with
the switch on equals that reference after a step (with Lamb and with FlatLamb), with it off the
global-norm clip after the all-reduce, as before; the switch's parsing, its refusal next to
SHARDED_LAMB and its place in the resume fingerprint."""

from __future__ import annotations

import copy
import datetime
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bertperf.errors import UserError
from bertperf.optim import DynamicLossScaler, Lamb, clipped_step, global_grad_norm
from bertperf.optim.bucket_clip import BucketClip, bucket_threshold, clip_then_allreduce
from bertperf.optim.clip import CLIP_EPS
from bertperf.train.dist import Dist
from tests.support.copy_task import env_for
from tests.support.net import free_port

WORLD, GA, SCALE = 2, 2, 2.0**4
MAX_NORM = 0.2  # between the first and the last layers' bucket norms of mlp(): some clip


def mlp() -> nn.Module:
    """float64, 6 Linear layers of 16 x 16 (2,048 bytes of weight and 128 of bias each)."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(16, 16) for _ in range(6)]).double()


def inputs(step: int, rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return [torch.randn(8, 16, generator=g, dtype=torch.float64) for _ in range(GA)]


def local_grads(model: nn.Module, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """This rank's gradient accumulated over the micro-batches, the loss scaled by SCALE."""
    model.zero_grad()
    for x in xs:
        (model(x).square().mean() * SCALE).backward()
    return [p.grad.clone() for p in model.parameters()]


def by_hand(grads: list[list[torch.Tensor]], buckets: list[list[int]], max_norm: float,
            scale: float) -> tuple[list[torch.Tensor], list[float]]:
    """Each rank's buckets clipped to max_norm * sqrt(bucket / model) (the unscaled norm), then
    averaged over the ranks; and every rank's coefficient per bucket."""
    total = sum(g.numel() for g in grads[0])
    out: list[torch.Tensor] = [torch.zeros_like(g) for g in grads[0]]
    coefs = []
    for rank_grads in grads:
        for bucket in buckets:
            numel = sum(rank_grads[i].numel() for i in bucket)
            norm = math.sqrt(sum(float(rank_grads[i].square().sum()) for i in bucket)) / scale
            coef = min(max_norm * math.sqrt(numel / total) / (norm + CLIP_EPS), 1.0)
            coefs.append(coef)
            for i in bucket:
                out[i] += rank_grads[i] * coef / len(grads)
    return out, coefs


def gathered(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Every rank's grads, on every rank."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    parts = [torch.empty_like(flat) for _ in range(tdist.get_world_size())]
    tdist.all_gather(parts, flat)
    return [[t.view_as(g) for t, g in zip(part.split([g.numel() for g in grads]), grads)]
            for part in parts]


def hook_rank(rank: int, store: Path) -> None:
    tdist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                             timeout=datetime.timedelta(seconds=60))
    model = mlp()
    reference = copy.deepcopy(model)
    params = list(model.parameters())
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.002)  # one layer a bucket, rebuilt
    opt = Lamb(model.parameters(), lr=0.01)
    scaler = DynamicLossScaler(init_scale=SCALE)
    state = BucketClip(MAX_NORM, sum(p.numel() for p in params), WORLD, scaler)
    seen: list[list[int]] = []

    def recording(state, bucket):  # (DDP refuses string annotations)
        seen.append([next(i for i, p in enumerate(params) if p is q) for q in bucket.parameters()])
        return clip_then_allreduce(state, bucket)

    ddp.register_comm_hook(state, recording)
    for step in range(3):
        xs = inputs(step, rank)
        mine = local_grads(reference, xs)
        seen.clear()
        for i, x in enumerate(xs):
            with ddp.no_sync() if i < GA - 1 else torch.enable_grad():
                scaler.scale_loss(ddp(x).square().mean()).backward()
        if step == 0:  # DDP reduces its first step in one bucket
            assert seen == [list(range(len(params)))], seen
        else:  # rebuilt in the order the gradients became ready
            assert len(seen) >= 3 and sorted(sum(seen, [])) == list(range(len(params))), seen
        want, coefs = by_hand(gathered(mine), seen, MAX_NORM, SCALE)
        for i, (p, w) in enumerate(zip(params, want)):
            torch.testing.assert_close(p.grad, w, rtol=1e-12, atol=1e-15, msg=f"step {step} {i}")
        if step == 1:  # the buckets clip differently from one another (so the test can fail)
            assert min(coefs) < 0.9 and max(coefs) == 1.0, coefs
        outcome = clipped_step(opt, None, scaler)
        assert bool(outcome.ok)
        torch.testing.assert_close(outcome.grad_norm,
                                   global_grad_norm([w / SCALE for w in want]), rtol=1e-12, atol=0)
        opt.zero_grad()
        for p, q in zip(params, reference.parameters()):
            q.data.copy_(p.data)
    # a non-finite gradient in one bucket of rank 1: that bucket turns NaN on every rank, and
    # the step is skipped on both
    before = [p.detach().clone() for p in params]
    poison = params[0].register_hook(lambda g: g * math.inf) if rank == 1 else None
    for i, x in enumerate(inputs(3, rank)):
        with ddp.no_sync() if i < GA - 1 else torch.enable_grad():
            scaler.scale_loss(ddp(x).square().mean()).backward()
    bucket = next(b for b in seen if 0 in b)
    for i, p in enumerate(params):
        assert bool(p.grad.isnan().all()) if i in bucket else bool(p.grad.isfinite().all()), i
    outcome = clipped_step(opt, None, scaler)
    assert not bool(outcome.ok) and float(scaler.scale) == SCALE / 2
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert all(bool((p.grad == 0).all()) for p in params)
    if poison is not None:
        poison.remove()
    del ddp  # DDP's reducer goes while the group exists (as the trainer's Plan.release does)
    Dist(rank, WORLD).close()  # and the group as the trainer leaves it


def test_hook_equals_buckets_clipped_by_hand_then_averaged(tmp_path):
    mp.start_processes(hook_rank, args=(tmp_path / "store",), nprocs=WORLD, start_method="spawn")


TRAIN_MAX_NORM = 0.05  # under the tiny BERT's local gradient norms at its first step: clips


def reference_step(trainer, micro, before: bool) -> list[torch.Tensor]:
    """The parameters after train_step's step, by hand on copies of the model and optimizer:
    each rank's accumulated gradient clipped to TRAIN_MAX_NORM, then averaged (before: DDP
    reduces its first step in one bucket, whose threshold is TRAIN_MAX_NORM), or averaged and
    then clipped (after)."""
    from bertperf.model import BertForPreTraining, forward_loss
    from bertperf.optim import make_optimizer, param_groups
    from bertperf.optim.clip import clip_coefficient
    core = BertForPreTraining(trainer.plan.core.config)  # (a deepcopy drops lamb_row_blocks)
    core.load_state_dict(trainer.plan.core.state_dict())
    opt = make_optimizer("lamb", param_groups(core, trainer.cfg.optim.weight_decay), lr=0.0)
    # the LR the schedule set, betas, eps (copied: FlatLamb's moments are views of its buffer)
    opt.load_state_dict(copy.deepcopy(trainer.plan.optimizer.state_dict()))
    divisors = trainer.dist.sum(torch.stack([m.counts for m in micro]).sum(0)).clamp(min=1) / WORLD
    for m in micro:
        forward_loss(core, m.inputs, divisors).backward()
    grads = [p.grad for p in core.parameters()]
    if before:
        norm = global_grad_norm(grads)
        assert float(norm) > TRAIN_MAX_NORM, float(norm)  # so the step can tell the two apart
        torch._foreach_mul_(grads, clip_coefficient(norm, TRAIN_MAX_NORM, 1.0))
    for g in grads:
        tdist.all_reduce(g)
        g.div_(WORLD)
    clipped_step(opt, None if before else TRAIN_MAX_NORM)
    return [p.detach().clone() for p in core.parameters()]


def trainer_rank(rank: int, env: dict, runs: list[tuple[str, str, int]], out: Path) -> None:
    from bertperf.config import load
    from bertperf.mlperf.log import MLPerfLogger
    from bertperf.train.checks import prepare
    from bertperf.train.loop import read_inputs, setup, train_step
    torch.set_num_threads(1)
    for switch, flat, port in runs:
        cfg = prepare(load({**env, "CLIP_BEFORE_ALLREDUCE": switch, "FLAT_LAMB": flat, "RANK": str(rank),
                    "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank), "MASTER_PORT": str(port)}))
        log = MLPerfLogger(out / f"log_{switch}{flat}_{rank}.txt", rank=rank, echo=False)
        trainer = setup(read_inputs(cfg), log)
        micro = [next(trainer.batches) for _ in range(GA)]
        want = {before: reference_step(trainer, micro, before) for before in (True, False)}
        train_step(trainer, micro)
        got = [p.detach() for p in trainer.plan.core.parameters()]
        mine, other = want[switch == "1"], want[switch == "0"]
        assert max(float((a - b).abs().max()) for a, b in zip(mine, other)) > 1e-4
        for i, (a, b) in enumerate(zip(got, mine)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{switch} {flat} {i}")
        trainer.plan.release()
        trainer.loader.close()
        trainer.dist.close()


def test_trainer_clips_before_allreduce_only_when_switched_on(tmp_path):
    env = {**env_for(tmp_path, GRADIENT_STEPS=str(GA), MAX_GRAD_NORM=str(TRAIN_MAX_NORM)),
           "DATA_VERIFY": "none", "DIST_TIMEOUT": "60", "MASTER_ADDR": "127.0.0.1"}
    runs = [("1", "0", free_port()), ("1", "1", free_port()), ("0", "0", free_port())]
    mp.start_processes(trainer_rank, args=(env, runs, tmp_path), nprocs=WORLD,
                       start_method="spawn")


@pytest.mark.parametrize("value, want", [("1", True), ("on", True), ("0", False), ("", False)])
def test_switch_parses(tmp_path, value, want):
    from bertperf.config import load
    assert load(env_for(tmp_path, CLIP_BEFORE_ALLREDUCE=value)).optim.clip_before_allreduce is want


@pytest.mark.parametrize("change, message", [
    ({"CLIP_BEFORE_ALLREDUCE": "maybe"},
     "CLIP_BEFORE_ALLREDUCE='maybe' is not a valid yes/no value"),
    ({"CLIP_BEFORE_ALLREDUCE": "1", "SHARDED_LAMB": "1"},
     "CLIP_BEFORE_ALLREDUCE=1 clips DDP's all-reduce buckets, which SHARDED_LAMB=1 replaces"),
])
def test_switch_refused_in_one_line(tmp_path, change, message):
    from bertperf.config import load
    from bertperf.train.checks import prepare
    with pytest.raises(UserError, match=message) as exc:
        prepare(load(env_for(tmp_path, **change)))
    assert "\n" not in str(exc.value)


def test_bucket_thresholds_compose_to_max_norm():
    sizes = [3, 1000, 17, 250_000]
    total = sum(sizes)
    assert math.isclose(sum(bucket_threshold(2.0, n, total) ** 2 for n in sizes), 4.0)
    assert bucket_threshold(2.0, total, total) == 2.0


def test_resume_needs_the_same_clipping(tmp_path):
    """A checkpoint saved with the switch on does not resume with it off, nor the other way; a
    checkpoint written before the switch existed (its fingerprint has no key for it) counts as
    clipped after the all-reduce, the default."""
    from bertperf.config import fingerprint, load
    from bertperf.train.checkpoint import Fingerprint
    on, off = (fingerprint(load(env_for(tmp_path / v, CLIP_BEFORE_ALLREDUCE=v))) for v in "10")
    assert (on["CLIP_BEFORE_ALLREDUCE"], off["CLIP_BEFORE_ALLREDUCE"]) == (True, False)
    Fingerprint(on).load_state_dict(on)
    for saved, mine in ((on, off), (off, on)):
        with pytest.raises(UserError, match="CLIP_BEFORE_ALLREDUCE"):
            Fingerprint(mine).load_state_dict(saved)
    older = {k: v for k, v in off.items() if k != "CLIP_BEFORE_ALLREDUCE"}
    Fingerprint(off).load_state_dict(older)
    with pytest.raises(UserError, match="saved with CLIP_BEFORE_ALLREDUCE=False, this run has True"):
        Fingerprint(on).load_state_dict(older)
