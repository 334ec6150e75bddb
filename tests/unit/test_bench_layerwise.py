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
