"""The whole chain, data_prep/prepare_data.sh, on the Wikipedia sample; and the MPI path on 2 ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bertperf.formats import padded as hdf5io
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


def env_for(out: Path, wiki: Path, vocab: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHON=sys.executable, WIKI_DIR=str(wiki), OUT_DIR=str(out),
               VOCAB=str(vocab), NUM_EVAL_ARTICLES="40", BLOCK_SIZE="1.0", NUM_PARTS="4",
               NUM_EVAL_SAMPLES="1000", WORKERS="2")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, wiki_sample, vocab_file) -> Path:
    out = tmp_path_factory.mktemp("prep")
    run = subprocess.run(["bash", str(ROOT / "data_prep" / "prepare_data.sh")],
                         env=env_for(out, wiki_sample, vocab_file), capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def manifest_files(folder: Path) -> dict[str, dict]:
    return json.loads((folder / "MANIFEST.json").read_text())["files"]


def test_chain_outputs(prepared):
    parts = sorted((prepared / "text").glob("part-*"))
    assert [p.name for p in parts] == [f"part-{k:05d}-of-00004" for k in range(4)]
    assert (prepared / "text" / "eval.txt").stat().st_size > 0
    assert len((prepared / "text" / "eval.md5").read_text().splitlines()) == 40
    training = manifest_files(prepared / "hdf5" / "training")
    assert sorted(training) == [f"{p.name}.hdf5" for p in parts]
    assert all(e["samples"] > 1000 for e in training.values())
    eval_set = hdf5io.read_samples(prepared / "hdf5" / "eval" / "eval_10k.hdf5")
    assert eval_set["input_ids"].shape == (1000, 512)
    assert eval_set["masked_lm_positions"].shape == (1000, 76)


def test_rerun_skips_everything(prepared, wiki_sample, vocab_file):
    before = {p: p.stat().st_mtime_ns for p in prepared.rglob("*.hdf5")}
    run = subprocess.run(["bash", str(ROOT / "data_prep" / "prepare_data.sh")],
                         env=env_for(prepared, wiki_sample, vocab_file), capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in prepared.rglob("*.hdf5")} == before
    assert "skipped" in run.stderr


@pytest.mark.mpi
def test_mpi_two_ranks_equal_one_process(prepared, vocab_file, tmp_path):
    """`mpirun -np 2`: rank r takes parts r, r+2; the files equal the single-process ones."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("OpenMPI's mpirun is not installed (make system-deps installs it)")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    out = tmp_path / "mpi"
    cmd = [mpirun, "-np", "2", sys.executable, "-m", "bertperf", "prep", "create",
           "--input_dir", str(prepared / "text"), "--output_dir", str(out), "--workers", "1",
           "--vocab_file", str(vocab_file), "--max_seq_length=512", "--max_predictions_per_seq=76",
           "--dupe_factor=10", "--random_seed=12345"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    single = manifest_files(prepared / "hdf5" / "training")
    assert {k: v["md5"] for k, v in manifest_files(out).items()} == \
        {k: v["md5"] for k, v in single.items()}
    assert not list(out.glob(".manifest-*")), "fragments must be merged by rank 0"

    # a bad part on one rank fails the whole run on every rank, without a hang
    bad = tmp_path / "badparts"
    shutil.copytree(prepared / "text", bad, ignore=shutil.ignore_patterns("MANIFEST.json"))
    (bad / "part-00003-of-00004").write_bytes(b"\xff\xfe broken\n")
    cmd[cmd.index(str(prepared / "text"))] = str(bad)
    cmd[cmd.index(str(out))] = str(tmp_path / "mpi_bad")
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode != 0 and "part-00003-of-00004:1: not UTF-8" in run.stderr
