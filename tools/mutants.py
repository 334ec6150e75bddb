"""What the test suite catches (on demand, not part of `make test`): planted one-line mutations
of the places a regression would hurt (mutation_set.json beside this file), each applied alone
to a clone of the committed checkout, with the tests that could catch it run against it.

  python tools/mutants.py probe    make test's tests, once, on a clone with a probe before every
                                   mutated line: which tests execute each line, how long each
                                   test takes, and which pass (only those can catch anything)
  python tools/mutants.py run      each mutation alone: the tests that execute its line, the
                                   fastest first, one at a time; which fail, and the seconds
                                   from pytest's start to the first failure
  python tools/mutants.py table    the results as a Markdown table

Everything is kept in .mutants/ at the checkout's root (the clone, the probe's findings, the
results); `run --only NAME,...` reruns some mutations. A test that executes a mutated line only
in a process outside its own process tree (a Slurm job, a namespace's daemon) is credited to the
test that ran last; the e2e tests run one at a time, so that is the one that started it."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".mutants"
TREE = STATE / "tree"
SET = Path(__file__).with_name("mutation_set.json")
TORCH = re.compile(r"^import torch$", re.M)


def make_variable(name: str) -> list[str]:
    """A `NAME := ...` line of the Makefile, as arguments."""
    return re.search(rf"^{name} := (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()


TIERS = {"unit": ["-n", "auto", "--dist", "loadfile", *make_variable("UNIT")],
         "e2e": make_variable("E2E")}
"""make test's tests (the Makefile's UNIT and E2E) as the probe runs them, one after the other:
the unit tests on every core, the end-to-end tests one at a time (a line a Slurm job or a
namespace's daemon executes is credited to the test that ran last)."""

PROBE = '''"""Records which test executes which mutated line (tools/mutants.py probe)."""
import os
import sys

STATE = {state!r}
_seen = set()
_found = None


def _parent(pid):
    with open(f"/proc/{{pid}}/status") as f:
        return int(next(line for line in f if line.startswith("PPid:")).split()[1])


def test_of(pid):
    """The test running this process: pytest's own (its environment), else the nearest
    ancestor's that a pytest process registered, else the test started last."""
    global _found
    if os.environ.get("MUTANT_TEST"):
        return os.environ["MUTANT_TEST"]
    if _found is None:
        while pid > 1 and _found is None:
            try:
                with open(os.path.join(STATE, "current", str(pid))) as f:
                    _found = f.read()
            except OSError:
                try:
                    pid = _parent(pid)
                except (OSError, StopIteration, ValueError):
                    break
        if _found is None:
            files = sorted(os.scandir(os.path.join(STATE, "current")),
                           key=lambda e: e.stat().st_mtime)
            _found = open(files[-1].path).read() if files else "?"
    return _found


def hit(name, pid=None):
    test = test_of(pid or os.getpid())
    if (name, test) not in _seen:
        _seen.add((name, test))
        with open(os.path.join(STATE, "hits", str(os.getpid())), "a") as f:
            f.write(f"{{name}}\\t{{test}}\\n")


if __name__ == "__main__":
    hit(sys.argv[1], int(sys.argv[2]))
'''

PLUGIN = '''"""pytest plugin of tools/mutants.py: each test's id where the probe finds it, and each
report's outcome and time."""
import json
import os
import time

STATE = {state!r}
START = time.time()


def pytest_runtest_setup(item):
    os.environ["MUTANT_TEST"] = item.nodeid
    with open(os.path.join(STATE, "current", str(os.getpid())), "w") as f:
        f.write(item.nodeid)


def pytest_runtest_logreport(report):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller writes what its workers report
    with open(os.path.join(STATE, "reports.jsonl"), "a") as f:
        f.write(json.dumps({{"test": report.nodeid, "when": report.when,
                            "outcome": report.outcome, "seconds": report.duration,
                            "at": time.time() - START}}) + "\\n")
'''


@dataclass(frozen=True)
class Mutant:
    name: str
    area: str
    path: str
    old: str
    new: str
    why: str


MUTANTS: list[Mutant] = []
"""The mutations (main loads --set)."""


def load_set() -> list[Mutant]:
    return MUTANTS


def site(text: str, mutant: Mutant) -> int:
    """The index of the mutated line in `text`'s lines (it must be there exactly once)."""
    lines = text.split("\n")
    found = [i for i, line in enumerate(lines) if line == mutant.old]
    if len(found) != 1:
        raise SystemExit(f"mutants: {mutant.name}: its line is in {mutant.path} {len(found)} "
                         "times, not once: update tools/mutation_set.json")
    return found[0]


def apply(text: str, mutant: Mutant) -> str:
    lines = text.split("\n")
    lines[site(text, mutant)] = mutant.new
    return "\n".join(lines)


def probed(text: str, mutants: list[Mutant], python: str) -> str:
    """`text` with a probe before each mutant's line, at its indentation."""
    lines = text.split("\n")
    for m in sorted(mutants, key=lambda m: site(text, m), reverse=True):
        i = site(text, m)
        indent = m.old[:len(m.old) - len(m.old.lstrip())]
        if m.path.endswith(".py"):  # torch.compile traces past it (is_compiling() is True)
            compiled = "torch.compiler.is_compiling() or " if TORCH.search(text) else ""
            probe = (f'{indent}{compiled}(__import__("sys").path.append("{TREE}") if "{TREE}" '
                     f'not in __import__("sys").path else None, '
                     f'__import__("_mutant_probe").hit({m.name!r}))')
        else:
            probe = f'{indent}"{python}" "{TREE}/_mutant_probe.py" {m.name} $$ || true'
        lines.insert(i, probe)
    return "\n".join(lines)


def clone() -> None:
    """A clone of HEAD in .mutants/tree with this checkout's built extensions."""
    if TREE.exists():
        shutil.rmtree(TREE)
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(TREE)], check=True)
    for built in ROOT.glob("implementations/pytorch/**/*.so"):
        target = TREE / built.relative_to(ROOT)
        if target.parent.is_dir():
            shutil.copy2(built, target)


def pytest(args: list[str], timeout: float | None = None) -> tuple[int, bool]:
    """python -m pytest ARGS in the clone with the plugin; (exit status, timed out)."""
    env = {**os.environ, "PYTHONPATH": f"{TREE}/implementations/pytorch:{TREE}"}
    env.pop("MUTANT_TEST", None)
    shared = ROOT.parent / "shared" / "data"  # what the tests find beside the checkout
    for name, path in (("WIKI_SAMPLE", shared / "wiki_sample"),
                       ("BERTPERF_VOCAB", shared / "vocab" / "vocab.txt")):
        if path.exists():
            env.setdefault(name, str(path))
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "_mutant_plugin",
                             "-p", "no:cacheprovider", *args], cwd=TREE, env=env,
                            start_new_session=True)
    try:
        return proc.wait(timeout=timeout), False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # the fixtures clean up (Slurm, namespaces)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return proc.returncode, True


def fresh_state(*names: str) -> None:
    for name in names:
        path = STATE / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    (STATE / "current").mkdir(parents=True, exist_ok=True)
    (STATE / "hits").mkdir(parents=True, exist_ok=True)


def reports() -> list[dict]:
    path = STATE / "reports.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def probe(tests: list[str]) -> None:
    mutants = load_set()
    clone()
    fresh_state("current", "hits", "reports.jsonl")
    (TREE / "_mutant_probe.py").write_text(PROBE.format(state=str(STATE)))
    (TREE / "_mutant_plugin.py").write_text(PLUGIN.format(state=str(STATE)))
    for path in sorted({m.path for m in mutants}):
        text = (TREE / path).read_text()
        (TREE / path).write_text(probed(text, [m for m in mutants if m.path == path],
                                        sys.executable))
    started = time.time()
    tiers = {}
    for tier, args in ({"given": tests} if tests else TIERS).items():
        t0 = time.time()
        pytest(args)
        tiers[tier] = time.time() - t0
    hits: dict[str, set[str]] = {m.name: set() for m in mutants}
    for path in (STATE / "hits").iterdir():
        for line in path.read_text().splitlines():
            name, test = line.split("\t")
            hits.setdefault(name, set()).add(test)
    tests: dict[str, dict] = {}
    for r in reports():  # a test can catch something only if it ran and passed
        t = tests.setdefault(r["test"], {"seconds": 0.0, "called": False, "failed": False})
        t["seconds"] += r["seconds"]
        t["called"] |= r["when"] == "call" and r["outcome"] == "passed"
        t["failed"] |= r["outcome"] == "failed"
    for t in tests.values():
        t["passed"] = t.pop("called") and not t.pop("failed")
    (STATE / "probe.json").write_text(json.dumps({
        "head": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=TREE, text=True,
                               capture_output=True).stdout.strip(),
        "seconds": time.time() - started, "tiers": tiers, "tests": tests,
        "hits": {k: sorted(v) for k, v in hits.items()}}, indent=1))
    silent = [m.name for m in mutants if not hits[m.name]]
    print(f"probe: {len(tests)} tests in {time.time() - started:.0f} s; lines no test executes: "
          f"{', '.join(silent) or 'none'}")


def tier_of(test: str) -> str:
    return "unit" if test.startswith("tests/unit/") else "e2e"


def run(only: list[str], maxfail: int, timeout: float) -> None:
    found = json.loads((STATE / "probe.json").read_text())
    results_path = STATE / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for m in load_set():
        if only and m.name not in only:
            continue
        tests = sorted((t for t in found["hits"].get(m.name, [])
                        if found["tests"].get(t, {}).get("passed")),
                       key=lambda t: found["tests"][t]["seconds"])
        subprocess.run(["git", "checkout", "-q", "HEAD", "--", "."], cwd=TREE, check=True)
        (TREE / m.path).write_text(apply((TREE / m.path).read_text(), m))
        fresh_state("current", "hits", "reports.jsonl")
        t0 = time.time()
        timed_out = False
        if tests:
            args = STATE / "args.txt"
            args.write_text("\n".join(tests) + "\n")
            _, timed_out = pytest(["-p", "no:xdist", *([f"--maxfail={maxfail}"] if maxfail else []),
                                   f"@{args}"], timeout=timeout)
        failed = [r for r in reports() if r["outcome"] == "failed"]
        ran = {r["test"] for r in reports()}
        results[m.name] = {
            "covering": {tier: sum(tier_of(t) == tier for t in tests) for tier in TIERS},
            "ran": len(ran), "seconds": time.time() - t0, "timed_out": timed_out,
            "failed": sorted({r["test"] for r in failed}),
            "first": min(failed, key=lambda r: r["at"])["test"] if failed else None,
            "first_at": min(r["at"] for r in failed) if failed else None}
        results_path.write_text(json.dumps(results, indent=1))
        r = results[m.name]
        print(f"{m.name}: {len(r['failed'])} of {r['ran']} tests fail"
              + (f", the first after {r['first_at']:.0f} s ({r['first']})" if failed else "")
              + (" (timed out)" if timed_out else ""), flush=True)
    subprocess.run(["git", "checkout", "-q", "HEAD", "--", "."], cwd=TREE, check=True)


def table() -> None:
    found = json.loads((STATE / "probe.json").read_text())
    results = json.loads((STATE / "results.json").read_text())
    print(f"At {found['head']}; the probe run took {found['seconds'] / 60:.1f} min "
          f"({', '.join(f'{k} {v / 60:.1f}' for k, v in found['tiers'].items())}).\n")
    print("| mutation | area | tests that run its line (unit + e2e) | tests run, failed | first "
          "to fail | s to it |")
    print("|---|---|---|---|---|---|")
    for m in load_set():
        r = results.get(m.name)
        if r is None:
            continue
        if r["first"]:
            first = r["first"].split("::", 1)[1]
        elif r["timed_out"]:
            first = f"none in its {r['seconds']:.0f} s (stopped: {r['ran']} tests had run)"
        else:
            first = "**none: survives**"
        where = r["first"].split("::")[0].removeprefix("tests/") if r["first"] else ""
        print(f"| {m.name} | {m.area} | {r['covering']['unit']} + {r['covering']['e2e']} | "
              f"{r['ran']}, {len(r['failed'])}{' (timed out)' if r['timed_out'] else ''} | "
              f"{where + ' ' if where else ''}{first} | "
              f"{'' if r['first_at'] is None else round(r['first_at'])} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", type=Path, default=SET, help="the mutations (JSON: name, area, "
                   "path, old, new, why)")
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("probe")
    pr.add_argument("tests", nargs="*", help="these pytest arguments, one run, instead of make "
                    "test's two")
    r = sub.add_parser("run")
    r.add_argument("--only", default="", help="comma-separated mutation names")
    r.add_argument("--maxfail", type=int, default=0, help="stop a mutation's tests after N "
                   "failures (0: run them all)")
    r.add_argument("--timeout", type=float, default=1800, help="seconds a mutation's tests may "
                   "take")
    sub.add_parser("table")
    args = p.parse_args()
    MUTANTS[:] = [Mutant(**m) for m in json.loads(args.set.read_text())]
    if args.command == "probe":
        probe(args.tests)
    elif args.command == "run":
        run([n for n in args.only.split(",") if n], args.maxfail, args.timeout)
    else:
        table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
