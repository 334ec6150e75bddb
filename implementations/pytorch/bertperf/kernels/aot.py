"""Ahead-of-time compilation of the Triton kernels to cubin for A100 (sm_80) and H100 (sm_90)
without a GPU, and what each compiled kernel needs: shared memory per block, registers and
stack (local memory: spills) per thread, read with the cuobjdump that Triton bundles, and how
many programs of it stay resident on one SM at once.

The cases below list every kernel's launches at BERT-large shapes, built with the block sizes
and warp counts of its launcher in bertperf.kernels.triton. The kernels must have been defined
with TRITON_INTERPRET unset (the interpreter replaces them by Python functions), so
`python -m bertperf.kernels.aot` compiles them all in a process of its own and prints one JSON
object per kernel and target.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from bertperf.kernels.lamb import LambLayout
from bertperf.kernels.triton import bias_gelu, cross_entropy, embedding, lamb, layer_norm
from bertperf.kernels.triton.common import row_config

CAPABILITIES = (80, 90)
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
"""Largest dynamic shared memory per block, bytes: A100 163 KB, H100 227 KB."""
SHARED_PER_SM = {80: 164 * 1024, 90: 228 * 1024}
"""Shared memory per SM, bytes, of which each resident block also takes 1 KB for the system."""
REGISTERS_PER_SM = 65536
"""32-bit registers per SM, in four sub-partitions, each warp's registers allocated in units of
256 within one (sm_80, sm_90; CUDA C++ Programming Guide, compute capabilities table)."""
WARPS_PER_SM, BLOCKS_PER_SM = 64, 32
"""Resident warps (2,048 threads) and blocks per SM, sm_80 and sm_90."""


@dataclass
class Case:
    """One launch of a kernel. `args` maps every kernel argument, in order, to its Triton type
    ("*bf16", "i32", "fp32", ...) or, for compile-time arguments (tl.constexpr, None), its
    value. Pointers are taken as 16-byte aligned (every PyTorch allocation is), and the integer
    arguments named in `divisible` as multiples of 16: the hints the JIT launcher derives from
    real arguments and without which Triton neither vectorises nor pipelines."""

    name: str
    kernel: Any
    args: dict[str, Any]
    divisible: tuple[str, ...] = ()
    num_warps: int = 4
    num_stages: int = 3
    maxnreg: int | None = None
    """The launcher's register cap a thread, if it sets one."""
    per_sm: int | None = None
    """For a kernel whose launcher sizes its grid to the SMs (common.row_programs): the programs
    it launches per SM, all of which must be resident at once."""


def compile_case(case: Case, capability: int) -> Any:
    """The triton CompiledKernel of `case` for sm_<capability>."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if list(case.args) != case.kernel.arg_names:
        raise ValueError(f"{case.name}: arguments {list(case.args)} are not the kernel's "
                         f"{case.kernel.arg_names}")
    signature, constexprs, attrs = {}, {}, {}
    for i, (name, value) in enumerate(case.args.items()):
        if isinstance(value, str):
            signature[name] = value
            if value.startswith("*") or name in case.divisible:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "constexpr"
            constexprs[name] = value
    source = ASTSource(case.kernel, signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": case.num_warps, "num_stages": case.num_stages}
    if case.maxnreg is not None:
        options["maxnreg"] = case.maxnreg
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)


def resident_programs(registers: int, num_warps: int, shared: int, capability: int) -> int:
    """Programs (blocks) of a kernel resident on one SM at once, limited by registers, warps,
    shared memory and the block limit, as CUDA's occupancy calculator counts them."""
    per_warp = -(-registers * 32 // 256) * 256
    warps_by_registers = 4 * ((REGISTERS_PER_SM // 4) // per_warp)
    by_shared = SHARED_PER_SM[capability] // (shared + 1024)
    return min(warps_by_registers // num_warps, WARPS_PER_SM // num_warps, by_shared,
               BLOCKS_PER_SM)


def cuobjdump() -> str | None:
    """Triton's bundled cuobjdump, or None when this Triton has none."""
    from triton.backends.nvidia import compiler

    path = os.path.join(os.path.dirname(compiler.__file__), "bin", "cuobjdump")
    return path if os.access(path, os.X_OK) else None


def resource_usage(cubin: bytes) -> dict[str, int]:
    """REG (registers per thread) and STACK (local memory per thread, bytes: register spills
    or a call's frame; 0 for a kernel that neither spills nor calls) of a cubin."""
    tool = cuobjdump()
    if tool is None:
        raise FileNotFoundError("this Triton bundles no cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    usage = {}
    for word in out.replace(",", " ").split():
        key, _, value = word.partition(":")
        if key in ("REG", "STACK") and value.isdigit():
            usage[key.lower()] = int(value)
    return usage


def bias_gelu_cases() -> list[Case]:
    """BERT-large's feed-forward (N = 4096) and MLM-head (N = 1024) activations in bf16."""
    cases = []
    for n in (4096, 1024):
        blocks = dict(BLOCK_M=bias_gelu.BLOCK_M, BLOCK_N=bias_gelu.column_block(n))
        cases += [
            Case(f"bias_gelu_fwd N={n}", bias_gelu.bias_gelu_fwd,
                 dict(X="*bf16", BIAS="*fp32", Y="*bf16", rows="i32", N="i32", **blocks),
                 divisible=("N",), num_warps=bias_gelu.NUM_WARPS),
            Case(f"bias_gelu_bwd N={n}", bias_gelu.bias_gelu_bwd,
                 dict(DY="*bf16", X="*bf16", BIAS="*fp32", DX="*bf16", DBIAS_PARTIAL="*fp32",
                      rows="i32", N="i32", **blocks), divisible=("N",),
                 num_warps=bias_gelu.NUM_WARPS, per_sm=bias_gelu.BACKWARD_PER_SM),
        ]
    return cases


def layer_norm_cases() -> list[Case]:
    """BERT-large (hidden 1024, bf16 activations, fp32 LayerNorm parameters): the sub-layer end
    (bias, dropout, residual) and the MLM head's transform (bias, GeLU)."""
    fwd, bwd = row_config(1024, False), row_config(1024, True)
    block = dict(BLOCK_N=fwd["BLOCK_N"])
    variants = {"dropout_add_layer_norm": dict(HAS_BIAS=True, GELU=False, DROPOUT=True,
                                               HAS_RESIDUAL=True),
                "bias_gelu_layer_norm": dict(HAS_BIAS=True, GELU=True, DROPOUT=False,
                                             HAS_RESIDUAL=False)}
    cases = []
    for name, sw in variants.items():
        res = "*bf16" if sw["HAS_RESIDUAL"] else None
        seed = "*i64" if sw["DROPOUT"] else None
        cases += [
            Case(f"{name}_fwd", layer_norm.sublayer_layer_norm_fwd,
                 dict(X="*bf16", BIAS="*fp32", RES=res, W="*fp32", LN_BIAS="*fp32", SEED=seed,
                      OUT="*bf16", N="i32", p="fp32", eps="fp32", **block, **sw),
                 divisible=("N",), num_warps=fwd["num_warps"]),
            Case(f"{name}_bwd", layer_norm.sublayer_layer_norm_bwd,
                 dict(DOUT="*bf16", X="*bf16", BIAS="*fp32", RES=res, W="*fp32", SEED=seed,
                      DX="*bf16", DRES=res, PARTIAL="*fp32", rows="i32", N="i32", p="fp32",
                      eps="fp32", **block, **sw),
                 divisible=("N",), num_warps=bwd["num_warps"],
                 per_sm=layer_norm.BACKWARD_PER_SM),
        ]
    cases.append(Case("dropout_keep_mask", layer_norm.keep_mask_kernel,
                      dict(SEED="*i64", KEEP="*i8", N="i32", p="fp32", **block),
                      divisible=("N",), num_warps=fwd["num_warps"]))
    return cases


def embedding_cases() -> list[Case]:
    """BERT-large: hidden 1024, fp32 tables, bf16 output, dropout, int32 ids, 2 token types."""
    fwd, bwd = row_config(1024, False), row_config(1024, True)
    block = dict(BLOCK_N=fwd["BLOCK_N"])
    ids = dict(IDS="*i32", SEG="*i32", POS="*i32", WORD="*fp32", POSITION="*fp32",
               TYPE="*fp32", W="*fp32")
    return [
        Case("embedding_layer_norm_fwd", embedding.embedding_layer_norm_fwd,
             dict(**ids, LN_BIAS="*fp32", SEED="*i64", OUT="*bf16", N="i32", p="fp32",
                  eps="fp32", **block, DROPOUT=True), divisible=("N",),
             num_warps=fwd["num_warps"]),
        Case("embedding_layer_norm_bwd", embedding.embedding_layer_norm_bwd,
             dict(DOUT="*bf16", **ids, SEED="*i64", DWORD="*fp32", DPOSITION="*fp32",
                  PARTIAL="*fp32", TYPE_PARTIAL="*fp32", rows="i32", N="i32", p="fp32",
                  eps="fp32", **block, TYPES=2, DROPOUT=True), divisible=("N",),
             num_warps=bwd["num_warps"], maxnreg=embedding.BACKWARD_MAX_REGISTERS,
             per_sm=embedding.BACKWARD_PER_SM),
    ]


def cross_entropy_cases() -> list[Case]:
    """BERT-large's MLM logits: bf16, 30522 real columns of the 30528-wide padded decoder."""
    cfg = cross_entropy.launch_config(30522)
    block = dict(BLOCK_V=cfg["BLOCK_V"])
    return [
        Case("cross_entropy_fwd", cross_entropy.cross_entropy_fwd,
             dict(LOGITS="*bf16", LABELS="*i32", WEIGHTS="*fp32", LOSS="*fp32", LSE="*fp32",
                  V="i32", stride="i32", **block), divisible=("stride",),
             num_warps=cfg["num_warps"]),
        Case("cross_entropy_bwd", cross_entropy.cross_entropy_bwd,
             dict(LOGITS="*bf16", LABELS="*i32", WEIGHTS="*fp32", LSE="*fp32", GRAD="*fp32",
                  DLOGITS="*bf16", V="i32", stride="i32", **block), divisible=("stride",),
             num_warps=cfg["num_warps"]),
    ]


def lamb_cases() -> list[Case]:
    """The default chunk of LambLayout, fp32 everything."""
    block = dict(BLOCK=LambLayout.BLOCK)
    tables = dict(CHUNK_TENSOR="*i32", TENSOR_CHUNKS="*i32", OFFSETS="*i64", WD="*fp32",
                  COEF="*fp32")
    return [
        Case("lamb_moments", lamb.lamb_moments,
             dict(W="*fp32", G="*fp32", M="*fp32", VSQ="*fp32", **tables, PARTIAL="*fp32",
                  beta3="fp32", one_minus_beta2="fp32", eps="fp32", **block),
             num_warps=lamb.NUM_WARPS),
        Case("lamb_ratios", lamb.lamb_ratios,
             dict(TENSOR_CHUNKS="*i32", PARTIAL="*fp32", ADAPT="*i8", LR="*fp32",
                  SCALE="*fp32", BLOCK=lamb.RATIO_BLOCK), num_warps=lamb.NUM_WARPS),
        Case("lamb_apply", lamb.lamb_apply,
             dict(W="*fp32", M="*fp32", VSQ="*fp32", **tables, SCALE="*fp32", eps="fp32",
                  **block), num_warps=lamb.NUM_WARPS),
    ]


def all_cases() -> list[Case]:
    """Every kernel's launches at BERT-large shapes."""
    return (bias_gelu_cases() + layer_norm_cases() + embedding_cases() + cross_entropy_cases()
            + lamb_cases())


def report(case: Case, capability: int) -> dict[str, Any]:
    """What one compiled kernel needs, as a JSON-ready dict (registers, stack and resident
    programs None when there is no cuobjdump; per_sm None for a grid not sized to the SMs)."""
    kernel = compile_case(case, capability)
    usage = resource_usage(kernel.asm["cubin"]) if cuobjdump() else {}
    shared = kernel.metadata.shared
    resident = (resident_programs(usage["reg"], case.num_warps, shared, capability)
                if "reg" in usage else None)
    return {"name": case.name, "capability": capability, "shared": shared,
            "shared_limit": SHARED_LIMIT[capability], "registers": usage.get("reg"),
            "stack": usage.get("stack"), "num_warps": case.num_warps, "resident": resident,
            "per_sm": case.per_sm}


def main() -> None:
    """Compile every case for every target; one JSON object per line."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("bertperf.kernels.aot: unset TRITON_INTERPRET (interpreted kernels cannot be "
                 "compiled)")
    for case in all_cases():
        for capability in CAPABILITIES:
            print(json.dumps(report(case, capability)), flush=True)


if __name__ == "__main__":
    main()
