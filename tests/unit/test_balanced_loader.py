"""The loader's balanced placement (BALANCE) and length-stratified order (LAYOUT=stratified):
every rank's batches of one global batch are a permutation of the unbalanced ones, every sample
once per epoch, deterministic, exact resume; the imbalance bound on an MLPerf-like length mix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertperf.__main__ import main
from bertperf.data.synthetic import synthetic_samples
from bertperf.data.dataset import ShardDataset
from bertperf.data.loader import ShardLoader
from bertperf.data.order import StratifiedPlan, bin_quota
from bertperf.errors import UserError
from bertperf.formats.unpadded import write_shard

L, P = 128, 20


def _ids(batch: dict) -> list[tuple]:
    """One key per sample of a varlen batch (its tokens; unique in these shards)."""
    ids, cu = batch["input_ids"], batch["cu_seqlens"]
    return [tuple(ids[cu[i]:cu[i + 1]].tolist()) for i in range(len(cu) - 1)]


def _lengths(batch: dict) -> np.ndarray:
    return np.diff(batch["cu_seqlens"])


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("unpadded")
    for i, n in enumerate([97, 64, 3, 120, 71]):
        write_shard(folder / f"part_{i:05d}.h5", synthetic_samples(n, 70 + i, L, P), L, P)
    return folder


def loaders(ds, b, world, **kw):
    kw = {"seed": 5, "prefetch": 0, "split": "global_batch", **kw}
    return [ShardLoader(ds, b, rank=r, world_size=world, **kw) for r in range(world)]


@pytest.mark.parametrize("world,b,drop_last", [(2, 8, True), (4, 5, True), (3, 6, False)])
def test_balance_only_moves_samples_within_a_global_batch(shards, world, b, drop_last):
    ds = ShardDataset.from_folder(shards)
    plain = loaders(ds, b, world, drop_last=drop_last)
    balanced = loaders(ds, b, world, drop_last=drop_last, balance=True)
    for _ in range(2):  # two epochs
        want = list(zip(*[[_ids(x) for x in loader] for loader in plain]))
        got = list(zip(*[[_ids(x) for x in loader] for loader in balanced]))
        assert len(got) == len(want) > 0
        for w, g in zip(want, got):
            assert [len(x) for x in g] == [len(x) for x in w]  # b samples a rank, fixed shapes
            assert sorted(sum(g, [])) == sorted(sum(w, []))  # the same global batch
            stream = sum(w, [])  # the unbalanced ranks' parts in turn: the stream's order
            for part in g:  # a rank's samples keep the stream's order
                assert [stream.index(x) for x in part] == sorted(stream.index(x) for x in part)
        seen = [s for step in got for part in step for s in part]
        assert len(seen) == len(set(seen))  # every sample at most once per epoch ...
    assert len(seen) == (ds.num_samples // world // b * b if drop_last else
                         ds.num_samples // world) * world  # ... and all of the epoch's


def test_balance_evens_the_tokens_and_is_deterministic(shards):
    ds = ShardDataset.from_folder(shards)
    world, b = 4, 12
    plain = loaders(ds, b, world)
    balanced = loaders(ds, b, world, balance=True)
    before = [[_lengths(x).sum() for x in loader] for loader in plain]
    batches = [list(loader) for loader in balanced]
    after = [[_lengths(x).sum() for x in rank] for rank in batches]
    ratio = lambda t: float(np.mean(np.max(t, 0) / np.mean(t, 0)))  # noqa: E731
    assert ratio(np.array(after)) < 1.01 < ratio(np.array(before))
    again = loaders(ShardDataset.from_folder(shards), b, world, balance=True)
    assert [[_ids(x) for x in loader] for loader in again] == \
        [[_ids(x) for x in rank] for rank in batches]


@pytest.mark.parametrize("position", [0, 12, 17, 36])
def test_balanced_resume_is_exact(shards, position):
    ds = ShardDataset.from_folder(shards)
    kw = {"rank": 2, "world_size": 3, "seed": 9, "split": "global_batch",
          "balance": True}
    full = ShardLoader(ds, 6, prefetch=0, **kw)
    want = [[s for x in full for s in _ids(x)] for _ in range(2)]
    part = ShardLoader(ds, 6, prefetch=2, **kw)
    part.load_state_dict({**part.state_dict(), "position": position})
    state = json.loads(json.dumps(part.state_dict()))
    fresh = ShardLoader(ds, 6, prefetch=2, **kw)
    fresh.load_state_dict(state)
    got = [[s for x in fresh for s in _ids(x)] for _ in range(2)]
    # the stream from `position` on (the epoch's last partial batch is dropped), then epoch 1
    assert len(got[0]) == (118 - position) // 6 * 6
    assert got[0] == want[0][position:position + len(got[0])] and got[1] == want[1]
    with pytest.raises(UserError, match="balance"):
        ShardLoader(ds, 6, prefetch=0, **{**kw, "balance": False}).load_state_dict(state)


def test_balance_on_an_mlperf_like_mix_meets_the_bound(tmp_path):
    """Lengths drawn like MLPerf's (about 40 % of samples at 512, the rest spread below),
    8 ranks of 32: tokens max/mean <= 1.02 for every global batch through the loader."""
    rng = np.random.default_rng(0)
    for i in range(4):
        s = synthetic_samples(400, 90 + i, 512, 76)
        keep = np.where(rng.random(len(s)) < 0.4, 512, rng.integers(40, 512, len(s)))
        cut = s.take(np.arange(len(s)))
        write_shard(tmp_path / f"part_{i:05d}.h5", _truncate(cut, keep), 512, 76)
    ds = ShardDataset.from_folder(tmp_path)
    tokens = np.array([[_lengths(x).sum() for x in loader]
                       for loader in loaders(ds, 32, 8, balance=True)])
    assert tokens.shape[1] == 6 and (tokens.max(0) / tokens.mean(0)).max() <= 1.02


def _truncate(s, keep):
    """Samples `s` cut to at most `keep[i]` tokens each (masks beyond the cut dropped)."""
    from bertperf.formats.samples import Samples, offsets_from_lengths
    n = np.minimum(s.lengths, keep)
    ids = np.concatenate([s.input_ids[s.offsets[i]:s.offsets[i] + n[i]] for i in range(len(s))])
    pos, mid, counts = [], [], []
    for i in range(len(s)):
        p = s.mlm_positions[s.mlm_offsets[i]:s.mlm_offsets[i + 1]]
        m = s.mlm_ids[s.mlm_offsets[i]:s.mlm_offsets[i + 1]]
        pos.append(p[p < n[i]])
        mid.append(m[p < n[i]])
        counts.append(int((p < n[i]).sum()))
    return Samples(ids, offsets_from_lengths(n), np.minimum(s.b_starts, n - 1),
                   np.concatenate(pos), np.concatenate(mid), offsets_from_lengths(counts), s.nsp)


# ---- LAYOUT=stratified: prep stratify's bins ----------------------------------------------------

@pytest.fixture(scope="module")
def stratified(shards, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("strat") / "out"
    assert main(["prep", "stratify", "--input", str(shards), "--output", str(out),
                 "--bins", "32,64,96,128", "--shards_per_bin", "2", "--workers", "1"]) == 0
    return out


def test_bin_quota_is_proportional():
    assert bin_quota([100, 300, 600, 0], 10).tolist() == [1, 3, 6, 0]
    assert bin_quota([1, 1, 1], 4).tolist() == [2, 1, 1]
    q = bin_quota([7, 50, 311, 25], 56)
    assert q.sum() == 56 and np.all(np.abs(q - 56 * np.array([7, 50, 311, 25]) / 393) < 1)


@pytest.mark.parametrize("world,b", [(1, 10), (2, 8), (3, 5)])
def test_stratified_batches_draw_fixed_counts_from_every_bin(stratified, world, b):
    ds = ShardDataset.from_stratified(stratified)
    summary = json.loads((stratified / "stratify.json").read_text())
    edges = [(int(x["name"][4:].split("-")[0]), int(x["name"][4:].split("-")[1]))
             for x in summary["bins"] if x["samples"]]
    quota = bin_quota([x["samples"] for x in summary["bins"] if x["samples"]], b)
    parts = [[x for x in loader] for loader in loaders(ds, b, world)]
    plan = StratifiedPlan(ds.bin_counts(), 5, 0, 0, world, b)
    assert all(len(p) == plan.batches > 0 for p in parts)
    seen = []
    for rank_batches in parts:
        for x in rank_batches:
            n = _lengths(x)
            got = [int(((n >= lo) & (n <= hi)).sum()) for lo, hi in edges]
            assert got == quota.tolist()
            seen += _ids(x)
    assert len(seen) == len(set(seen)) == plan.batches * b * world
    # every bin gives out all but fewer than W*c_k of its samples for the scarcest bin
    spare = [n - plan.batches * world * q for n, q in
             zip([x["samples"] for x in summary["bins"] if x["samples"]], quota) if q]
    assert min(spare) < world * max(quota)


def test_stratified_with_balance_resumes_exactly(stratified):
    ds = ShardDataset.from_stratified(stratified)
    kw = {"rank": 1, "world_size": 2, "seed": 3, "split": "global_batch",
          "balance": True}
    full = ShardLoader(ds, 8, prefetch=0, **kw)
    want = [s for x in full for s in _ids(x)]
    part = ShardLoader(ds, 8, prefetch=0, **kw)
    part.load_state_dict({**part.state_dict(), "position": 11})
    assert [s for x in part for s in _ids(x)] == want[11:11 + (len(want) - 11) // 8 * 8]
    other = ShardLoader(ShardDataset.from_stratified(stratified), 8, prefetch=0, **kw)
    assert [_ids(x) for x in other] == [_ids(x) for x in ShardLoader(ds, 8, prefetch=0, **kw)]


def test_stratified_epochs_differ_and_bins_are_checked(stratified, tmp_path):
    ds = ShardDataset.from_stratified(stratified)
    loader = ShardLoader(ds, 8, seed=1, prefetch=0, split="global_batch")
    first, second = [_ids(x) for x in loader], [_ids(x) for x in loader]
    assert first != second
    with pytest.raises(UserError, match="stratify.json"):
        ShardDataset.from_stratified(tmp_path)
    (tmp_path / "stratify.json").write_text("{not json")
    with pytest.raises(UserError, match=str(tmp_path)):
        ShardDataset.from_stratified(tmp_path)
    with pytest.raises(ValueError, match="stratified"):
        ShardLoader(ds, 8, split="shards")


def test_trainer_switches_are_checked(stratified, shards):
    """BALANCE parses as yes/no; LAYOUT=stratified is what a stratify output holds and needs
    LOADER_SPLIT=global_batch; an unpadded folder is not stratified: one line each."""
    from bertperf.config import load
    from bertperf.train.checks import prepare
    from bertperf.train.layout import resolve
    from tests.support.copy_task import env_for

    def cfg(root: Path, **extra: str):
        env = env_for(root)
        return load({**env, **extra})

    assert cfg(stratified.parent / "a", BALANCE="1").data.balance is True
    with pytest.raises(UserError, match="BALANCE") as err:
        cfg(stratified.parent / "b", BALANCE="maybe")
    assert "\n" not in str(err.value)
    strat = {"DATADIR_PHASE2": str(stratified)}
    assert resolve(cfg(stratified.parent / "c", **strat)).data.layout == "stratified"
    for extra, message in [({**strat, "LOADER_SPLIT": "shards"}, "needs LOADER_SPLIT"),
                           ({**strat, "LAYOUT": "varlen"}, "holds length-stratified shards"),
                           ({"DATADIR_PHASE2": str(shards), "LAYOUT": "stratified"},
                            "holds unpadded shards")]:
        with pytest.raises(UserError, match=message) as err:
            prepare(cfg(stratified.parent / message.replace(" ", "_"), **extra))
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("balance", [False, True])
def test_a_state_resumes_on_another_world_size_with_the_same_global_batch(shards, balance):
    """split global_batch: a state of 2 ranks x 6 loads into 3 ranks x 4 (and 1 x 12) and the
    global batches go on from the same one; inside a batch, with another global batch, with
    split shards or stratified data it is refused in one line."""
    ds = ShardDataset.from_folder(shards)

    def global_batches(world: int, b: int, state: dict | None = None) -> list[list[tuple]]:
        ranks = loaders(ds, b, world, balance=balance)
        for loader in ranks:
            if state is not None:
                loader.load_state_dict(state)
        return [sorted(sum(parts, [])) for parts in zip(*[[_ids(x) for x in loader]
                                                          for loader in ranks])]

    want = global_batches(2, 6)
    two = loaders(ds, 6, 2, balance=balance)[1]
    it = iter(two)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(two.state_dict()))
    assert global_batches(3, 4, state) == want[5:]
    assert global_batches(1, 12, state) == want[5:]
    for world, b, position, message in [(3, 4, 7, "inside a batch"), (3, 5, 30, "world_size"),
                                        (2, 5, 30, "batch_size")]:
        with pytest.raises(UserError, match=message) as err:
            loaders(ds, b, world, balance=balance)[1].load_state_dict({**state,
                                                                       "position": position})
        assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="world_size"):
        ShardLoader(ds, 4, rank=0, world_size=3, seed=5, split="shards").load_state_dict(
            {**state, "split": "shards"})


def test_stratified_state_stays_at_its_world_size(stratified):
    ds = ShardDataset.from_stratified(stratified)
    state = loaders(ds, 8, 2)[0].state_dict()
    with pytest.raises(UserError, match="world_size"):
        loaders(ds, 4, 4)[0].load_state_dict(state)
