"""Histogram packing (`prep pack`): the plan, the streaming assignment, the packed format, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bertperf.__main__ import main
from bertperf.formats import padded as hdf5io
from bertperf.formats.nvidia import write_varlen as write_nvidia
from bertperf.formats.packed import Packed, read_packed, write_packed
from bertperf.formats.samples import Samples, offsets_from_lengths
from bertperf.formats.unpadded import read_shard, write_shard
from bertperf.prep.shards.packing import Packer, Rows, assign_present, histogram, plan_packing
from tests.support.samples import CLS, make_samples, sample_digests

L = 512


def mlperf_like_weights() -> np.ndarray:
    """Shaped like Graphcore's Wikipedia histogram (data_prep_facts.md §A3): lengths 1-4 empty, a
    rise to a peak near 48 tokens, a slow decay, 23.4% of the samples at exactly 512, mean ~255."""
    w = np.zeros(L + 1)
    x = np.arange(5, L, dtype=float)
    w[5:L] = np.minimum((x - 4) / 44, 1.0) * np.minimum(1.0, (48 / x) ** 0.92)
    w[5:L] *= (1 - 0.234) / w[5:L].sum()
    w[L] = 0.234
    return w


def mlperf_like_histogram(n: int) -> np.ndarray:
    return np.floor(mlperf_like_weights() * n).astype(np.int64)


def read_folder(folder: Path) -> Samples:
    return Samples.concat([read_shard(p)[0] for p in sorted(folder.glob("*.hdf5"))])


def read_packed_folder(folder: Path) -> list[Packed]:
    return [read_packed(p)[0] for p in sorted(folder.glob("*.hdf5"))]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, Samples]:
    """Three unpadded shards of MLPerf-like random samples."""
    rng = np.random.default_rng(2024)
    folder = tmp_path_factory.mktemp("unpadded")
    w = mlperf_like_weights()
    parts = []
    for k, n in enumerate((1500, 1200, 900)):
        s = make_samples(rng, rng.choice(L + 1, size=n, p=w))
        write_shard(folder / f"part-{k:05d}.hdf5", s, L, 76)
        parts.append(s)
    return folder, Samples.concat(parts)


# ---- the plan ------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 3])
def test_plan_covers_histogram_within_limits(k):
    rng = np.random.default_rng(k)
    for hist in (mlperf_like_histogram(20_000),
                 np.bincount(rng.integers(1, L + 1, size=777), minlength=L + 1),
                 np.bincount([L, L, 1], minlength=L + 1),
                 np.bincount([300], minlength=L + 1),
                 np.bincount([200, 200, 200, 100], minlength=L + 1)):
        plan = plan_packing(hist, k)
        assert np.array_equal(plan.histogram(), hist)
        assert plan.shapes.sum(axis=1).max() <= L
        assert plan.sizes.max() <= k and plan.sizes.min() >= 1
        assert plan.rows >= -(-plan.tokens // L)
    assert plan_packing(np.bincount([170] * 6, minlength=L + 1)).rows == 2  # (170, 170, 170) x 2


def test_efficiency_on_mlperf_like_histogram():
    """>= 99% of the row capacity with <= 3 per row on the MLPerf-like shape (16M samples)."""
    hist = mlperf_like_histogram(16_000_000)
    n = hist.sum()
    lengths = np.arange(L + 1)
    assert hist[1:5].sum() == 0 and abs(hist[L] / n - 0.234) < 1e-3
    assert 250 < (hist * lengths).sum() / n < 260
    plan = plan_packing(hist, 3)
    assert np.array_equal(plan.histogram(), hist)
    assert plan.efficiency >= 0.99, plan.summary()
    assert plan.seqs_per_row > 1.98
    assert plan.max_seqs_per_row == 3


# ---- streaming assignment -----------------------------------------------------------------------

def check_rows(rows: Rows, lengths: np.ndarray, k: int = 3) -> None:
    assert np.array_equal(np.sort(rows.refs), np.arange(len(lengths)))  # each sequence once
    assert np.array_equal(rows.lengths, lengths[rows.refs])
    assert rows.sizes.min() >= 1 and rows.sizes.max() <= k
    assert rows.row_lengths.max() <= L


def test_stream_assignment_follows_the_plan():
    rng = np.random.default_rng(3)
    lengths = rng.choice(L + 1, size=200_000, p=mlperf_like_weights())
    plan = plan_packing(histogram(lengths, L))
    packer = Packer(plan)
    parts = [packer.push(c) for c in np.array_split(lengths, 13)] + [packer.finish()]
    rows = Rows.concat(parts)
    check_rows(rows, lengths)
    assert len(rows) == plan.rows and packer.stats.overflow == 0
    assert packer.stats.efficiency(L) == pytest.approx(plan.efficiency) and plan.efficiency > 0.99
    assert packer.stats.peak_pending < 20_000  # random order: a few thousand held, not 200k
    # deterministic
    again = Packer(plan)
    rows2 = Rows.concat([again.push(c) for c in np.array_split(lengths, 13)] + [again.finish()])
    assert np.array_equal(rows.refs, rows2.refs) and np.array_equal(rows.sizes, rows2.sizes)


def test_stream_cap_sorted_and_mismatched_input():
    rng = np.random.default_rng(4)
    lengths = rng.choice(L + 1, size=30_000, p=mlperf_like_weights())
    plan = plan_packing(histogram(lengths, L))
    # adversarial order (longest first) under a small cap: memory stays bounded, all packed once
    order = np.argsort(-lengths, kind="stable")
    packer = Packer(plan, max_pending=500)
    rows = Rows.concat([packer.push(c, order[i * 3000:(i + 1) * 3000])
                        for i, c in enumerate(np.array_split(lengths[order], 10))]
                       + [packer.finish()])
    check_rows(rows, lengths)
    assert packer.stats.flushes > 0 and packer.stats.overflow > 0
    assert packer.stats.peak_pending <= 500 + 3000
    # a stream that differs from the plan's histogram still packs every sequence exactly once
    other = plan_packing(histogram(rng.choice(L + 1, size=30_000, p=mlperf_like_weights()), L))
    packer = Packer(other)
    rows = Rows.concat([packer.push(c) for c in np.array_split(lengths, 4)] + [packer.finish()])
    check_rows(rows, lengths)
    assert packer.stats.efficiency(L) > 0.98


@pytest.mark.parametrize("k", [1, 2, 3])
def test_assign_present(k):
    lengths = np.random.default_rng(k).choice(L + 1, size=5000, p=mlperf_like_weights())
    plan = plan_packing(histogram(lengths, L), k)
    rows = assign_present(lengths, np.arange(len(lengths)), plan)
    check_rows(rows, lengths, k)
    assert len(rows) == plan.rows


BOUNDED_MEMORY_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from bertperf.prep.shards.packing import pack_lengths

    def peak_rss_kb():  # this process's high-water RSS (ru_maxrss would include the parent's)
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

    N, CHUNK, L = 10_000_000, 65536, 512
    w = np.zeros(L + 1)
    x = np.arange(5, L, dtype=float)
    w[5:L] = np.minimum((x - 4) / 44, 1.0) * np.minimum(1.0, (48 / x) ** 0.92)
    w[5:L] *= (1 - 0.234) / w[5:L].sum()
    w[L] = 0.234
    cdf = np.cumsum(w / w.sum())

    def chunks():  # the same stream on every call; never more than one chunk in memory
        rng, left = np.random.default_rng(7), N
        while left:
            n = min(CHUNK, left)
            left -= n
            yield np.searchsorted(cdf, rng.random(n), side="right")

    seen = {"rows": 0, "seqs": 0, "max_len": 0, "max_size": 0}

    def on_rows(rows):
        seen["rows"] += len(rows)
        seen["seqs"] += len(rows.refs)
        seen["max_len"] = max(seen["max_len"], int(rows.row_lengths.max()))
        seen["max_size"] = max(seen["max_size"], int(rows.sizes.max()))

    base = peak_rss_kb()
    plan, stats = pack_lengths(chunks, L, 3, on_rows=on_rows)
    peak = peak_rss_kb()
    print(json.dumps({"base_kb": base, "peak_kb": peak, "efficiency": stats.efficiency(L),
                      "plan_rows": plan.rows, "peak_pending": stats.peak_pending,
                      "overflow": stats.overflow, **seen}))
""")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_bounded_memory_ten_million_lengths():
    """Pack a 10M-length stream (histogram pass + assignment pass) in a fresh process: the peak RSS
    may grow by at most 40 MB over the imports, i.e. < 4 bytes per sample, so anything kept per
    sample (even one int32) fails; measured: about 22 MB, the same as for 1M samples."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", BOUNDED_MEMORY_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    growth_mb = (res["peak_kb"] - res["base_kb"]) / 1024
    print(f"10M lengths: peak RSS {res['peak_kb'] / 1024:.0f} MB (+{growth_mb:.1f} MB), {res}")
    assert growth_mb < 40, res
    assert res["seqs"] == 10_000_000 and res["rows"] == res["plan_rows"]
    assert res["max_len"] <= L and res["max_size"] <= 3
    assert res["efficiency"] >= 0.99 and res["overflow"] == 0
    assert res["peak_pending"] < 100_000


# ---- the packed format and the stage ------------------------------------------------------------

def pack(*args: str) -> int:
    return main(["prep", "pack", "--workers", "1", *args])


def test_pack_unpack_round_trip(tmp_path, dataset, capsys):
    src, original = dataset
    out, back = tmp_path / "packed", tmp_path / "unpacked"
    assert pack("--input", str(src), "--output", str(out)) == 0
    err = capsys.readouterr().err
    assert "rows" in err and "sequences/row" in err and "efficiency" in err
    names = sorted(p.name for p in out.glob("*.hdf5"))
    assert names == [f"part-{i:05d}-of-00003.hdf5" for i in range(3)]  # one shard per input
    assert set(json.loads((out / "MANIFEST.json").read_text())["files"]) == set(names)
    parts = read_packed_folder(out)
    rows = sum(len(p) for p in parts)
    tokens = sum(int(p.row_offsets[-1]) for p in parts)
    assert tokens == len(original.input_ids) and sum(p.num_sequences for p in parts) == len(original)
    assert tokens / (rows * L) >= 0.97  # 3,600 samples: a sparse histogram, still dense rows
    by_digest = {d: i for i, d in enumerate(sample_digests(original))}
    for p in parts:
        assert p.row_lengths.max() <= L and p.seqs_per_row.max() <= 3
        # masked positions are relative to the row and point at the sequence's masked token
        starts = p.seq_starts()
        s = p.to_samples()
        owner = np.repeat(np.arange(p.num_sequences), np.diff(p.mlm_offsets))
        row_tok = p.input_ids[p.row_offsets[p.seq_row()[owner]] + p.mlm_positions.astype(np.int64)]
        seq_tok = s.input_ids[s.offsets[owner] + p.mlm_positions.astype(np.int64) - starts[owner]]
        assert np.array_equal(row_tok, seq_tok)
        assert all(d in by_digest for d in sample_digests(s))
    assert pack("--unpack", "--input", str(out), "--output", str(back)) == 0
    assert sample_digests(read_folder(back)) == sample_digests(original)


def test_masked_positions_point_at_original_tokens(tmp_path, dataset):
    """Each masked position (row-relative) holds the token the sample had at that position."""
    src, original = dataset
    out = tmp_path / "packed"
    assert pack("--input", str(src), "--output", str(out), "--num_shards", "1") == 0
    (p,) = read_packed_folder(out)
    # map each packed sequence back to its original sample by digest
    index = {}
    for i in range(len(original)):
        a, b = original.offsets[i], original.offsets[i + 1]
        index.setdefault(original.input_ids[a:b].tobytes(), i)
    starts, rows = p.seq_starts(), p.seq_row()
    seq_off = offsets_from_lengths(p.seq_lengths.astype(np.int64))
    for j in range(0, p.num_sequences, 7):
        toks = p.input_ids[seq_off[j]:seq_off[j + 1]].astype(original.input_ids.dtype)
        i = index[toks.tobytes()]
        row_start = p.row_offsets[rows[j]]
        pos = p.mlm_positions[p.mlm_offsets[j]:p.mlm_offsets[j + 1]].astype(np.int64)
        orig_pos = original.mlm_positions[original.mlm_offsets[i]:original.mlm_offsets[i + 1]]
        assert np.array_equal(pos - starts[j], orig_pos)
        assert np.array_equal(p.input_ids[row_start + pos],
                              original.input_ids[original.offsets[i] + orig_pos])


def test_batch_helper(tmp_path, dataset):
    src, _ = dataset
    out = tmp_path / "packed"
    assert pack("--input", str(src), "--output", str(out), "--num_shards", "1") == 0
    (p,) = read_packed_folder(out)
    multi = np.flatnonzero(p.seqs_per_row >= 2)[:16]
    b = p.batch(multi)
    R = len(multi)
    assert b["input_ids"].shape == (R, L) and b["masked_lm_positions"].shape == (R, 3 * 76)
    for k, r in enumerate(multi):
        n = p.row_lengths[r]
        seqs = range(p.row_seq_offsets[r], p.row_seq_offsets[r + 1])
        lens = p.seq_lengths[list(seqs)].astype(np.int64)
        assert np.array_equal(b["input_ids"][k, :n], p.input_ids[p.row_offsets[r]:p.row_offsets[r + 1]])
        assert not b["input_ids"][k, n:].any() and b["input_mask"][k].sum() == n
        assert np.array_equal(b["seq_lengths"][k, :len(lens)], lens)
        assert not b["seq_lengths"][k, len(lens):].any()
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        assert np.array_equal(b["seq_starts"][k, :len(lens)], starts)
        assert np.array_equal(b["input_ids"][k, starts], np.full(len(lens), CLS))
        pos = np.concatenate([np.arange(x) for x in lens])
        assert np.array_equal(b["position_ids"][k, :n], pos)
        assert np.array_equal(b["sequence_index"][k, :n], np.repeat(np.arange(1, len(lens) + 1), lens))
        seg = np.concatenate([np.arange(x) >= p.b_starts[j] for j, x in zip(seqs, lens)])
        assert np.array_equal(b["segment_ids"][k, :n], seg)
        m = slice(p.mlm_offsets[p.row_seq_offsets[r]], p.mlm_offsets[p.row_seq_offsets[r + 1]])
        cnt = m.stop - m.start
        assert np.array_equal(b["masked_lm_positions"][k, :cnt], p.mlm_positions[m])
        assert np.array_equal(b["masked_lm_ids"][k, :cnt], p.mlm_ids[m])
        assert b["masked_lm_weights"][k].sum() == cnt and not b["masked_lm_positions"][k, cnt:].any()
        assert np.array_equal(b["next_sentence_labels"][k, :len(lens)], p.nsp[list(seqs)])
        assert (b["next_sentence_labels"][k, len(lens):] == -1).all()


def test_padded_and_nvidia_inputs(tmp_path, dataset):
    src, original = dataset
    part = Samples.concat([read_shard(p)[0] for p in sorted(src.glob("*.hdf5"))[:1]])
    padded, nvidia = tmp_path / "padded", tmp_path / "nvidia"
    padded.mkdir()
    nvidia.mkdir()
    hdf5io.write_samples(padded / "a.hdf5", part, np.arange(len(part)), L, 76, 30522)
    write_nvidia(nvidia / "a.hdf", part)
    for folder in (padded, nvidia):
        out, back = tmp_path / f"{folder.name}-packed", tmp_path / f"{folder.name}-back"
        assert pack("--input", str(folder), "--output", str(out), "--rows_per_shard", "300") == 0
        assert len(list(out.glob("*.hdf5"))) == -(-sum(len(p) for p in read_packed_folder(out)) // 300)
        assert pack("--unpack", "--input", str(out), "--output", str(back)) == 0
        assert sample_digests(read_folder(back)) == sample_digests(part)


def test_rerun_skips_and_seed_shuffles(tmp_path, dataset, capsys):
    src, _ = dataset
    a, b = tmp_path / "a", tmp_path / "b"
    assert pack("--input", str(src), "--output", str(a), "--num_shards", "2") == 0
    first = {p.name: p.read_bytes() for p in a.glob("*.hdf5")}
    capsys.readouterr()
    assert pack("--input", str(src), "--output", str(a), "--num_shards", "2") == 0
    assert "skipped" in capsys.readouterr().err
    assert pack("--input", str(src), "--output", str(b), "--num_shards", "2", "--seed", "7") == 0
    pa, pb = read_packed_folder(a), read_packed_folder(b)
    assert [len(p) for p in pa] == [len(p) for p in pb]
    assert not all(np.array_equal(x.input_ids, y.input_ids) for x, y in zip(pa, pb))
    assert sorted(sample_digests(x.to_samples()) for x in pa) == \
        sorted(sample_digests(y.to_samples()) for y in pb)
    # other shard counts replace the earlier outputs; reruns are byte-identical
    assert pack("--input", str(src), "--output", str(a), "--num_shards", "3") == 0
    assert sorted(p.name for p in a.glob("*.hdf5")) == [f"part-{i:05d}-of-00003.hdf5" for i in range(3)]
    assert pack("--input", str(src), "--output", str(a), "--num_shards", "2") == 0
    assert {p.name: p.read_bytes() for p in a.glob("*.hdf5")} == first
    assert main(["prep", "verify", str(a)]) == 0


def bad_packed(path: Path) -> None:
    """A packed file whose only row holds two 300-token sequences (600 > 512)."""
    lens = np.array([300, 300])
    p = Packed(np.full(600, 7, dtype=np.int64), np.array([0, 600]), lens, np.array([0, 2]),
               np.array([5, 5]), np.array([3, 303]), np.array([9, 9]), np.array([0, 1, 2]),
               np.array([0, 1]))
    write_packed(path, p, L, 76, 3)


def test_bad_packed_input(tmp_path, dataset, capsys):
    src, _ = dataset
    good = tmp_path / "in"
    assert pack("--input", str(src), "--output", str(good), "--num_shards", "1") == 0
    bad = good / "zz-bad.hdf5"
    bad_packed(bad)
    out = tmp_path / "out"
    capsys.readouterr()
    assert pack("--unpack", "--input", str(good), "--output", str(out)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"bertperf: error: {bad}: row 0 holds 600 tokens, more than 512"]
    assert not out.exists() or not list(out.iterdir())  # no partial outputs
    # packing packed input is refused, naming the file
    assert pack("--input", str(good), "--output", str(tmp_path / "again")) == 1
    assert "cannot be packed" in capsys.readouterr().err


def test_bad_unpadded_input(tmp_path, dataset, capsys):
    src, original = dataset
    folder = tmp_path / "in"
    folder.mkdir()
    write_shard(folder / "a.hdf5", original.take(np.arange(100)), L, 76)
    # a 600-token sample in a shard that says 512 (write_shard does not check)
    write_shard(folder / "b.hdf5", make_samples(np.random.default_rng(1), [40, 600, 30]), L, 76)
    out = tmp_path / "out"
    capsys.readouterr()
    assert pack("--input", str(folder), "--output", str(out)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"bertperf: error: {folder / 'b.hdf5'}: sample 1 has 600 tokens, more than 512"]
    assert not out.exists() or not list(out.iterdir())
    (folder / "b.hdf5").write_bytes(b"not hdf5")
    assert pack("--input", str(folder), "--output", str(out)) == 1
    assert str(folder / "b.hdf5") in capsys.readouterr().err
    assert not out.exists() or not list(out.iterdir())
