"""FP8 training of the encoder's GEMMs (FP8=1; docs/design.md, "FP8"), with torchao's float8
training: its "tensorwise" recipe, dynamic scaling (each tensor's scale is the format's max over
the tensor's current amax, computed every call; not Transformer Engine's delayed scaling), E4M3
for inputs and weights, E5M2 for the output gradient (the hybrid format).

`convert` swaps, in place, the four linear layers of each encoder layer (qkv, the attention
output, the intermediate and the output dense) for `Float8Linear`s holding the same parameter
objects: the state dict keeps its names, shapes and fp32 dtypes, and an FP8 checkpoint loads
into a model without FP8. Embeddings, the pooler and the heads, LayerNorm, attention, the
optimizer and the checkpoints are untouched. The model calls its bias-less GEMMs through
bertperf.model.layers.gemm, which asks `Float8Linear.gemm` where a layer is converted (the
bias stays fused into the next kernel, as without FP8). torchao is imported only here, only
when FP8 is on."""

from __future__ import annotations

import dataclasses
import logging
import re
from types import ModuleType

import torch
from torch import nn

ENCODER_LINEARS = ("attention.self.qkv", "attention.output.dense", "intermediate.dense",
                   "output.dense")
"""The linear layers of one BertLayer that FP8 converts (4 a layer)."""

RECIPE = "tensorwise"
"""torchao's Float8LinearRecipeName: dynamic per-tensor scales, E4M3 forward, E5M2 gradients."""

_CLASS = None

KNOWN_IMPORT_MESSAGES = {
    "torchao": re.compile(r"Failed to load \S*_C_(mxfp8|cutlass_90a)\S*\.so\b"),
    "torch.utils._pytree": re.compile(r"%s is an Enum subclass and is now natively supported"),
}
"""{logger: message} that importing torchao logs on every run and that say nothing about FP8
training here: its MX-format and sm_90a CUTLASS extensions, kernels of other recipes built for
another Python or CUDA, failing to load; torch deprecating the way torchao registers its enums
with pytree. Dropped during that import only (`torchao_float8`); every other message passes."""


def _known(record: logging.LogRecord) -> bool:
    """False (drop it) for a record KNOWN_IMPORT_MESSAGES names."""
    known = KNOWN_IMPORT_MESSAGES.get(record.name)
    return known is None or known.match(str(record.msg)) is None


def torchao_float8() -> tuple[ModuleType, ModuleType]:
    """torchao.float8's float8_linear and config modules: the one place torchao is imported,
    without the messages of KNOWN_IMPORT_MESSAGES."""
    loggers = [logging.getLogger(name) for name in KNOWN_IMPORT_MESSAGES]
    for logger in loggers:
        logger.addFilter(_known)
    try:
        from torchao.float8 import config, float8_linear
    finally:
        for logger in loggers:
            logger.removeFilter(_known)
    return float8_linear, config


def linear_class():
    """torchao's Float8Linear with a bias-less `gemm` (x @ W^T through the float8 matmul), made
    on first use so that torchao is imported only by runs that ask for FP8."""
    global _CLASS
    if _CLASS is None:
        float8_linear = torchao_float8()[0]

        class Fp8Linear(float8_linear.Float8Linear):
            """A Float8Linear whose bias the model may add itself (`gemm`)."""

            def gemm(self, x: torch.Tensor) -> torch.Tensor:
                """x @ weight^T in FP8, without the bias (Float8Linear.forward's matmul; under
                CUDA autocast the input in autocast's dtype as there)."""
                if torch.is_autocast_enabled("cuda"):
                    x = x.to(torch.get_autocast_dtype("cuda"))
                return float8_linear.matmul_with_hp_or_float8_args.apply(
                    x, self.weight.t(), self.linear_mm_config, self.config)

        _CLASS = Fp8Linear
    return _CLASS


def recipe(emulate: bool):
    """torchao's Float8LinearConfig for RECIPE; `emulate`: the float8 casts and scales as on the
    GPU, the matmul in high precision of the dequantized values (CPU tests; torchao's own
    emulation)."""
    config = torchao_float8()[1]
    return dataclasses.replace(config.Float8LinearConfig.from_recipe_name(RECIPE),
                               emulate=emulate)


def convert(encoder: nn.Module, emulate: bool = False) -> int:
    """Swap the encoder's linear layers (ENCODER_LINEARS of each `encoder.layer[i]`) for
    Fp8Linear in place, keeping their parameter objects (so before the optimizer takes them);
    returns how many were converted. Layers already converted are left as they are."""
    cls, config, count = linear_class(), recipe(emulate), 0
    for layer in encoder.layer:
        for path in ENCODER_LINEARS:
            *parents, leaf = path.split(".")
            parent = layer.get_submodule(".".join(parents))
            old = getattr(parent, leaf)
            if isinstance(old, cls):
                continue
            new = cls.from_float(old, config)
            new.train(old.training)
            setattr(parent, leaf, new)
            count += 1
    return count


def converted(module: nn.Module) -> int:
    """How many of `module`'s linear layers run in FP8."""
    return 0 if _CLASS is None else sum(isinstance(m, _CLASS) for m in module.modules())


def supported(device: torch.device) -> str | None:
    """None where FP8 GEMMs run on `device` (CUDA, compute capability 8.9 or newer: Ada,
    Hopper, Blackwell), else why not, in words."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return "FP8=1 runs the encoder's GEMMs on FP8 tensor cores, which need a CUDA GPU " \
            "(sm_89 or newer: Ada, Hopper); there is none here (FP8=emulate is torchao's CPU " \
            "emulation, for tests)"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"FP8=1 needs FP8 tensor cores (sm_89 or newer: Ada, Hopper), and " \
            f"{torch.cuda.get_device_name(device)} is sm_{major}{minor}: set FP8=0"
    return None
