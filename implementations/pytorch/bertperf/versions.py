"""The torch lines bertperf supports, the torchao release of each, and what a target with a given
torch lacks of the project's requirements (the image's build, the GPU bundle). Imports neither
torch nor anything outside the standard library and pip: the image's build runs it before
anything is installed. A version counts as its line however it is written: PyPI's 2.11.0,
2.11.0+cpu, NGC's pre-releases 2.11.0a0+<hash> (docs/design.md, "The image")."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from bertperf.errors import UserError

TORCHAO = {"2.10": "0.16.0", "2.11": "0.17.0", "2.12": "0.18.0", "2.13": "0.18.0"}
"""Each supported torch line -> the torchao release built for it (FP8=1). The keys are the
supported lines (pyproject.toml's range says the same; a test holds them together); 2.10, 2.11
and 2.13 are tested (constraints/), 2.12 is not."""
BASE_OWNS = ("torch", "triton", "numpy")
"""Packages a target keeps as it has them (pinned at their installed versions while the image
installs the rest): its torch build, the triton it requires, the numpy its torch was built with."""


def torch_line(version: str) -> str | None:
    """'2.11.0a0+abcdef', '2.11.0+cpu', '2.11.1' -> '2.11'; None for what is no version."""
    match = re.match(r"(\d+)\.(\d+)(?![\d])", version.strip())
    return f"{match[1]}.{match[2]}" if match else None


def supported_range() -> str:
    """The supported lines, as README writes them: '2.10 to 2.13'."""
    lines = sorted(TORCHAO, key=lambda line: tuple(map(int, line.split("."))))
    return f"{lines[0]} to {lines[-1]}"


def check_torch(version: str, what: str = "torch") -> str:
    """VERSION's line, or a UserError naming WHAT (whose torch) and the supported range."""
    line = torch_line(version)
    if line not in TORCHAO:
        raise UserError(f"{what} {version} is outside bertperf's supported torch lines, "
                        f"{supported_range()} (NGC's pre-releases of those lines included)")
    return line


def torchao_for(version: str, what: str = "torch") -> str:
    """The torchao release built for torch VERSION's line (check_torch's error otherwise)."""
    return TORCHAO[check_torch(version, what)]


def name_of(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def load_project(pyproject: str) -> dict:
    """pyproject.toml's [project] table, read with tomllib (Python 3.11+) or pip's own tomli."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: pip vendors tomli
        from pip._vendor import tomli as tomllib
    return tomllib.loads(pyproject)["project"]


def requirements(project: dict, extras: Iterable[str], torchao: str,
                 has: Callable[[str], bool]) -> list[str]:
    """What a target lacks of the project's dependencies and those of EXTRAS: never torch or
    triton (the target's own); torchao as release TORCHAO (torchao_for the target's torch); none
    for which has(requirement) is true."""
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise UserError(f"no extra named {', '.join(unknown)} in pyproject.toml (its extras: "
                        f"{', '.join(optional)})")
    wanted = [*project["dependencies"], *(r for e in extras for r in optional[e])]
    out = []
    for req in wanted:
        name = name_of(req)
        if name in ("torch", "triton"):
            continue
        if name == "torchao":
            req = f"torchao=={torchao}"
        if not has(req) and req not in out:
            out.append(req)
    return out
