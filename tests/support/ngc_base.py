"""Bases that behave as NVIDIA's NGC PyTorch images do for pip (tests/container): built with podman
on container/build.sh's Debian base. `ngc_like`: the build context's CPU torch wheel installed
and made to read as a pre-release of its line with a local tag (NGC's torch reads
2.10.0a0+b4e4ee81d3), with numpy at an older release than PyPI's newest, and
/etc/pip/constraint.txt pinning every package the base has (torch's own version and its
neighbours), read through PIP_CONSTRAINT, as NGC sets it since release 25.03. `out_of_range`: the
same constraints file and variable around a torch that is only a name and a version, of a line
bertperf does not support (NGC 25.04's 2.7 pre-release)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.support.paths import ROOT

DEBIAN_BASE = "localhost/bertperf-base:bookworm"
"""container/build.sh's base (Debian bookworm, Python 3.11 in a venv at /opt/python)."""
PRERELEASE = "2.13.0a0+ngclike"
"""The CPU wheel's torch 2.13.0+cpu as the NGC-like base reads it."""
NUMPY = "2.2.6"
"""The NGC-like base's numpy: older than PyPI's newest, so that a build that let pip choose would
change it."""
OUT_OF_RANGE = "2.7.0a0+79aa17489c"
"""The out-of-range base's torch (a 2.7 pre-release, as NGC 25.04's)."""

NGC_LIKE = f"""FROM {DEBIAN_BASE}
COPY . /tmp/ctx
RUN pip install --no-cache-dir /tmp/ctx/torch-*.whl numpy=={NUMPY} \\
 && python /tmp/ctx/prerelease.py torch {PRERELEASE} \\
 && mkdir -p /etc/pip && pip freeze > /etc/pip/constraint.txt && rm -rf /tmp/ctx
ENV PIP_CONSTRAINT=/etc/pip/constraint.txt
"""
OUT_OF_RANGE_BASE = f"""FROM {DEBIAN_BASE}
RUN site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \\
 && mkdir -p "$site/torch" "$site/torch-{OUT_OF_RANGE}.dist-info" \\
 && echo "__version__ = '{OUT_OF_RANGE}'" > "$site/torch/__init__.py" \\
 && printf 'Metadata-Version: 2.1\\nName: torch\\nVersion: {OUT_OF_RANGE}\\n' \\
      > "$site/torch-{OUT_OF_RANGE}.dist-info/METADATA" \\
 && mkdir -p /etc/pip && pip freeze > /etc/pip/constraint.txt
ENV PIP_CONSTRAINT=/etc/pip/constraint.txt
"""

FINGERPRINT = """
import hashlib, importlib.metadata as m, json, pathlib, sysconfig
site = pathlib.Path(sysconfig.get_paths()["purelib"])
digest = hashlib.sha256()
for root in sorted([site / "torch", site / "torchgen", *site.glob("torch-*.dist-info")]):
    for path in sorted(p for p in [root, *root.rglob("*")] if p.is_file()):
        digest.update(str(path.relative_to(site)).encode() + b"\\0" + path.read_bytes())
print(json.dumps({"torch": m.version("torch"), "numpy": m.version("numpy"),
                  "files": digest.hexdigest(),
                  "constraints": pathlib.Path("/etc/pip/constraint.txt").read_text()}))
"""
"""Run in an image: torch's and numpy's installed versions, one sha256 over every file of torch's
folders in site-packages (torch, torchgen, its dist-info) with their paths, and NGC's
constraints file."""


def build(podman_env: dict, tag: str, containerfile: str, context: Path,
          *args: str) -> subprocess.CompletedProcess:
    """podman build of CONTAINERFILE (text) in CONTEXT, as container/build.sh builds."""
    (context / "Containerfile").write_text(containerfile)
    return subprocess.run(["podman", "build", "--network", "host", "-f",
                           str(context / "Containerfile"), "-t", tag, *args, str(context)],
                          env=podman_env, capture_output=True, text=True, timeout=1800)


def ngc_like(podman_env: dict, tag: str, context: Path) -> None:
    """The NGC-like base, from the torch wheel container/build.sh left in .whl/."""
    (wheel,) = (ROOT / ".whl").glob("torch-*.whl")
    context.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(wheel, context / wheel.name)
    shutil.copyfile(Path(__file__).with_name("prerelease.py"), context / "prerelease.py")
    done = build(podman_env, tag, NGC_LIKE, context)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def out_of_range(podman_env: dict, tag: str, context: Path) -> None:
    context.mkdir(parents=True, exist_ok=True)
    done = build(podman_env, tag, OUT_OF_RANGE_BASE, context)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def fingerprint(podman_env: dict, image: str) -> str:
    """FINGERPRINT's line, run in IMAGE."""
    done = subprocess.run(["podman", "run", "--rm", "--network", "none", image, "python", "-c",
                           FINGERPRINT], env=podman_env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def versions(podman_env: dict, image: str, *names: str) -> dict:
    """The installed version of each of NAMES in IMAGE (None where it has none), read from the
    image, not from a build's output (a cached layer prints nothing)."""
    code = ("import importlib.metadata as m, json, sys\n"
            "def v(n):\n"
            "    try:\n"
            "        return m.version(n)\n"
            "    except m.PackageNotFoundError:\n"
            "        return None\n"
            "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    done = subprocess.run(["podman", "run", "--rm", "--network", "none", image, "python", "-c",
                           code, *names], env=podman_env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def build_project(podman_env: dict, tag: str, base: str) -> subprocess.CompletedProcess:
    """The project's Dockerfile built on BASE, as a user builds on another base."""
    return subprocess.run(["podman", "build", "--network", "host", "--build-arg",
                           f"FROM_IMAGE_NAME={base}", "-t", tag, str(ROOT)],
                          env=podman_env, capture_output=True, text=True, timeout=1800)
