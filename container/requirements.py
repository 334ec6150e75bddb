"""The image's pip inputs, from pyproject.toml and the base the Dockerfile builds on: DIR/
requirements.txt, what the base lacks of the project's dependencies and EXTRAS' (never torch or
triton; torchao as the release built for the base's torch, unless the base has one), and DIR/
constraints.txt, what the base owns (versions.BASE_OWNS) pinned at its installed versions. A base
whose torch is outside the supported lines, or that has none, stops the build in one line."""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "implementations" / "pytorch"))

from bertperf import versions  # noqa: E402
from bertperf.errors import UserError  # noqa: E402


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def base_has(requirement: str) -> bool:
    """The base has the package in a version the requirement admits (pre-releases included: the
    base's choice); any torchao of the base's is its own, built for its torch."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip vendors packaging
        from pip._vendor.packaging.requirements import Requirement
    req = Requirement(requirement)
    version = installed(req.name)
    return version is not None and (versions.name_of(req.name) == "torchao"
                                    or req.specifier.contains(version, prereleases=True))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--extras", default="", help="comma-separated extras of pyproject.toml")
    p.add_argument("--out", type=Path, required=True, help="the folder to write both files in")
    args = p.parse_args()
    try:
        torch = installed("torch")
        if torch is None:
            raise UserError("the base image has no torch: build on an NGC PyTorch image, or put "
                            "a torch wheel of a supported line in the build context's .whl/")
        torchao = versions.torchao_for(torch, "the base image's torch")
        project = versions.load_project((ROOT / "pyproject.toml").read_text())
        reqs = versions.requirements(project, [e for e in args.extras.split(",") if e],
                                     torchao, base_has)
    except UserError as exc:
        print(f"container/requirements.py: error: {exc}", file=sys.stderr)
        return 1
    pins = [f"{name}=={installed(name)}" for name in versions.BASE_OWNS if installed(name)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "requirements.txt").write_text("".join(f"{r}\n" for r in reqs))
    (args.out / "constraints.txt").write_text("".join(f"{c}\n" for c in pins))
    print(f"the base's, kept: {', '.join(pins)}; to install: {', '.join(reqs) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
