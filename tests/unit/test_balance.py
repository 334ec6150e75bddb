"""data/balance.py (placement of a global batch's samples on the ranks) and `bench balance`."""

from __future__ import annotations

import numpy as np
import pytest

from bertperf.__main__ import main
from bertperf.data.synthetic import synthetic_samples, write_synthetic_packed, write_synthetic_shards
from bertperf.data.balance import contiguous, imbalance, loads, place


def mlperf_lengths(n: int, seed: int = 7) -> np.ndarray:
    return synthetic_samples(n, seed, max_seq_length=512).lengths.astype(np.int64)


def check_placement(p: np.ndarray, world: int, b: int) -> None:
    assert p.shape == (world, b) and p.dtype == np.int64
    assert np.array_equal(np.sort(p.reshape(-1)), np.arange(world * b))


@pytest.mark.parametrize("world,b", [(8, 32), (64, 32), (1024, 32), (8, 56), (64, 56), (1024, 56)])
def test_balanced_on_an_mlperf_length_mix(world, b):
    lengths = mlperf_lengths(world * b, seed=world + b)
    p = place(lengths, world)
    check_placement(p, world, b)
    tokens, squares = imbalance(lengths, p)
    assert tokens <= 1.02 and squares <= 1.02
    before = imbalance(lengths, contiguous(world * b, world))
    assert tokens <= before[0] and squares <= before[1]
    assert np.array_equal(place(lengths, world), p)  # deterministic
    assert np.array_equal(place(lengths.copy(), world), p)


def test_never_worse_than_the_contiguous_split_on_many_batches():
    rng = np.random.default_rng(3)
    for trial in range(40):
        world, b = int(rng.integers(1, 40)), int(rng.integers(1, 12))
        lengths = rng.integers(1, 513, world * b) if trial % 2 else mlperf_lengths(world * b, trial)
        p = place(lengths, world)
        check_placement(p, world, b)
        after, before = imbalance(lengths, p), imbalance(lengths, contiguous(world * b, world))
        assert after[0] <= before[0] + 1e-12
        # the deal's bound: max - min of the ranks' tokens <= max(L) - min(L)
        tokens, _ = loads(lengths, place(lengths, world, max_swaps=0))
        assert tokens.max() - tokens.min() <= lengths.max() - lengths.min()



@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_deal_is_a_serpentine(world):
    """Before any swap, the longest-first order is dealt 0..W-1 in even rounds and W-1..0 in odd
    ones: evenly spaced lengths over an even number of rounds give every rank the same tokens."""
    lengths = np.arange(4 * world, 0, -1)
    dealt = place(lengths, world, max_swaps=0)
    order = np.arange(4 * world).reshape(4, world)
    want = np.stack([order[0], order[1, ::-1], order[2], order[3, ::-1]], axis=1)
    assert np.array_equal(np.sort(dealt, axis=1), np.sort(want, axis=1))
    assert len(set(loads(lengths, dealt)[0].tolist())) == 1

def test_refinement_never_raises_the_token_maximum():
    lengths = mlperf_lengths(64 * 3, seed=11)
    dealt = loads(lengths, place(lengths, 64, max_swaps=0))[0]
    refined = loads(lengths, place(lengths, 64, tolerance=0.0))[0]
    assert refined.max() <= dealt.max() and refined.min() >= dealt.min()


def test_edge_cases():
    same = np.full(64, 300)
    p = place(same, 8)
    check_placement(p, 8, 8)
    assert imbalance(same, p) == (1.0, 1.0)
    lengths = mlperf_lengths(56)
    p = place(lengths, 1)  # one rank: everything, longest first
    check_placement(p, 1, 56)
    assert np.all(np.diff(lengths[p[0]]) <= 0) and imbalance(lengths, p) == (1.0, 1.0)
    lengths = mlperf_lengths(16)
    p = place(lengths, 16)  # b = 1: nothing to balance, still a permutation
    check_placement(p, 16, 1)
    assert imbalance(lengths, p) == imbalance(lengths, contiguous(16, 16))
    check_placement(place(np.zeros(0, dtype=np.int64), 4), 4, 0)
    assert imbalance(np.zeros(8), place(np.zeros(8), 4)) == (1.0, 1.0)
    with pytest.raises(ValueError, match="do not split"):
        place(lengths, 3)
    with pytest.raises(ValueError, match="world_size"):
        place(lengths, 0)


def test_bench_balance_prints_its_table(tmp_path, capsys):
    write_synthetic_shards(tmp_path / "shards", shards=2, per_shard=200, seed=1, max_seq_length=64,
                           max_pred=10)
    assert main(["bench", "balance", "--data", str(tmp_path / "shards"), "--ranks", "2,8",
                 "--batch", "4", "--batches", "3"]) == 0
    out = capsys.readouterr().out
    assert ("| ranks | batches (epochs) | tokens max/mean before | after | sum L^2 max/mean before "
            "| after | balancer ms/batch |") in out
    assert "| 2 | 3 (1) |" in out and "| 8 | 3 (1) |" in out and "goal tokens" in out


def test_bench_balance_names_a_bad_folder(tmp_path, capsys):
    assert main(["bench", "balance", "--data", str(tmp_path / "missing")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing" in err[0]


def test_bench_balance_reads_packed_rows_and_stratified_data(tmp_path, capsys):
    write_synthetic_packed(tmp_path / "packed", shards=2, per_shard=300, seed=2,
                           max_seq_length=128, max_pred=20)
    assert main(["bench", "balance", "--data", str(tmp_path / "packed"), "--ranks", "4",
                 "--batch", "4", "--batches", "3"]) == 0
    assert "packed rows" in capsys.readouterr().out
    write_synthetic_shards(tmp_path / "shards", shards=2, per_shard=200, seed=1,
                           max_seq_length=128, max_pred=20)
    assert main(["prep", "stratify", "--input", str(tmp_path / "shards"), "--output",
                 str(tmp_path / "strat"), "--bins", "32,64,96,128", "--workers", "1"]) == 0
    capsys.readouterr()
    assert main(["bench", "balance", "--data", str(tmp_path / "strat"), "--ranks", "2,64",
                 "--batch", "8", "--batches", "5"]) == 0
    out = capsys.readouterr().out
    assert "length-stratified" in out and "| 2 | 5 (1) |" in out
    assert "| 64 | 0 | global batch larger than an epoch" in out
