"""`bench layerwise`'s flags, checked before anything is written (tests/e2e/
test_train_layerwise.py runs it on the demo)."""

from __future__ import annotations

from bertperf.__main__ import main


def test_flags_below_one_are_one_line_errors_before_anything_is_written(tmp_path, capsys):
    demo = tmp_path / "demo"
    (demo / "unpadded").mkdir(parents=True)
    (demo / "hdf5" / "eval").mkdir(parents=True)
    (demo / "hdf5" / "eval" / "eval_10k.hdf5").touch()
    out = tmp_path / "out"
    assert main(["bench", "layerwise", "--demo", str(demo), "--batch", "0", "--threads", "0",
                 "--out", str(out)]) != 0
    assert capsys.readouterr().err.strip() == \
        "bertperf: error: --batch, --threads: must be at least 1"
    assert not out.exists()


def study_samples():
    """Two samples: tokens 2000 (x4), 3000 (x2), 4000 (x1) around [CLS]/[SEP]; sample 1 has
    no masked-LM predictions."""
    import numpy as np

    from bertperf.formats.samples import Samples
    return Samples(input_ids=np.array([101, 2000, 103, 102, 2000, 3000, 102,
                                       101, 2000, 2000, 102]),
                   offsets=np.array([0, 7, 11]), b_starts=np.array([4, 3]),
                   mlm_positions=np.array([1, 2, 5]), mlm_ids=np.array([2000, 4000, 3000]),
                   mlm_offsets=np.array([0, 3, 3]), nsp=np.array([0, 1]))


def test_the_study_vocabulary_keeps_the_special_ids_and_the_most_frequent_tokens():
    from bertperf.bench.layerwise import KEPT_IDS, UNK, vocab_map
    mapping = vocab_map([study_samples()], KEPT_IDS + 2)
    assert (mapping[:KEPT_IDS] == list(range(KEPT_IDS))).all()
    assert mapping[2000] == KEPT_IDS and mapping[3000] == KEPT_IDS + 1
    assert mapping[4000] == UNK and mapping.max() == KEPT_IDS + 1


def test_remapped_samples_drop_the_predictions_outside_the_vocabulary():
    from bertperf.bench.layerwise import KEPT_IDS, UNK, remapped, vocab_map
    s = study_samples()
    small = remapped(s, vocab_map([s], KEPT_IDS + 2))
    assert small.input_ids.tolist() == [101, KEPT_IDS, 103, 102, KEPT_IDS, KEPT_IDS + 1, 102,
                                        101, KEPT_IDS, KEPT_IDS, 102]
    assert small.mlm_positions.tolist() == [1, 5]  # position 2's label (4000) is out
    assert small.mlm_ids.tolist() == [KEPT_IDS, KEPT_IDS + 1]
    assert small.mlm_offsets.tolist() == [0, 2, 2] and UNK not in small.mlm_ids


def test_a_vocabulary_outside_its_range_is_one_line(tmp_path, capsys):
    demo = tmp_path / "demo"
    (demo / "unpadded").mkdir(parents=True)
    (demo / "hdf5" / "eval").mkdir(parents=True)
    (demo / "hdf5" / "eval" / "eval_10k.hdf5").touch()
    assert main(["bench", "layerwise", "--demo", str(demo), "--vocab", "50",
                 "--out", str(tmp_path / "out")]) != 0
    assert capsys.readouterr().err.strip() == \
        "bertperf: error: --vocab: from 105 to 30522, not 50"
    assert not (tmp_path / "out").exists()


def test_fewer_samples_than_an_eval_interval_is_one_line(tmp_path, capsys):
    demo = tmp_path / "demo"
    (demo / "unpadded").mkdir(parents=True)
    (demo / "hdf5" / "eval").mkdir(parents=True)
    (demo / "hdf5" / "eval" / "eval_10k.hdf5").touch()
    assert main(["bench", "layerwise", "--demo", str(demo), "--samples", "64", "--stage", "16",
                 "--out", str(tmp_path / "out")]) != 0
    assert capsys.readouterr().err.strip() == ("bertperf: error: --samples 64: fewer than "
                                               "--eval-every 2000, so no run would be evaluated")
    assert not (tmp_path / "out").exists()
