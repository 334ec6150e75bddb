"""GRAD_COMM: compressed and infrequent gradient exchange for slow networks (bf16 and fp16 in
either division, the others open division only: Mode.division), built from what torch ships in
torch.distributed.algorithms: DDP communication hooks (bf16/fp16 compression, PowerSGD with
error feedback and warm start, post-local SGD) and the periodic model averager.
`train/parallel.py` reduces through a hooked mode's Comm (`Comm.install` registers the hook on
the DDP model; `Comm.after_step` runs after each optimizer step: local SGD's parameter
averaging); `Traffic` counts the bytes each rank hands to collectives, for every reduction.

What a rank sends is counted as the size of the tensors it hands to all-reduces (a reduce-scatter
plus an all-gather of N bytes count N, the traffic of one all-reduce of N bytes; on the wire a
ring all-reduce of N bytes sends 2(W-1)/W x N bytes per rank). `world` counts collectives over
every rank, `node` those within a node only (local SGD's gradient all-reduce between the ranks
of one machine after LOCALSGD_START)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as tdist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (PostLocalSGDState,
                                                                            post_localSGD_hook)
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from bertperf.benchmark import CLOSED, OPEN
from bertperf.optim import warmup_end


@dataclass
class Traffic:
    """Bytes this rank handed to collectives, and optimizer steps counted."""

    world: int = 0
    node: int = 0
    steps: int = 0

    def per_step(self) -> float:
        return self.world / self.steps if self.steps else 0.0

    def reset(self) -> None:
        self.world = self.node = self.steps = 0


def grad_bytes(params: list[torch.nn.Parameter]) -> int:
    """The bytes of one full fp32 (parameter dtype) gradient of `params`."""
    return sum(p.numel() * p.element_size() for p in params)


def comm_start(cfg: Any) -> int:
    """The step from which GRAD_COMM's method runs: 0, or for a mode that waits (Mode.start) its
    setting (POWERSGD_START, LOCALSGD_START), by default the end of the LR warm-up (at least
    Mode.earliest)."""
    o, mode = cfg.optim, MODES[cfg.optim.grad_comm]
    return mode.first_step(getattr(o, mode.start) if mode.start else None, warmup_end(o))


class Comm:
    """A GRAD_COMM mode's hook and state on one rank (module docstring). Subclasses: `hook`
    (called by DDP with each bucket) and, where the mode keeps state, `state_dict` /
    `load_state_dict` (a checkpoint part, `grad_comm`)."""

    stateful = False
    reads: tuple[str, ...] = ()
    """The settings of its own the mode reads (warnings: one given without the mode)."""

    def __init__(self, cfg: Any, traffic: Traffic, start: int) -> None:
        self.cfg, self.traffic, self.start = cfg, traffic, start

    def install(self, ddp: torch.nn.parallel.DistributedDataParallel,
                params: list[torch.nn.Parameter]) -> None:
        self.params = params

        def hook(state, bucket):  # unannotated: DDP checks annotations, and ours are strings
            return self.hook(state, bucket)

        ddp.register_comm_hook(None, hook)

    def hook(self, _state: Any, bucket: tdist.GradBucket) -> torch.futures.Future:
        raise NotImplementedError

    def after_step(self) -> None:
        """After each optimizer step (before the gradients are cleared)."""


class Compress(Comm):
    """bf16 / fp16: each bucket cast to the half type, all-reduced (averaged) there and cast back
    (torch's bf16_compress_hook / fp16_compress_hook): half the bytes, the average rounded to 8
    (bf16) or 11 (fp16) significant bits."""

    def __init__(self, cfg: Any, traffic: Traffic, start: int, dtype: torch.dtype) -> None:
        super().__init__(cfg, traffic, start)
        self.dtype = dtype
        self.torch_hook = default_hooks.bf16_compress_hook if dtype == torch.bfloat16 \
            else default_hooks.fp16_compress_hook

    def hook(self, _state: Any, bucket: tdist.GradBucket) -> torch.futures.Future:
        buffer = bucket.buffer()
        self.traffic.world += buffer.numel() * torch.finfo(self.dtype).bits // 8
        return self.torch_hook(None, bucket)


MIN_COMPRESSION_RATE = 2
"""PowerSGD sends a 2-D gradient M (n x m) as its rank-r factors only where they are this many
times smaller than M, (n + m) r x this < n m (torch's min_compression_rate, its default)."""


def compressing_rank(shapes: list[tuple[int, int]]) -> int:
    """The highest PowerSGD rank at which a gradient of one of these 2-D shapes is still sent
    compressed (0: none at any rank)."""
    return max([(n * m - 1) // (MIN_COMPRESSION_RATE * (n + m)) for n, m in shapes], default=0)


class PowerSGD(Comm):
    """PowerSGD (Vogels et al. 2019; torch's powerSGD_hook over a PowerSGDState with error
    feedback and warm start): each 2-D gradient M (n x m) whose rank-r factors are at least
    MIN_COMPRESSION_RATE times smaller is sent as P (n x r) and Q (m x r), M ~ P Q^T, the others
    uncompressed in one all-reduce; what the approximation missed (M - P Q^T, per rank) is kept
    and added to the next step's gradient (error feedback), and Q starts from the last step's
    (warm start).
    Plain all-reduce before POWERSGD_START. `bf16`: the buckets go through it in bf16 (torch's
    bf16_compress_wrapper), P, Q and the error buffer too.

    DDP rebuilds its buckets after a new DDP's first step (the order gradients became ready),
    and PowerSGD keys its error and Q by bucket index: so the first step of every new DDP, a
    resumed run's too, is a plain all-reduce here (a fresh run's is anyway: POWERSGD_START >= 2),
    and a checkpoint's error and Q, saved with the rebuilt buckets, are used from the second.
    torch's hook issues a bucket's P and Q all-reduces from the callbacks of its earlier ones, on
    the communication threads: with several buckets their order could differ between ranks
    (gloo then fails, "Received data size doesn't match expected size"), so each bucket's
    compression waits for the one before it to finish."""

    stateful = True
    reads = ("POWERSGD_RANK",)

    def __init__(self, cfg: Any, traffic: Traffic, start: int, bf16: bool) -> None:
        super().__init__(cfg, traffic, start)
        self.state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=cfg.optim.powersgd_rank,
            start_powerSGD_iter=max(2, start), min_compression_rate=MIN_COMPRESSION_RATE,
            use_error_feedback=True, warm_start=True, orthogonalization_epsilon=1e-8,
            random_seed=0)
        self.first_step = True
        self.pending: torch.futures.Future | None = None
        inner = self._hook
        self.hook = default_hooks.bf16_compress_wrapper(inner) if bf16 else inner

    def _hook(self, _state: Any, bucket: tdist.GradBucket) -> torch.futures.Future:
        state, buffer = self.state, bucket.buffer()
        size = buffer.element_size()
        if self.first_step or state.iter < state.start_powerSGD_iter:
            if bucket.is_last():
                self.first_step = False
            state.maybe_increase_iter(bucket)
            self.traffic.world += buffer.numel() * size
            return default_hooks._allreduce_fut(tdist.group.WORLD, buffer)
        if self.pending is not None:  # the last bucket's collectives first (module docstring)
            self.pending.wait()
        before = state.total_numel_after_compression
        fut = powerSGD_hook.powerSGD_hook(state, bucket)
        self.traffic.world += (state.total_numel_after_compression - before) * size
        self.pending = None if bucket.is_last() else fut
        return fut

    def state_dict(self) -> dict[str, Any]:
        """The step count, Q and P (the same on every rank: all-reduced) and every rank's own
        error buffers, gathered (a collective: every rank saves)."""
        s = self.state
        errors = [None] * tdist.get_world_size()
        tdist.all_gather_object(errors, {k: v.cpu() for k, v in s.error_dict.items()})
        return {"iter": s.iter, "q": {k: v.cpu() for k, v in s.q_memory_dict.items()},
                "p": {k: v.cpu() for k, v in s.p_memory_dict.items()},
                "errors": errors}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Every rank takes its own error buffers; with another world size the error restarts
        at zero (the Q matrices and the step count carry on)."""
        s, rank = self.state, tdist.get_rank()
        device = next(iter(self.params)).device
        s.iter = int(saved["iter"])
        s.q_memory_dict = {int(k): v.to(device) for k, v in saved["q"].items()}
        s.p_memory_dict = {int(k): v.to(device) for k, v in saved["p"].items()}
        errors = saved["errors"]
        s.error_dict = {int(k): v.to(device) for k, v in errors[rank].items()} \
            if len(errors) == tdist.get_world_size() else {}


def node_group() -> tuple[Any, int]:
    """(this rank's process group of the ranks on its machine (same host name), its size)."""
    names = [None] * tdist.get_world_size()
    tdist.all_gather_object(names, socket.gethostname())
    nodes: dict[str, list[int]] = {}
    for rank, name in enumerate(names):
        nodes.setdefault(name, []).append(rank)
    mine = names[tdist.get_rank()]
    group = None
    for ranks in nodes.values():  # every rank creates every group, in the same order
        g = tdist.new_group(ranks)
        if mine == names[ranks[0]]:
            group = g
    return group, len(nodes[mine])


class LocalSGD(Comm):
    """Post-local SGD (Lin et al. 2020; torch's PostLocalSGDState + post_localSGD_hook and a
    PeriodicModelAverager): DDP's all-reduce of the gradients until LOCALSGD_START, then each
    node steps on its own gradient (all-reduced between the ranks of one machine only, none when
    it has one rank) and every LOCALSGD_PERIOD steps the parameters are averaged over all ranks.
    Only the parameters: LAMB's moments stay each rank's own. The averager writes the averages
    into the parameters' own storage (FlatLamb's views stay views)."""

    stateful = True
    reads = ("LOCALSGD_PERIOD",)

    def __init__(self, cfg: Any, traffic: Traffic, start: int) -> None:
        super().__init__(cfg, traffic, start)
        group, size = node_group()
        self.node_ranks = size
        self.state = PostLocalSGDState(process_group=None, subgroup=group,
                                       start_localSGD_iter=start,
                                       post_local_gradient_allreduce=size > 1)
        self.averager = PeriodicModelAverager(period=cfg.optim.localsgd_period,
                                              warmup_steps=start)

    def hook(self, _state: Any, bucket: tdist.GradBucket) -> torch.futures.Future:
        buffer = bucket.buffer()
        if self.state.iter < self.state.start_localSGD_iter:
            self.traffic.world += buffer.numel() * buffer.element_size()
        elif self.state.post_local_gradient_allreduce:
            self.traffic.node += buffer.numel() * buffer.element_size()
        return post_localSGD_hook(self.state, bucket)

    def averages_now(self) -> bool:
        a = self.averager
        return a.step >= a.warmup_steps and (a.step - a.warmup_steps) % a.period == 0

    def after_step(self) -> None:
        params = [p for p in self.params if p.grad is not None]
        averaging = self.averages_now()
        storage = [p.data for p in params] if averaging else []
        self.averager.average_parameters(params)  # averages, or only counts the step
        if averaging:
            self.traffic.world += grad_bytes(params)
            for p, own in zip(params, storage):  # torch's average replaces .data: copy it back
                own.copy_(p.data)
                p.data = own

    def state_dict(self) -> dict[str, int]:
        return {"iter": self.state.iter, "averager_step": self.averager.step}

    def load_state_dict(self, saved: dict[str, int]) -> None:
        self.state.iter = int(saved["iter"])
        self.averager.step = int(saved["averager_step"])


@dataclass(frozen=True)
class Mode:
    """A GRAD_COMM mode: its Comm class, the arguments the mode adds to (cfg, traffic, start),
    and the facts the rules (train/allowed.py) and the performance model (perfmodel/) read."""

    cls: type[Comm] | None
    """Its hook's class; None: DDP's own all-reduce."""
    options: dict[str, Any] = field(default_factory=dict)
    family: str = "allreduce"
    """How it reduces, so how a cost model prices it: allreduce (every bucket all-reduced, each
    element in element_bytes), powersgd (P, Q and the tensors sent whole, all-reduced, and the
    compression's compute), localsgd (the node's all-reduce; the parameters averaged over all
    ranks every LOCALSGD_PERIOD steps)."""
    element_bytes: int = 4
    """Bytes an element of what it hands to collectives: 4 (float32), 2 (bf16, fp16)."""
    start: str | None = None
    """The setting (config.OptimConfig field) of the step it starts from, plain all-reduce
    before; None: from the first step."""
    earliest: int = 0
    """The earliest step it may start from, whatever the LR warm-up."""
    division: str = OPEN
    """The division it may run in: closed where it only rounds what the all-reduce carries to a
    format MLPerf's closed division pre-approves (fp32, bf16, fp16: MLPerf Training rules,
    "Numerical formats"), open where it changes the optimizer's arithmetic."""
    samples_factor: float = 1.0
    """Samples to the target against allreduce's, measured on the demo by `bench comm`
    (docs/slow_networks.md), not on BERT-large: what the performance model trains it for."""

    @property
    def stateful(self) -> bool:
        """It keeps state across steps (a checkpoint part)."""
        return self.cls is not None and self.cls.stateful

    @property
    def hooked(self) -> bool:
        """A DDP communication hook (not DDP's own all-reduce)."""
        return self.cls is not None

    @property
    def reads(self) -> tuple[str, ...]:
        """The settings of its own it reads."""
        return self.cls.reads if self.cls is not None else ()

    def first_step(self, given: int | None, warmup_end: int) -> int:
        """The step it starts from: 0 for a mode that does not wait; else its setting's value
        `given`, by default the end of the LR warm-up (at least `earliest`)."""
        if self.start is None:
            return 0
        return given if given is not None else max(self.earliest, warmup_end)

    def __call__(self, cfg: Any, traffic: Traffic, start: int) -> Comm:
        """The mode on this rank."""
        return self.cls(cfg, traffic, start, **self.options)


MODES = {
    "allreduce": Mode(None, division=CLOSED),
    "bf16": Mode(Compress, {"dtype": torch.bfloat16}, element_bytes=2, division=CLOSED),
    "fp16": Mode(Compress, {"dtype": torch.float16}, element_bytes=2, division=CLOSED),
    "powersgd": Mode(PowerSGD, {"bf16": False}, family="powersgd", start="powersgd_start",
                     earliest=2, samples_factor=1.33),
    "powersgd_bf16": Mode(PowerSGD, {"bf16": True}, family="powersgd", element_bytes=2,
                          start="powersgd_start", earliest=2, samples_factor=1.33),
    "localsgd": Mode(LocalSGD, family="localsgd", start="localsgd_start"),
}
"""GRAD_COMM's modes, keyed by config.GRAD_COMMS's names: a new mode is an entry here and its
name there. Samples factors: powersgd and powersgd_bf16 1.33x, the others 1.0x (bench comm on
the demo)."""


def warnings(cfg: Any) -> list[str]:
    """A mode's own setting (Comm.reads) changed from its default while GRAD_COMM is a mode
    that does not read it: it has no effect (train.checks.run_warnings)."""
    from bertperf.config import tunables
    read = set(MODES[cfg.optim.grad_comm].reads)
    out = []
    for name in sorted({n for mode in MODES.values() for n in mode.reads} - read):
        section, f = next((sec, f) for sec, f in tunables() if f.metadata["env"] == name)
        value = getattr(getattr(cfg, section), f.name)
        if value != f.default:
            users = ", ".join(m for m, mode in MODES.items() if name in mode.reads)
            out.append(f"{name}={value} with GRAD_COMM={cfg.optim.grad_comm}: only {users} "
                       "read it, so it has no effect")
    return out
