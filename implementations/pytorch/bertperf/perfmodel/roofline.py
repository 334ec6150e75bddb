"""A step-time model for the GPU: the training step's operator trace priced with a roofline. It is
a model, not a measurement.

Trace (`trace`): a step runs once to create its lazy state (gradients, optimizer moments), then
again under a TorchDispatchMode that records every ATen operator launching a kernel: its FLOPs,
the tensors it reads and writes (by storage and view) and their bytes, its phase (accumulate:
autograd adding a gradient into a parameter's .grad, which it does outside any compiled graph;
backward: another autograd node is running; optimizer: called from bertperf.optim; forward
otherwise) and the bertperf function that issued it (for backward operators the forward
operator's, from the tracebacks anomaly mode keeps). The caller runs it on fake tensors
(FakeTensorMode: shapes and dtypes, no data), so BERT-large at the MLPerf batch is traced in
seconds on a CPU, as CUDA would run it: inside `OnCuda()` layer_norm, softmax and log_softmax
run in float32 under CPU autocast, as CUDA autocast runs them (CPU autocast keeps them in
bfloat16), and the step is built with bertperf.kernels.Kernels(fused, assume_cuda=True,
launchers=STAND_INS), so the kernels take their Triton path where FUSED_KERNELS allows it
(everything else sees the CPU). Views, allocations, detaches and profiler marks launch nothing
and are not recorded; a host sync (`Tensor.item` and what calls it) is counted and answered with
1. bertperf.kernels' Triton kernels are custom operators with fake implementations, recorded as
one kernel each, except those launched outside ATen (FlatLamb's three LAMB kernels): their
launcher's stand-in in STAND_INS records each launch (`launch`) with the tensors it reads and
writes.

Price (`step_cost`): every kernel takes max(FLOPs / rate, bytes / bandwidth, launches x launch
cost); rate: the tensor-core peak for fp16/bf16 matmuls times MATMUL_EFFICIENCY, the FP8 peak
for FP8 ones (`fp8`) times FP8_EFFICIENCY, the tensor-core peak for attention times the
FlashAttention-2 fractions (forward and backward), the float32 peak for everything else; the
bandwidth times MEMORY_EFFICIENCY. Each efficiency is calibrated on a published (or the
developers') measurement of that kind of kernel on that GPU, kept as data in anchors.csv beside
this file; none is fitted to a training result. Not modelled: the efficiencies' dependence on
the shapes (BERT-large's GEMMs are smaller than the ones measured), overlap of the host's
launches with the GPU's work, caches, host syncs, data loading, communication (scale.py adds
the all-reduce). The launch costs are assumptions, not calibrated.

Attention (`flash_attention`): on the CPU the model pads the sequences into a dense batch; on CUDA
it runs one variable-length FlashAttention kernel per layer, forward and backward. The traced
operators of each attention call are replaced by that kernel: forward 4 d sum(L^2) FLOPs, reading
q, k, v and writing the output and the log-sum-exp; backward 2.5 times the forward FLOPs (it
recomputes Q K^T), reading q, k, v, output, its gradient and the log-sum-exp, writing dq, dk, dv.

Fusion (`fuse`): a run of consecutive operators becomes one kernel that reads the tensors it
gets from outside the run once and writes only what is read after the run or outlives the step
(parameters, gradients, optimizer state); its FLOPs are the run's. COMPILE (`fuse_elementwise`)
fuses only ATen operators: bertperf's Triton kernels are custom operators inductor cannot fuse
into or across, so they stay kernels of their own and cut the chains around them.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from bertperf.perfmodel import gpus
from bertperf.perfmodel.gpus import anchors

PACKAGE = Path(__file__).resolve().parents[1]
aten = torch.ops.aten


@dataclass(frozen=True)
class Gpu:
    """The datasheet numbers the model prices kernels with, and the fractions of them kernels
    reach (calibrated: the constants below)."""

    name: str
    tensor_flops: float
    """Dense fp16/bf16 tensor-core peak, FLOP/s."""
    vector_flops: float
    """float32 peak without tensor cores, FLOP/s."""
    bandwidth: float
    """Memory bandwidth, bytes/s."""
    matmul_efficiency: float
    """Fraction of tensor_flops a cuBLAS fp16/bf16 GEMM reaches."""
    memory_efficiency: float
    """Fraction of the bandwidth a memory-bound kernel reaches."""
    attention_forward_efficiency: float
    """Fraction of tensor_flops FlashAttention-2's forward kernel reaches."""
    attention_backward_efficiency: float
    """The same for its backward kernel."""
    fp8_flops: float = 0.0
    """Dense FP8 tensor-core peak, FLOP/s (0: no FP8 tensor cores)."""
    fp8_efficiency: float = 0.0
    """Fraction of fp8_flops an FP8 GEMM reaches."""


A100, H100 = gpus.A100, gpus.H100


def _fraction(quantity: str, gpu: str, peak: str) -> float:
    return anchors()[quantity, gpu].value / getattr(gpus.GPUS[gpu], peak)


MATMUL_EFFICIENCY = {g: _fraction("gemm", g, "tensor_flops") for g in (A100, H100)}
"""Fraction of the fp16/bf16 tensor peak a cuBLAS GEMM reaches, from anchors.csv's gemm rows:
A100 230 / 312 = 0.74 (fp16 matmul of square matrices up to 8192 in PyTorch, the table of
github.com/mli/transformers-benchmarks); H100 790 / 989 = 0.80 (the developers' bf16 GEMM on one
H100 SXM; a public 4224 x 8192 x 2048 run, Horace He's gist, gives 780). Every GEMM of the step
is priced at it whatever its shape: BERT-large's (K = 1,024 or 4,096) are smaller than those."""
FP8_EFFICIENCY = {H100: _fraction("gemm_fp8", H100, "fp8_flops")}
"""Fraction of the dense FP8 peak an FP8 GEMM reaches: H100 1,550 / 1,979 = 0.78 (DeepGEMM's
README: up to 1,550 TFLOP/s on an H800, whose FP8 peak is the H100 SXM's, at 1.0x cuBLASLt)."""
ATTENTION_FORWARD_EFFICIENCY = {g: _fraction("attention_forward", g, "tensor_flops")
                                for g in (A100, H100)}
"""Fraction of the tensor peak FlashAttention-2's forward kernel reaches: A100 0.50 (the low end
of the 50-73 % its paper, arXiv 2307.08691, reports; head dim 64 and 512-token sequences are
where its benchmarks are lowest); H100 335 / 989 = 0.34 (the paper's best H100 figure, section
4.1; FlashAttention-3's paper, arXiv 2407.08608: FlashAttention-2 reaches 35 % of an H100)."""
ATTENTION_BACKWARD_EFFICIENCY = {g: _fraction("attention_backward", g, "tensor_flops")
                                 for g in (A100, H100)}
"""The same for the backward kernel: A100 0.50 (the same low end of the paper's range, which
covers both passes: an upper bound at head dim 64 and 512 tokens rather than a point measurement);
H100 0.34 (the paper's H100 figure is forward and backward together)."""
MEMORY_EFFICIENCY = {g: _fraction("bandwidth", g, "bandwidth") for g in (A100, H100)}
"""Fraction of the bandwidth a memory-bound kernel (elementwise, LayerNorm, the Triton kernels,
LAMB) reaches, from anchors.csv's bandwidth rows: A100 1.616 / 2.039 = 0.79 (an fp32 a * 1.2,
0.202 TFLOP/s at 8 bytes an element, the micro-benchmark table of mli/transformers-benchmarks);
H100 3.0 / 3.35 = 0.90 (the developers' copy on one H100 SXM)."""


@functools.cache
def _gpu(g: gpus.Gpu) -> Gpu:
    like = g.calibrated_on
    return Gpu(g.name, g.tensor_flops, g.vector_flops, g.bandwidth, MATMUL_EFFICIENCY[like],
               MEMORY_EFFICIENCY[like], ATTENTION_FORWARD_EFFICIENCY[like],
               ATTENTION_BACKWARD_EFFICIENCY[like], g.fp8_flops,
               FP8_EFFICIENCY.get(like, 0.0) if g.fp8_flops else 0.0)


class _Priced(Mapping):
    """perfmodel/gpus.py's GPUs by name, each as roofline prices it (read at each lookup: the
    table is the one place a GPU is added)."""

    def __getitem__(self, name: str) -> Gpu:
        return _gpu(gpus.GPUS[name])

    def __iter__(self):
        return iter(gpus.GPUS)

    def __len__(self) -> int:
        return len(gpus.GPUS)


GPUS = _Priced()
"""Every GPU of perfmodel/gpus.py, its peaks at the calibrated efficiencies above (its
kernels_like GPU's)."""
LAUNCH_SECONDS = 5e-6
"""Eager PyTorch: host time to dispatch and launch one kernel (not calibrated)."""
GRAPH_LAUNCH_SECONDS = 1e-6
"""A kernel replayed from a CUDA graph (not calibrated)."""

# torch's multi_tensor_apply (foreach kernels): tensors per launch by number of tensor lists,
# chunks of 65,536 elements, 320 chunks per launch
_FOREACH_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
_FOREACH_CHUNK, _FOREACH_BLOCKS = 65536, 320
_MATMULS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm}
_NO_KERNEL = {aten.detach, aten.lift_fresh, aten._unsafe_view, aten.empty, aten.empty_like,
              aten.empty_strided, aten.new_empty, aten.new_empty_strided}
_SYNCS = {aten._local_scalar_dense}
FLASH = "flash_attention_varlen"
_TRACEBACK_LINE = re.compile(r'File "(.+)", line \d+, in (\S+)')


@dataclass(frozen=True)
class Access:
    """A tensor an operator reads or writes: its storage (numbered in trace order), which part
    of it, and the bytes that part holds (broadcast dimensions counted once)."""

    storage: int
    view: tuple
    nbytes: int


@dataclass(frozen=True)
class Op:
    """One kernel of the trace (or several fused into one)."""

    name: str
    phase: str
    """forward, backward, accumulate or optimizer."""
    region: str
    """The bertperf function that issued it ("kernels.bias_gelu.bias_gelu"), "" if none."""
    flops: float
    reads: tuple[Access, ...] = ()
    writes: tuple[Access, ...] = ()
    matmul: bool = False
    """A matmul (or attention) kernel: not fused with its neighbours."""
    tensor_cores: bool = False
    """fp16/bf16 matmul, priced at the tensor-core rate (others at the float32 rate)."""
    created: frozenset[int] = frozenset()
    """Storages this kernel allocates."""
    launches: int = 1
    nbytes: float | None = None
    """Bytes moved, when not the sum of the distinct reads and writes."""
    fp8: bool = False
    """An FP8 GEMM (`fp8`), priced at the FP8 tensor-core rate."""

    @property
    def bytes(self) -> float:
        if self.nbytes is not None:
            return self.nbytes
        return float(sum(a.nbytes for a in set(self.reads)) + sum(a.nbytes for a in set(self.writes)))


@dataclass
class Trace:
    ops: list[Op]
    syncs: int
    """Host syncs (Tensor.item and what calls it) during the step."""


# ---- recording -----------------------------------------------------------------------------------

@functools.cache
def _module(filename: str) -> str | None:
    """bertperf/kernels/bias_gelu.py -> "kernels.bias_gelu"; None outside the package (and for
    perfmodel/, which drives the step)."""
    try:
        rel = Path(filename).resolve().relative_to(PACKAGE)
    except ValueError:
        return None
    return None if rel.parts[0] == "perfmodel" else ".".join(rel.with_suffix("").parts)


def _bertperf_frames(frames: Iterable[tuple[str, str]]) -> list[str]:
    """'module.function' of the bertperf frames among (file, function) pairs, innermost first."""
    return [f"{m}.{fn}" for filename, fn in frames if (m := _module(filename)) is not None]


def _python_frames() -> Iterable[tuple[str, str]]:
    frame = sys._getframe(2)
    while frame is not None:
        yield frame.f_code.co_filename, frame.f_code.co_name
        frame = frame.f_back


def _nbytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor view covers (an expanded dimension counts once)."""
    return math.prod(n for n, s in zip(t.shape, t.stride()) if s != 0) * t.element_size()


def foreach_launches(lists: Sequence[Sequence[torch.Tensor]]) -> int:
    """Kernels torch's multi_tensor_apply launches for a foreach operator on these tensor lists."""
    tensors = lists[0]
    per_launch = _FOREACH_TENSORS.get(len(lists), 30)
    chunks = sum(-(-t.numel() // _FOREACH_CHUNK) for t in tensors)
    return max(1, -(-len(tensors) // per_launch), -(-chunks // _FOREACH_BLOCKS))


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Op] = []
        self.syncs = 0
        self._ids: dict[int, int] = {}
        self._count = itertools.count()
        self._has_data: set[int] = set()

    def _storage(self, t: torch.Tensor, fresh: bool = False) -> int:
        key = t.untyped_storage()._cdata
        if fresh or key not in self._ids:
            self._ids[key] = next(self._count)
            if not fresh:  # first seen as an input: it existed before the step, with data
                self._has_data.add(self._ids[key])
        return self._ids[key]

    def _access(self, t: torch.Tensor, storage: int) -> Access:
        return Access(storage, (t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype),
                      _nbytes(t))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in _SYNCS:
            self.syncs += 1
            return 1
        ins = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        in_keys = {t.untyped_storage()._cdata for t in ins}
        out = func(*args, **kwargs)
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if func.namespace in ("prim", "profiler") or func.is_view \
                or func.overloadpacket in _NO_KERNEL:
            for t in outs:  # a new allocation, no data yet
                if t.untyped_storage()._cdata not in in_keys:
                    self._storage(t, fresh=True)
            return out
        mutated = set()
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                value = args[i] if i < len(args) else kwargs.get(a.name)
                mutated |= {id(t) for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)}
        reads, writes, created = [], [], set()
        for t in ins:
            sid = self._storage(t)
            if id(t) not in mutated or sid in self._has_data:  # an output buffer is not read
                reads.append(self._access(t, sid))
            if id(t) in mutated:
                writes.append(self._access(t, sid))
        for t in outs:
            fresh = t.untyped_storage()._cdata not in in_keys
            sid = self._storage(t, fresh=fresh)
            if fresh:
                created.add(sid)
            writes.append(self._access(t, sid))
        self._has_data.update(a.storage for a in writes)
        region, phase = _where()
        low = any(t.dtype in (torch.float16, torch.bfloat16) for t in outs)
        if func.overloadpacket in _MATMULS:
            a, b = ins[-2], ins[-1]
            flops = 2.0 * math.prod(a.shape) * b.shape[-1]
        else:
            flops = float(max((t.numel() for t in ins + outs), default=0))
        launches = 1
        if func.name().startswith("aten::_foreach_"):
            lists = [v for v in args if isinstance(v, (list, tuple)) and v
                     and isinstance(v[0], torch.Tensor)]
            launches = foreach_launches(lists) if lists else 1
        self.ops.append(Op(func.name().removeprefix("aten::"), phase, region,
                           flops, tuple(reads), tuple(writes),
                           matmul=func.overloadpacket in _MATMULS,
                           tensor_cores=func.overloadpacket in _MATMULS and low,
                           created=frozenset(created), launches=launches))
        return out


    def launch(self, name: str, flops: float, reads: Sequence[torch.Tensor],
               writes: Sequence[torch.Tensor], created: Sequence[torch.Tensor]) -> None:
        """Record a kernel launched outside ATen (module `launch`)."""
        new = {self._storage(t) for t in created}
        ins = [self._access(t, self._storage(t)) for t in reads]
        outs = [self._access(t, self._storage(t)) for t in writes]
        self._has_data.update(a.storage for a in outs)
        region, phase = _where()
        self.ops.append(Op(name, phase, region, float(flops), tuple(ins), tuple(outs),
                           created=frozenset(new)))


def _where() -> tuple[str, str]:
    """(region, phase) of the operator being recorded (module docstring)."""
    node = torch._C._current_autograd_node()
    if node is not None and node.name().endswith("AccumulateGrad"):
        return "", "accumulate"
    if node is not None:
        lines = node.metadata.get("traceback_", [])
        frames = [m.groups() for line in reversed(lines) if (m := _TRACEBACK_LINE.search(line))]
        stack, phase = _bertperf_frames(frames), "backward"
    else:
        stack = _bertperf_frames(_python_frames())
        phase = "optimizer" if any(f.startswith("optim.") for f in stack) else "forward"
    return (stack[0] if stack else ""), phase


_RECORDING: list[_Recorder] = []


def launch(name: str, flops: float, reads: Sequence[torch.Tensor] = (),
           writes: Sequence[torch.Tensor] = (), created: Sequence[torch.Tensor] = ()) -> None:
    """Record one kernel launched outside ATen (a Triton kernel called directly) while `trace`
    records: a stand-in of its launcher calls this with the tensors the kernel reads and
    writes (whole tensors; `created`: those it allocates, made with torch.empty just before)
    and its FLOPs. Nothing happens outside a trace."""
    if _RECORDING:
        _RECORDING[-1].launch(name, flops, reads, writes, created)


def _lamb_launches(layout, params: torch.Tensor, grads: torch.Tensor, exp_avg: torch.Tensor,
                   exp_avg_sq: torch.Tensor, coef: torch.Tensor, lr: torch.Tensor, beta3: float,
                   one_minus_beta2: float, eps: float) -> None:
    """bertperf.kernels.triton.lamb.step's three launches, recorded with what each reads and
    writes (the same signature: tests/unit/test_roofline.py compares them): the moments and
    each chunk's squared norms, one program per tensor for its trust ratio, the update. FLOPs:
    one an element, as the recorder counts elementwise operators."""
    chunks = layout.chunk_tensor.numel()
    partial = torch.empty(chunks, 2, device=params.device, dtype=torch.float32)
    scale = torch.empty(len(layout.numels), device=params.device, dtype=torch.float32)
    tables = (layout.chunk_tensor, layout.tensor_chunks, layout.offsets, layout.weight_decay)
    launch("lamb_moments", params.numel(), (params, grads, exp_avg, exp_avg_sq, *tables, coef),
           (exp_avg, exp_avg_sq, partial), created=(partial,))
    launch("lamb_ratios", chunks, (layout.tensor_chunks, partial, layout.adapt, lr), (scale,),
           created=(scale,))
    launch("lamb_apply", params.numel(), (params, exp_avg, exp_avg_sq, *tables, coef, scale),
           (params,))


STAND_INS = {"lamb.step": _lamb_launches}
"""Stand-ins for the launchers of bertperf's Triton kernels that call them outside ATen, by name
(bertperf.kernels.Kernels.launchers): the real ones cannot run on fake tensors (nor without a
GPU)."""


class OnCuda(TorchFunctionMode):
    """Under CPU autocast, layer_norm, softmax and log_softmax in float32, as CUDA autocast runs
    them (module docstring)."""

    FUNCTIONS = frozenset({F.layer_norm, F.softmax, F.log_softmax, torch.softmax, torch.log_softmax,
                           torch.Tensor.softmax, torch.Tensor.log_softmax})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.FUNCTIONS and torch.is_autocast_enabled("cpu"):
            args, kwargs = pytree.tree_map_only(
                torch.Tensor, lambda t: t.float() if t.is_floating_point() else t, (args, kwargs))
        return func(*args, **kwargs)


def trace(step: Callable[[], object]) -> Trace:
    """The kernels of `step()`, run once to create lazy state and then recorded (module
    docstring). Call it inside the FakeTensorMode the step's tensors belong to (and OnCuda()
    for CUDA's step, built with Kernels(..., assume_cuda=True, launchers=STAND_INS))."""
    step()
    recorder = _Recorder()
    _RECORDING.append(recorder)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # anomaly mode announces itself
            with torch.autograd.set_detect_anomaly(True, check_nan=False), recorder:
                step()
    finally:
        _RECORDING.remove(recorder)
    return Trace(recorder.ops, recorder.syncs)


# ---- transforming ----------------------------------------------------------------------------------

def _runs(ops: Sequence[Op], key: Callable[[Op], Hashable | None]):
    """(key, start, stop) of the maximal runs of consecutive operators with the same key."""
    start = 0
    for k, group in itertools.groupby(ops, key):
        n = len(list(group))
        yield k, start, start + n
        start += n


def fuse(ops: Sequence[Op], key: Callable[[Op], Hashable | None],
         make: Callable[[Sequence[Op], tuple, tuple], Op] | None = None,
         min_ops: int = 2) -> list[Op]:
    """Each run of at least `min_ops` consecutive operators with the same key (None: leave as
    is) as one kernel (`make(run, reads, writes)`, default: a fused elementwise kernel) that
    reads what the run gets from outside once and writes what is read after the run or
    outlives the step."""
    readers: dict[int, list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        for a in op.reads:
            readers[a.storage].append(i)
    created = set().union(*(op.created for op in ops))
    out: list[Op] = []
    for k, start, stop in _runs(ops, key):
        run = ops[start:stop]
        if k is None or len(run) < min_ops:
            out.extend(run)
            continue
        inside = set().union(*(op.created for op in run))
        reads = tuple(dict.fromkeys(a for op in run for a in op.reads if a.storage not in inside))
        writes = tuple(dict.fromkeys(
            a for op in run for a in op.writes
            if a.storage not in created or any(j >= stop for j in readers[a.storage])))
        out.append((make or _fused)(run, reads, writes))
    return out


def _fused(run: Sequence[Op], reads: tuple, writes: tuple) -> Op:
    regions = {op.region for op in run}
    return Op(f"fused({len(run)})", run[0].phase, regions.pop() if len(regions) == 1 else "",
              sum(op.flops for op in run), reads, writes,
              created=frozenset().union(*(op.created for op in run)))


def is_attention(op: Op) -> bool:
    return op.region.startswith("kernels.") and "attention" in op.region


def flash_attention(ops: Sequence[Op], seq_lengths: Sequence[int], hidden: int, heads: int,
                    itemsize: int = 2) -> list[Op]:
    """The operators of each attention call replaced by one FlashAttention varlen kernel
    (module docstring); seq_lengths: the batch's segments (every one attends to itself)."""
    forward = 4.0 * hidden * sum(int(n) ** 2 for n in seq_lengths)
    tokens = sum(int(n) for n in seq_lengths)
    act, lse = tokens * hidden * itemsize, tokens * heads * 4

    def kernel(run, reads, writes):
        back = run[0].phase == "backward"
        return Op(f"{FLASH}_{'backward' if back else 'forward'}", run[0].phase,
                  run[0].region, 2.5 * forward if back else forward, reads, writes, matmul=True,
                  tensor_cores=True,
                  created=frozenset().union(*(op.created for op in run)),
                  nbytes=8 * act + lse if back else 4 * act + lse)

    return fuse(ops, lambda op: op.phase if is_attention(op) else None, kernel, min_ops=1)


def fuse_region(prefix: str) -> Callable[[Sequence[Op]], list[Op]]:
    """Each call of the functions under `prefix` (e.g. "kernels.bias_gelu"): one kernel
    forward and one backward."""
    return lambda ops: fuse(ops, lambda op: op.phase if op.region.startswith(prefix) else None)


def is_custom_op(op: Op) -> bool:
    """One of bertperf.kernels' Triton kernels, a custom operator (`bertperf::...`)."""
    return op.name.startswith("bertperf::")


def fuse_elementwise(ops: Sequence[Op]) -> list[Op]:
    """Every run of consecutive forward or backward ATen operators other than matmuls, attention
    and bertperf's Triton custom operators as one kernel: what torch.compile makes of the
    micro-step. Inductor does not fuse into cuBLAS matmuls nor into or across a custom operator
    (an opaque call to it: the chains before and after one stay two kernels, and it stays
    its own); autograd's gradient accumulation and the optimizer are not in the compiled
    micro-step."""
    return fuse(ops, lambda op: None if op.matmul or is_attention(op) or is_custom_op(op)
                or op.phase not in ("forward", "backward") else op.phase)


FP8_REGION = "model.layers"
"""Where the model's linear layers are called: those among them over every token of the
micro-batch are the encoder's (QKV, attention output, the two FFN layers; the MLM head runs
over the masked tokens, the pooler over the sequences), the GEMMs FP8 recipes (Transformer
Engine's, NVIDIA's MLPerf H100 code) run in FP8."""


def fp8(ops: Sequence[Op], tokens: int) -> list[Op]:
    """The step with the encoder's linear layers in FP8, as Transformer Engine runs them: each of
    their GEMMs (the FP8_REGION matmuls with an operand of `tokens` rows or columns: forward,
    data gradient, weight gradient) at the FP8 rate, and before it one
    cast kernel for those of its operands not cast yet in the micro-step: it reads the bf16
    operand (2 bytes an element) and writes it in FP8 and its transpose in FP8 (1 + 1 bytes),
    recording its amax on the way (TE's fused cast-transpose): the forward casts the activation
    and the weight, the backward the incoming gradient, which the data and the weight gradient
    share (the weight gradient reuses the forward's transposed activation). Nothing else
    changes: attention, LayerNorm, GeLU, dropout, the embeddings, the MLM head and its loss,
    LAMB and the all-reduce stay in bf16/fp32 (NVIDIA's MLPerf code also runs attention in FP8;
    this does not)."""
    out, cast = [], set()
    for op in ops:
        if op.matmul and op.tensor_cores and op.region.startswith(FP8_REGION) \
                and any(tokens in a.view[1] for a in op.reads):
            operands = [a for a in dict.fromkeys(op.reads)
                        if len(a.view[1]) > 1 and a.storage not in cast]  # not addmm's bias
            if operands:
                cast.update(a.storage for a in operands)
                elements = sum(a.nbytes for a in operands) / 2
                out.append(Op("fp8_cast_transpose_amax", op.phase, op.region, elements,
                              nbytes=4 * elements))
            out.append(replace(op, fp8=True))
        else:
            out.append(op)
    return out


# ---- pricing -----------------------------------------------------------------------------------------

def kernel_seconds(op: Op, gpu: Gpu, launch: float) -> float:
    if op.name == f"{FLASH}_forward":
        rate = gpu.tensor_flops * gpu.attention_forward_efficiency
    elif op.name.startswith(FLASH):
        rate = gpu.tensor_flops * gpu.attention_backward_efficiency
    elif op.fp8:
        if not gpu.fp8_flops:
            raise ValueError(f"{gpu.name} has no FP8 tensor cores")
        rate = gpu.fp8_flops * gpu.fp8_efficiency
    elif op.tensor_cores:
        rate = gpu.tensor_flops * gpu.matmul_efficiency
    else:
        rate = gpu.vector_flops
    return max(op.flops / rate, op.bytes / (gpu.bandwidth * gpu.memory_efficiency),
               op.launches * launch)


@dataclass(frozen=True)
class StepCost:
    seconds: float
    launches: int
    bytes: float


def step_cost(ops: Sequence[Op], gpu: Gpu, accumulation: int = 1,
              graphs: bool = False) -> StepCost:
    """One optimizer step: `accumulation` times the forward and backward kernels (replayed from
    CUDA graphs when `graphs`) and the gradient accumulation (launched eagerly: autograd runs
    it outside the graphs), once the optimizer's (launched eagerly)."""
    seconds = launches = moved = 0.0
    for op in ops:
        optimizer = op.phase == "optimizer"
        times = 1 if optimizer else accumulation
        graphed = graphs and op.phase in ("forward", "backward")
        launch = GRAPH_LAUNCH_SECONDS if graphed else LAUNCH_SECONDS
        seconds += times * kernel_seconds(op, gpu, launch)
        launches += times * op.launches
        moved += times * op.bytes
    return StepCost(seconds, int(launches), moved)
