"""bertperf.data.loader: order, rank partition, resume, prefetch, layouts, lazy mapped reads."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from bertperf.data.synthetic import synthetic_samples, write_synthetic_packed
from bertperf.data.collate import collate_padded, collate_varlen
from bertperf.data.dataset import ShardDataset
from bertperf.data.loader import ShardLoader
from bertperf.data.order import EpochPlan, permutation
from bertperf.data.readers import PackedReader, ShardReader, open_shard
from bertperf.errors import UserError
from bertperf.formats.samples import Samples
from bertperf.formats.unpadded import FIELDS, read_shard, write_shard

L, P = 64, 10
PADDED = functools.partial(collate_padded, max_seq_length=L, max_pred=P)
"""The reference's padded arrays, which most tests here read (sample_keys)."""


def make_shards(folder: Path, sizes: list[int], seed: int = 0, msl: int = L,
                mp: int = P) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, n in enumerate(sizes):
        path = folder / f"part_{i:05d}.h5"
        s = synthetic_samples(max(n, 1), seed * 1000 + i, msl, mp)
        write_shard(path, s.take(np.arange(n)), msl, mp)
        paths.append(path)
    return paths


def sample_keys(batch: dict) -> list[bytes]:
    """One key per sample of a padded batch: its real tokens and labels (unique here)."""
    keys = []
    for i in range(len(batch["next_sentence_labels"])):
        n = int(batch["input_mask"][i].sum())
        keys.append(batch["input_ids"][i, :n].tobytes() + batch["segment_ids"][i, :n].tobytes()
                    + batch["masked_lm_positions"][i].tobytes()
                    + batch["masked_lm_ids"][i].tobytes()
                    + bytes([int(batch["next_sentence_labels"][i])]))
    return keys


def stream(loader) -> list[bytes]:
    return [k for b in loader for k in sample_keys(b)]


def all_keys(paths: list[Path]) -> list[bytes]:
    keys = []
    for p in paths:
        s, meta = read_shard(p)
        if len(s):
            keys.extend(sample_keys(s.to_padded(L, P)))
    return keys


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    # uneven sizes, one shard smaller than a batch, one empty
    return make_shards(tmp_path_factory.mktemp("shards"), [40, 37, 5, 0, 41, 23, 40, 12], seed=3)


def test_permutation_is_stable():
    assert permutation(10, 5, 0, 0).tolist() == [6, 2, 3, 4, 9, 5, 7, 0, 1, 8]
    assert permutation(10, 5, 1, 0).tolist() == [5, 9, 2, 1, 4, 7, 0, 3, 8, 6]
    p = permutation(1000, 1, 2, 3)
    assert sorted(p.tolist()) == list(range(1000))
    assert permutation(0, 1).tolist() == [] and permutation(1, 1).tolist() == [0]



def test_each_epoch_reads_the_shards_in_an_order_of_its_own():
    counts = np.full(8, 10)
    orders = {tuple(EpochPlan(counts, 11, epoch).shard_order.tolist()) for epoch in range(4)}
    assert len(orders) == 4

def test_reader_matches_read_shard(shards):
    full, _ = read_shard(shards[0])
    rows = np.array([5, 0, 39, 17, 17, 2])
    r = ShardReader(shards[0])
    assert r.mode == "mmap" and len(r) == 40
    assert r.take(rows).equals(full.take(rows))
    assert r.read_range(3, 11).equals(full.take(np.arange(3, 11)))
    assert r.read_range(7, 7).equals(full.take(np.arange(0)))
    assert len(r.take(np.zeros(0, dtype=np.int64))) == 0
    with pytest.raises(IndexError):
        r.take(np.array([40]))
    r.close()
    empty = ShardReader(shards[3])
    assert len(empty) == 0 and len(empty.read_range(0, 0)) == 0
    empty.close()


def test_reader_h5py_fallback_for_chunked_files(tmp_path, shards):
    """A chunked/compressed file cannot be mapped: read slice by slice through h5py, same data."""
    full, _ = read_shard(shards[1])
    path = tmp_path / "chunked.h5"
    with h5py.File(path, "w") as f:
        f.attrs.update({"format": "bertperf-unpadded/1", "max_seq_length": L,
                        "max_predictions_per_seq": P})
        for k in FIELDS:
            f.create_dataset(k, data=getattr(full.astype_compact(), k), chunks=True,
                             compression="gzip")
    r = ShardReader(path)
    assert r.mode == "h5py"
    rows = permutation(len(full), 9)
    assert r.take(rows).equals(full.take(rows))
    assert r.read_range(2, 30).equals(full.take(np.arange(2, 30)))
    r.close()
    assert ShardReader(shards[1], use_mmap=False).take(rows).equals(full.take(rows))


def test_corrupt_or_foreign_shards_are_named(tmp_path, shards):
    bad = tmp_path / "part_bad.h5"
    bad.write_bytes(shards[0].read_bytes()[:3000])
    with pytest.raises(UserError, match="part_bad.h5"):
        ShardReader(bad)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.create_dataset("input_ids", data=np.zeros((2, 4)))
    with pytest.raises(UserError, match="other.h5: not a sample file"):
        ShardReader(other)
    with h5py.File(tmp_path / "half.h5", "w") as f:
        f.attrs["format"] = "bertperf-packed/1"
    with pytest.raises(UserError, match="half.h5: truncated or corrupt"):
        ShardDataset([tmp_path / "half.h5"])


@pytest.mark.parametrize("sizes,world", [
    ([30] * 12, 4),            # even: every rank reads whole shards, by itself
    ([30] * 12, 3),
    ([31, 29, 30, 0, 7, 44, 30, 2, 1], 3),   # uneven, S % W == 0
    ([31, 29, 30, 0, 7, 44, 30, 2, 1], 5),   # uneven, S % W != 0
    ([5, 3], 7),               # fewer shards than ranks
])
def test_ranks_are_disjoint_and_cover_the_epoch(sizes, world):
    counts = np.array(sizes)
    total = counts.sum()
    for epoch in (0, 1):
        plans = [EpochPlan(counts, 11, epoch, r, world) for r in range(world)]
        seen = []
        per_rank = []
        for plan in plans:
            assert plan.length == total // world
            refs = [(s, int(row)) for s, rows in plan.refs(0, plan.length) for row in rows]
            assert len(refs) == plan.length
            seen.extend(refs)
            per_rank.append({s for s, _ in refs})
        assert len(set(seen)) == len(seen)  # disjoint
        everything = {(s, r) for s, n in enumerate(sizes) for r in range(n)}
        assert set(seen) <= everything
        missing = everything - set(seen)
        assert len(missing) == total % world  # policy: the stream's last S % W samples are skipped
        if missing:  # ...which are the tail of the global stream (last shards of the permutation)
            order = plans[0].shard_order
            tail = [(int(s), int(r)) for s in order for r in plans[0].shard_permutation(int(s))]
            assert missing == set(tail[len(tail) - len(missing):])
        if len(set(sizes)) == 1 and len(sizes) % world == 0:  # shards owned whole by one rank
            assert all(not (a & b) for a, b in itertools.combinations(per_rank, 2))
            assert all(len(x) == len(sizes) // world for x in per_rank)
            order = plans[0].shard_order.tolist()
            k = len(sizes) // world
            for r, plan in enumerate(plans):
                assert plan.shards() == order[r * k:(r + 1) * k]


def test_loader_covers_everything_once_per_epoch(shards):
    world = 2  # 198 samples: divides
    keys = all_keys(shards)
    got = []
    for r in range(world):
        loader = ShardLoader(ShardDataset(shards), 8, collate=PADDED, rank=r, world_size=world,
                             seed=5,
                             drop_last=False, prefetch=0)
        got.extend(stream(loader))
    assert sorted(got) == sorted(keys) and len(set(got)) == len(got)


def test_batches_and_last_partial_batch(shards):
    ds = ShardDataset(shards)
    total = ds.num_samples
    for drop_last in (True, False):
        loader = ShardLoader(ds, 16, collate=PADDED, drop_last=drop_last, prefetch=0)
        sizes = [len(b["next_sentence_labels"]) for b in loader]
        assert len(sizes) == len(loader)
        assert all(n == 16 for n in sizes[:-1])
        assert sum(sizes) == (total // 16 * 16 if drop_last else total)
        if not drop_last:
            assert sizes[-1] == total % 16
        b = next(iter(ShardLoader(ds, 16, collate=PADDED, prefetch=0)))
        assert b["input_ids"].shape == (16, L) and b["masked_lm_ids"].shape == (16, P)
    # batches bigger than every shard span several shards
    big = ShardLoader(ds, 100, collate=PADDED, prefetch=0, drop_last=False)
    assert [len(b["next_sentence_labels"]) for b in big] == [100, total - 100]


def test_deterministic_and_epochs_differ(shards):
    def run(**kw):
        return stream(ShardLoader(ShardDataset(shards), 8, collate=PADDED, prefetch=0,
                                  drop_last=False, **kw))
    a = run(seed=1, epoch=0)
    assert a == run(seed=1, epoch=0)
    assert sorted(a) == sorted(run(seed=1, epoch=1)) and a != run(seed=1, epoch=1)
    assert a != run(seed=2, epoch=0)
    # one loader, consecutive loops = consecutive epochs
    loader = ShardLoader(ShardDataset(shards), 8, collate=PADDED, seed=1, prefetch=0,
                         drop_last=False)
    assert stream(loader) == a and loader.state_dict()["epoch"] == 1
    assert stream(loader) == run(seed=1, epoch=1)


@pytest.mark.parametrize("prefetch", [0, 3])
def test_resume_at_any_sample(shards, prefetch):
    ds = ShardDataset(shards)
    kw = dict(rank=1, world_size=2, seed=4, epoch=2, drop_last=False, prefetch=prefetch)
    full = stream(ShardLoader(ds, 8, collate=PADDED, **kw))
    plan = EpochPlan(ds.counts, 4, 2, 1, 2)
    first_len = len(plan.refs(0, plan.length)[0][1])
    for k in (0, 1, 7, 8, 13, first_len - 1, first_len, first_len + 3, len(full) - 1, len(full)):
        resumed = stream(ShardLoader(ds, 8, collate=PADDED, start_sample=k, **kw))
        assert resumed == full[k:], k
    # aligned positions give identical batches (drop_last too)
    base = [b["input_ids"]
            for b in ShardLoader(ds, 8, collate=PADDED, **{**kw, "drop_last": True})]
    again = [b["input_ids"] for b in ShardLoader(ds, 8, collate=PADDED, start_sample=24,
                                                 **{**kw, "drop_last": True})]
    assert all(np.array_equal(x, y) for x, y in zip(base[3:], again, strict=True))


@pytest.mark.parametrize("prefetch", [0, 2])
def test_state_dict_round_trip(shards, prefetch):
    ds = ShardDataset(shards)
    full = stream(ShardLoader(ds, 6, collate=PADDED, seed=8, prefetch=prefetch))
    loader = ShardLoader(ds, 6, collate=PADDED, seed=8, prefetch=prefetch)
    it = iter(loader)
    head = [k for _ in range(5) for k in sample_keys(next(it))]
    state = json.loads(json.dumps(loader.state_dict()))  # survives a JSON checkpoint
    assert state["position"] == 30 and state["epoch"] == 0
    it.close()  # the prefetch thread stops
    fresh = ShardLoader(ShardDataset(shards), 6, collate=PADDED, seed=8, prefetch=prefetch)
    fresh.load_state_dict(state)
    assert head + stream(fresh) == full
    assert fresh.state_dict()["epoch"] == 1 and fresh.state_dict()["position"] == 0
    with pytest.raises(UserError, match="world_size"):
        ShardLoader(ds, 6, collate=PADDED, seed=8, world_size=2).load_state_dict(state)
    with pytest.raises(UserError, match="seed"):
        ShardLoader(ds, 6, collate=PADDED, seed=9).load_state_dict(state)
    with pytest.raises(UserError, match="fingerprint"):
        ShardLoader(ShardDataset(shards[:-1]), 6, seed=8).load_state_dict(state)


@pytest.mark.parametrize("collate", [PADDED, collate_varlen])
def test_prefetch_on_and_off_identical(shards, collate):
    def batches(prefetch):
        return list(ShardLoader(ShardDataset(shards), 7, collate=collate, seed=3,
                                prefetch=prefetch, drop_last=False))
    a, b = batches(0), batches(4)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def test_varlen_matches_padded(shards):
    ds = ShardDataset(shards)
    padded = list(ShardLoader(ds, 9, collate=PADDED, seed=2, prefetch=0))
    varlen = list(ShardLoader(ds, 9, seed=2, prefetch=0))  # collate_varlen: the default
    for p, v in zip(padded, varlen, strict=True):
        lengths = p["input_mask"].sum(axis=1)
        assert np.array_equal(np.diff(v["cu_seqlens"]), lengths)
        assert int(v["max_seqlen"]) == lengths.max()
        mask = p["input_mask"].astype(bool)
        assert np.array_equal(v["input_ids"], p["input_ids"][mask])
        assert np.array_equal(v["segment_ids"], p["segment_ids"][mask])
        assert np.array_equal(v["position_ids"], np.nonzero(mask)[1])
        real = p["masked_lm_positions"] != 0
        rows = np.nonzero(real)[0]
        assert np.array_equal(v["masked_lm_positions"],
                              v["cu_seqlens"][rows] + p["masked_lm_positions"][real])
        assert np.all(v["masked_lm_positions"] < v["cu_seqlens"][rows + 1])
        assert np.array_equal(v["masked_lm_ids"], p["masked_lm_ids"][real])
        assert np.array_equal(np.diff(v["cu_masked"]), real.sum(axis=1))
        assert np.array_equal(v["next_sentence_labels"], p["next_sentence_labels"])
    empty = collate_varlen(Samples.concat([synthetic_samples(1, 0, L, P).take(np.arange(0))]))
    assert empty["cu_seqlens"].tolist() == [0] and int(empty["max_seqlen"]) == 0


def test_lazy_open_and_bounded_cache(tmp_path):
    paths = make_shards(tmp_path / "many", [3] * 60, seed=1)
    ds = ShardDataset(paths, cache_size=3)
    assert not ds._readers  # constructing opens nothing
    loader = ShardLoader(ds, 4, collate=PADDED, prefetch=2, world_size=3, rank=1)
    plan = loader.plan()
    touched = plan.shards()
    assert len(touched) == 20  # its own third of the shards
    for _ in loader:
        assert len(ds._readers) <= 3
    assert set(ds._readers) <= set(touched)


def test_manifest_counts_used_and_checked(tmp_path):
    paths = make_shards(tmp_path / "m", [4, 6], seed=2)
    doc = {"format": "bertperf-manifest/1", "files": {
        name: {"md5": "0" * 32, "bytes": 1, "samples": n, "stage": "chop", "key": "k"}
        for name, n in (("part_00000.h5", 4), ("part_00001.h5", 7))}}
    (tmp_path / "m" / "MANIFEST.json").write_text(json.dumps(doc))
    ds = ShardDataset.from_folder(tmp_path / "m")
    assert ds.counts.tolist() == [4, 7] and ds.max_seq_length == L and ds.max_pred == P
    with pytest.raises(UserError, match="part_00001.h5: holds 6 samples, but 7"):
        list(ShardLoader(ds, 2, collate=PADDED, prefetch=2))
    with pytest.raises(UserError, match="no sample files"):
        ShardDataset.from_folder(tmp_path)
    (tmp_path / "m" / "MANIFEST.json").unlink()  # without a manifest: counts from the headers
    assert ShardDataset(paths).counts.tolist() == [4, 6]


def test_producer_error_reaches_the_consumer(tmp_path):
    paths = make_shards(tmp_path / "e", [5, 5], seed=4)
    ds = ShardDataset(paths)
    paths[1].write_bytes(b"not hdf5 at all")
    for prefetch in (0, 2):
        with pytest.raises(UserError, match="part_00001.h5"):
            list(ShardLoader(ShardDataset(paths, counts=ds.counts), 3, collate=PADDED,
                             prefetch=prefetch))


def test_arguments_checked(shards):
    ds = ShardDataset(shards)
    for kw in ({"batch_size": 0}, {"rank": 2, "world_size": 2}, {"split": "x"}, {"seed": -1}):
        args = {"batch_size": 4, **kw}
        with pytest.raises(ValueError):
            ShardLoader(ds, args.pop("batch_size"), collate=PADDED, **args)


def test_to_torch_is_optional(shards):
    from bertperf.data.collate import to_torch
    batch = next(iter(ShardLoader(ShardDataset(shards), 4, collate=PADDED, prefetch=0)))
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match="PyTorch"):
            to_torch(batch)
        return
    out = to_torch(batch)
    assert all(np.array_equal(out[k].numpy(), batch[k]) for k in batch)


def test_bench_runs(capsys):
    from bertperf.__main__ import main
    assert main(["bench", "loader", "--seconds", "0.2", "--shards", "2", "--samples_per_shard",
                 "300", "--rss_shards", "30", "--rss_samples_per_shard", "5"]) == 0
    out = capsys.readouterr().out
    assert "unpadded shards -> padded" in out and "unpadded shards -> varlen" in out
    assert "packed shards -> packed" in out
    assert "peak RSS" in out and "30 shards" in out


def test_bench_help_speaks_of_the_benchmark(capsys):
    """The help describes the measurement and its goal, without pointers into planning notes."""
    import re

    from bertperf.__main__ import main
    with pytest.raises(SystemExit):
        main(["bench", "loader", "--help"])
    text = capsys.readouterr().out
    assert "Goal: >= 5,000 samples/s from one worker" in text and "< 2 GB per rank" in text
    assert not re.search(r"\bissues? \d|§|_anchors|_facts", text), text


# ---- packed shards (bertperf-packed/1) -----------------------------------------------------------

@pytest.fixture(scope="module")
def packed_shards(tmp_path_factory) -> list[Path]:
    return write_synthetic_packed(tmp_path_factory.mktemp("packed"), 5, 37, seed=6,
                                  max_seq_length=L, max_pred=P)


def row_keys(batch: dict) -> list[bytes]:
    return [batch["input_ids"][i].tobytes() + batch["next_sentence_labels"][i].tobytes()
            for i in range(len(batch["input_ids"]))]


def test_packed_reader_matches_packed_batch(packed_shards):
    from bertperf.formats.packed import read_packed

    full, meta = read_packed(packed_shards[0])
    r = open_shard(packed_shards[0])
    assert isinstance(r, PackedReader) and r.mode == "mmap" and len(r) == len(full)
    rows = permutation(len(full), 3)[:9]
    a = r.batch(rows, L, 3, P)
    b = full.batch(rows, L, 3, P)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert isinstance(open_shard(make_shards(Path(packed_shards[0]).parent.parent / "u", [2])[0]),
                      ShardReader)
    with pytest.raises(IndexError):
        r.batch(np.array([len(full)]), L, 3, P)


def test_packed_loader(packed_shards):
    ds = ShardDataset(packed_shards)
    assert ds.packed and ds.max_seqs_per_row == 3
    with pytest.raises(ValueError, match="collated by collate_packed"):
        ShardLoader(ds, 4, collate=PADDED)
    kw = dict(seed=2, drop_last=False)
    full = [k for b in ShardLoader(ds, 5, prefetch=0, **kw) for k in row_keys(b)]
    assert len(full) == ds.num_samples == len(set(full))  # every row once
    b0 = next(iter(ShardLoader(ds, 5, prefetch=0, **kw)))
    assert b0["input_ids"].shape == (5, L) and b0["next_sentence_labels"].shape == (5, 3)
    assert b0["masked_lm_positions"].shape == (5, 3 * P)
    # prefetch identical, resume exact, ranks disjoint
    assert [k for b in ShardLoader(ds, 5, prefetch=3, **kw) for k in row_keys(b)] == full
    for k in (1, 7, 33):
        assert [x for b in ShardLoader(ds, 5, prefetch=2, start_sample=k, **kw)
                for x in row_keys(b)] == full[k:]
    ranks = [[x for b in ShardLoader(ds, 4, rank=r, world_size=3, prefetch=0, **kw)
              for x in row_keys(b)] for r in range(3)]
    flat = [x for r in ranks for x in r]
    assert len(set(flat)) == len(flat) == ds.num_samples // 3 * 3


def test_formats_do_not_mix(shards, packed_shards):
    with pytest.raises(UserError, match="unpadded shard among packed ones"):
        ShardDataset([packed_shards[0], shards[0]])


# ---- split="global_batch": the ranks share each global batch ---------------------------------------

def _ids(batch):
    return [tuple(r) for r in batch["input_ids"].tolist()]


@pytest.mark.parametrize("world,b,drop_last", [(2, 4, True), (3, 5, False), (4, 1, True),
                                               (2, 7, False)])
def test_global_batch_split_unions_to_the_one_rank_batch(shards, world, b, drop_last):
    """Each global batch, its per-rank parts concatenated in rank order, is the batch of a 1-rank
    loader with batch_size W*b, in order, over two epochs."""
    ds = ShardDataset(shards)
    kw = dict(seed=3, prefetch=0, drop_last=drop_last, split="global_batch")
    one = ShardLoader(ds, world * b, collate=PADDED, **kw)
    ranks = [ShardLoader(ds, b, collate=PADDED, rank=r, world_size=world, **kw)
             for r in range(world)]
    for _ in range(2):
        want = [_ids(x) for x in one]
        got = [[_ids(x) for x in loader] for loader in ranks]
        assert all(len(g) == len(ranks[0]) for g in got)
        if drop_last:
            assert len(want) == len(got[0])
            assert [sum((g[i] for g in got), []) for i in range(len(want))] == want
        else:  # the same samples in the same order (the partial tail is split m rows per rank)
            flat_one = sum(want, [])
            blocks = [sum((g[i] for g in got), []) for i in range(len(got[0]))]
            flat = sum(blocks, [])
            assert len(flat) == len(flat_one) // world * world and flat == flat_one[:len(flat)]


def test_global_batch_split_covers_the_epoch_once(shards):
    ds = ShardDataset(shards)
    world, b = 3, 4
    seen = [x for r in range(world)
            for batch in ShardLoader(ds, b, collate=PADDED, rank=r, world_size=world, seed=1,
                                     prefetch=0, drop_last=False, split="global_batch")
            for x in _ids(batch)]
    assert len(seen) == len(set(seen)) == ds.num_samples // world * world


@pytest.mark.parametrize("prefetch", [0, 2])
def test_global_batch_resume_is_exact(shards, prefetch):
    import json
    ds = ShardDataset(shards)
    kw = dict(rank=1, world_size=2, seed=4, prefetch=prefetch, split="global_batch")
    full = ShardLoader(ds, 3, collate=PADDED, **kw)
    want = [_ids(x) for x in full] + [_ids(x) for x in full]
    part = ShardLoader(ds, 3, collate=PADDED, **kw)
    it = iter(part)
    head = [_ids(next(it)) for _ in range(5)]
    it.close()
    state = json.loads(json.dumps(part.state_dict()))
    assert state["split"] == "global_batch"
    fresh = ShardLoader(ds, 3, collate=PADDED, **kw)
    fresh.load_state_dict(state)
    tail = [_ids(x) for x in fresh] + [_ids(x) for x in fresh]
    assert head + tail[:len(want) - 5] == want
    with pytest.raises(UserError, match="split"):
        ShardLoader(ds, 3, collate=PADDED, rank=1, world_size=2, seed=4).load_state_dict(state)
    with pytest.raises(UserError, match="batch_size"):
        ShardLoader(ds, 4, collate=PADDED, **kw).load_state_dict(state)


# ---- packed batches for a fixed-shape trainer ----------------------------------------------------

def test_packed_batches_keep_one_shape_and_count_themselves(packed_shards):
    """Every packed batch of two epochs has the same shapes (B rows, L tokens, K slots, the
    masks_per_row bound), its cu_seqlens cover the B*L tokens, and its host counts are the
    data's: this rank's masks, sequences and tokens, and the whole global batch's sequences."""
    import torch

    from bertperf.data.collate import max_masks_per_row
    from bertperf.model import PackedBatch
    ds = ShardDataset(packed_shards)
    bound = max_masks_per_row(L, 3, P, 0.15)
    assert bound < 3 * P
    shapes, sequences = set(), []
    loaders = [ShardLoader(ds, 4, rank=r, world_size=2, seed=5, prefetch=0,
                           split="global_batch", masks_per_row=bound) for r in range(2)]
    for _ in range(2):
        for a, b in zip(*[list(loader) for loader in loaders]):
            assert a["global_sequences"] == b["global_sequences"] == \
                a["num_sequences"] + b["num_sequences"]
            sequences.append(int(a["global_sequences"]))
            for arrays in (a, b):
                batch = PackedBatch.from_arrays(arrays)
                shapes.add(tuple((k, tuple(v.shape)) for k, v in batch.inputs().items()
                                 if isinstance(v, torch.Tensor)))
                assert batch.cu_seqlens[-1] == 4 * L and batch.max_seqlen == L
                assert batch.masked_lm_weights.sum() == arrays["num_masked"]
                assert batch.next_sentence_weights.sum() == arrays["num_sequences"]
                assert int((batch.input_ids != 0).sum()) == arrays["num_tokens"]
    assert len(shapes) == 1 and len(sequences) > 10
    one = ShardLoader(ds, 8, seed=5, prefetch=0, split="global_batch", masks_per_row=bound)
    alone = [(int(x["global_sequences"]), int(x["num_sequences"])) for _ in range(2) for x in one]
    assert [g for g, _ in alone] == [n for _, n in alone] == sequences


def test_a_row_beyond_the_mask_bound_is_named(packed_shards):
    ds = ShardDataset(packed_shards)
    with pytest.raises(UserError, match=r"part_\d+\.h5: row \d+ holds \d+ masked tokens, more "
                                        r"than the 5 a packed batch has room for") as err:
        for _ in ShardLoader(ds, 4, prefetch=0, masks_per_row=5):
            pass
    assert "\n" not in str(err.value)


def test_a_prefetch_abandoned_in_a_cycle_and_collected_on_its_own_thread_is_quiet(monkeypatch):
    """The garbage collector may finalise an abandoned prefetching block on whichever thread
    allocates, its own producer thread too: leaving the block there stops the thread without
    joining it (a thread cannot join itself), and nothing is reported as unraisable."""
    import gc
    import sys
    import threading

    from bertperf.data.loader import prefetched
    unraisable, dropped, finished = [], threading.Event(), threading.Event()
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    def items():
        yield 0
        dropped.wait(10)
        gc.collect()  # here the block is finalised, on this (the producer's) thread
        finished.set()
        yield 1

    block = prefetched(items(), 1)
    consumer = block.__enter__()
    assert next(consumer) == 0
    block.cycle = block  # only the collector can finalise it now
    gc.disable()
    try:
        del block, consumer
        dropped.set()
        assert finished.wait(10)
    finally:
        gc.enable()
    assert [str(u.exc_value) for u in unraisable] == []
