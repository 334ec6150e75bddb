"""`prep stratify`: length bins of unpadded shards, through the command line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest

from bertperf.__main__ import main
from bertperf.data.synthetic import synthetic_samples
from bertperf.data.dataset import ShardDataset
from bertperf.data.loader import ShardLoader
from bertperf.formats.unpadded import read_shard, write_shard
from bertperf.prep.shards.stratify import bin_names, dealt

L, P = 512, 76
EDGES = [128, 256, 384, 512]


def keys_and_lengths(path: Path) -> list[tuple[bytes, int]]:
    """(identity, length) of every sample of a shard: tokens, B start, masks and NSP label."""
    s, _ = read_shard(path)
    out = []
    for i in range(len(s)):
        a, b = s.offsets[i], s.offsets[i + 1]
        m0, m1 = s.mlm_offsets[i], s.mlm_offsets[i + 1]
        key = (s.input_ids[a:b].astype(np.int32).tobytes()
               + int(s.b_starts[i]).to_bytes(2, "little")
               + s.mlm_positions[m0:m1].astype(np.int32).tobytes()
               + s.mlm_ids[m0:m1].astype(np.int32).tobytes() + bytes([int(s.nsp[i])]))
        out.append((key, int(b - a)))
    return out


@pytest.fixture(scope="module")
def unpadded(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("unpadded")
    for i, n in enumerate([300, 257, 10, 411, 64]):
        write_shard(folder / f"part_{i:05d}.h5", synthetic_samples(n, 50 + i, L, P), L, P)
    return folder


def stratify(inp: Path, out: Path, *flags: str) -> int:
    return main(["prep", "stratify", "--input", str(inp), "--output", str(out), *flags])


def read_output(out: Path) -> dict[str, list[list[tuple[bytes, int]]]]:
    summary = json.loads((out / "stratify.json").read_text())
    return {b["name"]: [keys_and_lengths(p) for p in sorted((out / b["name"]).glob("part_*.h5"))]
            for b in summary["bins"]}


@pytest.fixture(scope="module")
def stratified(unpadded, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("strat") / "out"
    assert stratify(unpadded, out, "--shards_per_bin", "3", "--seed", "7", "--workers", "1") == 0
    return out


def test_bins_partition_the_input(unpadded, stratified):
    inputs = [kl for p in sorted(unpadded.glob("*.h5")) for kl in keys_and_lengths(p)]
    got = read_output(stratified)
    names = bin_names(EDGES)
    assert sorted(got) == [n for n, _, _ in names]
    union = []
    for name, lo, hi in names:
        parts = got[name]
        assert len(parts) == 3
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1  # balanced parts
        for part in parts:
            assert all(lo <= n <= hi for _, n in part)  # every sample in its bin
            union.extend(part)
        with h5py.File(stratified / name / "part_00000.h5") as f:
            assert (f.attrs["bin_min_length"], f.attrs["bin_max_length"]) == (lo, hi)
            assert f.attrs["max_seq_length"] == L and f.attrs["max_predictions_per_seq"] == P
    assert Counter(union) == Counter(inputs)  # the same multiset: nothing lost, nothing repeated

    summary = json.loads((stratified / "stratify.json").read_text())
    assert summary["samples"] == len(inputs) == sum(b["samples"] for b in summary["bins"])
    for b in summary["bins"]:
        mine = [n for part in got[b["name"]] for _, n in part]
        assert b["samples"] == len(mine) and b["tokens"] == sum(mine) and b["shards"] == 3
    for name, _, _ in names:
        doc = json.loads((stratified / name / "MANIFEST.json").read_text())
        assert sorted(doc["files"]) == [f"part_{k:05d}.h5" for k in range(3)]
        assert sum(e["samples"] for e in doc["files"].values()) == sum(map(len, got[name]))
    leftovers = [p.name for p in stratified.iterdir() if p.name.startswith(".")]
    assert not leftovers


def test_shuffled_within_bins(unpadded, stratified):
    """Parts mix the input shards and are not in input order."""
    origin = {k: i for i, p in enumerate(sorted(unpadded.glob("*.h5")))
              for k, _ in keys_and_lengths(p)}
    part = read_output(stratified)["bin_385-512"][0]
    sources = [origin[k] for k, _ in part]
    assert len(set(sources)) >= 3 and sources != sorted(sources)


def test_deterministic_across_workers_and_seeds(unpadded, stratified, tmp_path):
    again = tmp_path / "again"
    assert stratify(unpadded, again, "--shards_per_bin", "3", "--seed", "7", "--workers", "2",
                    "--max_task_samples", "50") == 0
    assert read_output(again) == read_output(stratified)
    other = tmp_path / "other"
    assert stratify(unpadded, other, "--shards_per_bin", "3", "--seed", "8", "--workers", "1") == 0
    a, b = read_output(other), read_output(stratified)
    assert a != b
    assert all(Counter(x for p in a[n] for x in p) == Counter(x for p in b[n] for x in p)
               for n in a)


def test_custom_bins_and_default_shard_count(unpadded, tmp_path):
    out = tmp_path / "two"
    assert stratify(unpadded, out, "--bins", "200,512", "--workers", "1") == 0
    summary = json.loads((out / "stratify.json").read_text())
    assert [b["name"] for b in summary["bins"]] == ["bin_001-200", "bin_201-512"]
    assert summary["shards_per_bin"] == 5  # as many as input shards
    assert len(list((out / "bin_001-200").glob("part_*.h5"))) == 5


def test_rerun_replaces_earlier_output(unpadded, tmp_path):
    out = tmp_path / "re"
    assert stratify(unpadded, out, "--shards_per_bin", "4", "--workers", "1") == 0
    (out / "bin_999-999").mkdir()  # an older run's bin folder that the new bins do not have
    assert stratify(unpadded, out, "--shards_per_bin", "2", "--workers", "1") == 0
    assert len(list((out / "bin_001-128").glob("part_*.h5"))) == 2
    assert not (out / "bin_999-999").exists()


def test_corrupt_shard_fails_cleanly(unpadded, tmp_path, capsys):
    bad_in = tmp_path / "in"
    bad_in.mkdir()
    for p in sorted(unpadded.glob("*.h5")):
        (bad_in / p.name).write_bytes(p.read_bytes())
    victim = bad_in / "part_00003.h5"
    data = bytearray(victim.read_bytes())
    with h5py.File(victim) as f:
        start = f["offsets"].id.get_offset()
    data[start + 8 * 5:start + 8 * 6] = (10**9).to_bytes(8, "little")  # sample 4's end offset
    victim.write_bytes(bytes(data))
    out = tmp_path / "out"
    capsys.readouterr()
    assert stratify(bad_in, out, "--workers", "2") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "part_00003.h5" in err, err
    assert not out.exists()  # no partial output
    # a truncated file, into an earlier stratify's folder: what was there stays, nothing is added
    victim.write_bytes(victim.read_bytes()[:1000])
    assert stratify(unpadded, out, "--workers", "1") == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert stratify(bad_in, out, "--workers", "1") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "part_00003.h5" in err, err
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # a folder stratify did not write is refused before any work, its files kept
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("x")
    assert stratify(unpadded, mine, "--workers", "1") == 1
    assert "is a folder prep stratify did not write" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["keep.txt"]


def test_bad_arguments(unpadded, tmp_path, capsys):
    assert stratify(unpadded, tmp_path / "o", "--bins", "128,100") == 1
    assert "--bins" in capsys.readouterr().err
    assert stratify(unpadded, tmp_path / "o", "--bins", "128,256") == 1  # shards allow 512
    assert "max_seq_length 512" in capsys.readouterr().err
    assert stratify(tmp_path / "nothing", tmp_path / "o") == 1
    assert "nothing: no such input" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_dealing_is_balanced():
    k = 7
    total = np.zeros(k, dtype=np.int64)
    before = 0
    for n in [0, 3, 19, 1, 7, 30]:
        share = dealt(before, n, k)
        assert share.sum() == n and share.max() - share.min() <= 1
        total += share
        before += n
    assert total.max() - total.min() <= 1 and total.sum() == before


def test_loader_reads_the_bins(stratified):
    names = [n for n, _, _ in bin_names(EDGES)]
    bins = {name: ShardDataset.from_folder(stratified / name, "part_*.h5") for name in names}
    assert ShardDataset.from_stratified(stratified).bins == [3] * len(names)
    for name, ds in bins.items():
        lo, hi = (int(x) for x in name[4:].split("-"))
        batches = list(ShardLoader(ds, 5, prefetch=0, drop_last=False))
        lengths = np.concatenate([np.diff(b["cu_seqlens"]) for b in batches])
        assert len(lengths) == ds.num_samples and lengths.min() >= lo and lengths.max() <= hi
