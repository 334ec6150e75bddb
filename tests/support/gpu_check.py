"""tools/gpu_check.py and tools/gpu_bundle.py as a user runs them, and what their tests give them:
a wheel made here (a distribution the environment lacks, installed from a bundle with no
network) and a bundle made offline from it (gpu_bundle --wheelhouse)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.paths import ROOT

PROBE = "bertperf-bundle-probe"
"""A distribution no environment has: found by the check's steps only if installed from the
bundle."""


def load_tool(name: str):
    """tools/<name>.py as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def probe_wheel(folder: Path, version: str = "1.0") -> Path:
    """A pure-Python wheel of PROBE (a module and its dist-info, PEP 427)."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = PROBE.replace("-", "_")
    files = {f"{stem}/__init__.py": b"FROM = 'the bundle'\n",
             f"{stem}-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {PROBE}\nVersion: {version}\n".encode(),
             f"{stem}-{version}.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                 b"Tag: py3-none-any\n"}
    record = "".join(f"{name},sha256={digest(data)},{len(data)}\n" for name, data in files.items())
    path = folder / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{stem}-{version}.dist-info/RECORD",
                   record + f"{stem}-{version}.dist-info/RECORD,,\n")
    return path


def digest(data: bytes) -> str:
    """A RECORD line's hash: urlsafe base64 of the sha256, unpadded."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_bundle(out: Path, wheelhouse: Path, vocab: Path, foldoc: Path,
                *extra: str) -> subprocess.CompletedProcess:
    """gpu_bundle offline (the wheels of `wheelhouse`), for this interpreter's Python and torch
    unless `extra` says otherwise."""
    import torch

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_bundle.py"), "--out",
                           str(out), "--wheelhouse", str(wheelhouse), "--vocab", str(vocab),
                           "--foldoc", str(foldoc), "--python", python, "--torch",
                           torch.__version__.split("+")[0], *extra],
                          capture_output=True, text=True, timeout=120)
