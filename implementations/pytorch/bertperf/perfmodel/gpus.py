"""The GPUs the performance model knows: one entry a GPU, with each figure's source. roofline,
cluster, scale, commodity and plan read them here; adding a GPU is one entry (plus, where one is
published, a calibration row in results.csv or anchors.csv)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

PCIE3_X16, PCIE4_X16, PCIE5_X16 = 15.75e9, 31.5e9, 63.0e9
"""A PCIe x16 link a direction, bytes/s: 16 lanes at 8 (3.0), 16 (4.0) or 32 (5.0) GT/s with
128b/130b encoding (PCI-SIG, PCI Express Base Specification 3.0, 4.0 and 5.0; NVIDIA's V100
datasheet rounds 3.0 x16 to "32 GB/s" both ways). The link's rate: NCCL's ring over PCIe reaches
less, and GPUs behind one switch or across CPU sockets share less; neither is modelled."""

A100, H100 = "A100 80GB SXM", "H100 80GB SXM"
"""The GPUs with kernel measurements of their own in anchors.csv: every other GPU's kernels are
priced at the fractions of its peaks measured on one of these (Gpu.kernels_like)."""


@dataclass(frozen=True)
class Gpu:
    """A GPU's datasheet figures (dense peaks, without sparsity)."""

    name: str
    tensor_flops: float
    """Dense fp16/bf16 tensor-core peak, FLOP/s."""
    vector_flops: float
    """float32 peak without tensor cores, FLOP/s."""
    bandwidth: float
    """Memory bandwidth, bytes/s."""
    memory_gb: float
    """Memory, GB: bounds the micro-batch `plan` proposes."""
    pcie: float
    """Its PCIe x16 link to the host, bytes/s a direction: a commodity node's fabric between its
    GPUs (`model commodity`)."""
    source: str
    """Where the figures come from."""
    fp8_flops: float = 0.0
    """Dense FP8 tensor-core peak, FLOP/s (0: no FP8 tensor cores: PRECISION bf16 only)."""
    network: str | None = None
    """The network (network.FABRICS) its nodes have when `plan` is given none: its DGX's or
    rack's; None for a PCIe card, whose network the user names."""
    kernels_like: str = ""
    """The GPU (A100 or H100) whose measured kernel efficiencies (anchors.csv: the fractions of
    the peaks GEMMs, attention and memory-bound kernels reach) its kernels are priced at; ""
    for those two themselves. An assumption where it is not the GPU itself: the same
    architecture, or the nearest one measured."""

    @property
    def calibrated_on(self) -> str:
        """The GPU whose anchors.csv rows price its kernels."""
        return self.kernels_like or self.name


AMPERE = "NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TFLOP/s bf16 dense, 19.5 float32"
HOPPER = ("NVIDIA H100 Tensor Core GPU datasheet (2023), SXM: 989 TFLOP/s bf16 dense (1,979 with "
          "sparsity), 67 float32, FP8 1,979 dense")

GPUS = {g.name: g for g in (
    Gpu(A100, 312e12, 19.5e12, 2.039e12, 80, PCIE4_X16, f"{AMPERE}, HBM2e 2,039 GB/s",
        network="dgx-a100"),
    Gpu("A100 40GB SXM", 312e12, 19.5e12, 1.555e12, 40, PCIE4_X16,
        f"{AMPERE}, HBM2 1,555 GB/s", network="dgx-a100", kernels_like=A100),
    Gpu("A100 80GB PCIe", 312e12, 19.5e12, 1.935e12, 80, PCIE4_X16,
        f"{AMPERE}, HBM2e 1,935 GB/s (PCIe card)", kernels_like=A100),
    Gpu(H100, 989e12, 67e12, 3.35e12, 80, PCIE5_X16, f"{HOPPER}, HBM3 3.35 TB/s",
        fp8_flops=1979e12, network="dgx-h100"),
    Gpu("H100 80GB PCIe", 756e12, 51e12, 2.0e12, 80, PCIE5_X16,
        "NVIDIA H100 Tensor Core GPU datasheet (2023), PCIe: 1,513 TFLOP/s bf16 with sparsity "
        "(756 dense), 51 float32, FP8 3,026 with sparsity (1,513 dense), HBM2e 2 TB/s",
        fp8_flops=1513e12, kernels_like=H100),
    Gpu("H100 96GB SXM", 989e12, 67e12, 3.35e12, 96, PCIE5_X16,
        "a submitter's system description (96 GB); no datasheet of this variant: the H100 "
        "SXM's figures", fp8_flops=1979e12, network="dgx-h100", kernels_like=H100),
    Gpu("H200 141GB SXM", 989e12, 67e12, 4.8e12, 141, PCIE5_X16,
        "NVIDIA H200 Tensor Core GPU datasheet (2024): the H100 SXM's compute (989 TFLOP/s "
        "bf16 dense, 67 float32, FP8 1,979 dense), HBM3e 4.8 TB/s", fp8_flops=1979e12,
        network="dgx-h100", kernels_like=H100),
    Gpu("B200 180GB SXM", 2250e12, 80e12, 8.0e12, 180, PCIE5_X16,
        "NVIDIA HGX B200 datasheet (2024), a GPU at 1,000 W: 4.5 PFLOP/s bf16 with sparsity "
        "(2.25 dense), 80 TFLOP/s float32, FP8 9 with sparsity (4.5 dense), HBM3e 8 TB/s "
        "(DGX B200: 64 TB/s for 8 GPUs)", fp8_flops=4500e12, network="dgx-b200",
        kernels_like=H100),
    Gpu("GB200 186GB", 2500e12, 90e12, 8.0e12, 186, PCIE5_X16,
        "NVIDIA GB200 NVL72 datasheet (2024), a GPU at 1,200 W: 5 PFLOP/s bf16 with sparsity "
        "(2.5 dense), 90 TFLOP/s float32, FP8 10 with sparsity (5 dense); HBM3e 576 TB/s and "
        "13.4 TB for 72 GPUs", fp8_flops=5000e12, network="gb200-nvl72", kernels_like=H100),
    Gpu("V100 32GB", 125e12, 15.7e12, 0.9e12, 32, PCIE3_X16,
        "NVIDIA Tesla V100 datasheet (2020): SXM2 125 TFLOP/s tensor, 15.7 float32, HBM2 900 "
        "GB/s, PCIe 3.0 x16 (the PCIe card: 112 and 14 at lower clocks)", kernels_like=A100),
    Gpu("RTX 3090", 71e12, 35.6e12, 0.936e12, 24, PCIE4_X16,
        "NVIDIA Ampere GA102 GPU Architecture whitepaper (2020): 71 TFLOP/s fp16 tensor with "
        "fp32 accumulation (142 with sparsity), 35.6 float32, GDDR6X 936 GB/s, PCIe 4.0 x16",
        kernels_like=A100),
    Gpu("RTX A5000", 111.1e12, 27.8e12, 0.768e12, 24, PCIE4_X16,
        "NVIDIA RTX A5000 datasheet (2021): 222.2 TFLOP/s tensor with sparsity (111.1 dense), "
        "27.8 float32, GDDR6 768 GB/s, PCIe 4.0 x16", kernels_like=A100),
)}
"""Every GPU of the published results and of `plan`, and the commodity ones (PCIe cards).
Blackwell's kernels are priced at the H100's measured fractions (no kernel measurement of a
B200 is at hand); the V100 and the RTX cards' at the A100's."""


ANCHORS = Path(__file__).with_name("anchors.csv")
"""The published (or the developers') measurements roofline's efficiencies are calibrated on, one
a row: quantity (gemm, gemm_fp8, bandwidth, attention_forward, attention_backward, mlperf_fp8;
bert_dle_fp16: one code's BERT-large rate on several GPUs), gpu, value, unit, what was measured,
source. Data, not code: installed with the package."""


@dataclass(frozen=True)
class Anchor:
    quantity: str
    gpu: str
    value: float
    unit: str
    what: str
    source: str


@functools.cache
def anchors(path: Path = ANCHORS) -> dict[tuple[str, str], Anchor]:
    """The rows of anchors.csv by (quantity, gpu)."""
    import csv

    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {(r["quantity"], r["gpu"]): Anchor(r["quantity"], r["gpu"], float(r["value"]), r["unit"],
                                              r["what"], r["source"]) for r in rows}
