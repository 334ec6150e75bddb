"""Run the official MLPerf checkers (mlperf-logging, training ruleset 5.0.0) and give one verdict
table. Each checker runs as `sys.executable -m mlperf_logging.<tool>` in a subprocess with its
log file (`--log_output`) and working folder in a temporary folder and every path made absolute
first, so relative paths work and nothing lands in the caller's folder, except `scaling.json`:
the package checker and the result summarizer write it in results/<system>/bert when the RCP
check says the score must be normalised, and it is part of a submission, so it stays. A verdict
(PASS, BYPASS, WARN, FAIL) comes from the tool's text, never from its exit status alone (the
package and system-description checkers exit 0 on errors, the summarizer without a score); the
parse_* functions read the lines compliance/README.md lists for each tool (verified on
mlperf-logging 4.1.68), and an output with none of its verdict lines is a crash: FAIL, with its
last line."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from bertperf.benchmark import BENCHMARK, RULESET
from bertperf.errors import UserError

USAGE = "training"
TIMEOUT_S = 1800            # per tool run; a real package checks in seconds

PASS, BYPASS, WARN, FAIL = "PASS", "BYPASS", "WARN", "FAIL"

# Failure messages the package checker's --rcp-bypass turns into a pass (rcp_checker.check_directory).
_BYPASSABLE = re.compile(
    r"^(RCP found|RCP Interpolation|Missing RCP, please submit RCP with BS = \d+)$")
_DASHES = re.compile(r"^-+$")


@dataclass
class Result:
    check: str          # compliance | rcp | package | system-desc | summarizer
    target: str         # the file or folder checked
    verdict: str        # PASS | BYPASS | WARN | FAIL
    detail: str
    seconds: float = 0.0
    output: str = field(default="", repr=False)
    package: str = ""   # the submitter folder a result file of a package belongs to


# ---- parsing (pure functions; tests/unit/test_check.py feeds them captured real outputs) ---------

def _last_line(output: str) -> str:
    lines = [l.strip() for l in output.splitlines() if l.strip() and not l.startswith("** ")]
    return lines[-1] if lines else "no output"


def _crash(tool: str, rc: int, output: str) -> tuple[str, str]:
    return FAIL, f"{tool} gave no verdict (exit {rc}): {_last_line(output)}"


def _messages(output: str, level: str) -> list[str]:
    """The text of each `LEVEL - ` line, with the multi-line forms folded into one message."""
    lines = output.splitlines()
    prefix = f"{level} -"
    out: list[str] = []
    for i, line in enumerate(lines):
        if not line.startswith(prefix):
            continue
        text = line[len(prefix):].strip()
        if not text or _DASHES.match(text) or text == "Found parsing errors:" \
                or text.startswith(":::MLLOG"):
            continue
        if text.startswith("^^"):
            out.append("parse error: " + text.lstrip("^ ").strip())
            continue
        if text.startswith("CHECK for"):
            test = next((l.strip() for l in lines[i + 1:i + 4] if l.startswith("failed test:")), "")
            text = f"{text.rstrip(':')}: {test}" if test else text
        out.append(text)
    return out


def _join(messages: list[str], limit: int = 3, width: int = 240) -> str:
    more = f" (+{len(messages) - limit} more)" if len(messages) > limit else ""
    cut = [m if len(m) <= width else m[:width - 3] + "..." for m in messages[:limit]]
    return "; ".join(cut) + more


def parse_compliance(rc: int, output: str) -> tuple[str, str]:
    lines = {l.strip() for l in output.splitlines()}
    warnings = [m for m in _messages(output, "WARNING") if m != "Log lines had parsing errors."]
    if "INFO - SUCCESS" in lines and rc == 0:
        return PASS, ("passed with warnings: " + _join(warnings)) if warnings else "compliant"
    if "ERROR - FAILED" in lines:
        return FAIL, _join(warnings) or "FAILED"
    return _crash("compliance_checker", rc, output)


def parse_rcp(rc: int, output: str, rcp_bypass: bool = False) -> tuple[str, str]:
    passed = re.search(r"^INFO - (.*), RCP test PASSED$", output, re.M)
    failed = re.search(r"^ERROR - (.*), RCP test FAILED", output, re.M)
    extra = []
    mean = re.search(r"Submission mean epochs: ([0-9.]+)", output)
    if mean:
        extra.append(f"olympic mean samples to converge {float(mean.group(1)):,.0f}")
    unconverged = len(re.findall(r"Run incomplete or did not converge", output))
    if unconverged:
        extra.append(f"{unconverged} run(s) not converged")
    norm = re.search(r"Score should be normalized by factor of .* = ([0-9.]+)", output)
    if norm:
        extra.append(f"score to be scaled by {float(norm.group(1)):.4f}")
    tail = f" ({', '.join(extra)})" if extra else ""
    if passed:
        return PASS, passed.group(1).strip() + tail
    if failed:
        msg = failed.group(1).strip()
        if rcp_bypass and _BYPASSABLE.match(msg):
            return BYPASS, f"RCP check failed: {msg}; let through by the RCP bypass{tail}"
        return FAIL, msg + tail
    return _crash("rcp_checker", rc, output)


def parse_package(rc: int, output: str) -> tuple[str, str]:
    ok = "PACKAGE CHECKER FOUND NO ERRORS, SUCCESS !" in output
    bad = "PACKAGE CHECKER FOUND ERRORS" in output
    if not ok and not bad:
        return _crash("package_checker", rc, output)
    errors = _messages(output, "ERROR")
    notes = []
    if re.search(r"^WARNING - +Skipping benchmark: bert$", output, re.M):
        errors.insert(0, f"bert is not a benchmark of ruleset {RULESET}: skipped, nothing checked")
    elif not re.search(r"^INFO - +Benchmark bert$", output, re.M):
        errors.insert(0, "no results/<system>/bert folder: nothing was checked")
    if "accepting this under olympic scoring" in output:
        notes.append("1 result file does not comply; accepted under olympic scoring")
    bypassed = re.findall(r"RCP Test Passed: (.*) passed using rcp_bypass", output)
    rcp = re.findall(r"RCP Test Passed: (.*)$", output, re.M)
    scaled = re.search(r"Results scaling set to normalization factor of ([0-9.]+)", output)
    if scaled:
        notes.append(f"score to be scaled by {scaled.group(1)} (scaling.json written)")
    if errors:
        return FAIL, _join(errors)
    if bypassed:
        return BYPASS, _join([f"RCP check failed: {b}; let through by the RCP bypass"
                              for b in bypassed] + notes)
    return PASS, _join(([f"RCP: {r}" for r in rcp] or ["SUCCESS"]) + notes)


def parse_system_desc(rc: int, output: str) -> tuple[str, str]:
    failed = re.search(r"System description checker failed for (.*?) : (.*)$", output, re.M)
    if failed:
        return FAIL, failed.group(2).strip()
    passed = re.search(r"System description checker passed for (.*)$", output, re.M)
    if passed:
        return PASS, f"all fields present for system_name {passed.group(1).strip()!r}"
    return _crash("system_desc_checker", rc, output)


def parse_summarizer(rc: int, output: str, rows: list[dict] | None, submitter: str,
                     system: str, system_name: str | None = None,
                     rcp_bypass: bool = False) -> tuple[str, str]:
    """One system's verdict from the summarizer's stdout and the rows of its detailed JSON.

    `submitter` and `system_name` are the fields of systems/<system>.json (the summarizer's rows
    carry those); `system` is the results/<system> folder name (its messages carry that)."""
    where = f"{submitter} {system}/{BENCHMARK}"
    if f"CRITICAL ERROR: Too many non-converging runs for {where}" in output:
        return FAIL, "too many non-converging or non-compliant runs: no score"
    name = system_name or system
    row = next((r for r in rows or [] if r.get("submitter") == submitter
                and r.get("system") == name), None)
    if row is None:
        return FAIL, f"no score for {submitter}/{name}: {_last_line(output)}"
    score = row.get(f"{BENCHMARK}:time_to_train")
    if score is None:
        return FAIL, f"no {BENCHMARK} score for {submitter}/{name}: {_last_line(output)}"
    parts = [f"{BENCHMARK} {score:.4f} min"]
    if row.get(f"{BENCHMARK}:samples_to_converge") is not None:
        parts.append(f"{row[f'{BENCHMARK}:samples_to_converge']:,.0f} samples to converge")
    if row.get(f"{BENCHMARK}:GBS") is not None:
        parts.append(f"GBS {row[f'{BENCHMARK}:GBS']:.0f}")
    factor = row.get(f"{BENCHMARK}:rcp_scaling_factor")
    if factor not in (None, 1.0):
        parts.append(f"scaled by {factor:.4f}")
    parts.append(f"RCP {row.get(f'{BENCHMARK}:RCP') or '?'}")
    dropped = re.findall(r"^(?:.*) in (\S*/results/" + re.escape(system) + r"/bert/\S+)$",
                         output, re.M)
    if dropped:
        parts.append("dropped: " + ", ".join(Path(d).name for d in sorted(set(dropped))))
    detail = ", ".join(parts)
    rcp = re.search(r"ERROR: RCP Test Failed on " + re.escape(f"{submitter}/{system}/{BENCHMARK}")
                    + r" with message: (.*)\.$", output, re.M)
    if rcp:
        if rcp_bypass and _BYPASSABLE.match(rcp.group(1)):
            return BYPASS, f"{detail} (RCP check failed: {rcp.group(1)}; RCP bypass)"
        return FAIL, f"{detail} (RCP check failed: {rcp.group(1)})"
    return PASS, detail


# ---- running the tools ---------------------------------------------------------------------------

def tool_version() -> str:
    from importlib import metadata
    try:
        return metadata.version("mlperf-logging")
    except metadata.PackageNotFoundError:
        raise UserError(f"mlperf-logging is not installed for {sys.executable} "
                        "(pip install mlperf-logging==4.1.68)") from None


def run_tool(module: str, args: list[str], workdir: Path) -> tuple[int, str, float]:
    """`python -m mlperf_logging.<module> args`: exit status, stdout+stderr, seconds."""
    cmd = [sys.executable, "-m", f"mlperf_logging.{module}", *args]
    start = time.monotonic()
    try:
        run = subprocess.run(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, errors="replace", timeout=TIMEOUT_S)
        return run.returncode, run.stdout, time.monotonic() - start
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        return 124, f"{out or ''}\ntimed out after {TIMEOUT_S} s", time.monotonic() - start


def check_log(log: Path, workdir: Path) -> Result:
    log = Path(log).absolute()
    if not log_events(log):  # the checker would name the first key it misses
        return Result("compliance", str(log), "FAIL", "not an MLPerf log (no :::MLLOG line)")
    rc, out, secs = run_tool("compliance_checker", [
        "--usage", USAGE, "--ruleset", RULESET,
        "--log_output", str(_scratch(workdir, "compliance", log)), str(log)], workdir)
    return Result("compliance", str(log), *parse_compliance(rc, out), secs, out)


def check_rcp(folder: Path, workdir: Path, rcp_bypass: bool) -> Result:
    folder = Path(folder).absolute()
    rc, out, secs = run_tool("rcp_checker", [
        str(folder), "--rcp_usage", USAGE, "--rcp_version", RULESET, "--rcp_pass", "pruned_rcps",
        "--log_output", str(_scratch(workdir, "rcp", folder))], workdir)
    declared, note = bypass_declared(folder)
    verdict, detail = parse_rcp(rc, out, rcp_bypass or declared)
    if declared and not rcp_bypass and verdict == BYPASS:
        detail += " (package_checker_params)"
    return Result("rcp", str(folder), verdict, detail + (f"; {note}" if note else ""), secs, out)


def check_system_desc(desc: Path, workdir: Path) -> Result:
    desc = Path(desc).absolute()
    rc, out, secs = run_tool("system_desc_checker", [
        str(desc), USAGE, RULESET, "--log_output", str(_scratch(workdir, "sysdesc", desc))], workdir)
    return Result("system-desc", str(desc), *parse_system_desc(rc, out), secs, out)


def check_package(org: Path, workdir: Path, rcp_bypass: bool) -> Result:
    org = Path(org).absolute()
    args = [str(org), USAGE, RULESET, "--log_output", str(_scratch(workdir, "package", org))]
    rc, out, secs = run_tool("package_checker", args + (["--rcp-bypass"] if rcp_bypass else []),
                             workdir)
    verdict, detail = parse_package(rc, out)
    notes = [n for d in sorted((org / "results").glob(f"*/{BENCHMARK}"))
             for n in [bypass_declared(d)[1]] if n]
    if notes:
        detail = "; ".join([detail] + notes)
    return Result("package", str(org), verdict, detail, secs, out)


def summarize(org: Path, workdir: Path, rcp_bypass: bool) -> list[Result]:
    org = Path(org).absolute()
    csv = _scratch(workdir, "summary", org).with_suffix(".csv")
    rc, out, secs = run_tool("result_summarizer", [str(org), USAGE, RULESET, "--csv", str(csv)],
                             workdir)
    detailed = csv.with_name(csv.stem + "_detailed.json")
    try:
        rows = json.loads(detailed.read_text())
    except (OSError, ValueError):
        rows = None
    systems = sorted(p.name for p in (org / "results").iterdir()
                     if (p / BENCHMARK).is_dir()) if (org / "results").is_dir() else []
    if not systems:
        return [Result("summarizer", str(org), FAIL, "no results/<system>/bert folder", secs, out)]
    found = []
    for s in systems:
        try:
            desc = json.loads((org / "systems" / f"{s}.json").read_text())
            submitter, name = str(desc["submitter"]), str(desc["system_name"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            found.append(Result("summarizer", str(org / "results" / s / BENCHMARK), FAIL,
                                f"cannot read systems/{s}.json: {exc}", secs, out))
            continue
        declared, _ = bypass_declared(org / "results" / s / BENCHMARK)
        found.append(Result("summarizer", str(org / "results" / s / BENCHMARK),
                            *parse_summarizer(rc, out, rows, submitter, s, name,
                                              rcp_bypass or declared), secs, out))
    return found


def bypass_declared(bert_dir: Path) -> tuple[bool, str]:
    """Whether the package checker reads an rcp-bypass from package_checker_params in
    results/<system>/bert or results/<system>, and a note when the file is there but ignored.

    It compares each line, newline included, with == "rcp-bypass": only a last line without a
    trailing newline counts."""
    note = ""
    for params in (bert_dir / "package_checker_params", bert_dir.parent / "package_checker_params"):
        try:
            lines = params.read_text().splitlines(keepends=True)
        except OSError:
            continue
        if "rcp-bypass" in lines:
            return True, ""
        if any(l.strip() == "rcp-bypass" for l in lines):
            note = (f"{params} says rcp-bypass with a trailing newline, which the package checker "
                    "ignores (write it with printf, not echo)")
    return False, note


_counter = itertools.count()


def _scratch(workdir: Path, kind: str, target: Path) -> Path:
    """A fresh absolute path in the scratch folder for one tool's own file (its log)."""
    return Path(workdir).absolute() / f"{next(_counter):04d}-{kind}-{target.name or 'root'}.log"


# ---- inputs --------------------------------------------------------------------------------------

def expand_logs(paths: Iterable[str | Path]) -> list[Path]:
    logs: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("result_*.txt"), key=natural_key)
            if not found:
                raise UserError(f"log folder {p} has no result_*.txt files")
            logs += found
        elif p.is_file():
            logs.append(p)
        else:
            raise UserError(f"log file {p} does not exist")
    return logs


def results_folder(path: str | Path) -> Path:
    """A results/<system>/bert folder (holding result_*.txt), or its parent results/<system>."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"results folder {p} does not exist")
    for cand in (p, p / BENCHMARK):
        if any(cand.glob("result_*.txt")):
            return cand
    raise UserError(f"results folder {p} has no result_*.txt files (nor has {p / BENCHMARK})")


def submitter_folders(path: str | Path) -> list[Path]:
    """The submitter folder(s): DIR itself if it has results/ or systems/, else its subfolders that do."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"submission folder {p} does not exist")

    def is_org(d: Path) -> bool:
        return (d / "results").is_dir() or (d / "systems").is_dir()

    if is_org(p):
        return [p]
    orgs = sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith(".") and is_org(d))
    if not orgs:
        raise UserError(f"submission folder {p} has no results/ or systems/ folder, "
                        "nor any <submitter>/ subfolder with them")
    return orgs


def natural_key(path: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


# ---- the runs behind the logs --------------------------------------------------------------------

def log_events(log: Path) -> list[dict]:
    """The :::MLLOG events of a log; a line that does not parse is left out (the compliance
    checker judges the file)."""
    out = []
    for line in Path(log).read_text(encoding="latin-1").splitlines():
        if ":::MLLOG " in line:
            try:
                out.append(json.loads(line.split(":::MLLOG ", 1)[1]))
            except ValueError:
                pass
    return out


def repeated_runs(logs: Iterable[Path]) -> list[tuple[Path, Path, str]]:
    """(log, the earlier of `logs` it repeats, how) for each log that is no run of its own: the
    same bytes as another, or the same run (its init_start and run_start at the same times; a
    copy edited by hand). The package checker lets such copies through in the open division,
    where it checks no seeds."""
    seen: dict[object, Path] = {}
    out = []
    for log in logs:
        times = {e.get("key"): e.get("time_ms") for e in log_events(log)
                 if e.get("key") in ("init_start", "run_start")}
        keys = {"the same bytes": hashlib.sha256(Path(log).read_bytes()).hexdigest()}
        if len(times) == 2:
            keys["the same run: init_start and run_start at the same times"] = \
                (times["init_start"], times["run_start"])
        repeated = next(((seen[key], how) for how, key in keys.items() if key in seen), None)
        if repeated is not None:
            out.append((log, *repeated))
        for key in keys.values():
            seen.setdefault(key, log)
    return out


def check_runs(folder: Path) -> Result:
    """Whether the result logs of a results/<system>/bert folder are as many runs."""
    logs = sorted(Path(folder).glob("result_*.txt"), key=natural_key)
    repeats = repeated_runs(logs)
    if not repeats:
        return Result("runs", str(folder), PASS, f"{len(logs)} logs, {len(logs)} runs")
    log, first, how = repeats[0]
    more = f" (and {len(repeats) - 1} more)" if len(repeats) > 1 else ""
    return Result("runs", str(folder), FAIL, f"{log.name} repeats {first.name} ({how}){more}")


# ---- the whole check -----------------------------------------------------------------------------

def _submission_jobs(org: Path, workdir: Path, rcp_bypass: bool) -> list[Callable[[], list[Result]]]:
    jobs: list[Callable[[], list[Result]]] = []
    for desc in sorted((org / "systems").glob("*.json")) if (org / "systems").is_dir() else []:
        jobs.append(lambda d=desc: [check_system_desc(d, workdir)])
    results = org / "results"
    for log in sorted(results.glob(f"*/{BENCHMARK}/result_*.txt"), key=natural_key):
        jobs.append(lambda l=log: [_in_package(check_log(l, workdir), org)])
    for folder in sorted(results.glob(f"*/{BENCHMARK}")):
        jobs.append(lambda f=folder: [check_runs(f)])
    # package checker then summarizer: both write/delete scaling.json in the same folders
    jobs.append(lambda: [check_package(org, workdir, rcp_bypass)] + summarize(org, workdir,
                                                                            rcp_bypass))
    return jobs


def _in_package(result: Result, org: Path) -> Result:
    result.package = str(org)
    return result


def _olympic(results: list[Result]) -> None:
    """In a package, one non-compliant result file per system that the package checker accepted
    under olympic scoring is WARN, not FAIL (it is dropped from the score, as MLPerf allows)."""
    packages = {r.target: r for r in results if r.check == "package"}
    by_folder: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        if r.check == "compliance" and r.verdict == FAIL and r.package:
            by_folder.setdefault((r.package, str(Path(r.target).parent)), []).append(r)
    for (org, _), failed in by_folder.items():
        pkg = packages.get(org)
        if len(failed) == 1 and pkg is not None \
                and "accepting this under olympic scoring" in pkg.output:
            failed[0].verdict = WARN
            failed[0].detail += " (dropped: the package checker accepts 1 such run, olympic scoring)"


def run_checks(logs: Iterable[str | Path] = (), results: Iterable[str | Path] = (),
               submissions: Iterable[str | Path] = (), rcp_bypass: bool = False,
               jobs: int | None = None) -> list[Result]:
    """Every check asked for, in a stable order (the table's). Paths are made absolute: the
    tools run in a scratch folder (they write files into their working directory)."""
    log_paths = expand_logs([Path(p).absolute() for p in logs])
    result_dirs = [results_folder(Path(r).absolute()) for r in results]
    orgs = [o for s in submissions for o in submitter_folders(Path(s).absolute())]
    if not (log_paths or result_dirs or orgs):
        raise UserError("nothing to check: give --logs, --results or --submission")
    tool_version()
    with tempfile.TemporaryDirectory(prefix="bertperf-check-") as tmp:
        workdir = Path(tmp)
        work: list[Callable[[], list[Result]]] = []
        work += [lambda l=l: [check_log(l, workdir)] for l in log_paths]
        work += [lambda d=d: [check_rcp(d, workdir, rcp_bypass)] for d in result_dirs]
        for org in orgs:
            work += _submission_jobs(org, workdir, rcp_bypass)
        workers = jobs or max(1, min(4, os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            out = [r for rs in pool.map(lambda f: f(), work) for r in rs]
    _olympic(out)
    return out


def format_table(results: list[Result]) -> str:
    rows = [("check", "target", "verdict", "detail")]
    rows += [(r.check, r.target, r.verdict, r.detail) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + "  " + row[3]
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * 6)
    return "\n".join(lines)


def rcp_batch_sizes() -> list[int]:
    """The global batch sizes of the BERT RCP table that ships with mlperf-logging (5.0.0)."""
    from importlib.util import find_spec
    spec = find_spec("mlperf_logging")
    if spec is None or not spec.submodule_search_locations:
        return []
    path = Path(list(spec.submodule_search_locations)[0], "rcp_checker", f"{USAGE}_{RULESET}",
                f"rcps_{BENCHMARK}.json")
    try:
        return sorted({int(r["BS"]) for r in json.loads(path.read_text()).values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def summary_lines(results: list[Result], rcp_bypass: bool) -> list[str]:
    count = {v: sum(r.verdict == v for r in results) for v in (PASS, BYPASS, WARN, FAIL)}
    lines = [f"{len(results)} checks (mlperf-logging {tool_version()}, {USAGE} ruleset {RULESET}): "
             + ", ".join(f"{n} {v}" for v, n in count.items() if n)]
    if count[BYPASS]:
        reasons = sorted({m.group(0) for r in results if r.verdict == BYPASS
                          for m in [re.search(r"RCP check failed: [^;)]*", r.detail)] if m})
        missing = sorted({int(b) for r in reasons for b in re.findall(r"with BS = (\d+)", r)})
        table = ", ".join(map(str, rcp_batch_sizes()))
        lines.append(
            "BYPASS: the RCP (reference convergence point) check FAILED and these results pass "
            "only because of the RCP bypass (--rcp-bypass, or package_checker_params in the "
            "results folder): " + "; ".join(reasons) + ".")
        if missing:
            lines.append(
                f"  Global batch size {', '.join(map(str, missing))} is not in the {BENCHMARK} "
                f"RCP table of ruleset {RULESET} (batch sizes {table}): there is no reference "
                "convergence point to hold these runs to. Fine for a test of a tiny config; a "
                "real submission uses a batch size the table covers (or lies between two of "
                "them), or brings RCP runs for its own and has the review committee accept "
                "them. See compliance/README.md.")
        else:
            lines.append("  A real submission needs the review committee's approval for this; "
                         "see compliance/README.md.")
    if rcp_bypass and not count[BYPASS]:
        lines.append("--rcp-bypass was given but not needed: every RCP check passed on its own.")
    if count[WARN]:
        lines.append("WARN: a result file that fails compliance, which MLPerf accepts once per "
                     "system (dropped under olympic scoring).")
    if count[FAIL]:
        lines.append("FAILED: " + ", ".join(sorted({r.target for r in results if r.verdict == FAIL})))
    return lines
