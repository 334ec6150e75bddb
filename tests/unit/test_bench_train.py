"""`bench train`: the model FLOPs formula, the step-time model's trace (of the trainer's own
step) and pricing against hand-computed values, and the benchmark itself (it runs, its tables
are well formed, every row trains on the same sequences, every bertperf row runs the trainer's
build_step and train_step with its switches as settings). Speed is what the benchmark measures;
nothing here times it."""

from __future__ import annotations

import importlib.util
import itertools
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from bertperf.bench import roofline
from bertperf.bench.flops import forward_flops, train_flops
from bertperf.bench.roofline import Access, Gpu, Op
from bertperf.model import BertConfig

TRITON = importlib.util.find_spec("triton") is not None


@pytest.fixture(autouse=True)
def kernels_back_to_auto():
    """A bertperf row or the model's trace selects the kernels for the process, as the
    trainer's build_step does (FUSED_KERNELS); each test leaves the default behind."""
    from bertperf.kernels import backend

    yield
    backend.select(None)

# ---- model FLOPs -----------------------------------------------------------------------------------


def test_bert_large_flops_per_sequence():
    """BERT-large's forward, written out: 24 layers x 2 x (3 d^2 + d^2 + 2 d f) per token, 24 x
    4 d L^2 per sequence, (2 d^2 + 2 d V) per masked token, 2 d^2 + 4 d per sequence."""
    large = BertConfig.large()
    d, f, V = 1024, 4096, 30522
    per_token = 24 * 2 * (3 * d * d + d * d + 2 * d * f)
    assert per_token == 603_979_776  # 603.98 MFLOP a token
    L, m = 300, 45
    expected = per_token * L + 24 * 4 * d * L * L + (2 * d * d + 2 * d * V) * m + 2 * d * d + 4 * d
    assert forward_flops(d, f, 24, V, [L], m) == expected
    assert train_flops(large, [L], m) == 3 * expected
    # a batch is the sum of its sequences (the L^2 term per sequence, not of the total)
    two = train_flops(large, [300, 100], 60)
    assert two == train_flops(large, [300], 45) + train_flops(large, [100], 15)
    assert two < train_flops(large, [400], 60)


# ---- the step-time model: pricing a hand-made trace ----------------------------------------------

GPU = Gpu("test", tensor_flops=100e12, vector_flops=10e12, bandwidth=1e12,
          matmul_efficiency=0.8, memory_efficiency=0.9, attention_forward_efficiency=0.25,
          attention_backward_efficiency=0.2, fp8_flops=200e12, fp8_efficiency=0.5)
MB = 10**6


def access(storage: int, nbytes: int) -> Access:
    return Access(storage, (0, (nbytes,), (1,), torch.uint8), nbytes)


def hand_trace() -> list[Op]:
    """x (1) @ w (2) -> h (3); h + bias (4) -> a (5); gelu(a) -> g (6); g @ w2 (7) -> y (8);
    then the optimizer updates w in place."""
    return [
        Op("mm", "forward", "", 8e12, (access(1, 100 * MB), access(2, 50 * MB)),
           (access(3, 200 * MB),), matmul=True, tensor_cores=True, created=frozenset({3})),
        Op("add", "forward", "kernels.f.f", 1e8, (access(3, 200 * MB), access(4, MB)),
           (access(5, 200 * MB),), created=frozenset({5})),
        Op("gelu", "forward", "kernels.f.f", 1e8, (access(5, 200 * MB),),
           (access(6, 200 * MB),), created=frozenset({6})),
        Op("mm", "forward", "", 8e12, (access(6, 200 * MB), access(7, 50 * MB)),
           (access(8, 100 * MB),), matmul=True, tensor_cores=False, created=frozenset({8})),
        Op("add_", "optimizer", "optim.lamb.step", 1e3, (access(2, 50 * MB),),
           (access(2, 50 * MB),)),
    ]


def test_kernel_time_is_the_largest_of_compute_memory_and_launch():
    mm, add, _, mm32, opt = hand_trace()
    launch = roofline.LAUNCH_SECONDS
    # 8 TFLOP at 80 % of 100 TFLOP/s: 0.1 s (the 350 MB take 0.39 ms)
    assert roofline.kernel_seconds(mm, GPU, launch) == pytest.approx(0.1)
    # the same matmul in float32 runs at the 10 TFLOP/s float32 peak
    assert roofline.kernel_seconds(mm32, GPU, launch) == pytest.approx(0.8)
    # 401 MB at 90 % of 1 TB/s
    assert roofline.kernel_seconds(add, GPU, launch) == pytest.approx(401e6 / 0.9e12)
    # 100 MB read and written in place: 0.22 ms; at a 1 s launch cost the launch wins
    assert roofline.kernel_seconds(opt, GPU, launch) == pytest.approx(100e6 / 0.9e12)
    assert roofline.kernel_seconds(opt, GPU, 1.0) == 1.0


def test_step_cost_repeats_the_micro_batch_not_the_optimizer():
    ops = hand_trace()
    one = sum(roofline.kernel_seconds(op, GPU, 5e-6) for op in ops[:4])
    opt = roofline.kernel_seconds(ops[4], GPU, 5e-6)
    cost = roofline.step_cost(ops, GPU, accumulation=3)
    assert cost.seconds == pytest.approx(3 * one + opt)
    assert cost.launches == 3 * 4 + 1
    assert cost.bytes == pytest.approx(3 * (350 + 401 + 400 + 350) * MB + 100 * MB)


def test_cuda_graphs_cut_the_launch_cost_of_the_micro_step_only():
    """Launch-bound kernels (1-byte tensors): 5 us each eagerly; replayed from a graph 1 us,
    but the optimizer (outside the graph) still 5 us."""
    ops = [Op("add", phase, "", 1, (access(i, 1),), (access(i + 10, 1),))
           for i, phase in enumerate(("forward", "backward", "optimizer"))]
    assert roofline.step_cost(ops, GPU, 2).seconds == pytest.approx(5 * 5e-6)
    assert roofline.step_cost(ops, GPU, 2, graphs=True).seconds == pytest.approx(4e-6 + 5e-6)


def test_gradient_accumulation_stays_eager_and_unfused():
    """autograd adds a micro-step's gradients into .grad outside any compiled graph: CUDA
    graphs do not cut its launches and the elementwise fusion leaves it alone."""
    ops = [Op("add", phase, "", 1, (access(i, 1),), (access(i + 10, 1),))
           for i, phase in enumerate(("backward", "accumulate", "accumulate", "optimizer"))]
    assert roofline.step_cost(ops, GPU, 2, graphs=True).seconds == pytest.approx(
        2 * (1e-6 + 2 * 5e-6) + 5e-6)
    assert [op.phase for op in roofline.fuse_elementwise(ops)] == \
        ["backward", "accumulate", "accumulate", "optimizer"]


def test_fusing_a_region_moves_only_what_crosses_its_boundary():
    """add + gelu as one kernel: reads h and the bias, writes g (read by the next matmul); the
    intermediate a is neither written nor read back."""
    fused = roofline.fuse_region("kernels.f")(hand_trace())
    assert [op.name for op in fused] == ["mm", "fused(2)", "mm", "add_"]
    kernel = fused[1]
    assert kernel.bytes == (200 + 1 + 200) * MB
    assert kernel.flops == 2e8 and kernel.launches == 1 and not kernel.matmul
    assert kernel.region == "kernels.f.f"


def test_a_fused_kernel_writes_what_outlives_the_step():
    """A run that updates a parameter in place and then reads it writes it back; an output
    nobody reads after the run is not written."""
    ops = [
        Op("mul_", "optimizer", "optim.x.y", 1, (access(1, MB),), (access(1, MB),)),
        Op("add", "optimizer", "optim.x.y", 1, (access(1, MB), access(2, MB)),
           (access(3, 4 * MB),), created=frozenset({3})),
    ]
    (kernel,) = roofline.fuse(ops, lambda op: op.phase)
    assert kernel.bytes == (1 + 1 + 1) * MB  # reads 1 and 2, writes 1 (a parameter), not 3


def test_elementwise_fusion_stops_at_matmuls_and_leaves_the_optimizer():
    ops = hand_trace()
    ops.append(replace(ops[-1], name="mul_"))
    fused = roofline.fuse_elementwise(ops)
    assert [op.name for op in fused] == ["mm", "fused(2)", "mm", "add_", "mul_"]


def test_attention_becomes_one_flash_kernel_each_way():
    """Two sequences of 3 and 5 tokens, hidden 8, 2 heads, bf16: forward 4 * 8 * (9 + 25)
    FLOPs, reading q, k, v and writing the output (8 tokens x 8 x 2 bytes each) and the
    log-sum-exp (8 tokens x 2 heads x 4 bytes); backward 2.5 times the FLOPs, 8 such tensors."""
    region = "kernels.varlen_attention.varlen_attention_padded"
    ops = [Op("mm", "forward", "", 1.0, (access(1, 10),), (access(2, 10),), matmul=True,
              created=frozenset({2})),
           Op("index_copy", "forward", region, 1.0, (access(2, 10),), (access(3, 99),),
              created=frozenset({3})),
           Op("bmm", "forward", region, 1.0, (access(3, 99),), (access(4, 10),), matmul=True,
              created=frozenset({4})),
           Op("mm", "forward", "", 1.0, (access(4, 10),), (access(5, 10),), matmul=True,
              created=frozenset({5})),
           Op("bmm", "backward", region, 1.0, (access(5, 10), access(3, 99)),
              (access(6, 10),), matmul=True, created=frozenset({6}))]
    out = roofline.flash_attention(ops, [3, 5], hidden=8, heads=2)
    assert [op.name for op in out] == ["mm", "flash_attention_varlen_forward", "mm",
                                       "flash_attention_varlen_backward"]
    forward, backward = out[1], out[3]
    assert forward.flops == 4 * 8 * 34 and backward.flops == 2.5 * 4 * 8 * 34
    assert forward.bytes == 4 * 8 * 8 * 2 + 8 * 2 * 4
    assert backward.bytes == 8 * 8 * 8 * 2 + 8 * 2 * 4
    assert forward.tensor_cores and forward.phase == "forward" and backward.phase == "backward"
    # priced at the GPU's FlashAttention fractions of the tensor-core peak, forward and backward
    # (no launch floor here)
    assert roofline.kernel_seconds(forward, GPU, 0.0) == pytest.approx(
        max(forward.flops / 25e12, forward.bytes / 0.9e12))
    assert roofline.kernel_seconds(backward, GPU, 0.0) == pytest.approx(
        max(backward.flops / 20e12, backward.bytes / 0.9e12))


def test_compile_does_not_fuse_across_the_triton_custom_ops():
    """Inductor cannot fuse into a custom operator (bertperf::...): the elementwise chains on
    either side of one stay two kernels, and it stays its own."""
    ops = [Op(name, "forward", "", 1, (access(i, MB),), (access(i + 1, MB),),
              created=frozenset({i + 1}))
           for i, name in enumerate(("add", "mul", "bertperf::layer_norm", "add", "gelu"))]
    fused = roofline.fuse_elementwise(ops)
    assert [op.name for op in fused] == ["fused(2)", "bertperf::layer_norm", "fused(2)"]


def fp8_trace(tokens: int = 2048) -> list[Op]:
    """A linear layer over every token (x: storage 1, w: 2), forward and backward (the
    incoming gradient: 4, shared by the data and the weight gradient), and the MLM head's
    linear over 600 masked tokens, in model.layers."""
    x, w, g = access(1, 2 * tokens * 1024), access(2, 2 * 1024 * 4096), access(4, 2 * tokens * 4096)
    for a, shape in ((x, (tokens, 1024)), (w, (1024, 4096)), (g, (tokens, 4096))):
        object.__setattr__(a, "view", (0, shape, (shape[1], 1), torch.bfloat16))
    head = Access(5, (0, (600, 1024), (1024, 1), torch.bfloat16), 2 * 600 * 1024)
    flops = 2.0 * tokens * 1024 * 4096
    mm = dict(matmul=True, tensor_cores=True)
    return [Op("mm", "forward", "model.layers.forward", flops, (x, w), (access(3, 1),), **mm),
            Op("mm", "forward", "model.layers.forward", 1e9, (head, w), (access(6, 1),), **mm),
            Op("mm", "backward", "model.layers.forward", flops, (g, w), (access(7, 1),), **mm),
            Op("mm", "backward", "model.layers.forward", flops, (g, x), (access(8, 1),), **mm)]


def test_fp8_runs_the_encoder_gemms_in_fp8_and_adds_their_casts():
    """The encoder's GEMMs (over every token) at the FP8 rate, each operand cast once a
    micro-step (read bf16, write FP8 and its transpose: 4 bytes an element), the gradient once
    for both backward GEMMs; the MLM head's GEMM (over the masked tokens) untouched."""
    out = roofline.fp8(fp8_trace(), tokens=2048)
    assert [(op.name, op.fp8) for op in out] == [
        ("fp8_cast_transpose_amax", False), ("mm", True), ("mm", False),
        ("fp8_cast_transpose_amax", False), ("mm", True), ("mm", True)]
    forward_cast, backward_cast = out[0], out[3]
    assert forward_cast.bytes == 4 * (2048 * 1024 + 1024 * 4096)  # x and w
    assert backward_cast.bytes == 4 * 2048 * 4096  # the gradient only
    # priced at 50 % of the 200 TFLOP/s FP8 peak, where bf16 runs at 80 % of 100
    assert roofline.kernel_seconds(out[1], GPU, 0.0) == pytest.approx(out[1].flops / 100e12)
    assert roofline.kernel_seconds(out[2], GPU, 0.0) == pytest.approx(
        max(1e9 / 80e12, out[2].bytes / 0.9e12))
    with pytest.raises(ValueError, match="no FP8"):
        roofline.kernel_seconds(out[1], replace(GPU, fp8_flops=0.0), 0.0)


def test_the_efficiencies_are_the_anchors_over_the_datasheet_peaks():
    """Every GPU's efficiencies are a published (or the developers') measurement in
    bench/anchors.csv, installed with the package, over the datasheet peak; each anchor names
    what was measured and where it was published."""
    from pathlib import Path

    assert roofline.ANCHORS.parent == Path(roofline.__file__).parent
    anchors = roofline.anchors()
    assert all(a.source and a.what for a in anchors.values())
    for gpu in roofline.GPUS:
        assert gpu.matmul_efficiency == anchors["gemm", gpu.name].value / gpu.tensor_flops
        assert gpu.memory_efficiency == anchors["bandwidth", gpu.name].value / gpu.bandwidth
        assert gpu.attention_forward_efficiency == \
            anchors["attention_forward", gpu.name].value / gpu.tensor_flops
        assert gpu.attention_backward_efficiency == \
            anchors["attention_backward", gpu.name].value / gpu.tensor_flops
        for fraction in (gpu.matmul_efficiency, gpu.memory_efficiency,
                         gpu.attention_forward_efficiency, gpu.attention_backward_efficiency):
            assert 0 < fraction < 1
    a100, h100 = roofline.GPUS
    assert a100.fp8_flops == 0 and h100.fp8_efficiency == \
        anchors["gemm_fp8", h100.name].value / h100.fp8_flops


def test_foreach_launches_follow_multi_tensor_apply():
    small = [torch.empty(10)] * 200
    assert roofline.foreach_launches([small]) == 2  # 110 tensors a launch
    assert roofline.foreach_launches([small, small, small]) == 5  # 48 with three lists
    big = [torch.empty(65536 * 321)]
    assert roofline.foreach_launches([big]) == 2  # 321 chunks, 320 a launch


# ---- the step-time model: recording ----------------------------------------------------------------

def test_trace_records_kernels_with_flops_bytes_and_phase():
    x, w = torch.randn(4, 8), torch.randn(8, 16)
    trace = roofline.trace(lambda: torch.relu(x @ w.t().t()))  # views launch nothing
    assert [op.name for op in trace.ops] == ["mm", "relu"]
    mm, relu = trace.ops
    assert mm.flops == 2 * 4 * 8 * 16 and mm.matmul and not mm.tensor_cores
    assert mm.bytes == 4 * (4 * 8 + 8 * 16 + 4 * 16)
    assert relu.bytes == 4 * (2 * 4 * 16)
    assert relu.reads[0].storage == mm.writes[0].storage  # the data flows by storage
    assert {op.phase for op in trace.ops} == {"forward"} and trace.syncs == 0


def test_trace_finds_the_bertperf_function_forward_and_backward():
    from bertperf.kernels import bias_gelu_reference

    x = torch.randn(4, 8, requires_grad=True)
    b = torch.randn(8, requires_grad=True)

    def step():
        y = bias_gelu_reference(x, b).sum()
        y.backward()
        return float(y.detach())  # a host sync

    trace = roofline.trace(step)
    phases = {op.phase for op in trace.ops}
    # the second run (recorded) adds the gradients to the first's: x and b, one kernel each
    assert phases == {"forward", "backward", "accumulate"} and trace.syncs == 1
    assert sum(op.phase == "accumulate" for op in trace.ops) == 2
    region = "kernels.bias_gelu.bias_gelu_reference"
    forward = [op for op in trace.ops if op.phase == "forward"]
    assert [op.region for op in forward] == [region] * 6 + ["", ""]  # then sum, backward's seed
    assert any(op.region == region for op in trace.ops if op.phase == "backward")


def test_trace_runs_under_fake_tensors_with_cuda_autocast_dtypes():
    """LayerNorm under autocast runs in float32 (CUDA's policy), the matmul in bfloat16 on
    tensor cores; nothing is computed (fake tensors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.randn(64, 32)
        lin = torch.nn.Linear(32, 32)
        norm = torch.nn.LayerNorm(32)

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return norm(lin(x))

        with roofline.OnCuda():
            trace = roofline.trace(step)
    by_name = {op.name: op for op in trace.ops}
    assert by_name["addmm"].tensor_cores
    layer_norm = by_name["native_layer_norm"]
    assert layer_norm.writes[0].view[3] == torch.float32


@pytest.mark.skipif(not TRITON, reason="the kernels' Triton path needs Triton installed")
def test_on_cuda_tells_only_the_kernels_backend_that_tensors_are_on_cuda():
    """Inside OnCuda the kernels take their Triton path as FUSED_KERNELS selects it (auto: yes,
    0: no), while everything else (attention, autocast, the caller) sees the CPU tensor it is;
    nothing of the package is replaced."""
    from bertperf.kernels import backend

    x = torch.zeros(3)
    use_triton = backend.use_triton
    with roofline.OnCuda():
        assert backend.use_triton(x) and not x.is_cuda and x.device.type == "cpu"
        backend.select(False)
        assert not backend.use_triton(x)
    backend.select(None)
    assert not backend.use_triton(x) and backend.use_triton is use_triton


@pytest.mark.skipif(not TRITON, reason="the kernels' Triton path needs Triton installed")
def test_launches_outside_aten_are_recorded_by_their_stand_ins():
    """A Triton launcher called directly (not a custom operator) cannot run on fake tensors:
    inside triton_stand_ins its module is a stand-in whose launcher records each launch with
    the tensors it reads and writes; afterwards the real module is back."""
    import importlib

    import bertperf.kernels.triton as package
    from bertperf.kernels import LambLayout
    from bertperf.kernels.lamb import lamb_step
    from torch._subclasses.fake_tensor import FakeTensorMode

    name = "bertperf.kernels.triton.lamb"
    before = sys.modules.get(name), getattr(package, "lamb", None)
    roofline.launch("nothing", 1.0)  # outside a trace: ignored
    with FakeTensorMode():
        layout = LambLayout([3000, 5], [0.01, 0.0], [True, False], "cpu")
        w, g, m, v = (torch.zeros(3005) for _ in range(4))
        with roofline.OnCuda(), roofline.triton_stand_ins():
            from bertperf.kernels.triton import lamb as stand_in
            assert stand_in.step is roofline._lamb_launches
            trace = roofline.trace(lambda: lamb_step(layout, w, g, m, v, lr=1e-3,
                                                     betas=(0.9, 0.999), eps=1e-6, step=1))
    assert (sys.modules.get(name), getattr(package, "lamb", None)) == before
    kernels = [op for op in trace.ops if op.name.startswith("lamb_")]
    assert [op.name for op in kernels] == ["lamb_moments", "lamb_ratios", "lamb_apply"]
    moments, ratios, apply = kernels
    n = 3005 * 4
    assert moments.flops == apply.flops == 3005 and ratios.flops == 3  # 2 + 1 chunks of 2,048
    # moments: reads w, g, m, v (and the layout's tables), writes m, v and 3 chunks' 2 norms
    assert sum(a.nbytes for a in moments.reads if a.nbytes == n) == 4 * n
    assert sum(a.nbytes for a in moments.writes) == 2 * n + 3 * 2 * 4
    assert moments.writes[-1].storage == ratios.reads[1].storage  # the partial norms
    assert ratios.writes[0].storage == apply.reads[-1].storage  # the trust ratios
    assert [a.storage for a in apply.writes] == [moments.reads[0].storage]  # w, in place
    # the stand-in takes the real launcher's arguments
    import inspect

    real = importlib.import_module(name).step
    assert inspect.signature(roofline._lamb_launches).parameters.keys() == \
        inspect.signature(real).parameters.keys()


@pytest.mark.parametrize("triton", [False, pytest.param(True, marks=pytest.mark.skipif(
    not TRITON, reason="the kernels' Triton path needs Triton installed"))],
    ids=["plain", "triton"])
def test_the_model_traces_the_trainers_step(triton, monkeypatch):
    """The model traces the trainer's own step (train.loop.build_step with FUSED_KERNELS=0 or 1,
    and train_step), so the LAMB the trainer takes with the kernels' Triton path off (Lamb,
    foreach ops) or on (FlatLamb: its three launches and one norm of the flat gradient buffer),
    and adds every parameter's gradient into .grad as the trainer's later micro-steps do."""
    import numpy as np
    from bertperf.bench import train
    from bertperf.model import BertForPreTraining
    from bertperf.train import loop

    built, stepped = spy(monkeypatch, loop, "build_step"), spy(monkeypatch, loop, "train_step")
    config = replace(BertConfig.named("tiny"), num_hidden_layers=1)
    step = train.Step(train.samples_of_lengths(np.array([5, 9])), None)
    trace, segments, name = train.trace_step(config, step, "varlen", triton)
    (cfg, _, _, _), = [args for args, _ in built]
    assert (cfg.train.fused_kernels, cfg.train.precision, cfg.data.layout) == \
        (triton, "bf16", "varlen")
    assert len(stepped) == 2  # once to create the lazy state, once traced
    assert name == ("FlatLamb" if triton else "Lamb") and list(segments) == [5, 9]
    assert trace.syncs == 0
    params = len(list(BertForPreTraining(config).parameters()))
    assert sum(op.phase == "accumulate" for op in trace.ops) == params
    optimizer = [op for op in trace.ops if op.phase == "optimizer"]
    launches = [op.name for op in optimizer if op.name.startswith("lamb_")]
    norms = [op for op in optimizer
             if "norm" in op.name and op.region == "optim.clip.global_grad_norm"]
    if triton:
        assert launches == ["lamb_moments", "lamb_ratios", "lamb_apply"]
        assert [op.name for op in norms] == ["linalg_vector_norm"]
        assert not any(op.name.startswith("_foreach_") and op.region.startswith("optim.lamb")
                       for op in optimizer)
    else:
        assert launches == []
        assert any(op.name.startswith("_foreach_") and op.region.startswith("optim.lamb")
                   for op in optimizer)
        assert norms[0].name.startswith("_foreach_norm")


# ---- the benchmark ---------------------------------------------------------------------------------

def test_help_starts_without_torch():
    code = ("import sys\nfrom bertperf.__main__ import build_parser\n"
            "try:\n    build_parser(['bench', 'train', '--help']).parse_args(['bench', 'train', "
            "'--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("flag, value, least", [
    ("--batch", "0", 1), ("--steps", "0", 1), ("--layers", "0", 1), ("--warmup", "-1", 0)])
def test_sizes_below_their_least_are_one_line_before_anything_runs(monkeypatch, capsys, flag,
                                                                    value, least):
    """0 is a value, not "unset": it is refused, not replaced by the default (which ran a whole
    benchmark)."""
    from bertperf.__main__ import main
    from bertperf.bench import train
    monkeypatch.setattr(train, "load_steps", lambda *args: pytest.fail("the benchmark ran"))
    assert main(["bench", "train", "--synthetic", flag, value]) == 1
    assert capsys.readouterr().err == \
        f"bertperf: error: {flag} must be at least {least}, got {value}\n"


def small_bench(tmp_path, packed: bool):
    """Two steps of two rows of real shards (written by data.synthetic) for a 1-layer tiny
    BERT."""
    import argparse

    from bertperf.bench import train
    from bertperf.data import synthetic
    from bertperf.model import BertForPreTraining

    folder = tmp_path / ("packed" if packed else "unpadded")
    write = synthetic.write_synthetic_packed if packed else synthetic.write_synthetic_shards
    write(folder, 2, 16, seed=3, max_seq_length=64, max_pred=10)
    args = argparse.Namespace(synthetic=False, data=folder, batch=2, seed=1)
    steps, _, max_len, max_pred = train.load_steps(args, 2)
    config = replace(BertConfig.named("tiny"), num_hidden_layers=1)
    initial = BertForPreTraining(config).state_dict()
    return train.Bench(config, torch.device("cpu"), steps, 1, max_len, max_pred, initial)


def spy(monkeypatch, module, name: str) -> list:
    """module.name replaced by a wrapper that records each call's (args, kwargs), then calls
    the real function."""
    calls, real = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


@pytest.mark.parametrize("packed", [False, True], ids=["unpadded", "packed"])
def test_rows_train_on_the_same_sequences(tmp_path, packed):
    """HF's padded batches and the trainer's unpadded (or packed) micro-batches hold the same
    sequences, step by step; packed shards give steps of whole rows; before any step and
    without dropout both models give the same (mean) losses."""
    from bertperf.bench import train

    bench = small_bench(tmp_path, packed)
    assert len(bench.steps) == 2
    for step in bench.steps:
        assert (step.rows is not None) == packed
        if packed:
            assert len(step.rows) == 2 and step.rows.sum() == len(step.samples)
        else:
            assert len(step.samples) == 2
    from bertperf.model import forward_loss

    hf = train.hf_row(bench, "fp32")
    hf.model.eval()
    for layout in ["varlen", "packed"] if packed else ["varlen"]:
        ours = train.bertperf_row(bench, train.run_config((layout,), "cpu"))
        assert hf.digests == ours.digests and len(set(hf.digests)) == 2
        ours.model.eval()
        with torch.no_grad():
            for a, micro in zip(hf.batches, ours.batches):
                torch.testing.assert_close(
                    hf.model(**a).loss,
                    forward_loss(ours.model, micro.inputs, micro.counts).float(),
                    rtol=1e-5, atol=1e-5)


def test_every_bertperf_row_runs_the_trainers_step(tmp_path, monkeypatch):
    """Each bertperf row builds its step with train.loop.build_step from a RunConfig carrying
    its switches as the trainer's settings (PRECISION, LAYOUT; FUSED_KERNELS=0 before the
    fused-kernels switch and 1 from it on; COMPILE=inductor; USE_CUDA_GRAPH=1) and the bench's
    LAMB, on one process and the bench's device, from the bench's weights; every step it times
    is train.loop.train_step on that step and one MicroBatch (stubbed here: the CLI test and
    the test above run it)."""
    from bertperf.bench import train
    from bertperf.train import loop
    from bertperf.train.dist import Dist

    assert [(c.train.precision, c.data.layout, c.train.fused_kernels, c.train.compile,
             c.train.use_cuda_graph, c.train.fp8) for c in (train.run_config(s, "cpu") for s in (
                 ("varlen",), ("varlen", "bf16"), ("varlen", "bf16", "packed"),
                 ("varlen", "bf16", "packed", "fused kernels"),
                 ("varlen", "bf16", "packed", "fused kernels", "compile"),
                 ("varlen", "bf16", "packed", "fused kernels", "compile", "CUDA graphs"),
                 train.SWITCHES))] == [
        ("fp32", "varlen", False, "none", False, "0"),
        ("bf16", "varlen", False, "none", False, "0"),
        ("bf16", "packed", False, "none", False, "0"), ("bf16", "packed", True, "none", False, "0"),
        ("bf16", "packed", True, "inductor", False, "0"),
        ("bf16", "packed", True, "inductor", True, "0"),
        ("bf16", "packed", True, "inductor", True, "1")]
    bench = small_bench(tmp_path, packed=True)
    built = spy(monkeypatch, loop, "build_step")
    stepped = []
    monkeypatch.setattr(loop, "train_step", lambda step, micro: stepped.append((step, micro))
                        or torch.zeros((), dtype=torch.float64))
    ran = {}
    for label, precision, build in train.rows(bench, ("fp32",)):
        if label.startswith("bertperf") and train.measure(bench, label, precision,
                                                          build).missing is None:
            (cfg, dist, device, core), _ = built[-1]
            assert dist == Dist(0, 1) and device == bench.device
            assert all(torch.equal(v, bench.initial[k]) for k, v in core.state_dict().items())
            assert (cfg.optim.lr, cfg.optim.max_steps, cfg.optim.max_grad_norm) == \
                (train.LR, train.MAX_STEPS, train.MAX_GRAD_NORM)
            timed = stepped[-len(bench.steps):]
            assert all(step.cfg is cfg and step.plan.core is core and len(micro) == 1
                       and isinstance(micro[0], loop.MicroBatch) for step, micro in timed)
            ran[label] = (cfg.data.layout, cfg.train.fused_kernels, cfg.train.compile,
                          cfg.train.use_cuda_graph)
    # on this CPU the fused kernels and CUDA graphs are not available, and left out after
    assert ran == {"bertperf: varlen": ("varlen", False, "none", False),
                   "bertperf: + packed": ("packed", False, "none", False),
                   "bertperf: + compile": ("packed", False, "inductor", False)}
    assert len(stepped) == 3 * len(bench.steps)


def test_rows_the_trainer_refuses_say_why_in_its_words(tmp_path):
    """A switch the trainer refuses for the row's configuration is "not available" with the
    trainer's own line (train.parallel.check, train.checks.check_device) and is left out of the
    rows after; what the data lacks is the bench's to say."""
    from bertperf.bench import train
    from bertperf.errors import UserError
    from bertperf.train import checks, parallel

    bench = small_bench(tmp_path, packed=False)
    why = dict((label, build) for label, _, build in train.rows(bench, ("fp32",)))

    def reason(label):
        with pytest.raises(train.NotAvailable) as exc:
            why[label]()
        return str(exc.value)

    assert reason("bertperf: + packed") == "needs packed shards: prep pack"
    with pytest.raises(UserError) as refused:
        parallel.check(train.run_config(("varlen", "compile"), "cpu"), False)
    assert reason("bertperf: + compile") == str(refused.value)
    with pytest.raises(UserError) as refused:
        checks.check_device(train.run_config(("varlen", "fused kernels"), "cpu"))
    assert reason("bertperf: + fused kernels") == str(refused.value)
    with pytest.raises(UserError) as refused:
        parallel.check(train.run_config(("varlen", "FP8"), "cpu"), False)
    assert reason("bertperf: + FP8") == str(refused.value)  # fp32 rows: PRECISION=bf16 first
    if not torch.cuda.is_available():
        with pytest.raises(UserError) as refused:
            checks.check_device(train.run_config(("varlen", "bf16", "FP8"), "cpu"))
        assert "sm_89 or newer" in str(refused.value)


def lambs_of(line: str) -> dict[str, list[str]]:
    """The LAMB line read back: {each LAMB class: the rows that stepped it, in order}."""
    lambs = {}
    for part in line.removeprefix("LAMB: ").split("; "):
        described, rows = part.rsplit(" in ", 1)
        lambs[described.split()[0]] = rows.split(", ")
    return lambs


def test_the_optimizer_line_names_each_rows_lamb(capsys):
    """One line: each LAMB class with the rows that ran with it, in the rows' order; a row that
    did not run (missing) is not named."""
    from bertperf.bench import train

    results = [train.Result("HF", "fp32", optimizer="Lamb"),
               train.Result("bertperf: varlen", "fp32", optimizer="Lamb"),
               train.Result("bertperf: + packed", "fp32", optimizer="Lamb",
                            missing="not available (x)"),
               train.Result("bertperf: + fused kernels", "bf16", optimizer="FlatLamb")]
    train.print_optimizers(results)
    (line,) = capsys.readouterr().out.splitlines()
    assert lambs_of(line) == {"Lamb": ["HF", "bertperf: varlen"],
                              "FlatLamb": ["bertperf: + fused kernels"]}


@pytest.mark.slow
def test_bench_train_prints_both_tables(tmp_path, cpu_emulates_bf16):
    """The command on synthetic samples with a tiny model: one table of rows (every bertperf
    switch either measured or 'not available (why)'), the same-samples line, the model's table
    marked as a model, and the report file. Both precisions, or fp32 alone where this CPU
    emulates bf16 (its bf16 rows would take most of the test's time)."""
    report = tmp_path / "report.md"
    both = not cpu_emulates_bf16
    run = subprocess.run([sys.executable, "-m", "bertperf", "bench", "train", "--synthetic",  # noqa: PLW1510
                          "--config", "tiny", "--batch", "2", "--warmup", "1", "--steps", "1",
                          "--precision", "both" if both else "fp32",
                          "--report", str(report)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    rows = [line for line in lines if line.startswith("| ") and " | " in line]
    header = rows.index(next(r for r in rows if r.startswith("| row |")))
    table = rows[header + 1:header + 8 + both * 2]
    assert [r.split(" | ")[0] for r in table] == \
        ["| HF BertForPreTraining (SDPA, padded)"] * (1 + both) + ["| bertperf: varlen"] + \
        ["| bertperf: + bf16"] * both + [
        "| bertperf: + packed", "| bertperf: + fused kernels", "| bertperf: + compile",
        "| bertperf: + CUDA graphs", "| bertperf: + FP8"]
    losses = []
    for r in table:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert len(cells) == 9, r
        if cells[2].startswith("not available ("):
            continue
        assert float(cells[2].replace(",", "")) > 0 and cells[5].endswith("%"), r
        losses.append(float(cells[7]))
    assert len(losses) >= 3 + both and max(losses) - min(losses) < 0.1 * min(losses)
    assert f"| bertperf: + CUDA graphs | {'bf16' if both else 'fp32'} | not available " \
        "(USE_CUDA_GRAPH=1 needs a CUDA device, not DEVICE=cpu)" in run.stdout
    # FP8: refused in the trainer's own words (fp32: PRECISION; bf16: no FP8 GPU here)
    assert f"| bertperf: + FP8 | {'bf16' if both else 'fp32'} | not available (FP8=1 " + \
        ("runs the encoder's GEMMs on FP8 tensor cores" if both else
         "runs the encoder's GEMMs in FP8 around bf16 activations") in run.stdout
    assert any(line.startswith("every row trained on the same 4 sequences") for line in lines)
    # on this CPU every row steps Lamb (FlatLamb where the kernels take Triton: CUDA)
    assert "LAMB: Lamb (per tensor, foreach ops) in HF BertForPreTraining (SDPA, padded), " \
        f"bertperf: varlen, {'bertperf: + bf16, ' if both else ''}bertperf: + packed" in run.stdout
    model = lines.index(next(line for line in lines if line.startswith("step-time MODEL")))
    assert "a model, not a measurement" in lines[model]
    model_rows = [line for line in lines[model:] if line.startswith(("| A100", "| H100"))]
    assert len(model_rows) >= 2 * 4 and all(len(r.strip("|").split("|")) == 8 for r in model_rows)
    assert any("encoder GEMMs in FP8" in r for r in model_rows if r.startswith("| H100"))
    assert not any("FP8" in r for r in model_rows if r.startswith("| A100"))
    assert any(line.startswith("calibration checked on the A100 by `python -m bertperf bench "
                               "scale`") for line in lines[model:])
    assert report.read_text().count("step-time MODEL") == 1


FAST = ["bench", "train", "--synthetic", "--config", "tiny", "--layers", "1", "--batch", "2",
        "--warmup", "0", "--steps", "1", "--precision", "fp32"]
"""The command at its smallest: one timed step of 2 synthetic rows, a 1-layer tiny BERT, fp32."""


def table_of(out: str) -> list[list[str]]:
    """The measured table read back: each row's cells."""
    lines = out.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("| row |")))
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in itertools.takewhile(lambda line: line.startswith("| "),
                                            lines[header + 2:])]


def wrap_rows(monkeypatch, wrap) -> None:
    """train.rows as the command calls it, each row's build replaced by wrap(label, build)."""
    from bertperf.bench import train

    real = train.rows

    def rows(*args):
        for label, precision, build in real(*args):
            yield label, precision, wrap(label, build)

    monkeypatch.setattr(train, "rows", rows)


def test_each_row_is_printed_and_reported_as_soon_as_it_is_measured(tmp_path, monkeypatch,
                                                                    capsys):
    """The table's header comes before the first row is built, each row's line (with its speed
    against the HF row before it) before the next row is built, on stdout and in --report's
    file alike, so that a run stopped at a time limit keeps the rows measured; --rows measures
    and prints only the rows it names; --no-model prints no step-time model."""
    from bertperf.__main__ import main

    report = tmp_path / "report.md"
    before = []  # (stdout since the row before was built, the report) as each row is built

    def recording(label, build):
        def build_after_recording():
            before.append((capsys.readouterr().out, report.read_text()))
            return build()
        return build_after_recording

    wrap_rows(monkeypatch, recording)
    assert main([*FAST, "--rows", "hf,varlen,packed", "--no-model",
                 "--report", str(report)]) == 0
    out = "".join(o for o, _ in before) + capsys.readouterr().out
    table = table_of(out)
    assert [cells[0] for cells in table] == ["HF BertForPreTraining (SDPA, padded)",
                                             "bertperf: varlen", "bertperf: + packed"]
    assert all(float(cells[2].replace(",", "")) > 0 for cells in table)
    assert table[0][8] == "1.00x" and all(cells[8].endswith("x") for cells in table)
    lines = out.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("| row |")))
    done = lines[header + 1:header + 4]  # the separator, HF's line, varlen's
    assert [o for o, _ in before[1:]] == [line + "\n" for line in done[1:]]
    for (o, text), line in zip(before, done, strict=True):
        assert o.endswith(line + "\n") and text.endswith(line + "\n")
    assert before[0][1].startswith("`python -m bertperf")  # the command (pytest's own argv here)
    assert "step-time MODEL" not in out
    assert any(line.startswith("every row trained on the same") for line in out.splitlines())
    assert report.read_text().count("| bertperf: + packed |") == 1


def test_a_failing_row_is_one_cell_freed_and_the_rows_after_run(monkeypatch, capsys):
    """A row whose build raises (here HF's, a ValueError after its model is built) is that
    row's "failed (type: first line)" cell; its model is freed before the next row is built;
    the rows after it are measured, with no HF row of their precision to compare with."""
    import weakref

    from bertperf.__main__ import main

    models, freed = [], []

    def failing_hf(label, build):
        def build_or_fail():
            freed.extend(model() is None for model in models)
            if not label.startswith("HF"):
                return build()
            t = build()
            models.append(weakref.ref(t.model))
            raise ValueError("injected after the model was built\nsecond line")
        return build_or_fail

    wrap_rows(monkeypatch, failing_hf)
    assert main([*FAST, "--rows", "hf,varlen,packed", "--no-model"]) == 0
    out = capsys.readouterr().out
    hf, *after = table_of(out)
    assert hf[2:] == ["failed (ValueError: injected after the model was built)"] + [""] * 6
    assert freed == [True, True]
    assert [cells[0] for cells in after] == ["bertperf: varlen", "bertperf: + packed"]
    assert all(float(cells[2].replace(",", "")) > 0 and cells[8] == "" for cells in after)
    (line,) = [line for line in out.splitlines() if line.startswith("LAMB: ")]
    assert lambs_of(line) == {"Lamb": ["bertperf: varlen", "bertperf: + packed"]}
    assert any(line.startswith("every row trained on the same") for line in out.splitlines())


def test_rows_selects_rows_with_the_switches_of_those_before(tmp_path, monkeypatch, capsys):
    """--rows' keys name the rows built; a bertperf row left out still adds its switch to the
    rows after it (where available); an unknown key is one line naming it and the keys, before
    anything is measured."""
    from bertperf.__main__ import main
    from bertperf.bench import train
    from bertperf.train import loop

    bench = small_bench(tmp_path, packed=True)
    def labels(*keys):
        return [label for label, _, _ in train.rows(bench, ("fp32",), *keys)]

    assert labels({"hf"}) == ["HF BertForPreTraining (SDPA, padded)"]
    assert labels(set(train.ROW_KEYS)) == labels()
    (label, precision, build), fp8 = train.rows(bench, ("fp32",), {"compile", "fp8"})
    assert (label, precision, fp8[0]) == ("bertperf: + compile", "fp32", "bertperf: + FP8")
    built = spy(monkeypatch, loop, "build_step")
    build()
    (cfg, _, _, _), _ = built[-1]
    # packed on before it; the fused kernels not available on this CPU
    assert cfg == train.run_config(("varlen", "packed", "compile"), "cpu")
    with pytest.raises(train.NotAvailable):  # FP8=1 needs PRECISION=bf16
        fp8[2]()

    assert main([*FAST, "--rows", "hf, cuda,fp8"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == ("bertperf: error: --rows: no row 'cuda'; the rows: hf, varlen, "
                                 "bf16, packed, kernels, compile, graphs, fp8\n")
