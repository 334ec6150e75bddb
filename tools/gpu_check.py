"""`make gpu-check`: what CI cannot prove, on a CUDA machine, in one command of a budget.

It runs with the interpreter it is started with, as that interpreter's environment is: it
creates no environment and calls neither pip nor apt, except to install from a bundle (`make
gpu-bundle`, made on a connected machine) with no network. The project is found from this
checkout, and every child process keeps what this one found. The steps, in order of value
(`--list` prints them with their time plan), each with its own time limit; a step that would not
fit what is left of `--budget` is "not run: budget", and the rest go on. Output streams as it
comes; the report (`--report`) is rewritten after every step; `--from STEP` continues that
report, running STEP and the later steps it does not already hold as passed. Without CUDA it
goes as far as it can (the environment, the data, the GPU tests collected) and stops with one
line saying why. Exit status 0 only when every step passed. Every output path is checked before
the first step (bertperf.formats.outputs: --out is a folder of the check's own or new, a report
continued is one of its reports). Of bertperf it imports only reaper, versions and
formats.outputs (the standard library alone), so that its report is written even when the
package is broken.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "implementations" / "pytorch"
sys.path.insert(0, str(PACKAGE))

from bertperf import reaper, versions  # noqa: E402 (the standard library alone)
from bertperf.errors import UserError  # noqa: E402
from bertperf.formats.files import folder_problem  # noqa: E402
from bertperf.formats.outputs import claim, mark  # noqa: E402

TAG = "GPU_CHECK_STEP"
"""The variable every process of a step carries, to be found when the step ends."""
STEP_TAGS = itertools.count()
BUDGET = 480
"""Seconds: one command of 8 minutes, inside a 10-minute command limit with time to spare."""
BUNDLE = "bundle.json"
NEEDED = ("bertperf", "numpy", "h5py", "mlperf_logging", "nltk", "punkt", "torch", "triton",
          "transformers")
"""Modules the steps import; the environment step fails naming those that do not import."""


class CheckError(Exception):
    """A fault of the command line, the bundle or the report: one line, exit status 2."""


@dataclass(frozen=True)
class Context:
    out: Path
    notes: Path
    """Where a step's own summary goes ($GPU_CHECK_REPORT), copied into the report after it."""

    @property
    def data(self) -> Path:
        """The data step's folder: FOLDOC at 512 tokens (hdf5/eval, unpadded, packed)."""
        return self.out / "foldoc_512"


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    estimate: int
    """Seconds on one H100 with cold caches: an estimate until measured (the report says which)."""
    limit: int
    """Seconds after which the step is stopped."""
    cuda: bool
    """Needs a CUDA device."""
    data: bool
    """Needs the BERT-large data the data step makes."""
    argv: Callable[[Context], list[str]]


def pytest_argv(*files: str) -> Callable[[Context], list[str]]:
    return lambda c: [sys.executable, "-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider",
                      *(f"tests/gpu/{f}" for f in files)]


def bench_argv(rows: str) -> Callable[[Context], list[str]]:
    """bench train on BERT-large in bf16 on MLPerf-like synthetic lengths (no data needed)."""
    return lambda c: [sys.executable, "-m", "bertperf", "bench", "train", "--config", "large",
                      "--device", "cuda", "--precision", "bf16", "--synthetic", "--rows", rows,
                      "--report", str(c.notes)]


def data_argv(c: Context) -> list[str]:
    """FOLDOC ($FOLDOC: the bundle's) through the MLPerf chain at 512 tokens and 76 predictions,
    then packed (each part skips what an earlier run made)."""
    return ["bash", "-c", 'OUT_DIR="$1" MAX_SEQ_LENGTH=512 MAX_PREDICTIONS_PER_SEQ=76 bash '
            'data_prep/prepare_demo.sh && "$0" -m bertperf prep pack --input "$1/unpadded" '
            '--output "$1/packed"', sys.executable, str(c.data)]


STEPS = (
    Step("environment", "versions, the bundle installed, the modules the steps import", 15, 120,
         False, False, lambda c: [sys.executable, "-c", ENVIRONMENT]),
    Step("kernels", "each fused kernel, attention path and FlatLamb against its reference on "
         "CUDA", 60, 180, True, False, pytest_argv("test_kernels_gpu.py", "test_flat_lamb_gpu.py")),
    Step("bench-eager", "bench train, BERT-large bf16: HF, then the eager bertperf rows", 120,
         300, True, False, bench_argv("hf,varlen,packed,kernels")),
    Step("data", "data: FOLDOC through the MLPerf chain at 512 tokens, packed", 30, 300,
         False, False, data_argv),
    Step("train-300", "300 steps of BERT-large from random weights, packed 512-token FOLDOC", 120,
         300, True, True, pytest_argv("test_train_bert_large.py")),
    Step("bench-compiled", "bench train, BERT-large bf16: + compile, + CUDA graphs, + FP8", 240,
         420, True, False, bench_argv("compile,graphs,fp8")),
    Step("gpu-tests", "the packed step without host syncs, dropout under graph replay, FP8, "
         "convergence to the demo target", 300, 540, True, False,
         pytest_argv("test_packed_step_gpu.py", "test_dropout_graphs_gpu.py", "test_fp8_gpu.py",
                     "test_convergence_gpu.py")),
)
NAMES = [s.name for s in STEPS]
DATA = next(s for s in STEPS if s.name == "data")

ENVIRONMENT = f"""
import importlib, importlib.metadata as m, json, os, platform
def version(name):
    try: return m.version(name)
    except m.PackageNotFoundError: return None
missing = [f"{{name}} (the bundle's: not found)" for name in
           filter(None, os.environ.get("GPU_CHECK_BUNDLED", "").split(",")) if not version(name)]
for module in {NEEDED!r}:
    try: importlib.import_module(module)
    except Exception as exc: missing.append(f"{{module}} ({{type(exc).__name__}}: {{exc}})")
import torch
cuda = torch.cuda.is_available()
print(f"versions: Python {{platform.python_version()}} | torch {{torch.__version__}} (CUDA "
      f"{{torch.version.cuda}}) | " + " | ".join(f"{{n}} {{version(n)}}" for n in
      ("triton", "torchao", "numpy", "transformers")))
sm = "".join(map(str, torch.cuda.get_device_capability())) if cuda else ""
print("GPU:", f"{{torch.cuda.get_device_name()}} (sm_{{sm}})" if cuda
      else "none (torch sees no CUDA device)")
print("GPU_CHECK_ENV " + json.dumps({{"cuda": cuda, "gpu": torch.cuda.get_device_name() if cuda
                                     else None, "torch": torch.__version__}}))
if missing:
    raise SystemExit("cannot import: " + "; ".join(missing))
"""


# ---- the report --------------------------------------------------------------------------------

class Report:
    """The report's lines, rewritten to its file (temporary name, then rename) after every step."""

    def __init__(self, path: Path, lines: list[str]) -> None:
        self.path, self.lines = path, lines
        self.write()

    def add(self, text: str, echo: bool = True) -> None:
        if echo:
            print(text, flush=True)
        self.lines.append(text)
        self.write()

    def write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text("\n".join(self.lines) + "\n")
            tmp.replace(self.path)
        except (FileExistsError, NotADirectoryError) as exc:  # a file where a folder should be
            raise CheckError(f"cannot write the report {self.path}: {exc.filename} is not a "
                             "folder") from None
        except OSError as exc:
            raise CheckError(f"cannot write the report {self.path}: {exc.strerror or exc}") \
                from None

    def passed(self) -> set[str]:
        """The steps this report holds as passed."""
        return {m.group(1) for line in self.lines if (m := re.match(r"- `(\S+)`: ok,", line))}


def report_path(args: argparse.Namespace, gpu: str | None) -> Path:
    """--report; else, continuing (--from), the newest report in --reports for this GPU; else a
    new name of the minute and the GPU, never one that exists."""
    name = (gpu or "no_CUDA").replace(" ", "_")
    if args.report is not None:
        return args.report
    if args.start is not None:
        found = sorted(args.reports.glob(f"*_{name}.md"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise CheckError(f"--from {args.start}: no report for {name} in {args.reports} to "
                             "continue (name it with --report)")
        return found[-1]
    stamp = datetime.datetime.now()
    path = args.reports / f"{stamp:%Y-%m-%d_%H%M}_{name}.md"
    for n in range(2, 100):
        if not path.exists():
            break
        path = args.reports / f"{stamp:%Y-%m-%d_%H%M}_{name}_{n}.md"
    return path


# ---- running a step ----------------------------------------------------------------------------

@dataclass
class Outcome:
    returncode: int | None
    """None: stopped at its time limit."""
    seconds: float
    lines: list[str]


def run(argv: list[str], env: dict, limit: float) -> Outcome:
    """Run a step, its output (stdout and stderr together) printed as it comes; stopped at
    `limit` seconds or when this command is (SIGTERM to its process group, then SIGKILL to every
    process it started, ranks in sessions of their own included: they carry its tag)."""
    tag = f"{os.getpid()}-{next(STEP_TAGS)}"
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env={**env, TAG: tag}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    lines: list[str] = []

    def pump() -> None:
        for line in proc.stdout:
            print("    " + line.rstrip("\n"), flush=True)
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    returncode = None
    try:
        returncode = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    finally:
        left = reaper.reap(TAG, tag, grace=2.0 if returncode is not None else 0.0)
        proc.wait()
    reader.join(timeout=10)
    if left:
        lines.append(f"gpu-check: killed {len(left)} process(es) the step left: "
                     + "; ".join(p.command[:120] for p in left))
    return Outcome(returncode, time.perf_counter() - start, lines)


def record(report: Report, step: Step, outcome: Outcome, notes: Path | None) -> bool:
    """The step's line in the report, its summary and, if it failed, the end of its output."""
    if outcome.returncode == 0:
        status = "ok"
    elif outcome.returncode is None:
        status = "FAILED: stopped at its time limit"
    else:
        status = f"FAILED (exit status {outcome.returncode})"
    report.add(f"- `{step.name}`: {status}, {outcome.seconds:.0f} s (planned {step.estimate} s, "
               f"limit {step.limit} s): {step.title}")
    summary = [line for line in outcome.lines
               if line.startswith(("versions:", "GPU:", "cannot import", "bundle:"))
               or re.match(r"=+ .*(passed|failed|error|skipped|no tests).* =+$", line)]
    if summary and outcome.returncode == 0:
        report.add("\n".join("  " + line for line in summary), echo=False)
    if notes is not None and notes.is_file() and notes.stat().st_size:
        report.add("\n" + notes.read_text().rstrip() + "\n", echo=False)
    if outcome.returncode != 0:
        tail = outcome.lines[-25:]
        report.add("\n".join(["  ```", *("  " + line for line in tail), "  ```"]), echo=False)
    return outcome.returncode == 0


# ---- the bundle --------------------------------------------------------------------------------

def install_bundle(bundle: Path, python: str, site: Path, env: dict) -> list[str]:
    """Check the bundle (its files and the interpreter it was made for) and install its wheels
    whose distributions this interpreter lacks into `site`, with no index; lines for the report.
    The vocab and FOLDOC it holds become $BERTPERF_VOCAB and $FOLDOC."""
    try:
        text = (bundle / BUNDLE).read_text()
        meta = json.loads(text)
    except (OSError, ValueError) as exc:
        raise CheckError(f"--bundle {bundle}: no readable {BUNDLE} ({exc}); make one with "
                         "make gpu-bundle") from None
    files = [(bundle / f["path"], f) for f in meta["files"]]
    for path, f in files:
        if not path.is_file() or path.stat().st_size != f["bytes"] \
                or hashlib.sha256(path.read_bytes()).hexdigest() != f["sha256"]:
            raise CheckError(f"--bundle {bundle}: {f['path']} is missing or not the file the "
                             f"bundle was made with (size or sha256 differ)")
    stamp = site / ".bundle.json"
    if stamp.is_file() and stamp.read_text() != text:
        shutil.rmtree(site)  # another bundle's packages
    target = meta["target"]
    wheels = [(bundle / f["path"], f) for f in meta["files"] if f["path"].endswith(".whl")]
    probe = subprocess.run(  # the interpreter's Python and torch, and which wheels it has
        [python, "-c", "import importlib.metadata as m, json, platform, sys\n"
         "def v(n):\n try: return m.version(n)\n except m.PackageNotFoundError: return None\n"
         "print(json.dumps([platform.python_version(), {n: v(n) for n in sys.argv[1:]}]))",
         "torch", *(f["name"] for _, f in wheels)], capture_output=True, text=True, env=env)
    if probe.returncode != 0:
        raise CheckError(f"{python} does not run: "
                         f"{(probe.stderr.strip().splitlines() or ['?'])[-1]}")
    py, installed = json.loads(probe.stdout)
    torch_version = installed.pop("torch") or "none"
    if py.rsplit(".", 1)[0] != target["python"] \
            or versions.torch_line(torch_version) != versions.torch_line(target["torch"]):
        raise CheckError(f"--bundle {bundle} was made for Python {target['python']} and torch "
                         f"{target['torch']}; this interpreter has Python {py} and torch "
                         f"{torch_version} (make gpu-bundle --python/--torch for it)")
    missing = [(path, f) for path, f in wheels if installed[f["name"]] is None]
    present = [f"{f['name']} {installed[f['name']]}" for _, f in wheels
               if installed[f["name"]] is not None]
    lines = [f"bundle: {bundle} ({sum(f['bytes'] for _, f in files) / 2**20:.1f} MiB, made "
             f"{meta['made']} for Python {target['python']}, torch {target['torch']})"]
    start = time.perf_counter()
    if missing:
        done = subprocess.run([python, "-m", "pip", "install", "--no-index", "--no-deps",
                               "--no-compile", "--disable-pip-version-check", "--quiet",
                               "--upgrade", "--target", str(site), *(str(p) for p, _ in missing)],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise CheckError("installing the bundle's wheels failed: "
                             f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
        stamp.write_text(text)
    lines.append(f"bundle: installed into {site} in {time.perf_counter() - start:.0f} s: "
                 + (", ".join(f"{f['name']} {f['version']}" for _, f in missing) or "nothing")
                 + "; already here: " + (", ".join(present) or "nothing"))
    env["GPU_CHECK_BUNDLED"] = ",".join(f["name"] for _, f in wheels)  # seen by the steps?
    env["BERTPERF_VOCAB"] = str(bundle / meta["vocab"])
    env["FOLDOC"] = str(bundle / meta["foldoc"])
    return lines


# ---- the command -------------------------------------------------------------------------------

def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "out" / "gpu_check",
                   help="where the data and the bundle's packages go (kept: a rerun reuses them)")
    p.add_argument("--reports", type=Path, default=ROOT / "results" / "gpu_check",
                   help="folder of the reports (default name: <date>_<time>_<GPU>.md)")
    p.add_argument("--report", type=Path, help="the report's path")
    p.add_argument("--bundle", type=Path,
                   help="a folder made by make gpu-bundle: its wheels are installed where this "
                        "interpreter lacks them, its vocab and FOLDOC used")
    p.add_argument("--budget", type=float, default=BUDGET,
                   help=f"seconds for the whole check (default {BUDGET})")
    p.add_argument("--from", dest="start", choices=NAMES,
                   help="continue the report: run this step and the later ones not yet passed")
    p.add_argument("--list", action="store_true", help="print the steps and their time plan")
    return p.parse_args()


def print_plan() -> None:
    print("| step | planned s (one H100, cold caches: estimates) | limit s | needs |")
    print("|---|---|---|---|")
    for s in STEPS:
        needs = ", ".join(n for n, on in (("CUDA", s.cuda), ("the data", s.data)) if on)
        print(f"| `{s.name}`: {s.title} | {s.estimate} | {s.limit} | {needs or '-'} |")


def report_exists(path: Path) -> CheckError:
    """The refusal of a new check's report where one is already."""
    return CheckError(f"{path} exists: continue it with --from STEP, or name another --report")


def check_outputs(args: argparse.Namespace) -> None:
    """Every path the check writes, before any step: --out (new, empty or the check's own), and
    --report (a new file, or with --from one of the check's reports), else --reports."""
    if args.report is not None and args.report.is_file() and args.start is None:
        raise report_exists(args.report)
    try:
        claim("--out", args.out, "gpu-check")
        if args.report is not None:
            claim("--report", args.report, "gpu-check report", force=True)
    except UserError as exc:
        raise CheckError(str(exc)) from None
    if args.report is None and (why := folder_problem(args.reports)):
        raise CheckError(f"--reports {args.reports}: cannot be written: {why}")
    mark(args.out, "gpu-check")


def main() -> int:
    args = parse()
    if args.list:
        print_plan()
        return 0
    check_outputs(args)
    if args.budget <= 0:
        raise CheckError(f"--budget {args.budget:g}: must be a positive number of seconds")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a running step is stopped too
    start = time.perf_counter()
    context = Context(args.out.resolve(), args.out.resolve() / "notes")
    paths = [str(context.out / "site"), str(PACKAGE), str(ROOT), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p),
           "PYTHON": sys.executable, "PYTHONUNBUFFERED": "1", "GPU_CHECK": "1",
           "GPU_CHECK_DATA": str(context.data / "packed"),
           "GPU_CHECK_EVAL": str(context.data / "hdf5" / "eval" / "eval_10k.hdf5")}
    found = install_bundle(args.bundle.resolve(), sys.executable, context.out / "site", env) \
        if args.bundle else []
    for line in found:
        print("    " + line, flush=True)
    first = STEPS[0]
    outcome = run(first.argv(context), env, first.limit)
    machine = next((json.loads(line.split(" ", 1)[1]) for line in outcome.lines
                    if line.startswith("GPU_CHECK_ENV ")), {"cuda": False, "gpu": None})
    outcome.lines = found + [line for line in outcome.lines if not line.startswith("GPU_CHECK_ENV")]

    path = report_path(args, machine["gpu"])
    if args.start is None and path.exists():
        raise report_exists(path)
    earlier = path.read_text().rstrip("\n").splitlines() if args.start else []
    report = Report(path, earlier)
    passed = report.passed()
    report.add(("\n## continued" if earlier else "# make gpu-check")
               + f", {datetime.datetime.now():%Y-%m-%d %H:%M}: `{' '.join(sys.argv)}`, budget "
               f"{args.budget:.0f} s\n")
    failed = [] if record(report, first, outcome, None) else [first.name]

    todo = [s for s in STEPS[NAMES.index(args.start or NAMES[1]):]
            if s.name not in passed or s.name == args.start]
    if any(s.data for s in todo) and "data" not in passed and DATA not in todo:
        todo.insert(0, DATA)  # a later step needs it
    data_ok = "data" in passed
    for step in todo:
        left = args.budget - (time.perf_counter() - start)
        if step.cuda and not machine["cuda"]:
            continue  # said once, at the end
        if step.estimate > left:
            report.add(f"- `{step.name}`: not run: budget ({step.estimate} s planned, "
                       f"{max(left, 0):.0f} s left): {step.title}")
        elif step.data and not data_ok:
            report.add(f"- `{step.name}`: not run: the data step did not pass: {step.title}")
        else:
            print(f"\n== {step.name}: {step.title} (planned {step.estimate} s, limit "
                  f"{min(step.limit, left):.0f} s)", flush=True)
            notes = context.notes / f"{step.name}.md"
            notes.parent.mkdir(parents=True, exist_ok=True)
            notes.unlink(missing_ok=True)
            outcome = run(step.argv(replace(context, notes=notes)),
                          {**env, "GPU_CHECK_REPORT": str(notes)}, min(step.limit, left))
            if record(report, step, outcome, notes):
                data_ok = data_ok or step is DATA
                continue
        failed.append(step.name)
    if not machine["cuda"]:
        return no_cuda(report, env, start)
    verdict = "every step passed" if not failed else f"not passed: {', '.join(failed)}"
    report.add(f"\n{time.perf_counter() - start:.0f} s in all; {verdict}.")
    if failed:
        print(f"gpu-check: {verdict}; the report: {path}", file=sys.stderr)
    return 0 if not failed else 1


def no_cuda(report: Report, env: dict, start: float) -> int:
    """Without CUDA: the GPU tests collected (they import), then one line."""
    collected = run([sys.executable, "-m", "pytest", "-qq", "--co", "-p", "no:cacheprovider",
                     "tests/gpu"], env, 120)
    count = ", ".join(line for line in collected.lines[-12:] if line.strip()) or "no output"
    report.add(f"- tests/gpu collected: {'ok' if collected.returncode == 0 else 'FAILED'}, "
               f"{collected.seconds:.0f} s: {count}")
    why = "torch sees no CUDA device here"
    report.add(f"\nStopped after {time.perf_counter() - start:.0f} s: {why}.")
    print(f"gpu-check: stopped: {why}; the report so far: {report.path}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CheckError as exc:
        print(f"gpu-check: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("gpu-check: interrupted", file=sys.stderr)
        sys.exit(130)
