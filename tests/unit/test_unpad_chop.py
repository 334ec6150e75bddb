"""`prep unpad` and `prep chop`: exact round trips, NVIDIA-layout interop, shuffle, bad input."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import bertperf
from bertperf.__main__ import main
from bertperf.formats import padded as hdf5io
from bertperf.formats import nvidia
from bertperf.formats import unpadded as shards
from bertperf.formats.samples import Samples
from bertperf.prep.shards.chop import permutation, shard_counts
from tests.support.corpus import synthetic_corpus
from tests.support.paths import ROOT

N_SHARDS = 7


# ---- data and helpers ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def padded(tmp_path_factory, vocab_file) -> Path:
    """Three padded part files made by `prep create` from the synthetic corpus (512/76, dupe 10)."""
    root = tmp_path_factory.mktemp("padded")
    docs = synthetic_corpus(vocab_file.read_text(encoding="utf-8").splitlines()).split("\n\n")
    (root / "parts").mkdir()
    for k in range(3):
        (root / "parts" / f"part-{k:05d}-of-00003").write_text("\n\n".join(docs[k::3]) + "\n")
    assert main(["prep", "create", "--input_dir", str(root / "parts"), "--output_dir",
                 str(root / "hdf5"), "--vocab_file", str(vocab_file), "--workers", "1",
                 "--max_seq_length=512", "--max_predictions_per_seq=76"]) == 0
    return root / "hdf5"


@pytest.fixture(scope="module")
def unpadded(padded) -> Path:
    out = padded.parent / "unpadded"
    assert cli("unpad", "--input", padded, "--output", out, "--workers", "1") == 0
    return out


@pytest.fixture(scope="module")
def nvidia_unpadded(padded) -> Path:
    out = padded.parent / "nvidia"
    assert cli("unpad", "--input", padded, "--output", out, "--output_format", "nvidia",
               "--workers", "1") == 0
    return out


@pytest.fixture(scope="module")
def chopped(unpadded) -> Path:
    out = unpadded.parent / "chopped"
    assert cli("chop", "--input", unpadded, "--output", out, "--num_shards", N_SHARDS,
               "--workers", "1") == 0
    return out


def cli(stage: str, *args) -> int:
    return main(["prep", stage, *(str(a) for a in args)])


def files(folder: Path, suffix: str) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix == suffix)


def md5s(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.name.startswith("part")}


def digests(s: Samples) -> list[str]:
    """One md5 per sample over everything it holds (tokens, B start, masks, NSP)."""
    out = []
    for i in range(len(s)):
        t = s.input_ids[s.offsets[i]:s.offsets[i + 1]].astype(np.int64)
        m = slice(s.mlm_offsets[i], s.mlm_offsets[i + 1])
        h = hashlib.md5(t.tobytes())
        for part in (s.b_starts[i:i + 1], s.mlm_positions[m], s.mlm_ids[m], s.nsp[i:i + 1]):
            h.update(b"|" + np.asarray(part, dtype=np.int64).tobytes())
        out.append(h.hexdigest())
    return out


def read_all(folder: Path) -> Samples:
    return Samples.concat([shards.read_shard(p)[0] for p in files(folder, ".h5")])


def same_values(a: Samples, b: Samples) -> bool:
    return a.equals(b)  # array_equal: values, whatever the dtypes


def only_manifest_left(folder: Path) -> bool:
    """Nothing in `folder` (hidden temporaries and fragments included) but MANIFEST.json."""
    return not folder.exists() or all(p.name == "MANIFEST.json" for p in folder.iterdir())


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in err), err
    assert err and err[-1].startswith("bertperf: error: "), err
    return err[-1]


# ---- unpad --------------------------------------------------------------------------------------

def test_unpad_round_trip(padded, unpadded):
    """Reading an unpadded shard and padding it again gives the padded arrays exactly."""
    doc = json.loads((unpadded / "MANIFEST.json").read_text())["files"]
    srcs = files(padded, ".hdf5")
    assert [p.stem for p in srcs] == [p.stem for p in files(unpadded, ".h5")]
    for src in srcs:
        arrays = hdf5io.read_samples(src)
        out = unpadded / f"{src.stem}.h5"
        samples, meta = shards.read_shard(out)
        assert (meta["max_seq_length"], meta["max_predictions_per_seq"]) == (512, 76)
        back = samples.to_padded(512, 76)
        for k, v in arrays.items():
            assert back[k].shape == v.shape and np.array_equal(back[k], v), k
        with h5py.File(out) as f:
            assert sorted(f) == sorted(shards.FIELDS)  # no input_mask, nothing derivable
            assert f["input_ids"].dtype == np.uint16 and f["offsets"].dtype == np.int64
            assert f["input_ids"].shape[0] == int(arrays["input_mask"].sum())
        assert doc[out.name]["samples"] == len(arrays["next_sentence_labels"])
        assert doc[out.name]["stage"] == "unpad"
    assert cli("verify", unpadded) == 0


def test_unpad_nvidia_layout_both_ways(padded, unpadded, nvidia_unpadded, tmp_path):
    for src in files(padded, ".hdf5"):
        expect = Samples.from_padded(hdf5io.read_samples(src))
        out = nvidia_unpadded / src.name
        assert same_values(nvidia.read_varlen(out), expect)
        with h5py.File(out) as f:
            assert sorted(f) == sorted(nvidia.FIELDS)
            for k, dt in (("input_ids", np.int16), ("segment_ids", np.int8),
                          ("masked_lm_positions", np.int16), ("masked_lm_ids", np.int16)):
                assert h5py.check_vlen_dtype(f[k].dtype) == dt, k
            assert f["next_sentence_labels"].dtype == np.int8
    # NVIDIA's layout in: the same shards as from the padded files, byte for byte
    back = tmp_path / "back"
    assert cli("unpad", "--input", nvidia_unpadded, "--output", back, "--input_format", "nvidia",
               "--workers", "1") == 0
    assert md5s(back) == md5s(unpadded)


def test_unpad_workers_and_resume(padded, unpadded, tmp_path, capsys):
    out = tmp_path / "w2"
    assert cli("unpad", "--input", padded, "--output", out, "--workers", "2") == 0
    assert md5s(out) == md5s(unpadded)
    capsys.readouterr()
    victim, other = out / "part-00001-of-00003.h5", out / "part-00000-of-00003.h5"
    victim.write_bytes(victim.read_bytes()[:500])
    before = other.stat().st_mtime_ns
    assert cli("unpad", "--input", padded, "--output", out, "--workers", "1") == 0
    assert "2 already made and verified" in capsys.readouterr().err
    assert other.stat().st_mtime_ns == before and md5s(out) == md5s(unpadded)
    # a single file as input
    one = tmp_path / "one"
    assert cli("unpad", "--input", padded / "part-00002-of-00003.hdf5", "--output", one) == 0
    assert md5s(one) == {k: v for k, v in md5s(unpadded).items() if "00002" in k}


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) * 2 // 3] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("case", ["md5", "truncated", "truncated_no_manifest", "not_canonical",
                                  "missing", "nvidia_as_padded"])
def test_unpad_bad_input(padded, nvidia_unpadded, tmp_path, capsys, case):
    src_dir = tmp_path / "in"
    shutil.copytree(padded, src_dir)
    victim = src_dir / "part-00001-of-00003.hdf5"
    needle, flags = victim.name, []
    if case == "md5":
        _flip_byte(victim)
        needle = "md5"
    elif case.startswith("truncated"):
        victim.write_bytes(victim.read_bytes()[:victim.stat().st_size // 2])
        if case == "truncated_no_manifest":
            (src_dir / "MANIFEST.json").unlink()
        needle = "truncated"
    elif case == "not_canonical":
        arrays = hdf5io.read_samples(victim)
        n = int(arrays["input_mask"][3].sum())
        arrays["input_ids"][3, n + 1] = 1000  # a token in the padding
        victim.unlink()
        hdf5io.write_arrays(victim, arrays)
        (src_dir / "MANIFEST.json").unlink()
        needle = "sample 3: input_ids"
    elif case == "missing":
        victim.unlink()
        (src_dir / "MANIFEST.json").unlink()
        needle = "no such"
    elif case == "nvidia_as_padded":  # detected by default; a forced layout must fit
        victim = nvidia_unpadded / victim.name
        needle, flags = "an NVIDIA variable-length file, not a padded sample file", \
            ["--input_format", "padded"]
    out = tmp_path / "out"
    assert cli("unpad", "--input", victim, "--output", out, "--workers", "1", *flags) == 1
    line = error_line(capsys)
    assert str(victim) in line and needle in line, line
    assert only_manifest_left(out)


def test_unpad_bad_file_in_folder_keeps_the_others(padded, tmp_path, capsys):
    src_dir = tmp_path / "in"
    shutil.copytree(padded, src_dir)
    _flip_byte(src_dir / "part-00001-of-00003.hdf5")
    out = tmp_path / "out"
    assert cli("unpad", "--input", src_dir, "--output", out, "--workers", "1") == 1
    assert "part-00001-of-00003.hdf5" in error_line(capsys)
    assert sorted(p.name for p in out.iterdir()) == \
        ["MANIFEST.json", "part-00000-of-00003.h5", "part-00002-of-00003.h5"]
    assert cli("verify", out) == 0


# ---- chop ---------------------------------------------------------------------------------------

def test_shard_arithmetic_and_permutation():
    for n, s, nominal, n_excess in ((156_726_829, 4320, 36_280, 2_771),
                                    (156_726_829, 2048, 76_527, 467), (5, 4, 2, 3), (8, 8, 1, 0)):
        counts = shard_counts(n, s)
        assert counts.sum() == n and len(counts) == s
        assert counts.max() == nominal and (counts == nominal - 1).sum() == n_excess
        assert np.all(counts[:n_excess] == nominal - 1) and np.all(counts[n_excess:] == nominal)
    perm = permutation(100_003, 24)
    assert perm.dtype == np.int32
    assert np.array_equal(perm, np.random.default_rng(24).permutation(100_003))


def test_chop_shards(unpadded, chopped):
    """Counts by the arithmetic; each position holds the sample the permutation sends there."""
    inputs = read_all(unpadded)
    n = len(inputs)
    outs = files(chopped, ".h5")
    assert [p.name for p in outs] == [f"part_{k:05d}_of_{N_SHARDS:05d}.h5" for k in range(N_SHARDS)]
    got = [shards.read_shard(p)[0] for p in outs]
    assert [len(s) for s in got] == list(shard_counts(n, N_SHARDS))
    doc = json.loads((chopped / "MANIFEST.json").read_text())["files"]
    assert [doc[p.name]["samples"] for p in outs] == [len(s) for s in got]
    # the union is exactly the input multiset
    in_dig = digests(inputs)
    out_dig = [digests(s) for s in got]
    assert sorted(in_dig) == sorted(d for ds in out_dig for d in ds)
    # no two shards alike, and each draws from every input file
    assert len(set(in_dig)) == n  # (the synthetic samples are all distinct)
    source = {d: k for k, p in enumerate(files(unpadded, ".h5"))
              for d in digests(shards.read_shard(p)[0])}
    for a in range(N_SHARDS):
        assert {source[d] for d in out_dig[a]} == {0, 1, 2}
        for b in range(a):
            assert not set(out_dig[a]) & set(out_dig[b])
    # exactly the documented rule: input sample i goes to output position permutation(N, 24)[i]
    order = np.argsort(permutation(n, 24))
    assert same_values(Samples.concat(got), inputs.take(order))


def test_chop_determinism_seeds_workers_groups(unpadded, chopped, tmp_path, capsys):
    base = md5s(chopped)
    runs = {"again": [], "seed25": ["--seed", "25"], "workers2": ["--workers", "2"],
            "groups": ["--memory_gb", "1e-6"], "tmpdir": ["--tmp_dir", tmp_path / "scratch"],
            "workers2_groups": ["--workers", "2", "--memory_gb", "1e-6"]}
    for name, flags in runs.items():
        capsys.readouterr()
        assert cli("chop", "--input", unpadded, "--output", tmp_path / name, "--num_shards",
                   N_SHARDS, "--workers", "1", *flags) == 0
        err = capsys.readouterr().err
        if name.endswith("groups"):
            assert f"{N_SHARDS} group(s) of up to 1 shard(s)" in err
        else:
            assert "1 group(s)" in err
        got = md5s(tmp_path / name)
        if name == "seed25":
            assert all(got[k] != base[k] for k in base)
            assert sorted(digests(read_all(tmp_path / name))) == \
                sorted(digests(read_all(chopped)))
        else:
            assert got == base, name
        assert only_manifest_left(tmp_path / "scratch") if name == "tmpdir" else True
        assert not any(p.name.startswith(".") for p in (tmp_path / name).iterdir())


def test_chop_resume(unpadded, chopped, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(chopped, out)
    assert cli("chop", "--input", unpadded, "--output", out, "--num_shards", N_SHARDS,
               "--workers", "1") == 0
    assert f"wrote 0 shard(s) to {out}, {N_SHARDS} already made" in capsys.readouterr().err
    victim = out / "part_00003_of_00007.h5"
    victim.write_bytes(victim.read_bytes()[:1000])
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p != victim}
    assert cli("chop", "--input", unpadded, "--output", out, "--num_shards", N_SHARDS,
               "--workers", "1", "--memory_gb", "1e-6") == 0
    assert f"wrote 1 shard(s) to {out}, {N_SHARDS - 1} already made" in capsys.readouterr().err
    assert md5s(out) == md5s(chopped)
    assert all(p.stat().st_mtime_ns == before[p.name] for p in out.iterdir()
               if p.name not in (victim.name, "MANIFEST.json"))
    assert cli("verify", out) == 0
    # another shard count into the same folder: a warning about the other plan's files
    assert cli("chop", "--input", unpadded, "--output", out, "--num_shards", 3,
               "--workers", "1") == 0
    assert "also holds 7 shard file(s) of another plan" in capsys.readouterr().err


def test_chop_nvidia_layout(unpadded, nvidia_unpadded, chopped, tmp_path):
    """NVIDIA-layout input (detected) gives the same shards; NVIDIA-layout output, same samples."""
    ours = tmp_path / "from_nvidia"
    assert cli("chop", "--input", nvidia_unpadded, "--output", ours, "--num_shards", N_SHARDS,
               "--workers", "1") == 0
    assert md5s(ours) == md5s(chopped)
    nv = tmp_path / "nv"
    assert cli("chop", "--input", unpadded, "--output", nv, "--num_shards", N_SHARDS,
               "--format", "nvidia", "--workers", "1") == 0
    outs = files(nv, ".hdf5")
    assert [p.name for p in outs] == \
        [f"part_{k:05d}_of_{N_SHARDS:05d}.hdf5" for k in range(N_SHARDS)]
    for p, q in zip(outs, files(chopped, ".h5")):
        assert same_values(nvidia.read_varlen(p), shards.read_shard(q)[0])
    assert cli("verify", nv) == 0


def _corrupt_offsets(path: Path) -> None:
    s, meta = shards.read_shard(path)
    s.offsets = s.offsets.copy()
    s.offsets[-1] += 7  # the last sample runs past the token array
    path.unlink()
    shards.write_shard(path, s, meta["max_seq_length"], meta["max_predictions_per_seq"])


@pytest.mark.parametrize("case", ["md5", "truncated", "truncated_no_manifest", "offsets",
                                  "too_many_shards", "missing", "missing_shard", "padded_input"])
def test_chop_bad_input(unpadded, padded, tmp_path, capsys, case):
    src = tmp_path / "in"
    shutil.copytree(unpadded, src)
    victim = src / "part-00001-of-00003.h5"
    shards_arg, needle = N_SHARDS, None
    if case == "md5":
        _flip_byte(victim)
        needle = "md5"
    elif case.startswith("truncated"):
        victim.write_bytes(victim.read_bytes()[:victim.stat().st_size * 3 // 4])
        if case == "truncated_no_manifest":
            (src / "MANIFEST.json").unlink()
        needle = "truncated"
    elif case == "offsets":
        _corrupt_offsets(victim)
        (src / "MANIFEST.json").unlink()
        needle = "offsets run to"
    elif case == "too_many_shards":
        shards_arg = len(read_all(unpadded)) + 1
        victim, needle = src, "fewer than --num_shards"
    elif case == "missing":
        shutil.rmtree(src)
        victim, needle = src, "no such input folder"
    elif case == "missing_shard":
        victim.unlink()
        needle = "listed in"
    elif case == "padded_input":
        src = padded
        victim, needle = padded / "part-00000-of-00003.hdf5", "unpad it first"
    out = tmp_path / "out"
    assert cli("chop", "--input", src, "--output", out, "--num_shards", shards_arg,
               "--workers", "1") == 1
    line = error_line(capsys)
    assert str(victim) in line and needle in line, line
    assert only_manifest_left(out)


def test_chop_bad_flags(unpadded, tmp_path, capsys):
    assert cli("chop", "--input", unpadded, "--output", tmp_path / "o", "--num_shards", 0) == 1
    assert "--num_shards=0" in error_line(capsys)
    assert cli("chop", "--input", unpadded, "--output", unpadded, "--num_shards", 2) == 1
    assert "must differ from the input folder" in error_line(capsys)
    assert only_manifest_left(tmp_path / "o")


@pytest.mark.mpi
def test_chop_mpirun_two_ranks(unpadded, chopped, tmp_path):
    pytest.importorskip("mpi4py")
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found")
    cmd = [mpirun, "-np", "2", "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    package_root = str(Path(bertperf.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (package_root, str(ROOT),
                    os.environ.get("PYTHONPATH")) if p))
    cmd += ["-x", "PYTHONPATH", sys.executable, "-m", "bertperf", "prep", "chop", "--input",
            str(unpadded), "--output", str(tmp_path / "two"), "--num_shards", str(N_SHARDS),
            "--workers", "1", "--memory_gb", "1e-6"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert md5s(tmp_path / "two") == md5s(chopped)
    assert (tmp_path / "two" / "MANIFEST.json").read_bytes() == \
        (chopped / "MANIFEST.json").read_bytes()
