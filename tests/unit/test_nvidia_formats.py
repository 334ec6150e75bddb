"""NVIDIA's layouts: variable-length files (segment ids checked, their eval file read by the
trainer) and packed training files (read, written, and taken by unpad, chop, pack and stats)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from bertperf.__main__ import main
from bertperf.data.synthetic import synthetic_packed
from bertperf.errors import UserError
from bertperf.formats import detect, nvidia, reading
from bertperf.formats import padded as hdf5io
from bertperf.formats.samples import Samples
from bertperf.formats.unpadded import read_shard
from tests.support.samples import make_samples, sample_digests


def samples(seed: int, n: int = 40) -> Samples:
    rng = np.random.default_rng(seed)
    return make_samples(rng, rng.integers(12, 300, size=n))


@pytest.fixture(scope="module")
def nv_packed(tmp_path_factory) -> tuple[Path, list[Samples]]:
    """Two NVIDIA packed files named as theirs (part_XXXXX, no suffix), and their sequences."""
    folder = tmp_path_factory.mktemp("nvidia_packed")
    parts = [samples(1), samples(2, 25)]
    for k, s in enumerate(parts):
        nvidia.write_packed(folder / f"part_{k:05d}", synthetic_packed(s))
    return folder, parts


def cli(stage: str, *args) -> int:
    return main(["prep", stage, *(str(a) for a in args)])


def error_line(capsys) -> str:
    """The error line a failed stage ends with (no traceback before it)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in err), err
    assert err and err[-1].startswith("bertperf: error: "), err
    return err[-1]


def set_entry(path: Path, dataset: str, index: int, values) -> None:
    with h5py.File(path, "a") as f:
        f[dataset][index] = np.asarray(values, dtype=h5py.check_vlen_dtype(f[dataset].dtype))


# ---- variable-length files ---------------------------------------------------------------------

@pytest.mark.parametrize("segments", ["1 before 0", "0 after 1", "not 0 or 1"])
def test_varlen_segment_ids_are_checked(tmp_path, capsys, segments):
    s = samples(3, 10)
    path = tmp_path / "v.hdf5"
    nvidia.write_varlen(path, s)
    assert nvidia.read_varlen(path, 512, 76).equals(s)
    n, b = int(s.lengths[4]), int(s.b_starts[4])
    seg = (np.arange(n) >= b).astype(np.int8)
    if segments == "1 before 0":
        seg[0] = 1
    elif segments == "0 after 1":
        seg[-1] = 0
    else:
        seg[b] = 2
    set_entry(path, "segment_ids", 4, seg)
    with pytest.raises(UserError, match=f"^{path}: sample 4: segment_ids are not 0s then 1s"):
        nvidia.read_varlen(path)
    assert cli("unpad", "--input", path, "--output", tmp_path / "out", "--workers", "1") == 1
    assert f"{path}: sample 4: segment_ids are not 0s then 1s" in error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_varlen_round_trip_with_equal_lengths(tmp_path):
    """Samples all of one length (a padded-looking file) are written and read back as well."""
    s = make_samples(np.random.default_rng(7), np.full(6, 40))
    nvidia.write_varlen(tmp_path / "v.hdf5", s)
    assert nvidia.read_varlen(tmp_path / "v.hdf5").equals(s)


def test_trainer_reads_nvidia_varlen_eval_file(tmp_path, capsys):
    """The padded eval set and NVIDIA's variable-length one give the trainer the same samples;
    other layouts are a one-line error naming the file."""
    from bertperf.train.evaluation import load_eval_share
    from bertperf.train.preflight import eval_count_problem

    s = samples(4, 30)
    padded_dir = tmp_path / "eval"
    padded_dir.mkdir()
    hdf5io.write_samples(padded_dir / "eval_10k.hdf5", s, np.arange(len(s)), 512, 76, 30522)
    nv_dir = tmp_path / "eval_varlength"
    assert cli("unpad", "--input", padded_dir, "--output", nv_dir, "--output_format", "nvidia",
               "--workers", "1") == 0
    nv_file = nv_dir / "eval_10k.hdf5"
    assert detect.kind(nv_file) == detect.NVIDIA
    for rank, world in ((0, 1), (1, 3)):
        want, total = load_eval_share(padded_dir / "eval_10k.hdf5", rank, world)
        got, nv_total = load_eval_share(nv_file, rank, world)
        assert got.equals(want) and total == nv_total == len(s)
    # the preflight count check still applies (prep unpad recorded the count)
    assert eval_count_problem(nv_file, len(s)) is None
    assert "eval samples read, the manifest recorded 30" in eval_count_problem(nv_file, 29)
    packed = tmp_path / "part_00000"
    nvidia.write_packed(packed, synthetic_packed(s))
    with pytest.raises(UserError, match=f"^{packed}: an NVIDIA packed file, not a padded sample "
                                        "file or an NVIDIA variable-length file$"):
        load_eval_share(packed, 0, 1)


# ---- packed files --------------------------------------------------------------------------------

def test_packed_round_trip(tmp_path):
    """Our samples -> NVIDIA packed file -> read back: the same rows and the same samples."""
    s = samples(5)
    rows = synthetic_packed(s)
    path = tmp_path / "part_00007"
    nvidia.write_packed(path, rows)
    assert detect.kind(path) == detect.NVIDIA_PACKED
    assert detect.sample_files(tmp_path) == [path]
    back = nvidia.read_packed(path)
    assert back.equals(rows) and back.to_samples().equals(s)
    got, length, preds = reading.read_samples(path)
    assert got.equals(s) and (length, preds) == (512, 76)
    with h5py.File(path) as f:
        assert sorted(f) == sorted(nvidia.PACKED_FIELDS)
        for k, dt in (("input_ids", np.int16), ("segment_ids", np.int8),
                      ("packed_input_len", np.int16), ("masked_lm_positions", np.int16),
                      ("masked_lm_ids", np.int16), ("packed_masked_lm_len", np.int16),
                      ("next_sentence_labels", np.int8)):
            assert h5py.check_vlen_dtype(f[k].dtype) == dt, k
        # row 0 as NVIDIA writes it: its sequences back to back, positions offset by the row
        n0, n1 = (int(x) for x in rows.seq_lengths[:2])
        assert f["packed_input_len"][0][:2].tolist() == [n0, n1]
        m0 = int(s.mlm_counts[0])
        assert f["masked_lm_positions"][0][m0:m0 + 2].tolist() == \
            (s.mlm_positions[s.mlm_offsets[1]:s.mlm_offsets[1] + 2] + n0).tolist()
        seg = f["segment_ids"][0][n0:n0 + n1]
        assert seg.tolist() == (np.arange(n1) >= s.b_starts[1]).astype(int).tolist()
        k = len(f["packed_input_len"][0])
        assert f["next_sentence_labels"][0].tolist() == s.nsp[:k].tolist()


@pytest.mark.parametrize("damage", ["lengths", "segments", "labels", "position", "mask_count"])
def test_packed_bad_rows(tmp_path, capsys, damage):
    s = samples(6, 20)
    rows = synthetic_packed(s)
    path = tmp_path / "part_00000"
    nvidia.write_packed(path, rows)
    r = 2
    with h5py.File(path) as f:
        entry = {k: f[k][r] for k in nvidia.PACKED_FIELDS}
    assert len(entry["packed_input_len"]) >= 2
    if damage == "lengths":
        set_entry(path, "packed_input_len", r, entry["packed_input_len"] + 1)
        needle = f"row {r}: packed_input_len adds up to"
    elif damage == "segments":
        seg = entry["segment_ids"].copy()
        seg[int(entry["packed_input_len"][0])] = 1  # the second sequence starts with segment B
        set_entry(path, "segment_ids", r, seg)
        needle = f"row {r}: segment_ids are not 0s then 1s"
    elif damage == "labels":
        set_entry(path, "next_sentence_labels", r, entry["next_sentence_labels"][:-1])
        needle = f"row {r}: next_sentence_labels holds"
    elif damage == "position":  # the first mask of the row's second sequence, in the first one
        pos = entry["masked_lm_positions"].copy()
        pos[int(entry["packed_masked_lm_len"][0])] = 1
        set_entry(path, "masked_lm_positions", r, pos)
        needle = f"row {r}: a masked position lies outside its sequence"
    else:
        set_entry(path, "packed_masked_lm_len", r, entry["packed_masked_lm_len"] + 1)
        needle = f"row {r}: masked_lm_positions holds"
    with pytest.raises(UserError, match=f"^{path}: {needle}"):
        nvidia.read_packed(path)
    for stage, flags in (("unpad", []), ("chop", ["--num_shards", 1]), ("pack", [])):
        out = tmp_path / f"out_{stage}"
        assert cli(stage, "--input", tmp_path, "--output", out, "--workers", 1, *flags) == 1
        line = error_line(capsys)
        assert f"{path}: {needle}" in line, (stage, line)
        assert not out.exists()


def test_unpad_chop_pack_stats_take_nvidia_packed(tmp_path, nv_packed):
    folder, parts = nv_packed
    everything = sample_digests(Samples.concat(parts))
    # unpad, detected or named: each file's sequences, in row order
    for flags in ([], ["--input_format", "nvidia-packed"]):
        out = tmp_path / f"unpad{len(flags)}"
        assert cli("unpad", "--input", folder, "--output", out, "--workers", 1, *flags) == 0
        for k, s in enumerate(parts):
            got, meta = read_shard(out / f"part_{k:05d}.h5")
            assert got.equals(s) and (meta["max_seq_length"], meta["max_predictions_per_seq"]) \
                == (512, 76)
        assert cli("verify", out) == 0
    # chop: every sequence once
    chopped = tmp_path / "chopped"
    assert cli("chop", "--input", folder, "--output", chopped, "--num_shards", 4,
               "--workers", 1) == 0
    shards = [read_shard(p)[0] for p in sorted(chopped.glob("*.h5"))]
    assert len(shards) == 4 and sample_digests(Samples.concat(shards)) == everything
    # pack: the sequences packed anew, and back
    packed, unpacked = tmp_path / "packed", tmp_path / "unpacked"
    assert cli("pack", "--input", folder, "--output", packed, "--workers", 1) == 0
    assert cli("pack", "--unpack", "--input", packed, "--output", unpacked, "--workers", 1) == 0
    back = Samples.concat([read_shard(p)[0] for p in sorted(unpacked.glob("*.hdf5"))])
    assert sample_digests(back) == everything
    # stats: sequences, and the rows as NVIDIA packed them
    js = tmp_path / "stats.json"
    assert cli("stats", folder, "--png", tmp_path / "s.png", "--json", js, "--workers", 1) == 0
    st = json.loads(js.read_text())
    rows = [synthetic_packed(s) for s in parts]
    tokens = sum(int(s.lengths.sum()) for s in parts)
    assert (st["kind"], st["samples"], st["tokens"]) == \
        ("nvidia-packed", sum(map(len, parts)), tokens)
    assert st["packing"]["rows"] == sum(len(r) for r in rows)
    assert st["packing"]["efficiency"] == pytest.approx(tokens / (512 * st["packing"]["rows"]))
