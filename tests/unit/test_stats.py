"""`prep stats`: exact numbers on a tiny known dataset in every layout, the PNG, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertperf.__main__ import main
from bertperf.formats import padded as hdf5io
from bertperf.formats.nvidia import write_packed as write_nvidia_packed
from bertperf.formats.nvidia import write_varlen as write_nvidia
from bertperf.formats.packed import Packed, read_packed, write_packed
from bertperf.formats.samples import Samples, offsets_from_lengths
from bertperf.formats.unpadded import write_shard
from bertperf.prep.shards.stats import hist_median

L = 512
LENGTHS = [10, 20, 30, 512]
MASKS = [1, 2, 3, 4]
NSP = [0, 1, 1, 0]
EXPECTED = {
    "samples": 4, "tokens": 572, "mean_length": 143.0, "median_length": 25.0, "min_length": 10,
    "max_length": 512, "full_length_fraction": 0.25, "padding_fraction": 1 - 572 / 2048,
    "masked_per_sample": 2.5, "nsp_random_fraction": 0.5,
}


def tiny() -> Samples:
    lengths = np.array(LENGTHS)
    offsets = offsets_from_lengths(lengths)
    ids = np.arange(offsets[-1]) % 20000 + 1000
    ids[offsets[:-1]] = 101
    positions = np.concatenate([np.arange(1, k + 1) for k in MASKS])
    return Samples(ids, offsets, np.array([3, 5, 7, 100]), positions, positions + 2000,
                   offsets_from_lengths(np.array(MASKS)), np.array(NSP))


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stats")
    s = tiny()
    out = {k: root / k for k in ("padded", "unpadded", "nvidia")}
    for d in out.values():
        d.mkdir()
    # two files each, to check that files add up
    halves = [np.array([0, 3]), np.array([1, 2])]
    for k, rows in enumerate(halves):
        hdf5io.write_samples(out["padded"] / f"p{k}.hdf5", s, rows, L, 76, 30522)
        write_shard(out["unpadded"] / f"u{k}.hdf5", s.take(rows), L, 76)
        write_nvidia(out["nvidia"] / f"n{k}.hdf", s.take(rows))
    out["packed"] = root / "packed"
    assert main(["prep", "pack", "--input", str(out["unpadded"]), "--output", str(out["packed"]),
                 "--workers", "1"]) == 0
    # the same rows in NVIDIA's packed layout (files named part_XXXXX, no suffix)
    out["nvidia-packed"] = root / "nvidia-packed"
    out["nvidia-packed"].mkdir()
    for k, p in enumerate(sorted(out["packed"].glob("*.hdf5"))):
        write_nvidia_packed(out["nvidia-packed"] / f"part_{k:05d}", read_packed(p)[0])
    return out


def stats(tmp_path: Path, folder: Path, *flags: str) -> dict:
    js = tmp_path / f"{folder.name}.json"
    assert main(["prep", "stats", str(folder), "--png", str(tmp_path / f"{folder.name}.png"),
                 "--json", str(js), "--workers", "1", *flags]) == 0
    return json.loads(js.read_text())


@pytest.mark.parametrize("layout", ["padded", "unpadded", "nvidia", "packed", "nvidia-packed"])
def test_exact_numbers(tmp_path, folders, layout, capsys):
    st = stats(tmp_path, folders[layout])
    for key, value in EXPECTED.items():
        assert st[key] == pytest.approx(value, abs=1e-12), key
    hist = np.zeros(L + 1, dtype=int)
    hist[LENGTHS] = 1
    assert st["length_histogram"] == hist.tolist()
    pk = st["packing"]
    # <= 3 per row: (512) and (30, 20, 10): 2 rows, 572 / 1024 tokens
    assert (pk["rows"], pk["seqs_per_row"], pk["efficiency"]) == (2, 2.0, 572 / 1024)
    if layout.endswith("packed"):
        assert pk["source"] == "as packed" and pk["rows_by_sequences"] == {"1": 1, "2": 0, "3": 1}
    out = capsys.readouterr().out
    for text in ("samples                  4", "mean length              143.00",
                 "median length            25", "padding at 512           72.07%",
                 "masked tokens/sample     2.500", "NSP random fraction      0.5000",
                 "packing efficiency       55.8594% (2 rows, 2.00000 sequences/row"):
        assert text in out, text
    png = tmp_path / f"{folders[layout].name}.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_depth_flag_and_default_png(tmp_path, folders):
    st = stats(tmp_path, folders["unpadded"], "--max_seqs_per_row", "1")
    assert (st["packing"]["rows"], st["packing"]["efficiency"]) == (4, 572 / 2048)
    folder = tmp_path / "copy"
    folder.mkdir()
    for p in folders["unpadded"].glob("*.hdf5"):
        (folder / p.name).write_bytes(p.read_bytes())
    assert main(["prep", "stats", str(folder), "--workers", "1"]) == 0
    assert (folder / "lengths.png").read_bytes()[:4] == b"\x89PNG"
    # one file
    assert main(["prep", "stats", str(folder / "u0.hdf5"), "--png", str(tmp_path / "one.png")]) == 0


def test_median_matches_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 10, 11, 1000):
        values = rng.integers(1, 40, size=n)
        assert hist_median(np.bincount(values)) == np.median(values)


def test_bad_input(tmp_path, folders, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    lens = np.array([300, 300])
    write_packed(bad / "x.hdf5",
                 Packed(np.full(600, 7), np.array([0, 600]), lens, np.array([0, 2]), np.array([5, 5]),
                        np.array([3, 303]), np.array([9, 9]), np.array([0, 1, 2]), np.array([0, 1])),
                 L, 76, 3)
    png = tmp_path / "bad.png"
    assert main(["prep", "stats", str(bad), "--png", str(png), "--workers", "1"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"bertperf: error: {bad / 'x.hdf5'}: row 0 holds 600 tokens, more than 512"]
    assert not png.exists()
    # mixed packed and unpacked files; an empty folder; a file that is not HDF5
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for src in (folders["unpadded"], folders["packed"]):
        p = next(src.glob("*.hdf5"))
        (mixed / p.name).write_bytes(p.read_bytes())
    assert main(["prep", "stats", str(mixed), "--png", str(png), "--workers", "1"]) == 1
    assert "mixed" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["prep", "stats", str(empty), "--png", str(png)]) == 1
    assert str(empty) in capsys.readouterr().err
    (empty / "junk.hdf5").write_bytes(b"junk")
    assert main(["prep", "stats", str(empty), "--png", str(png), "--workers", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(empty / "junk.hdf5") in err[0]
    assert not png.exists()
