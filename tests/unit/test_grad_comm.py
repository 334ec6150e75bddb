"""GRAD_COMM (bertperf.train.comm, reduced through train/parallel.py) on 2 gloo ranks:
bf16/fp16 give the exact average of the ranks' gradients within their rounding (relative error
of the averaged gradient <= 2^-8 for bf16, 2^-10 for fp16) for exactly half the bytes; PowerSGD
keeps each rank's reconstruction error and adds it to the next step's gradient (error feedback:
every compressed step's error is the gradient plus the last error minus what was sent, and what
was sent over the steps plus the ranks' mean error is the exact accumulated average), its bytes
torch's P and Q plus the uncompressed tensors; post-local SGD steps each node alone and averages
the parameters every LOCALSGD_PERIOD steps (into FlatLamb's own buffer) while LAMB's moments
stay per rank (measured); the bytes of each; refusals in one line; one rank: no effect."""

from __future__ import annotations

import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bertperf.errors import UserError
from bertperf.train.dist import Dist
from tests.support.copy_task import env_for

WORLD, STEPS, RANK, START = 2, 6, 2, 2


def small_model() -> nn.Module:
    """Matrices PowerSGD compresses at rank 2 (64x32, 48x64) and ones it does not (8x48 and the
    biases: (n + m) r 2 >= n m)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 48), nn.Tanh(),
                         nn.Linear(48, 8))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def local_and_reduced(core: nn.Module, ddp: nn.Module, step: int, rank: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(this rank's own gradient, the exact fp32 average over ranks, what DDP's hook gave)."""
    x, y = batch(step, rank)
    core.zero_grad(set_to_none=True)
    (core(x) - y).square().mean().backward()
    own = flat(p.grad for p in core.parameters()).clone()
    exact = own.clone()
    tdist.all_reduce(exact)
    exact /= WORLD
    core.zero_grad(set_to_none=True)
    (ddp(x) - y).square().mean().backward()
    return own, exact, flat(p.grad for p in core.parameters()).clone()


def make(mode: str, start: int = START):
    from bertperf.train.comm import MODES, Traffic
    cfg = SimpleNamespace(optim=SimpleNamespace(powersgd_rank=RANK, localsgd_period=2))
    core = small_model()
    ddp = DistributedDataParallel(core)
    traffic = Traffic()
    comm = MODES[mode](cfg, traffic, start)
    return core, ddp, comm, traffic


def half_precision(mode: str, rank: int) -> None:
    core, ddp, comm, traffic = make(mode)
    comm.install(ddp, list(core.parameters()))
    numel = sum(p.numel() for p in core.parameters())
    bound = 2.0 ** -8 if mode == "bf16" else 2.0 ** -10
    for step in range(STEPS):
        _, exact, got = local_and_reduced(core, ddp, step, rank)
        rel = float((got - exact).norm() / exact.norm())
        assert 0 < rel <= bound, (mode, step, rel)
        half = torch.bfloat16 if mode == "bf16" else torch.float16  # sent in it, cast back
        assert torch.equal(got.to(half).float(), got), (mode, step)
    assert traffic.world == STEPS * numel * 2  # half of fp32's 4 bytes, exactly


def expected_compressed_bytes(core: nn.Module, size: int = 4) -> int:
    """PowerSGD's payload of one compressed step (torch's rule: a tensor is compressed when
    (n + m) r 2 < n m): P and Q of those, the rest whole, `size` bytes each."""
    total = 0
    for p in core.parameters():
        n = p.shape[0]
        m = p.numel() // n
        r = min(n, m, RANK)
        total += (n + m) * r if (n + m) * r * 2 < n * m else n * m
    return total * size


def powersgd(rank: int) -> None:
    core, ddp, comm, traffic = make("powersgd")
    seen = []
    inner = comm.hook

    def spy(state, bucket):  # the bucket as it comes in, the error before, what goes out
        entry = bucket.buffer().clone()
        state_ = comm.state
        before = state_.error_dict.get(bucket.index())
        before = torch.zeros_like(entry) if before is None else before.clone()
        compressed = not comm.first_step and state_.iter >= state_.start_powerSGD_iter
        fut = inner(state, bucket)

        def record(f):
            out = f.value()
            out = out[0] if isinstance(out, list) else out
            after = state_.error_dict.get(bucket.index())
            seen.append((compressed, entry, before, out.clone(),
                         None if after is None else after.clone()))
            return out
        return fut.then(record)

    comm.hook = spy
    comm.install(ddp, list(core.parameters()))
    full = sum(p.numel() for p in core.parameters()) * 4
    sent = exact_sum = None
    for step in range(STEPS):
        before_bytes = traffic.world
        _, exact_params, got = local_and_reduced(core, ddp, step, rank)
        compressed, entry, error_before, out, error_after = seen[-1]
        assert len(seen) == step + 1  # one bucket (its own order of the parameters)
        exact = entry.clone()  # the exact average, in the bucket's order
        tdist.all_reduce(exact)
        exact /= WORLD
        step_bytes = traffic.world - before_bytes
        if step < START:
            assert not compressed and step_bytes == full
            torch.testing.assert_close(got, exact_params, rtol=1e-5, atol=1e-7)
            continue
        assert compressed and step_bytes == expected_compressed_bytes(core) < full / 2
        # error feedback: the rank's error is its gradient plus the last error minus what was
        # sent, and the last error is not zero from the second compressed step on
        torch.testing.assert_close(error_after, entry + error_before - out, rtol=0, atol=1e-5)
        if step > START:
            assert float(error_before.norm()) > 1e-3 * float(entry.norm())
        sent = out if sent is None else sent + out
        exact_sum = exact if exact_sum is None else exact_sum + exact
        assert float((out - exact).norm()) > 1e-4 * float(exact.norm())  # it is compressed
    # over the compressed steps: sent + the ranks' mean error = the exact accumulated average
    mean_error = seen[-1][4].clone()
    tdist.all_reduce(mean_error)
    mean_error /= WORLD
    torch.testing.assert_close(sent + mean_error, exact_sum, rtol=0, atol=1e-5)
    # the checkpoint part: the step count, Q, and every rank's error (gathered)
    state = comm.state_dict()
    assert state["iter"] == STEPS and len(state["errors"]) == WORLD and state["q"]
    fresh_core, fresh_ddp, fresh, _ = make("powersgd")
    fresh.install(fresh_ddp, list(fresh_core.parameters()))
    fresh.load_state_dict(state)
    assert fresh.state.iter == STEPS
    torch.testing.assert_close(fresh.state.error_dict[0], seen[-1][4])


def localsgd(rank: int) -> None:
    from bertperf.optim import FlatLamb, clipped_step, param_groups
    from bertperf.train import comm as comm_module
    real = comm_module.socket
    comm_module.socket = SimpleNamespace(gethostname=lambda: f"node{rank}")  # a node per rank
    try:
        core, ddp, comm, traffic = make("localsgd", start=1)
    finally:
        comm_module.socket = real
    assert comm.node_ranks == 1 and not comm.state.post_local_gradient_allreduce
    opt = FlatLamb(param_groups(core, 0.01), lr=0.05)
    params = list(core.parameters())
    comm.install(ddp, params)
    storage = [p.data_ptr() for p in params]
    param_bytes = sum(p.numel() * 4 for p in params)
    averaged_at, spread = [], []
    for step in range(STEPS):
        before = traffic.world
        local_and_reduced(core, ddp, step, rank)
        clipped_step(opt, 1.0)
        averages = comm.averages_now()
        comm.after_step()
        opt.zero_grad(set_to_none=True)
        assert [p.data_ptr() for p in params] == storage  # still FlatLamb's views
        mine = flat(p.detach() for p in params)
        both = [torch.empty_like(mine) for _ in range(WORLD)]
        tdist.all_gather(both, mine)
        same = torch.equal(both[0], both[1])
        assert same == (step == 0 or averages), (step, averages)
        want = (param_bytes if step == 0 else 0) + (param_bytes if averages else 0)
        assert traffic.world - before == want, (step, traffic.world - before, want)
        if averages:
            averaged_at.append(step)
        moments = flat(opt.state[p]["exp_avg"] for p in params)
        other = [torch.empty_like(moments) for _ in range(WORLD)]
        tdist.all_gather(other, moments)
        spread.append(float((other[0] - other[1]).norm() / other[0].norm()))
    assert averaged_at == [1, 3, 5] and traffic.node == 0
    assert spread[0] < 1e-6 and min(spread[1:]) > 1e-3  # LAMB's moments: per rank after start
    if rank == 0:
        print("LAMB first moments, |m0 - m1| / |m0| per step:", [f"{s:.3f}" for s in spread])
    # the checkpoint part: torch's hook stops counting at its start; the averager counts on
    assert comm.state_dict() == {"iter": 1, "averager_step": STEPS}


def powersgd_buckets(rank: int) -> None:
    """Several DDP buckets: each compresses (two all-reduces issued from callbacks) in the same
    order on every rank, for the bytes the rule gives (2 an element with powersgd_bf16)."""
    from bertperf.train.comm import MODES, Traffic
    for mode, size in (("powersgd", 4), ("powersgd_bf16", 2)):
        torch.manual_seed(0)
        core = nn.Sequential(*[nn.Linear(256, 256) for _ in range(6)])
        ddp = DistributedDataParallel(core, bucket_cap_mb=0.3)
        traffic = Traffic()
        comm = MODES[mode](SimpleNamespace(optim=SimpleNamespace(powersgd_rank=RANK)), traffic,
                           START)
        comm.install(ddp, list(core.parameters()))
        for step in range(STEPS):
            before = traffic.world
            x = torch.randn(8, 256, generator=torch.Generator().manual_seed(step * 10 + rank))
            ddp(x).square().mean().backward()
            if step >= START:
                assert traffic.world - before == expected_compressed_bytes(core, size), mode
        assert len(comm.state.error_dict) >= 3  # buckets
        del ddp


CASES = {"bf16": lambda rank: half_precision("bf16", rank),
         "fp16": lambda rank: half_precision("fp16", rank),
         "powersgd": powersgd, "powersgd_buckets": powersgd_buckets, "localsgd": localsgd}


def worker(rank: int, store: Path) -> None:
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                             timeout=datetime.timedelta(seconds=60))
    try:
        for case, run in CASES.items():
            try:
                run(rank)
            except Exception as exc:
                raise AssertionError(f"case {case}, rank {rank}: {exc!r}") from exc
    finally:
        Dist(rank, WORLD).close()  # every collective of both ranks done, as the trainer leaves


def test_every_mode_on_two_ranks(tmp_path):
    """The cases one after the other on one pair of ranks: a spawned rank's start-up (torch
    imported) took most of a case's time when each case had a pair of its own."""
    mp.start_processes(worker, args=(tmp_path / "store",), nprocs=WORLD, start_method="spawn")


@pytest.mark.parametrize("change, message", [
    ({"GRAD_COMM": "powersgd", "SUBMISSION_DIVISION": "closed"},
     "GRAD_COMM=powersgd is an open-division method: set SUBMISSION_DIVISION=open"),
    ({"GRAD_COMM": "zip"}, "GRAD_COMM must be one of allreduce, bf16, fp16, powersgd"),
    ({"GRAD_COMM": "powersgd", "SHARDED_LAMB": "1"},
     "GRAD_COMM=powersgd is a DDP communication hook, and SHARDED_LAMB=1 has no DDP"),
    ({"GRAD_COMM": "bf16", "CLIP_BEFORE_ALLREDUCE": "1"},
     "GRAD_COMM=bf16 and CLIP_BEFORE_ALLREDUCE=1 are both DDP communication hooks"),
    ({"GRAD_COMM": "localsgd", "LAYERWISE": "1:64,2"},
     "GRAD_COMM=localsgd keeps per-bucket state"),
    ({"GRAD_COMM": "powersgd_bf16", "PRECISION": "fp16"},
     "with PRECISION=fp16: an overflowed step's inf"),
    ({"GRAD_COMM": "powersgd", "WARMUP_STEPS": "10", "POWERSGD_START": "5"},
     r"POWERSGD_START=5 is before the end of the LR warm-up \(step 10"),
    ({"GRAD_COMM": "powersgd", "POWERSGD_RANK": "0"}, "POWERSGD_RANK must be at least 1"),
    ({"GRAD_COMM": "localsgd", "LOCALSGD_PERIOD": "0"}, "LOCALSGD_PERIOD must be at least 1"),
    ({"GRAD_COMM": "powersgd", "POWERSGD_RANK": "100000"},
     r"^POWERSGD_RANK=100000: PowerSGD sends a gradient as P and Q only where they are 2x "
     r"smaller than it, and none of BERT_CONFIG .*'s is at this rank: every gradient would go "
     r"whole \(POWERSGD_RANK at most 11\)$"),
    ({"GRAD_COMM": "powersgd_bf16", "POWERSGD_RANK": "12"}, "POWERSGD_RANK at most 11"),
    ({"GRAD_COMM": "localsgd", "LOCALSGD_PERIOD": "1000"},
     r"^LOCALSGD_PERIOD=1000: the ranks step alone for the last 50 of MAX_STEPS=50 steps \(from "
     r"LOCALSGD_START, or the end of the LR warm-up\), too few for this period: their "
     r"parameters would be averaged after the first of those steps and never again "
     r"\(LOCALSGD_PERIOD below 50\)$"),
    ({"GRAD_COMM": "localsgd", "LOCALSGD_START": "40", "LOCALSGD_PERIOD": "10"},
     "the last 10 of MAX_STEPS=50 steps"),
])
def test_refused_in_one_line(tmp_path, change, message):
    from bertperf.config import load
    from bertperf.train.checks import prepare
    env = env_for(tmp_path, **{"SUBMISSION_DIVISION": "open", **change})
    with pytest.raises(UserError, match=message) as exc:
        prepare(load(env))
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("change", [
    {"GRAD_COMM": "powersgd", "POWERSGD_RANK": "11"},
    {"GRAD_COMM": "localsgd", "LOCALSGD_PERIOD": "49"},
    {"GRAD_COMM": "localsgd", "LOCALSGD_START": "40", "LOCALSGD_PERIOD": "9"},
])
def test_the_last_settings_that_compress_or_average_pass(tmp_path, change):
    """The copy task's model (hidden 32, intermediate 64, 32 words): its qkv gradient (96 x
    32) is still compressed at rank 11; local SGD from step 41 of 50 still averages at steps
    41 and 50 with a period of 9."""
    from bertperf.config import load
    from bertperf.train.checks import prepare
    prepare(load(env_for(tmp_path, SUBMISSION_DIVISION="open", **change)))


def test_compressing_rank_is_torchs_decision():
    """comm.compressing_rank agrees with torch's PowerSGD hook on which gradients it
    compresses, at the rate we give it."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    from bertperf.train.comm import MIN_COMPRESSION_RATE, compressing_rank
    for n, m in [(30528, 1024), (4096, 1024), (1024, 1024), (2, 128), (96, 32), (512, 128)]:
        top = compressing_rank([(n, m)])
        for rank in range(1, 600):
            compressed = _should_compress(n, m, min(n, m, rank), MIN_COMPRESSION_RATE)[0]
            assert compressed == (rank <= top), (n, m, rank)
    assert compressing_rank([(30528, 1024), (2, 1024)]) == 495  # BERT-large: its embeddings


def test_one_rank_no_effect_and_fingerprint(tmp_path):
    from bertperf.config import fingerprint, load, warnings
    from bertperf.train.comm import comm_start
    from bertperf.train.parallel import reduction_for
    cfg = load(env_for(tmp_path, SUBMISSION_DIVISION="open", GRAD_COMM="powersgd",
                       WARMUP_STEPS="10"))
    assert reduction_for(cfg, 1).name == "none" and reduction_for(cfg, 2).name == "powersgd"
    assert any("GRAD_COMM=powersgd with one rank" in w for w in warnings(cfg))
    assert fingerprint(cfg)["GRAD_COMM"] == "powersgd"
    assert comm_start(cfg) == 10  # unset: the end of the warm-up


def test_bench_comm_needs_root_in_one_line(monkeypatch):
    import argparse

    from bertperf.bench import comm as bench_comm
    monkeypatch.setattr(bench_comm.os, "geteuid", lambda: 1000)
    parser = argparse.ArgumentParser()
    bench_comm.add_arguments(parser)
    with pytest.raises(UserError, match="bench comm makes network namespaces") as exc:
        bench_comm.run(parser.parse_args([]))
    assert "\n" not in str(exc.value)


def test_bench_comm_rate_scaling():
    """The demo's gradient over the bench's link takes BERT-large's time over 10 Gb/s."""
    from bertperf.bench.comm import LARGE_SECONDS, demo_gradient_bytes
    assert LARGE_SECONDS == pytest.approx(1.072, abs=1e-3)
    assert demo_gradient_bytes() == 17_736_968  # 4,434,242 parameters x 4
