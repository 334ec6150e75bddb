"""A failed prep stage leaves no new empty folder, no manifest fragment and no temporary behind,
and keeps what it finished: finished files are recorded in MANIFEST.json and the rerun skips
them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import pytest

from bertperf.__main__ import main
from bertperf.formats import nvidia
from bertperf.formats import padded as hdf5io
from bertperf.formats.unpadded import write_shard
from tests.support.dictd import ENTRY, make_db
from tests.support.samples import make_samples

GOOD_TEXT = ('<doc id="1" url="x" title="T">\nT\n\nThe cat sat on the mat. It was happy there.\n'
             "</doc>\n")
BAD_TEXT = b"\xff\xfe not UTF-8\n"
PART_TEXT = "\n\n".join(" ".join(["the cat sat on the mat ."] * (1 + d % 3)) + "\nit was happy ."
                        for d in range(6)) + "\n"


def cli(*args) -> int:
    return main(["prep", *(str(a) for a in args)])


def left(folder: Path) -> list[str]:
    """Everything under `folder`, hidden files included, relative to it."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def samples(seed: int, n: int = 12):
    rng = np.random.default_rng(seed)
    return make_samples(rng, rng.integers(20, 120, size=n))


def corrupt_offsets(path: Path) -> None:
    """An unpadded shard whose header is fine but whose last sample runs past its tokens: found
    only when the shard is read whole, after a stage has started writing."""
    s = samples(9)
    s.offsets = s.offsets.copy()
    s.offsets[-1] += 7
    write_shard(path, s, 512, 76)


@pytest.fixture
def inputs(tmp_path) -> dict[str, Path]:
    """For each kind of input, a folder whose first file fails (late, where a stage can)."""
    root = tmp_path / "in"
    d = {k: root / k for k in ("text", "parts", "padded", "unpadded", "nvidia", "packed")}
    for folder in d.values():
        folder.mkdir(parents=True)
    (d["text"] / "AA").mkdir()
    (d["text"] / "AA" / "wiki_00").write_bytes(BAD_TEXT)
    (d["parts"] / "part-00000-of-00001").write_bytes(BAD_TEXT)
    (d["padded"] / "a.hdf5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(200))  # truncated HDF5
    corrupt_offsets(d["unpadded"] / "a.h5")
    bad = samples(3)
    nvidia.write_varlen(d["nvidia"] / "a.hdf5", bad)
    with h5py.File(d["nvidia"] / "a.hdf5", "a") as f:  # sample 2: B before A
        f["segment_ids"][2] = np.ones(int(bad.lengths[2]), dtype=np.int8)
    (d["packed"] / "a.hdf5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(200))
    db = make_db(root / "db", [("Lisp", ENTRY)])
    db.with_name("test.index").write_text("Lisp\tA\tzzzz\n")  # past the end of the database
    d["dictd"] = db
    return d


def stage_args(stage: str, d: dict[str, Path], out: Path, vocab: Path | None) -> list:
    return {
        "clean": ["clean", "--input", d["text"], "--output", out, "--workers", 1],
        "segment": ["segment", "--input", d["text"], "--output", out, "--workers", 1],
        "split": ["split", "--input", d["text"], "--output", out, "--workers", 1,
                  "--num_test_articles", 0],
        "create": ["create", "--input_dir", d["parts"], "--output_dir", out, "--vocab_file", vocab,
                   "--workers", 1, "--max_seq_length", 32, "--max_predictions_per_seq", 5,
                   "--dupe_factor", 1],
        "eval": ["eval", "--input_file", d["padded"] / "a.hdf5", "--output_file", out / "e.hdf5"],
        "unpad": ["unpad", "--input", d["padded"], "--output", out, "--workers", 1],
        "chop": ["chop", "--input", d["unpadded"], "--output", out, "--num_shards", 2,
                 "--workers", 1, "--tmp_dir", out.parent / "scratch"],
        "pack": ["pack", "--input", d["nvidia"], "--output", out, "--workers", 1],
        "unpack": ["pack", "--unpack", "--input", d["packed"], "--output", out, "--workers", 1],
        "stratify": ["stratify", "--input", d["unpadded"], "--output", out, "--workers", 1],
        "stats": ["stats", d["padded"], "--png", out / "lengths.png", "--workers", 1],
        "dictd": ["dictd", "--dict", d["dictd"], "--output", out],
    }[stage]


STAGES = ["clean", "segment", "split", "create", "eval", "unpad", "chop", "pack", "unpack",
          "stratify", "stats", "dictd"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_failed_stage_leaves_no_new_folder(tmp_path, inputs, capsys, stage, request):
    vocab = request.getfixturevalue("vocab_file") if stage == "create" else None
    new = tmp_path / "new"  # neither the output folder nor its parent exists before
    assert cli(*stage_args(stage, inputs, new / "sub" / "out", vocab)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bertperf: error: ") and not any("Traceback" in e for e in err)
    assert not new.exists(), left(new)


# the per-file stages: a bad first file, a good second one


def per_file_inputs(stage: str, d: dict[str, Path]) -> tuple[Path, str, Callable[[], object]]:
    """(input folder, the good file's output name, a function that mends the bad input)."""
    if stage in ("clean", "segment"):
        (d["text"] / "AA" / "wiki_01").write_text(GOOD_TEXT)
        return d["text"], "AA/wiki_01", \
            lambda: (d["text"] / "AA" / "wiki_00").write_text(GOOD_TEXT)
    if stage == "create":
        (d["parts"] / "part-00001-of-00001").write_text(PART_TEXT)
        return d["parts"], "part-00001-of-00001.hdf5", \
            lambda: (d["parts"] / "part-00000-of-00001").write_text(PART_TEXT)
    s = samples(5)
    hdf5io.write_samples(d["padded"] / "b.hdf5", s, np.arange(len(s)), 512, 76, 30522)
    return d["padded"], "b.h5", lambda: shutil.copyfile(d["padded"] / "b.hdf5",
                                                        d["padded"] / "a.hdf5")


@pytest.mark.parametrize("stage", ["clean", "segment", "create", "unpad"])
def test_a_failed_stage_keeps_and_records_what_it_finished(tmp_path, inputs, capsys, stage,
                                                           request):
    vocab = request.getfixturevalue("vocab_file") if stage == "create" else None
    folder, done, mend = per_file_inputs(stage, inputs)
    out = tmp_path / "out"
    args = stage_args(stage, {**inputs, "text": folder, "parts": folder, "padded": folder}, out,
                      vocab)
    assert cli(*args) == 1
    capsys.readouterr()
    assert not [p for p in left(out) if Path(p).name.startswith(".")], left(out)
    record = json.loads((out / "MANIFEST.json").read_text())["files"]
    assert list(record) == [done] and (out / done).is_file()
    made = (out / done).stat().st_mtime_ns
    mend()
    assert cli(*args) == 0
    assert (out / done).stat().st_mtime_ns == made  # skipped: verified against the record
    assert len(json.loads((out / "MANIFEST.json").read_text())["files"]) == 2
    assert not [p for p in left(out) if Path(p).name.startswith(".")], left(out)


@pytest.mark.parametrize("stage", ["create", "unpad", "chop", "pack"])
def test_a_stage_on_a_full_disk_says_so_in_one_line(tmp_path, capsys, stage, request,
                                                    small_disk):
    """The output's disk fills (a tmpfs of one page): one line naming an output file and "no
    space left on device" (not HDF5's text over two lines), exit 1, nothing half-written."""
    d = {k: tmp_path / k for k in ("text", "parts", "padded", "unpadded", "nvidia", "packed",
                                   "dictd")}
    for folder in d.values():
        folder.mkdir()
    (d["parts"] / "part-00000-of-00001").write_text(PART_TEXT * 20)
    s = samples(5, n=200)
    hdf5io.write_samples(d["padded"] / "a.hdf5", s, np.arange(len(s)), 512, 76, 30522)
    write_shard(d["unpadded"] / "a.h5", s, 512, 76)
    nvidia.write_varlen(d["nvidia"] / "a.hdf5", s)
    vocab = request.getfixturevalue("vocab_file") if stage == "create" else None
    out = small_disk("out", 4)
    assert cli(*stage_args(stage, d, out, vocab)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    errors = [e for e in err if e.startswith("bertperf: error: ")]
    assert len(errors) == 1 and errors[0] == err[-1], err
    assert f"bertperf: error: {out}/" in errors[0] and "no space left on device" in errors[0], err
    assert not [p for p in left(out) if Path(p).name.startswith(".")], left(out)
