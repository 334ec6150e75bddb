"""Nothing a user owns is lost: every writer of formats/outputs.py's KINDS, run as its user runs
it, against the same cases (its output named as one of its inputs, the input's folder, that
folder's parent, a file or non-empty folder it did not write, its own earlier output with and
without --force, a folder on a read-only file system, a full disk that holds its own earlier
output), with --force wherever it takes one: a refusal is one line naming the output, before any
work, and nothing on disk changed. A module that writes through the atomic helpers is either a row
here or in WRITES_ITS_OWN with the rule it follows, so a new writer cannot go unlisted."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from bertperf.__main__ import main
from bertperf.data.synthetic import write_synthetic_packed, write_synthetic_shards
from bertperf.formats.outputs import KINDS, MARKER
from tests.support.copy_task import make_dataset
from tests.support.paths import PYTHONPATH, ROOT

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 8


@dataclass(frozen=True)
class Writer:
    flag: str
    """The argument naming the output."""
    input: str
    """The input's file name (made in user/data/, with stand-in bytes)."""
    argv: Callable[[Path, Path], list[str]]
    """The command line, from (input, output)."""
    own: Callable[[Path], None]
    """Makes `path` an earlier output of this writer."""
    tool: str | None = None
    """tools/<tool>.py rather than python -m bertperf."""
    force: bool = True
    """Whether the writer takes --force (a reused working folder or prep file does not)."""
    make_input: Callable[[Path], None] | None = None
    """Writes the input (default: stand-in bytes)."""
    allowed: tuple[str, ...] = ()
    """Cases that are no loss for this writer (it adds files to a folder, never replaces it)."""


def marked(kind: str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.mkdir()
        (path / MARKER).write_text(kind + "\n")
        (path / "part").write_text("an earlier output")
    return make


def file_of(data: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data)


def staged_file(stage: str) -> Callable[[Path], None]:
    """An earlier output of the prep stage `stage`, as its folder's manifest records it (for a
    stage that writes into a folder, `path` is that folder and the file goes in it)."""
    def make(path: Path) -> None:
        from bertperf.formats import manifest
        if stage == "unpack":
            path.mkdir()
            path = path / "part_00000.h5"
        path.write_bytes(b"\x89HDF\r\n\x1a\n")
        manifest.record(path.parent, path.name, manifest.entry_for(path, stage, "an earlier key"))
        manifest.finalize(path.parent)
    return make


def shard(write: Callable[..., list[Path]]) -> Callable[[Path], None]:
    """A real shard at the input's path (the stage reads its header before its output)."""
    def make(path: Path) -> None:
        write(path.parent, 1, 8, seed=1, max_seq_length=64, max_pred=10)[0].rename(path)
    return make


def vocab() -> str:
    from bertperf.resources import find_vocab
    return str(find_vocab())


PLAN = ["plan", "--gpu", "A100 80GB SXM", "--gpus", "8", "--layerwise", "none", "--write"]


def planned(folder: Path) -> None:
    """A checkout's root where plan wrote its configs."""
    folder.mkdir()
    (folder / "config_common.sh").write_text("# the checkout's\n")
    assert main([*PLAN, str(folder)]) == 0


def dataset(path: Path) -> None:
    """A run's data at the input's folder: its eval file at `path` (tests.support.copy_task)."""
    make_dataset(path.parent)
    assert path.is_file()


def train_check(inp: Path, out: Path) -> list[str]:
    data = inp.parent
    return ["train", "--check", "--train-dir", str(data / "train"), "--eval-file", str(inp),
            "--bert-config", str(data / "bert_config.json"), "--log-file", str(out),
            "--batch-size", "8", "--lr", "1e-3", "--max-steps", "10", "--device", "cpu"]


def tensorboard_check(inp: Path, out: Path) -> list[str]:
    return [*train_check(inp, inp.parent / "log.txt"), "--tensorboard", "--tensorboard-dir",
            str(out)]


def submitted(folder: Path) -> None:
    """An earlier submission of org "data", system "s"."""
    (folder / "data" / "results" / "s" / "bert").mkdir(parents=True)
    (folder / "data" / "results" / "s" / "bert" / "result_0.txt").write_text(":::MLLOG {}\n")


def demo_at(levels: int) -> Callable[[Path], None]:
    """The input inside a stand-in demo folder `levels` above it (its unpadded/ made)."""
    def make(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"the user's input\n")
        (path.parents[levels - 1] / "unpadded").mkdir(exist_ok=True)
    return make


WRITERS = {
    "export": Writer("--output", "ckpt_00000001.pt",
                     lambda i, o: ["export", "--checkpoint", str(i), "--output", str(o)],
                     marked("export")),
    "plot": Writer("--output", "result_0.txt",
                   lambda i, o: ["plot", str(i), "--output", str(o)], file_of(PNG)),
    "model validate": Writer("--plot", "results.csv",
                             lambda i, o: ["model", "validate", "--results", str(i), "--plot",
                                           str(o)], file_of(PNG)),
    "bench comm": Writer("--out", "config.sh",
                         lambda i, o: ["bench", "comm", "--demo", str(i.parent), "--config",
                                       str(i), "--modes", "none", "--out", str(o)],
                         marked("bench comm"), force=False, make_input=demo_at(1)),
    "bench layerwise": Writer("--out", "hdf5/eval/eval_10k.hdf5",
                              lambda i, o: ["bench", "layerwise", "--demo", str(i.parents[2]),
                                            "--out", str(o)],
                              marked("bench layerwise"), force=False, make_input=demo_at(3)),
    "convert-ckpt": Writer("--output", "model.ckpt-1.index",
                           lambda i, o: ["convert-ckpt", "--tf-checkpoint", str(i),
                                         "--bert-config", "tiny", "--output", str(o)],
                           file_of(b"PK\x03\x04 an earlier checkpoint")),
    "prep eval": Writer("--output_file", "eval_all.hdf5",
                        lambda i, o: ["prep", "eval", "--input_file", str(i), "--output_file",
                                      str(o)], staged_file("eval"), force=False),
    "mlperf log": Writer("MLLOG_FILE", "eval.hdf5", train_check,
                         file_of(b':::MLLOG {"key": "run_start"}\n'), force=False,
                         make_input=dataset),
    "tensorboard": Writer("TENSORBOARD_DIR", "eval.hdf5", tensorboard_check, marked("tensorboard"),
                          force=False, make_input=dataset),
    "submission": Writer("--out", "result_0.txt",
                         lambda i, o: ["submission", "--run-dir", str(i.parent), "--org", "data",
                                       "--system", "s", "--out", str(o)], submitted,
                         allowed=("input's folder", "a foreign folder")),
    "plan": Writer("--write", "config_common.sh", lambda i, o: [*PLAN, str(o)], planned,
                   allowed=("input's folder",)),
    "prep create": Writer("--output_file", "wiki.txt",
                          lambda i, o: ["prep", "create", "--input_file", str(i),
                                        "--output_file", str(o), "--vocab_file", vocab()],
                          staged_file("create"), force=False),
    "prep unpack": Writer("--output", "part_00000.h5",
                          lambda i, o: ["prep", "pack", "--unpack", "--input", str(i),
                                        "--output", str(o)],
                          staged_file("unpack"), force=False,
                          make_input=shard(write_synthetic_packed),
                          allowed=("input's parent", "a foreign folder")),
    "prep stats": Writer("--png", "part_00000.h5",
                         lambda i, o: ["prep", "stats", str(i), "--png", str(o)], file_of(PNG),
                         force=False, make_input=shard(write_synthetic_shards)),
    "prep stratify": Writer("--output", "part_00000.h5",
                            lambda i, o: ["prep", "stratify", "--input", str(i.parent),
                                          "--output", str(o), "--workers", "1"],
                            marked("prep stratify"), force=False,
                            make_input=shard(write_synthetic_shards)),
    "gpu-bundle": Writer("--out", "vocab.txt",
                         lambda i, o: ["--out", str(o), "--vocab", str(i), "--wheelhouse",
                                       str(i.parent / "no_wheels")],
                         marked("gpu-bundle"), tool="gpu_bundle"),
    "gpu-check": Writer("--out", "bundle.json",
                        lambda i, o: ["--out", str(o), "--bundle", str(i.parent), "--reports",
                                      str(o.parent / "reports"), "--budget", "-1"],
                        marked("gpu-check"), tool="gpu_check", force=False),
    "gpu-check report": Writer("--report", "notes.md",
                               lambda i, o: ["--out", str(i.parent / "work"), "--report", str(o),
                                             "--from", "kernels", "--budget", "-1"],
                               file_of(b"# make gpu-check, earlier\n"), tool="gpu_check",
                               force=False),
}

WRITES_ITS_OWN = {
    "formats/files.py": "the atomic helpers themselves",
    "formats/manifest.py": "MANIFEST.json of a prep stage's output folder",
    "formats/outputs.py": "the rule itself",
    "prep/shards/chop.py": "a prep stage: its manifest",
    "prep/shards/unpad.py": "a prep stage: its manifest",
    "prep/text/clean.py": "a prep stage: its manifest",
    "prep/text/dictd.py": "a prep stage: manifest.own_outputs",
    "prep/text/split.py": "a prep stage: its manifest",
    "resources.py": "the package's own vocab.txt",
    "train/checkpoint.py": "ckpt_<step>.pt in the run's CHECKPOINT_DIR",
}
"""Modules that write through the atomic helpers but not under a KINDS entry: what they
write."""

CASES = ("input", "input's folder", "input's parent", "a foreign file", "a foreign folder",
         "its own, no --force", "its own, --force", "read-only", "a full disk")


def fill(path: Path) -> None:
    """A file at `path` that takes what its disk has left."""
    try:
        with open(path, "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc


def tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def run(writer: Writer, inp: Path, out: Path, force: bool) -> tuple[int, str]:
    argv = writer.argv(inp, out) + (["--force"] if force else [])
    if writer.tool:
        done = subprocess.run([sys.executable, str(ROOT / "tools" / f"{writer.tool}.py"), *argv],
                              capture_output=True, text=True, timeout=120,
                              env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin"})
        return done.returncode, done.stderr
    from contextlib import redirect_stderr
    from io import StringIO
    err = StringIO()
    with redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def test_every_writer_has_a_row():
    assert set(WRITERS) == set(KINDS)
    package = ROOT / "implementations" / "pytorch" / "bertperf"
    writes = {str(p.relative_to(package)) for p in package.rglob("*.py")
              if any(h in p.read_text() for h in ("atomic_output(", "atomic_folder(",
                                                   "output_folder("))}
    claims = {str(p.relative_to(package)) for p in package.rglob("*.py")
              if "claim(" in p.read_text().replace("def claim(", "")}
    assert writes - claims == set(WRITES_ITS_OWN), "a new writer: a KINDS entry and a row here"


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", list(WRITERS))
def test_a_writer_loses_nothing(kind, case, tmp_path, small_disk, capfd):
    writer = WRITERS[kind]
    if kind == "bench comm" and (os.geteuid() != 0 or not all(map(shutil.which,
                                                                  ("ip", "tc", "unshare")))):
        pytest.skip("bench comm needs root, ip, tc and unshare")
    user = tmp_path / "user"
    data = user / "data"
    data.mkdir(parents=True)
    inp = data / writer.input
    (writer.make_input or (lambda path: path.write_bytes(b"the user's input\n")))(inp)
    (data / "no_wheels").mkdir()
    refused = True
    if case == "input":
        out = inp
    elif case == "input's folder":
        out = data
    elif case == "input's parent":
        out = user
    elif case == "a foreign file":
        out = tmp_path / "mine.txt"
        out.write_text("the user's file")
    elif case == "a foreign folder":
        out = tmp_path / "mine"
        out.mkdir()
        (out / "notes.txt").write_text("the user's notes")
    elif case == "read-only":
        disk = small_disk("ro", kib=64, read_only=True)
        out = disk / "out"
    elif case == "a full disk":  # its own earlier output there, --force: refused before any work
        disk = small_disk("full", kib=1024)
        out = disk / "out"
        if writer.force:
            writer.own(out)
        fill(disk / "the user's other file")
    else:
        out = tmp_path / "earlier"
        writer.own(out)
        refused = case == "its own, no --force" and writer.force
    refused = refused and case not in writer.allowed
    force = writer.force and case != "its own, no --force"  # --force lets nothing else by
    before = tree(tmp_path)
    code, err = run(writer, inp, out, force)
    if not refused:
        assert f"{writer.flag} {out}:" not in err, err
        return
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0], err
    if case == "its own, no --force":
        assert "--force replaces it" in lines[0]
    if case == "a full disk":
        assert "is on a full disk (no space left on device)" in lines[0], lines[0]
    assert tree(tmp_path) == before


@pytest.mark.parametrize("stage", ["clean", "chop"])
def test_a_prep_stage_keeps_a_file_it_did_not_write_at_an_output_name(stage, tmp_path, capfd):
    """The prep stages that write into a folder the user names (their manifest records what
    they wrote) refuse, before any work, a file at one of their output names that they did not
    write; the file stays as it was."""
    inp, out = tmp_path / "in", tmp_path / "out"
    if stage == "clean":
        (inp / "AA").mkdir(parents=True)
        (inp / "AA" / "wiki_00").write_text('<doc id="1" url="u" title="T">\nT\n\nSome text.\n'
                                            "</doc>\n")
        theirs, argv = out / "AA" / "wiki_00", ["prep", "clean", "--input", str(inp)]
    else:
        write_synthetic_shards(inp, 1, 8, seed=1, max_seq_length=64, max_pred=10)
        theirs = out / "part_00000_of_00001.h5"
        argv = ["prep", "chop", "--input", str(inp), "--num_shards", "1"]
    theirs.parent.mkdir(parents=True)
    theirs.write_text("the user's file")
    code, err = run(Writer("--output", "", lambda i, o: [*argv, "--output", str(out)],
                           lambda path: None), inp, out, False)
    assert code != 0 and err.strip().splitlines() == [
        f"bertperf: error: {theirs}: exists and was not written by prep {stage}; choose another "
        "--output or remove the file"], err
    assert theirs.read_text() == "the user's file"
