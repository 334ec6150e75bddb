"""Ahead-of-time compilation of the Triton kernels to cubin for A100 (sm_80) and H100 (sm_90)
without a GPU, and what each compiled kernel needs: shared memory per block, registers and
stack (local memory: spills) per thread, read with the cuobjdump that Triton bundles.

Each module of bertperf.kernels.triton lists its launches at BERT-large shapes in `aot_cases()`,
built with the same block sizes and warp counts its launchers use. The kernels must have been
defined with TRITON_INTERPRET unset (the interpreter replaces them by Python functions), so
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

CAPABILITIES = (80, 90)
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
"""Largest dynamic shared memory per block, bytes: A100 163 KB, H100 227 KB."""


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
    return triton.compile(source, target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": case.num_warps, "num_stages": case.num_stages})


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


def all_cases() -> list[Case]:
    """Every kernel's launches at BERT-large shapes."""
    from bertperf.kernels.triton import bias_gelu, cross_entropy, embedding, lamb, layer_norm

    return [case for module in (bias_gelu, layer_norm, embedding, cross_entropy, lamb)
            for case in module.aot_cases()]


def report(case: Case, capability: int) -> dict[str, Any]:
    """What one compiled kernel needs, as a JSON-ready dict (registers and stack None when
    there is no cuobjdump)."""
    kernel = compile_case(case, capability)
    usage = resource_usage(kernel.asm["cubin"]) if cuobjdump() else {}
    return {"name": case.name, "capability": capability, "shared": kernel.metadata.shared,
            "shared_limit": SHARED_LIMIT[capability], "registers": usage.get("reg"),
            "stack": usage.get("stack"), "num_warps": case.num_warps}


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
