"""Assemble an MLPerf Training submission folder (ruleset 5.0.0, BERT) from a run directory.

    <OUT>/<Org>/systems/<system>.json                         system description (this machine + flags)
    <OUT>/<Org>/benchmarks/bert/implementations/pytorch/...   snapshot of this repository's files
    <OUT>/<Org>/results/<system>/bert/result_0..9.txt         the 10 result logs, each compliance-checked
    <OUT>/<Org>/results/<system>/bert/package_checker_params  "rcp-bypass" (no newline), if asked

Nothing is made up: the system description holds what this machine reports (/proc/cpuinfo,
/proc/meminfo, /sys/devices/system/cpu, /etc/os-release, torch.cuda, nvidia-smi) and what the flags
say; a field neither can tell is "" (accelerator fields "N/A" and 0 GPUs without CUDA), which the
system-description checker accepts. `--field key=value` fills the rest (cooling, storage, network).
The folder is built in a hidden temporary folder inside OUT and renamed into place at the end, so a
failure leaves OUT as it was.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

from bertperf.errors import UserError
from bertperf.formats.outputs import claim
from bertperf.benchmark import BENCHMARK, CLOSED, RESULT_COUNT, RULESET
from bertperf.mlperf.check import (FAIL, check_log, log_events, natural_key, repeated_runs,
                                   tool_version)

# system_desc_checker's required fields (mlperf-logging 4.1.68), in its order
SYSTEM_FIELDS = (
    "submitter", "division", "status", "system_name", "number_of_nodes",
    "host_processors_per_node", "host_processor_model_name", "host_processor_core_count",
    "host_processor_vcpu_count", "host_processor_frequency", "host_processor_caches",
    "host_processor_interconnect", "host_memory_capacity", "host_storage_type",
    "host_storage_capacity", "host_networking", "host_networking_topology",
    "host_memory_configuration", "accelerators_per_node", "accelerator_model_name",
    "accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories",
    "accelerator_memory_configuration", "accelerator_memory_capacity", "accelerator_interconnect",
    "accelerator_interconnect_topology", "cooling", "hw_notes", "framework",
    "other_software_stack", "operating_system", "sw_notes",
)
# the only values system_desc_checker accepts for `status` (training rulesets >= 4.0)
STATUSES = {
    "available": "Available on-premise",
    "cloud": "Available cloud",
    "research": "Research, Development, or Internal (RDI)",
    "preview": "Preview",
}
_FLAG_FIELDS = {"submitter": "--org", "system_name": "--system", "division": "--division",
                "status": "--status", "number_of_nodes": "--nodes"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")

# What the implementation folder holds: these globs, relative to the repository root, keep their
# relative paths (the copy builds and runs like the checkout: `pip install .`, `make`).
IMPLEMENTATION_GLOBS = (
    "README.md", "LICENSE*", "NOTICE*", "Makefile", "pyproject.toml", "setup.py", "Dockerfile*",
    ".dockerignore", "requirements*.txt", "*.sh", "*.sub",          # config_*.sh, run_and_time.sh, run.sub
    "data_prep/**/*", "compliance/**/*", "tools/**/*", "docs/*.md",
    "implementations/pytorch/*.sh", "implementations/pytorch/*.sub",
    "implementations/pytorch/Dockerfile*", "implementations/pytorch/README.md",
    "implementations/pytorch/requirements*.txt",
    "implementations/pytorch/bertperf/**/*",
)
_SKIP_DIRS = {"__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
_SKIP_SUFFIXES = {".pyc", ".pyo", ".so", ".o", ".pyd"}

PACKAGE = Path(__file__).resolve().parents[1]       # .../bertperf
REPO = PACKAGE.parents[2]                           # the checkout, when run from one


# ---- the machine ---------------------------------------------------------------------------------

def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _cpuinfo() -> list[dict[str, str]]:
    blocks = []
    for block in _read("/proc/cpuinfo").split("\n\n"):
        entry = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                entry[key.strip()] = value.strip()
        if entry:
            blocks.append(entry)
    return blocks


def _cpu_dirs() -> list[Path]:
    return sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*"), key=natural_key)


def _size(nbytes: float, unit: str = "GiB") -> str:
    div = {"GiB": 2**30, "GB": 1e9, "TB": 1e12}[unit]
    value = nbytes / div
    return f"{value:.0f} {unit}" if value >= 100 or value == int(value) else f"{value:.1f} {unit}"


def host_processor() -> dict[str, str]:
    cpus = _cpuinfo()
    first = cpus[0] if cpus else {}
    topo = [(_read(d / "topology/physical_package_id").strip(), _read(d / "topology/core_id").strip())
            for d in _cpu_dirs() if (d / "topology").is_dir()]
    if topo:
        sockets = len({p for p, _ in topo})
        cores = len(set(topo)) // max(sockets, 1)
        vcpus = len(topo)
    else:
        sockets = len({c.get("physical id") for c in cpus if "physical id" in c})
        cores = int(first["cpu cores"]) if first.get("cpu cores", "").isdigit() else 0
        vcpus = len(cpus)
    freq = ""
    max_khz = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").strip()
    if max_khz.isdigit():
        freq = f"{int(max_khz) / 1000:.0f} MHz (max)"
    elif first.get("cpu MHz"):
        freq = f"{float(first['cpu MHz']):.0f} MHz"
    caches = []
    for idx in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"), key=natural_key):
        level, kind, size = (_read(idx / n).strip() for n in ("level", "type", "size"))
        if level and size:
            tag = {"Data": "d", "Instruction": "i"}.get(kind, "")
            caches.append(f"L{level}{tag} {size}")
    if not caches and first.get("cache size"):
        caches.append(f"cache size {first['cache size']}")
    model = first.get("model name") or first.get("Model") or first.get("Hardware") or ""
    return {
        "host_processors_per_node": str(sockets) if sockets else "",
        "host_processor_model_name": model,
        "host_processor_core_count": str(cores) if cores else "",
        "host_processor_vcpu_count": str(vcpus) if vcpus else "",
        "host_processor_frequency": freq,
        "host_processor_caches": ", ".join(caches) + (" (per core, as cpu0 sees them)"
                                                      if caches else ""),
    }


def host_memory() -> str:
    m = re.search(r"^MemTotal:\s+(\d+) kB", _read("/proc/meminfo"), re.M)
    return _size(int(m.group(1)) * 1024) if m else ""


def operating_system() -> str:
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', _read("/etc/os-release"), re.M)
    name = m.group(1) if m else platform.system()
    return f"{name} ({platform.system()} kernel {platform.release()})"


def _nvidia_smi(query: str) -> list[str]:
    try:
        run = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [l.strip() for l in run.stdout.splitlines() if l.strip()] if run.returncode == 0 else []


def accelerators() -> dict[str, str]:
    none = {"accelerators_per_node": "0", "accelerator_model_name": "N/A",
            "accelerator_host_interconnect": "N/A", "accelerator_frequency": "N/A",
            "accelerator_on-chip_memories": "N/A", "accelerator_memory_configuration": "N/A",
            "accelerator_memory_capacity": "N/A", "accelerator_interconnect": "N/A",
            "accelerator_interconnect_topology": "N/A"}
    try:
        import torch
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            return none
        count = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
    except Exception:  # noqa: BLE001 (a broken driver reads as no accelerator, not a crash)
        return none
    clocks = _nvidia_smi("clocks.max.sm")
    pcie = _nvidia_smi("pcie.link.gen.max,pcie.link.width.max")
    info = {key: "" for key in none}
    info.update({
        "accelerators_per_node": str(count),
        "accelerator_model_name": props.name,
        "accelerator_memory_capacity": _size(props.total_memory),
        "accelerator_frequency": f"{clocks[0]} (max SM clock)" if clocks else "",
    })
    if pcie and "," in pcie[0]:
        gen, width = (v.strip() for v in pcie[0].split(",", 1))
        info["accelerator_host_interconnect"] = f"PCIe Gen{gen} x{width}"
    return info


def software() -> dict[str, str]:
    import torch
    framework = f"PyTorch {torch.__version__}"
    stack = [f"Python {platform.python_version()}", f"mlperf-logging {tool_version()}"]
    if torch.version.cuda:
        stack.append(f"CUDA {torch.version.cuda}")
    if torch.backends.cudnn.is_available():
        stack.append(f"cuDNN {torch.backends.cudnn.version()}")
    try:
        if torch.cuda.is_available() and torch.cuda.nccl.is_available([]):
            stack.append("NCCL " + ".".join(map(str, torch.cuda.nccl.version())))
    except Exception:  # noqa: BLE001
        pass
    driver = _nvidia_smi("driver_version")
    if driver:
        stack.append(f"NVIDIA driver {driver[0]}")
    return {"framework": framework, "other_software_stack": ", ".join(stack),
            "operating_system": operating_system()}


def describe_system(org: str, system: str, division: str = CLOSED, status: str = "research",
                    nodes: int = 1, fields: dict[str, str] | None = None) -> dict[str, str]:
    """systems/<system>.json: every field system_desc_checker requires, as strings (its table code
    joins some of them with ','; the summarizer int()s the counts)."""
    if status not in STATUSES:
        raise UserError(f"--status {status!r} is not one of {', '.join(sorted(STATUSES))}")
    if nodes < 1:
        raise UserError(f"--nodes {nodes} must be at least 1")
    desc = {key: "" for key in SYSTEM_FIELDS}
    desc.update(submitter=org, division=division, status=STATUSES[status], system_name=system,
                number_of_nodes=str(nodes), host_memory_capacity=host_memory())
    desc.update(host_processor())
    desc.update(accelerators())
    desc.update(software())
    for key, value in (fields or {}).items():
        if key in _FLAG_FIELDS:
            raise UserError(f"--field {key}: set it with {_FLAG_FIELDS[key]}")
        if key not in SYSTEM_FIELDS:
            raise UserError(f"--field {key}: not a system description field "
                            f"(fields: {', '.join(SYSTEM_FIELDS)})")
        desc[key] = value
    return desc


def parse_fields(items: Iterable[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--field {item!r} is not KEY=VALUE")
        out[key.strip()] = value
    return out


# ---- the implementation snapshot -----------------------------------------------------------------

def _skipped(rel: Path) -> bool:
    return (any(p in _SKIP_DIRS or p.endswith(".egg-info") for p in rel.parts[:-1])
            or rel.suffix in _SKIP_SUFFIXES or rel.name in _SKIP_DIRS)


def implementation_files(root: Path = REPO) -> list[tuple[Path, Path]]:
    """(source, path inside the implementation folder) for every file the globs match."""
    if not (root / "implementations" / "pytorch" / "bertperf").is_dir():
        # an installed package, not a checkout: the package alone, at its checkout path
        root, globs = PACKAGE.parent, ("bertperf/**/*",)
        prefix = Path("implementations/pytorch")
    else:
        globs, prefix = IMPLEMENTATION_GLOBS, Path()
    files: dict[Path, Path] = {}
    for pattern in globs:
        for src in sorted(root.glob(pattern)):
            rel = src.relative_to(root)
            if src.is_file() and not _skipped(rel):
                files[prefix / rel] = src
    return [(src, rel) for rel, src in sorted(files.items())]


# ---- the result logs -----------------------------------------------------------------------------

def log_facts(log: Path) -> dict:
    ev = log_events(log)

    def first(key: str):
        return next((e.get("value") for e in ev if e.get("key") == key), None)

    seeds = [(str(e.get("metadata", {}).get("file")), e.get("metadata", {}).get("lineno"),
              e.get("value")) for e in ev if e.get("key") == "seed"]
    stop = next((e for e in ev if e.get("key") == "run_stop"), None)
    return {"global_batch_size": first("global_batch_size"), "seeds": seeds,
            "division": first("submission_division"), "org": first("submission_org"),
            "status": (stop or {}).get("metadata", {}).get("status")}


def find_logs(run_dir: Path, pattern: str) -> list[Path]:
    if not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} does not exist")
    logs = sorted((p for p in run_dir.rglob(pattern) if p.is_file()), key=natural_key)
    if len(logs) != RESULT_COUNT:
        raise UserError(f"run directory {run_dir} has {len(logs)} result logs matching "
                        f"{pattern!r}; a {BENCHMARK} submission needs exactly {RESULT_COUNT} (either "
                        "division)")
    return logs


def vet_logs(logs: list[Path], division: str, allow_one_failed: bool) -> list[str]:
    """Refuse (UserError naming the log) what the package checker would reject, and a log that
    repeats another (check.repeated_runs); notes otherwise."""
    repeats = repeated_runs(logs)
    if repeats:
        log, first, how = repeats[0]
        raise UserError(f"result log {log} repeats {first} ({how}): a {BENCHMARK} submission "
                        f"needs {RESULT_COUNT} separate runs")
    with tempfile.TemporaryDirectory(prefix="bertperf-submission-") as tmp:
        with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
            checked = list(pool.map(lambda l: check_log(l, Path(tmp)), logs))
    failed = [r for r in checked if r.verdict == FAIL]
    if failed and not (allow_one_failed and len(failed) == 1):
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        hint = "" if len(failed) > 1 else "; --allow-one-failed-run accepts one such run"
        raise UserError(f"result log {failed[0].target} fails the MLPerf compliance checker "
                        f"(ruleset {RULESET}): {failed[0].detail}{more}{hint}")
    notes = [f"{r.target}: fails compliance, kept (--allow-one-failed-run): {r.detail}"
             for r in failed]
    facts = {log: log_facts(log) for log in logs}
    first = logs[0]
    for log in logs[1:]:
        if facts[log]["global_batch_size"] != facts[first]["global_batch_size"]:
            raise UserError(f"result log {log} logs global_batch_size "
                            f"{facts[log]['global_batch_size']} but {first} logs "
                            f"{facts[first]['global_batch_size']}: the RCP check needs one batch "
                            "size for all runs of a submission")
    seen: dict[tuple, Path] = {}
    for log, f in facts.items():
        if f["division"] not in (None, division):
            raise UserError(f"result log {log} logs submission_division {f['division']!r}, "
                            f"not {division!r} (--division)")
        if division == CLOSED and not f["seeds"] and log not in {Path(r.target) for r in failed}:
            raise UserError(f"result log {log} logs no seed (the package checker's seed check "
                            "needs one per run)")
        for seed in f["seeds"]:
            if seed in seen and division == CLOSED:
                raise UserError(f"result log {log} logs seed {seed[2]} from {seed[0]}:{seed[1]}, "
                                f"as {seen[seed]} does: each run needs its own seed")
            seen.setdefault(seed, log)
    return notes


# ---- assembly ------------------------------------------------------------------------------------

def _check_name(kind: str, value: str) -> None:
    if not _NAME.match(value):
        raise UserError(f"--{kind} {value!r}: use letters, digits and . _ + - "
                        "(it names a folder), starting with a letter or digit")


def assemble(run_dir: str | Path, org: str, system: str, out: str | Path,
             config_files: Iterable[str | Path] = (), pattern: str = "result_*.txt",
             status: str = "research", division: str = CLOSED, nodes: int = 1,
             fields: dict[str, str] | None = None, rcp_bypass: bool = False,
             allow_one_failed: bool = False, force: bool = False,
             root: Path = REPO) -> list[str]:
    """Build <out>/<org>/ and return report lines."""
    _check_name("org", org)
    _check_name("system", system)
    run_dir, out = Path(run_dir), Path(out)
    configs = [Path(c) for c in config_files]
    for c in configs:
        if not c.is_file():
            raise UserError(f"config file {c} does not exist")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder")
    target = out / org
    claim("--out", target, "submission",
          inputs=[("--run-dir", run_dir), *(("--config-file", c) for c in configs)])
    bert_dir = target / "results" / system / BENCHMARK
    if bert_dir.exists() and not force:
        raise UserError(f"{bert_dir} already exists (--force replaces it)")
    logs = find_logs(run_dir, pattern)
    notes = vet_logs(logs, division, allow_one_failed)
    desc = describe_system(org, system, division, status, nodes, fields)
    orgs_logged = {str(log_facts(l)["org"]) for l in logs} - {"None"}
    if orgs_logged and orgs_logged != {org}:
        notes.append(f"note: the logs' submission_org is {', '.join(sorted(orgs_logged))}, "
                     f"not {org!r}")
    impl = implementation_files(root)

    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{org}.partial-", dir=out))
    try:
        new = tmp / org
        if target.exists():  # keep the other systems of this submitter
            shutil.copytree(target, new, symlinks=True)
            shutil.rmtree(new / "results" / system / BENCHMARK, ignore_errors=True)
            shutil.rmtree(new / "benchmarks" / BENCHMARK / "implementations" / "pytorch",
                          ignore_errors=True)
        (new / "systems").mkdir(parents=True, exist_ok=True)
        (new / "systems" / f"{system}.json").write_text(json.dumps(desc, indent=4) + "\n")

        impl_dir = new / "benchmarks" / BENCHMARK / "implementations" / "pytorch"
        for src, rel in impl:
            (impl_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, impl_dir / rel)
        for c in configs:
            impl_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(c, impl_dir / c.name)

        results = new / "results" / system / BENCHMARK
        results.mkdir(parents=True)
        for i, log in enumerate(logs):
            shutil.copy2(log, results / f"result_{i}.txt")
        if rcp_bypass:
            # the package checker compares each line with == "rcp-bypass": no trailing newline
            (results / "package_checker_params").write_bytes(b"rcp-bypass")

        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{org}.old-", dir=out))
            os.rename(target, old / org)
            os.rename(new, target)
            shutil.rmtree(old)
        else:
            os.rename(new, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    report = [
        f"wrote {target}",
        f"  systems/{system}.json  ({desc['host_processor_model_name'] or 'CPU ?'}, "
        f"{desc['accelerators_per_node']} x {desc['accelerator_model_name']}, {desc['framework']}, "
        f"status {desc['status']!r})",
        f"  benchmarks/{BENCHMARK}/implementations/pytorch/  ({len(impl) + len(configs)} files)",
        f"  results/{system}/{BENCHMARK}/result_0..{len(logs) - 1}.txt  (from {run_dir}, "
        f"each compliant with ruleset {RULESET})" if not notes else
        f"  results/{system}/{BENCHMARK}/result_0..{len(logs) - 1}.txt  (from {run_dir})",
    ]
    if rcp_bypass:
        report.append(f"  results/{system}/{BENCHMARK}/package_checker_params  (rcp-bypass: the "
                      "package checker lets a failed RCP check through; needs review approval)")
    empty = [k for k in SYSTEM_FIELDS if desc[k] == ""]
    if empty:
        report.append(f"  system fields the machine cannot tell, left empty (set with --field): "
                      f"{', '.join(empty)}")
    report += notes
    report.append(f"next: python -m bertperf check --submission {target}"
                  + (" --rcp-bypass" if rcp_bypass else ""))
    return report


