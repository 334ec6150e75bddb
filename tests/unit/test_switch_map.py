"""docs/design.md's switch map against the code: each of the trainer's switches is followed from
config.py to where it acts in at most three files, and no other module of the package reads the
setting (train/allowed.py, the one table of what may be combined, reads them all)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bertperf import config
from tests.support.paths import ROOT

PACKAGE = ROOT / "implementations" / "pytorch" / "bertperf"
SWITCHES = ("LAYOUT", "BALANCE", "FLAT_LAMB", "SHARDED_LAMB", "CLIP_BEFORE_ALLREDUCE", "COMPILE",
            "USE_CUDA_GRAPH", "FUSED_KERNELS", "FP8", "GRAD_COMM", "LAYERWISE")
ALSO_READING = {"config.py", "train/allowed.py"}
"""Where a setting is defined and checked, besides where it acts."""
ROOMS_OUTSIDE = ("bench", "perfmodel")
"""Rooms above the trainer that set its switches as a user does (a RunConfig), not read them."""


def switch_map() -> dict[str, list[str]]:
    """{switch: its files, in order} from design.md's table."""
    rows = re.findall(r"^\s*\| ([A-Z_0-9]+) \| (.+) \|$", (ROOT / "docs" / "design.md").read_text(),
                      re.MULTILINE)
    return {name: re.findall(r"`([^`]+\.py)`", files) for name, files in rows if name in SWITCHES}


def field_of(env: str) -> tuple[str, str]:
    """(section, field name) of the setting read from the variable `env`."""
    return next((section, f.name) for section, f in config.tunables() if f.metadata["env"] == env)


def reads(tree: ast.AST, section: str, name: str) -> bool:
    """Whether the module reads `<...>.<section>.<name>`, directly or through a name bound to a
    `.section` (`o = cfg.optim`, `self.o, self.t = cfg.optim, cfg.train`)."""
    aliases = {section}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = [t.elts if isinstance(t, ast.Tuple) else [t] for t in node.targets]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for target in targets:
                for t, v in zip(target, values):
                    if isinstance(v, ast.Attribute) and v.attr == section:
                        aliases.add(t.id if isinstance(t, ast.Name) else getattr(t, "attr", ""))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.ctx, ast.Load):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in aliases or \
                    isinstance(owner, ast.Attribute) and owner.attr in aliases:
                return True
    return False


def readers(section: str, name: str) -> set[str]:
    out = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.split("/")[0] not in ROOMS_OUTSIDE and reads(ast.parse(path.read_text()), section,
                                                             name):
            out.add(rel)
    return out


def test_the_map_has_every_switch_in_three_files_at_most():
    found = switch_map()
    assert set(found) == set(SWITCHES)
    for name, files in found.items():
        assert files[0] == "config.py" and 2 <= len(files) <= 3, (name, files)
        assert all((PACKAGE / f).is_file() for f in files), (name, files)


@pytest.mark.parametrize("switch", SWITCHES)
def test_only_the_mapped_files_read_the_switch(switch):
    section, name = field_of(switch)
    files = switch_map()[switch]
    got = readers(section, name)
    assert files[1] in got, f"{switch}: {files[1]} does not read {section}.{name}"
    assert got - ALSO_READING <= set(files), f"{switch} is also read in {got - set(files)}"


def test_the_scan_sees_an_alias():
    tree = ast.parse("def f(cfg):\n    o = cfg.optim\n    return o.flat_lamb\n")
    assert reads(tree, "optim", "flat_lamb") and not reads(tree, "optim", "grad_comm")
    assert not reads(ast.parse("x.optim = 1\ny = x.flat_lamb\n"), "optim", "flat_lamb")
