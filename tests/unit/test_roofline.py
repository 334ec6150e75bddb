"""The step-time model's roofline (bertperf.perfmodel.roofline): pricing a hand-made trace
against hand-computed values, and recording a step's kernels (FLOPs, bytes, phase, the bertperf
function that issued them) on real and fake tensors."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace

import pytest
import torch

from bertperf.perfmodel import gpus, roofline
from bertperf.perfmodel.roofline import Access, Gpu, Op

TRITON = importlib.util.find_spec("triton") is not None

# ---- pricing a hand-made trace -------------------------------------------------------------------

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
    perfmodel/anchors.csv, installed with the package, over the datasheet peak; each anchor names
    what was measured and where it was published."""
    from pathlib import Path

    assert gpus.ANCHORS.parent == Path(roofline.__file__).parent
    anchors = gpus.anchors()
    assert all(a.source and a.what for a in anchors.values())
    for name in (gpus.A100, gpus.H100):
        gpu = roofline.GPUS[name]
        assert gpu.matmul_efficiency == anchors["gemm", gpu.name].value / gpu.tensor_flops
        assert gpu.memory_efficiency == anchors["bandwidth", gpu.name].value / gpu.bandwidth
        assert gpu.attention_forward_efficiency == \
            anchors["attention_forward", gpu.name].value / gpu.tensor_flops
        assert gpu.attention_backward_efficiency == \
            anchors["attention_backward", gpu.name].value / gpu.tensor_flops
        for fraction in (gpu.matmul_efficiency, gpu.memory_efficiency,
                         gpu.attention_forward_efficiency, gpu.attention_backward_efficiency):
            assert 0 < fraction < 1
    a100, h100 = roofline.GPUS[gpus.A100], roofline.GPUS[gpus.H100]
    assert a100.fp8_flops == 0 and h100.fp8_efficiency == \
        anchors["gemm_fp8", h100.name].value / h100.fp8_flops
    # every other GPU: its own datasheet at its kernels_like GPU's measured fractions
    assert set(roofline.GPUS) == set(gpus.GPUS)
    for name, g in gpus.GPUS.items():
        priced, like = roofline.GPUS[name], roofline.GPUS[g.calibrated_on]
        assert (priced.tensor_flops, priced.bandwidth, priced.fp8_flops) == \
            (g.tensor_flops, g.bandwidth, g.fp8_flops)
        assert (priced.matmul_efficiency, priced.memory_efficiency) == \
            (like.matmul_efficiency, like.memory_efficiency)
        assert bool(priced.fp8_efficiency) == bool(g.fp8_flops)


def test_foreach_launches_follow_multi_tensor_apply():
    small = [torch.empty(10)] * 200
    assert roofline.foreach_launches([small]) == 2  # 110 tensors a launch
    assert roofline.foreach_launches([small, small, small]) == 5  # 48 with three lists
    big = [torch.empty(65536 * 321)]
    assert roofline.foreach_launches([big]) == 2  # 321 chunks, 320 a launch


# ---- recording -----------------------------------------------------------------------------------

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


def test_kernels_assuming_cuda_take_the_triton_path_for_cpu_tensors():
    """Kernels(assume_cuda=True), as the model's trace builds the step, take the Triton path for
    a CPU tensor as FUSED_KERNELS says (auto and 1: yes, 0: no), while the tensor (and so
    attention, autocast, the caller) is the CPU tensor it is; the default Kernels do not."""
    from bertperf.kernels import Kernels

    x = torch.zeros(3)
    assert Kernels(assume_cuda=True).use_triton(x) and Kernels(True, True).use_triton(x)
    assert not Kernels(False, assume_cuda=True).use_triton(x)
    assert not x.is_cuda and not Kernels().use_triton(x) and not Kernels(True).use_triton(x)


def test_launches_outside_aten_are_recorded_by_their_stand_ins():
    """A Triton launcher called directly (not a custom operator) cannot run on fake tensors:
    given the stand-ins (roofline.STAND_INS) as the Kernels' launchers, lamb_step calls the
    stand-in, which records each launch with the tensors it reads and writes; no module is
    imported or replaced (Triton need not be installed)."""
    from bertperf.kernels import Kernels, LambLayout
    from bertperf.kernels.lamb import lamb_step
    from torch._subclasses.fake_tensor import FakeTensorMode

    name = "bertperf.kernels.triton.lamb"
    before = sys.modules.get(name)
    roofline.launch("nothing", 1.0)  # outside a trace: ignored
    kernels = Kernels(True, assume_cuda=True, launchers=roofline.STAND_INS)
    with FakeTensorMode():
        layout = LambLayout([3000, 5], [0.01, 0.0], [True, False], "cpu")
        w, g, m, v = (torch.zeros(3005) for _ in range(4))
        trace = roofline.trace(lambda: lamb_step(layout, w, g, m, v, lr=1e-3,
                                                 betas=(0.9, 0.999), eps=1e-6, step=1,
                                                 kernels=kernels))
    assert sys.modules.get(name) is before
    launches = [op for op in trace.ops if op.name.startswith("lamb_")]
    assert [op.name for op in launches] == ["lamb_moments", "lamb_ratios", "lamb_apply"]
    moments, ratios, apply = launches
    n = 3005 * 4
    assert moments.flops == apply.flops == 3005 and ratios.flops == 3  # 2 + 1 chunks of 2,048
    # moments: reads w, g, m, v (and the layout's tables), writes m, v and 3 chunks' 2 norms
    assert sum(a.nbytes for a in moments.reads if a.nbytes == n) == 4 * n
    assert sum(a.nbytes for a in moments.writes) == 2 * n + 3 * 2 * 4
    assert moments.writes[-1].storage == ratios.reads[1].storage  # the partial norms
    assert ratios.writes[0].storage == apply.reads[-1].storage  # the trust ratios
    assert [a.storage for a in apply.writes] == [moments.reads[0].storage]  # w, in place


@pytest.mark.skipif(not TRITON, reason="the real launcher needs Triton installed")
def test_the_stand_ins_take_the_real_launchers_arguments():
    import inspect

    from bertperf.kernels.triton import lamb

    assert list(roofline.STAND_INS) == ["lamb.step"]
    assert inspect.signature(roofline.STAND_INS["lamb.step"]).parameters.keys() == \
        inspect.signature(lamb.step).parameters.keys()
