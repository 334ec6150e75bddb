"""Parameter groups for BERT: weight decay and LAMB's trust ratio for every parameter except the
excluded ones (docs/design.md gives the references' rules): (1) a name containing "bias",
"LayerNorm" or "layer_norm", or with "gamma" or "beta" as a whole dotted component (NVIDIA's
TF-checkpoint LayerNorm names); (2) a parameter owned directly by a torch.nn.LayerNorm (or a
class in `norm_types`), whatever its name. On BERT with HF or NVIDIA names both rules pick the
same tensors. A fused tensor holding a bias under another name is decayed: give it a name with
"bias". Frozen parameters are left out; a tied parameter appears once, under its first name."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# Substring patterns (TF reference) and whole-component patterns (NVIDIA's LayerNorm gamma/beta).
NO_DECAY_PATTERNS: tuple[str, ...] = ("bias", "LayerNorm", "layer_norm")
NO_DECAY_COMPONENTS: tuple[str, ...] = ("gamma", "beta")
DEFAULT_NORM_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm,)


def is_no_decay(
    name: str,
    patterns: tuple[str, ...] = NO_DECAY_PATTERNS,
    components: tuple[str, ...] = NO_DECAY_COMPONENTS,
) -> bool:
    """True when the parameter name says bias/LayerNorm (rule 1 of the module docstring)."""
    if any(p in name for p in patterns):
        return True
    return any(c in components for c in name.split("."))


def _norm_param_names(model: nn.Module, norm_types: tuple[type[nn.Module], ...]) -> set[str]:
    """Names of the parameters owned directly by a normalization module (rule 2)."""
    names: set[str] = set()
    for mod_name, module in model.named_modules():
        if isinstance(module, norm_types):
            for p_name, _ in module.named_parameters(recurse=False):
                names.add(f"{mod_name}.{p_name}" if mod_name else p_name)
    return names


def split_decay(
    model: nn.Module,
    *,
    patterns: tuple[str, ...] = NO_DECAY_PATTERNS,
    components: tuple[str, ...] = NO_DECAY_COMPONENTS,
    norm_types: tuple[type[nn.Module], ...] = DEFAULT_NORM_TYPES,
) -> tuple[list[tuple[str, torch.Tensor]], list[tuple[str, torch.Tensor]]]:
    """(decayed, excluded) lists of (name, parameter), in named_parameters order."""
    norm_names = _norm_param_names(model, norm_types)
    decay: list[tuple[str, torch.Tensor]] = []
    no_decay: list[tuple[str, torch.Tensor]] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name in norm_names or is_no_decay(name, patterns, components):
            no_decay.append((name, p))
        else:
            decay.append((name, p))
    return decay, no_decay


def param_groups(
    model: nn.Module,
    weight_decay: float,
    *,
    patterns: tuple[str, ...] = NO_DECAY_PATTERNS,
    components: tuple[str, ...] = NO_DECAY_COMPONENTS,
    norm_types: tuple[type[nn.Module], ...] = DEFAULT_NORM_TYPES,
) -> list[dict[str, Any]]:
    """Two optimizer groups: [decayed + layer-adapted, bias/LayerNorm with neither].

    Each group carries "params", "param_names" (for logs and checks), "weight_decay" and
    "layer_adaptation" (read by bertperf.optim.lamb.Lamb; other optimizers ignore it). Empty
    groups are dropped.
    """
    decay, no_decay = split_decay(model, patterns=patterns, components=components, norm_types=norm_types)
    groups = [
        {"params": [p for _, p in decay], "param_names": [n for n, _ in decay],
         "weight_decay": float(weight_decay), "layer_adaptation": True},
        {"params": [p for _, p in no_decay], "param_names": [n for n, _ in no_decay],
         "weight_decay": 0.0, "layer_adaptation": False},
    ]
    return [g for g in groups if g["params"]]
