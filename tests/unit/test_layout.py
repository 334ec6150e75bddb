"""The package's rooms and which may import which (docs/design.md, "Layout"), checked on the
code itself: every `import` of bertperf inside bertperf, at module level or inside a function,
read with ast; no module's imports lead back to it. And the commands that must start without
PyTorch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import bertperf

PACKAGE = Path(bertperf.__file__).parent

FLOORS = {  # room -> floor; a room imports only rooms on lower floors (and itself)
    "errors": 1, "benchmark": 1, "commands": 1, "reaper": 1, "host": 1, "versions": 2,
    "config": 2, "formats": 2,
    "resources": 3, "data": 3, "kernels": 3,
    "model": 4, "optim": 4, "prep": 4,
    "mlperf": 5,
    "train": 6,
    "bench": 7,  # benchmarks time the trainer's own step
    "perfmodel": 7,  # the performance model traces it; neither of the two imports the other
    "__main__": 8,
}
ONLY_FROM_WITHIN = {"prep"}  # rooms nothing outside them imports


def room_of(module: str) -> str:
    """bertperf.formats.detect -> formats; bertperf.errors -> errors."""
    return module.split(".")[1]


def module_name(path: Path) -> str:
    """bertperf/formats/detect.py -> bertperf.formats.detect; bertperf/data/__init__.py ->
    bertperf.data."""
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(
        ".__init__")


def imports() -> list[tuple[str, str, int]]:
    """(importing module, imported bertperf module, line) for every import in the package. A
    name imported from a package is its submodule where it has one of that name (`from
    bertperf.kernels import backend` imports bertperf.kernels.backend), else the package."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                         else node.module for a in node.names]
            else:
                continue
            found += [(module_name(path), n, node.lineno) for n in dict.fromkeys(names)
                      if n.startswith("bertperf.")]
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


def test_only_the_performance_model_imports_itself():
    """No module outside perfmodel/ imports bertperf.perfmodel, at module level or inside a
    function: the trainer and the benchmarks stand without the model."""
    outside = [f"{module}:{line} imports {target}" for module, target, line in imports()
               if room_of(target) == "perfmodel" and room_of(module) != "perfmodel"]
    assert not outside, "\n".join(outside)
    assert any(room_of(module) == "perfmodel" and room_of(target) == "perfmodel"
               for module, target, _ in imports())  # the scan sees perfmodel's own imports


def fake_package(tmp_path, monkeypatch, files: dict[str, str]) -> None:
    """A package `bertperf` of `files` ({path in it: text}) in tmp_path, scanned instead of the
    real one (the checkers' own tests)."""
    fake = tmp_path / "bertperf"
    for rel, text in {"__init__.py": "", **files}.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)


def test_a_lazy_import_of_the_model_is_caught(tmp_path, monkeypatch):
    """The checker itself: a benchmark importing the model inside a function is reported."""
    fake_package(tmp_path, monkeypatch, {
        "bench/__init__.py": "",
        "bench/x.py": "def f():\n    from bertperf.perfmodel import scale\n"})
    with pytest.raises(AssertionError, match="bertperf.bench.x:2 imports bertperf.perfmodel"):
        test_only_the_performance_model_imports_itself()


def test_the_model_command_lists_its_commands():
    from bertperf.__main__ import COMMANDS
    from bertperf.bench.cli import COMMANDS as BENCH
    from bertperf.perfmodel.cli import COMMANDS as MODEL

    assert COMMANDS["model"][0] == "bertperf.perfmodel.cli"
    assert list(MODEL) == ["step", "scale", "commodity", "layerwise", "results",
                           "validate"]
    assert COMMANDS["plan"][0] == "bertperf.perfmodel.plan"
    assert [module for module, _ in MODEL.values()] == \
        [f"bertperf.perfmodel.{name}" for name in MODEL]
    assert not any(module.startswith("bertperf.perfmodel") for module, _ in BENCH.values())


def test_the_rule_catches_an_upward_import(tmp_path, monkeypatch):
    """The checker itself: a formats module importing train must be reported."""
    fake_package(tmp_path, monkeypatch, {
        "formats/__init__.py": "",
        "formats/x.py": "def f():\n    from bertperf.train import loop\n"})
    assert imports() == [("bertperf.formats.x", "bertperf.train", 2)]
    with pytest.raises(AssertionError, match="bertperf.formats.x:2 imports bertperf.train"):
        test_rooms_import_only_lower_floors()


def import_cycles() -> list[tuple[list[tuple[str, str, int]], list[str]]]:
    """For each group of modules that import one another, directly or not: one cycle of
    imports through it (in order, the last one back to where the first starts) and the group."""
    graph: dict[str, dict[str, int]] = {}
    for module, target, line in imports():
        if target != module:
            graph.setdefault(module, {}).setdefault(target, line)

    def reach(start: str) -> dict[str, str]:
        """Every module reachable from start -> the module it is first reached from."""
        came_from, todo = {}, [start]
        while todo:
            here = todo.pop(0)
            for there in graph.get(here, {}):
                if there not in came_from:
                    came_from[there] = here
                    todo.append(there)
        return came_from

    found, seen = [], set()
    for start in sorted(graph):
        if start in seen:
            continue
        came_from = reach(start)
        if start not in came_from:
            continue
        group = sorted(m for m in came_from if start in reach(m))
        seen.update(group)
        cycle, here = [], start
        while not cycle or here != start:  # back from start along the first-reached imports
            back = came_from[here]
            cycle.insert(0, (back, here, graph[back][here]))
            here = back
        found.append((cycle, group))
    return found


def test_no_import_cycles():
    """A module's imports, at module level or inside functions, never lead back to it."""
    cycles = [" -> ".join(f"{a}:{line}" for a, _, line in cycle) + f" -> {cycle[0][0]}"
              + f" (the modules in a cycle with it: {', '.join(group)})"
              for cycle, group in import_cycles()]
    assert not cycles, "import cycles (module:line of each import):\n" + "\n".join(cycles)


def test_the_cycle_check_catches_a_cycle(tmp_path, monkeypatch):
    """The checker itself: a function-level import back to a module that imports it (a
    package importing its own modules is no cycle)."""
    fake_package(tmp_path, monkeypatch, {
        "kernels/__init__.py": "from bertperf.kernels import a\n",
        "kernels/a.py": "import bertperf.kernels.b\n",
        "kernels/b.py": "def f():\n    from bertperf.kernels import a\n"})
    assert import_cycles() == [([("bertperf.kernels.a", "bertperf.kernels.b", 1),
                                 ("bertperf.kernels.b", "bertperf.kernels.a", 2)],
                                ["bertperf.kernels.a", "bertperf.kernels.b"])]
    with pytest.raises(AssertionError, match="bertperf.kernels.a:1 -> bertperf.kernels.b:2 -> "
                                             "bertperf.kernels.a"):
        test_no_import_cycles()


COMMANDS_WITHOUT_TORCH = [["--help"], ["rank"], ["prep", "--help"], ["bench", "--help"], ["bench", "balance", "--help"], ["train", "--help"],
                          ["check", "--help"], ["submission", "--help"], ["plot", "--help"],
                          ["model", "--help"], ["export", "--help"]]
COMMANDS_WITHOUT_TORCH += [["model", name, "--help"] for name in ("step", "scale", "layerwise")]
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
