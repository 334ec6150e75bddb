"""`make gpu-check`: what CI cannot prove, on a CUDA machine, from a fresh clone.

Steps, each recorded in the report (results/gpu_check/<date>_<GPU>.md, written whatever happens):
the versions and `pip check`; the data (a Wikipedia extract from WIKI_SAMPLE through `make
demo-wiki`, else FOLDOC through the same chain with MLPerf's 512-token samples), packed; tests/gpu
with every skip counted as a failure; `bench train` on BERT-large in bf16, its rows ending with
FP8 (FP8=1; "not available" below sm_89). Without CUDA it goes as far as it can (versions, pip
check, data, the GPU tests collected) and stops with one line saying why. Exit status 0 only when every step passed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Report:
    """The report's lines, written to its file after every step (nothing is lost on a crash)."""

    def __init__(self, path: Path) -> None:
        self.path, self.lines, self.failed = path, [], []
        path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text("\n".join(self.lines) + "\n")
        tmp.replace(self.path)

    def step(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
        """Run one step as a process; its outcome and duration go into the report."""
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=ROOT, env={**os.environ, **(env or {})},
                              capture_output=True, text=True)
        seconds = time.perf_counter() - start
        status = "ok" if done.returncode == 0 else f"FAILED (exit status {done.returncode})"
        self.add(f"- {name}: {status}, {seconds:.0f} s")
        if done.returncode != 0:
            self.failed.append(name)
            tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
            self.add("\n".join(["  ```", *("  " + line for line in tail), "  ```"]))
        return done


def versions() -> tuple[str, bool, str | None]:
    """A line of versions and the GPU, whether torch sees CUDA, and the GPU's name."""
    code = ("import json, torch, importlib.metadata as m\n"
            "def v(n):\n"
            "    try: return m.version(n)\n"
            "    except m.PackageNotFoundError: return None\n"
            "cuda = torch.cuda.is_available()\n"
            "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
            "  'triton': v('triton'), 'torchao': v('torchao'), 'available': cuda,\n"
            "  'gpu': torch.cuda.get_device_name() if cuda else None,\n"
            "  'capability': '.'.join(map(str, torch.cuda.get_device_capability())) if cuda\n"
            "  else None}))")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                    text=True, check=True).stdout)
    line = (f"torch {out['torch']} (CUDA {out['cuda']}), triton {out['triton']}, torchao "
            f"{out['torchao']}, Python {platform.python_version()}; GPU: "
            f"{out['gpu'] or 'none'}" + (f" (sm_{out['capability']})" if out['gpu'] else ""))
    return line, bool(out["available"]), out["gpu"]


def prepare_data(report: Report, out: Path, wiki: str | None) -> tuple[Path, Path] | None:
    """(packed shards, eval file) made with the project's own commands (skipped where done)."""
    if wiki:
        folder = out / "wiki_sample"
        made = report.step(f"data: WIKI_SAMPLE={wiki} through the MLPerf chain",
                           ["make", "demo-wiki", f"WIKI_SAMPLE={wiki}", f"OUT={out}",
                            f"VENV={Path(sys.executable).parents[1]}"])
    else:
        folder = out / "foldoc_512"
        made = report.step("data: FOLDOC through the MLPerf chain, 512-token samples",
                           ["bash", "data_prep/prepare_demo.sh"],
                           {"OUT_DIR": str(folder), "PYTHON": sys.executable,
                            "MAX_SEQ_LENGTH": "512", "MAX_PREDICTIONS_PER_SEQ": "76"})
    if made.returncode != 0:
        return None
    packed = report.step("data: packed rows (prep pack)",
                         [sys.executable, "-m", "bertperf", "prep", "pack", "--input",
                          str(folder / "unpadded"), "--output", str(folder / "packed")])
    if packed.returncode != 0:
        return None
    return folder / "packed", folder / "hdf5" / "eval" / "eval_10k.hdf5"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "out" / "gpu_check",
                   help="where the data is made (kept: a rerun skips it)")
    p.add_argument("--reports", type=Path, default=ROOT / "results" / "gpu_check",
                   help="folder of the reports")
    p.add_argument("--wiki", default=os.environ.get("WIKI_SAMPLE") or None,
                   help="a wikiextractor folder (default: FOLDOC, fetched as `make demo` does)")
    args = p.parse_args()
    start = time.perf_counter()
    line, cuda, gpu = versions()
    name = (gpu or "no_CUDA").replace(" ", "_")
    report = Report(args.reports / f"{datetime.date.today():%Y-%m-%d}_{name}.md")
    report.add(f"# make gpu-check, {datetime.datetime.now():%Y-%m-%d %H:%M}\n\n{line}\n")
    report.step("pip check", [sys.executable, "-m", "pip", "check"])
    data = prepare_data(report, args.out, args.wiki)
    if not cuda:
        report.step("tests/gpu collected", [sys.executable, "-m", "pytest", "-q", "--co",
                                             "tests/gpu"])
        why = "torch sees no CUDA device here"
    elif data is None:
        why = "the data could not be made"
    else:
        packed, eval_file = data
        env = {"GPU_CHECK": "1", "GPU_CHECK_REPORT": str(report.path),
               "GPU_CHECK_DATA": str(packed), "GPU_CHECK_EVAL": str(eval_file)}
        tests = report.step("tests/gpu (a skip counts as a failure)",
                            [sys.executable, "-m", "pytest", "-q", "-rfEs", "tests/gpu"], env)
        report.add("  " + (tests.stdout.strip().splitlines() or ["(no output)"])[-1])
        source = ["--data", str(packed)] if args.wiki else ["--synthetic"]
        # every bertperf row, the bf16 ones and last "+ FP8" (FP8=1; "not available (why)"
        # below sm_89)
        report.step("bench train, BERT-large, bf16 and FP8 rows",
                    [sys.executable, "-m", "bertperf", "bench", "train", "--config", "large",
                     "--device", "cuda", "--precision", "bf16", *source,
                     "--report", str(report.path)])
        why = None
    minutes = (time.perf_counter() - start) / 60
    if why is not None:
        report.add(f"\nStopped after {minutes:.1f} min: {why}.")
        print(f"gpu-check: stopped: {why}; the report so far: {report.path}", file=sys.stderr)
        return 1
    verdict = "every step passed" if not report.failed else f"failed: {', '.join(report.failed)}"
    report.add(f"\n{minutes:.1f} min in all; {verdict}.")
    return 0 if not report.failed else 1


if __name__ == "__main__":
    sys.exit(main())
