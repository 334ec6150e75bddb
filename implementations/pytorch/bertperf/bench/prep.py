"""`python -m bertperf bench prep --text DIR`: whole-process speed of `prep create` against the
MLCommons reference `create_pretraining_data.py`, per core, with MLPerf's flags.

The text stages run once on DIR (a folder of wikiextractor output, e.g. the one `make
demo-wiki` takes), each timed as a whole process: clean, segment, split into one part per input
file (no eval articles held out). Then every row makes the samples of all parts in a fresh
process pinned to one core, timed from start to exit (interpreter start, imports, vocab and
Unicode tables included, as a user runs it); the median of --repeat runs is shown:

  reference        the reference script itself, `--input_file` = all parts, one output file
                   (--reference DIR holding create_pretraining_data.py and tokenization.py from
                   mlcommons/training, retired_benchmarks/bert/cleanup_scripts), under
                   TensorFlow 1.x where it is installed, else the checkout's stand-in (--tf-stub
                   tools/tf_stub: real tf.train.Example protocol buffers in a real TFRecord
                   file; pip install 'bertperf[bench]'); with neither the command stops
  prep create      the same command shape (`--input_file` = all parts, `--output_file`): the
                   default (C instance builder, cached Python tokenizer), `--engine python`,
                   `--tokenizer hf`
  per part         `prep create --input_dir --workers N` (one run per part, MLPerf's way),
                   on N cores (not pinned)
  start-up         `python -m bertperf prep create --help`: what every process pays first

Every row must produce the same number of samples; a difference is reported.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bertperf.benchmark import CREATE_FLAGS
from bertperf.errors import UserError
from bertperf.formats import manifest
from bertperf.resources import find_vocab

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--text", required=True, type=Path,
                   help="a folder of wikiextractor output, e.g. the one `make demo-wiki` takes")
    p.add_argument("--reference", type=Path,
                   help="folder with the reference create_pretraining_data.py and tokenization.py"
                        " (without it the reference row is left out)")
    p.add_argument("--tf-stub", type=Path,
                   help="with --reference: the TensorFlow stand-in the reference runs under "
                        "where TensorFlow is not installed, tools/tf_stub in the checkout")
    p.add_argument("--vocab_file", type=Path, help="vocab (default: found as in bertperf.resources)")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="cores of the per-part row (default: all)")
    p.add_argument("--repeat", type=int, default=3, help="runs per row; the median is shown")
    p.add_argument("--skip_python", action="store_true", help="leave out the --engine python row")


def _one_core() -> None:
    """preexec_fn: pin the child to the lowest core this process may use."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def timed(argv: list[str], *, pin: bool, cwd: Path | None = None,
          env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall-clock seconds of a whole process and its stderr; a UserError when it fails."""
    t0 = time.perf_counter()
    run = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env,
                         preexec_fn=_one_core if pin else None)
    seconds = time.perf_counter() - t0
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"bench prep: `{' '.join(argv)}` failed: {last}")
    return seconds, run.stderr


def bertperf(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertperf", *args]


def manifest_samples(folder: Path) -> int:
    return sum(e.samples or 0 for e in manifest.load(folder).values())


def reference_samples(stderr: str) -> int:
    found = re.findall(r"Wrote (\d+) total instances", stderr)
    if not found:
        raise UserError("bench prep: the reference script did not report its instance count")
    return int(found[-1])


def run(args: argparse.Namespace) -> int:
    if not args.text.is_dir():
        raise UserError(f"{args.text}: no such folder (--text: wikiextractor files)")
    if args.reference is not None:
        missing = [f for f in ("create_pretraining_data.py", "tokenization.py")
                   if not (args.reference / f).is_file()]
        if missing:
            raise UserError(f"{args.reference}: no {', '.join(missing)} (--reference)")
        if args.tf_stub is not None and not (args.tf_stub / "tensorflow" / "__init__.py").is_file():
            raise UserError(f"{args.tf_stub}: no tensorflow/__init__.py (--tf-stub: the TensorFlow "
                            "stand-in, tools/tf_stub in the checkout)")
        if args.tf_stub is None and importlib.util.find_spec("tensorflow") is None:
            raise UserError("bench prep --reference: the reference imports tensorflow, which is "
                            "not installed here; give it the stand-in: --tf-stub tools/tf_stub")
        try:
            import absl  # noqa: F401
            import google.protobuf  # noqa: F401
            import google_crc32c  # noqa: F401
            import six  # noqa: F401
        except ImportError as exc:
            raise UserError(f"bench prep --reference: {exc.name} is missing (pip install "
                            "'bertperf[bench]')") from None
    vocab = str(args.vocab_file or find_vocab())
    n_files = len([p for p in args.text.rglob("*") if p.is_file()])
    rows: list[tuple[str, int, list[float], int]] = []
    with tempfile.TemporaryDirectory(prefix="bertperf-bench-") as tmp:
        work = Path(tmp)
        text_stages = [
            ("clean", ["clean", "--input", str(args.text), "--output", str(work / "clean")]),
            ("segment", ["segment", "--input", str(work / "clean"),
                         "--output", str(work / "segmented")]),
            ("split", ["split", "--input", str(work / "segmented"), "--raw_dir", str(args.text),
                       "--output", str(work / "parts"), "--num_test_articles", "0",
                       "--num_outputs", str(n_files)]),
        ]
        for name, argv in text_stages:
            seconds, _ = timed(bertperf("prep", *argv, "--workers", "1"), pin=True)
            print(f"{name:8s} {seconds:6.2f} s (whole process, one core)")
        parts = sorted((work / "parts").glob("part-*"))
        joined = ",".join(str(p) for p in parts)
        text_mb = sum(p.stat().st_size for p in parts) / 1e6

        def repeat(label: str, cores: int, make_argv, count, **kw) -> None:
            times, samples = [], None
            for i in range(args.repeat):
                out = work / f"{len(rows)}-{i}"
                out.mkdir()
                seconds, stderr = timed(make_argv(out), **kw)
                times.append(seconds)
                samples = count(out, stderr)
                shutil.rmtree(out)
            rows.append((label, cores, times, samples))

        if args.reference is not None:
            env = dict(os.environ, **({} if args.tf_stub is None else
                                      {"PYTHONPATH": str(args.tf_stub.resolve())}))
            repeat("reference create_pretraining_data.py", 1,
                   lambda out: [sys.executable, str(args.reference / "create_pretraining_data.py"),
                                f"--input_file={joined}", f"--output_file={out / 'out.tfrecord'}",
                                f"--vocab_file={vocab}", "--do_lower_case=True", *CREATE_FLAGS],
                   lambda out, err: reference_samples(err), pin=True, cwd=args.reference, env=env)
        configs = [("prep create (C builder)", []),
                   ("prep create --tokenizer hf", ["--tokenizer", "hf"])]
        if not args.skip_python:
            configs.insert(1, ("prep create --engine python", ["--engine", "python"]))
        for label, extra in configs:
            repeat(label, 1,
                   lambda out, extra=extra: bertperf(
                       "prep", "create", "--input_file", joined, "--output_file",
                       str(out / "out.hdf5"), "--vocab_file", vocab, *extra, *CREATE_FLAGS),
                   lambda out, err: manifest_samples(out), pin=True)
        repeat(f"prep create --input_dir --workers {args.workers}", args.workers,
               lambda out: bertperf("prep", "create", "--input_dir", str(work / "parts"),
                                    "--output_dir", str(out / "hdf5"), "--vocab_file", vocab,
                                    "--workers", str(args.workers), *CREATE_FLAGS),
               lambda out, err: manifest_samples(out / "hdf5"), pin=False)
        repeat("start-up: prep create --help", 1, lambda out: bertperf("prep", "create", "--help"),
               lambda out, err: 0, pin=True)
    print(f"\ncreate on {text_mb:.2f} MB of text ({len(parts)} parts from {n_files} files of "
          f"{args.text}), MLPerf flags; whole processes, median of {args.repeat}")
    print("| row | cores | seconds (min-max) | samples | samples/s per core | vs reference |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(rows[0][2]) if args.reference is not None else None
    for label, cores, times, samples in rows:
        med = statistics.median(times)
        rate = f"{samples / med / cores:,.0f}" if samples else "-"
        ratio = f"{base / med:.1f}x" if base and samples else "-"
        print(f"| {label} | {cores} | {med:.2f} ({min(times):.2f}-{max(times):.2f}) | "
              f"{samples or '-'} | {rate} | {ratio} |")
    counts = {s for _, _, _, s in rows if s}
    if len(counts) > 1:
        print(f"warning: the rows made different numbers of samples: {sorted(counts)}")
    return 0
