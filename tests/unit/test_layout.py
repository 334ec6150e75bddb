"""The package's rooms and which may import which (docs/design.md, "Layout"), checked on the
code itself: every `import` of bertperf inside bertperf, at module level or inside a function,
read with ast. And the commands that must start without PyTorch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import bertperf

PACKAGE = Path(bertperf.__file__).parent

FLOORS = {  # room -> floor; a room imports only rooms on lower floors (and itself)
    "errors": 1, "benchmark": 1, "commands": 1,
    "config": 2, "formats": 2,
    "resources": 3, "data": 3, "kernels": 3,
    "model": 4, "optim": 4, "prep": 4,
    "mlperf": 5,
    "train": 6, "bench": 6,
    "__main__": 7,
}
ONLY_FROM_WITHIN = {"prep"}  # rooms nothing outside them imports


def room_of(module: str) -> str:
    """bertperf.formats.detect -> formats; bertperf.errors -> errors."""
    return module.split(".")[1]


def imports() -> list[tuple[str, str, int]]:
    """(importing file, imported bertperf module, line) for every import in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found += [(module, n, node.lineno) for n in names if n.startswith("bertperf.")]
    return found


def test_every_room_has_a_floor():
    rooms = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p / "__init__.py").is_file())}
    assert rooms - {"__init__"} == set(FLOORS)


def test_rooms_import_only_lower_floors():
    wrong = []
    for module, target, line in imports():
        mine, theirs = room_of(module), room_of(target)
        if mine == theirs:
            continue
        if FLOORS[theirs] >= FLOORS[mine]:
            wrong.append(f"{module}:{line} imports {target} (floor {FLOORS[mine]} -> "
                         f"{FLOORS[theirs]})")
        elif theirs in ONLY_FROM_WITHIN:
            wrong.append(f"{module}:{line} imports {target} ({theirs}/ is imported only "
                         "from within)")
    assert not wrong, "\n".join(wrong)


def test_the_rule_catches_an_upward_import(tmp_path, monkeypatch):
    """The checker itself: a formats module importing train must be reported."""
    fake = tmp_path / "bertperf"
    (fake / "formats").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "formats" / "__init__.py").write_text("")
    (fake / "formats" / "x.py").write_text("def f():\n    from bertperf.train import loop\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert imports() == [("bertperf.formats.x", "bertperf.train", 2)]
    with pytest.raises(AssertionError, match="bertperf.formats.x:2 imports bertperf.train"):
        test_rooms_import_only_lower_floors()


COMMANDS_WITHOUT_TORCH = [["--help"], ["rank"], ["prep", "--help"], ["bench", "--help"], ["bench", "balance", "--help"], ["train", "--help"],
                          ["check", "--help"], ["submission", "--help"], ["plot", "--help"]]
COMMANDS_WITHOUT_TORCH += [["prep", stage, "--help"] for stage in
                           ("dictd", "clean", "segment", "split", "create", "eval", "verify",
                            "unpad", "chop", "pack", "stratify", "stats")]


@pytest.mark.parametrize("argv", COMMANDS_WITHOUT_TORCH, ids=" ".join)
def test_commands_start_without_torch(argv):
    """Parse the command line as `python -m bertperf` does and report whether torch got loaded
    (a --help exits inside parse_args, after every import the command needs)."""
    code = ("import sys\nfrom bertperf.__main__ import build_parser\n"
            f"try:\n    build_parser({argv!r}).parse_args({argv!r})\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
