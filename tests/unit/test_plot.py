"""bertperf.mlperf.plot: curves read back from an MLPerf log, the PNG, and bad logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bertperf.errors import UserError
from bertperf.mlperf.plot import plot_log, read_curves
from tests.support.paths import PYTHONPATH


def line(key: str, value, **meta) -> str:
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME",
                                     "key": key, "value": value, "metadata": meta})


def write_log(path: Path) -> Path:
    path.write_text("\n".join([
        line("run_start", None),
        line("train_loss", 10.5, samples_count=64, step=1, lr=1e-3),
        "a progress line that is not MLLOG",
        line("train_loss", 8.25, samples_count=128, step=2, lr=2e-3),
        line("eval_accuracy", 0.125, epoch_num=128),
        line("eval_accuracy", 0.5, epoch_num=256),
    ]) + "\n")
    return path


def test_curves_come_from_train_loss_and_eval_accuracy(tmp_path):
    curves = read_curves(write_log(tmp_path / "result_0.txt"))
    assert curves == {"loss": [(64, 10.5), (128, 8.25)], "accuracy": [(128, 0.125), (256, 0.5)]}


def test_png_is_written_atomically(tmp_path):
    png = plot_log(write_log(tmp_path / "result_0.txt"), tmp_path / "out" / "curves.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in png.parent.iterdir()] == ["curves.png"]


def test_an_output_that_is_a_folder_is_named(tmp_path):
    """--output naming a folder: one line naming it (not the temporary name written beside it)."""
    folder = tmp_path / "pngs"
    folder.mkdir()
    with pytest.raises(UserError) as err:
        plot_log(write_log(tmp_path / "result_0.txt"), folder)
    assert str(err.value) == f"{folder}: is a folder, expected the name of a file to write"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pngs", "result_0.txt"]


def test_bad_logs_are_one_line_errors(tmp_path):
    with pytest.raises(UserError, match="no such MLPerf log"):
        read_curves(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text(line("run_start", None) + "\n")
    with pytest.raises(UserError, match="no train_loss or eval_accuracy"):
        read_curves(empty)
    broken = tmp_path / "broken.txt"
    broken.write_text(line("run_start", None) + "\n:::MLLOG {not json\n")
    with pytest.raises(UserError, match=r"broken.txt:2: malformed"):
        read_curves(broken)


def test_cli(tmp_path):
    log = write_log(tmp_path / "result_0.txt")
    run = subprocess.run([sys.executable, "-m", "bertperf", "plot", str(log)], cwd=tmp_path,
                         capture_output=True, text=True,
                         env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "result_0.txt.png").is_file()


def test_a_disk_that_fills_while_the_png_is_written_keeps_the_earlier_one(tmp_path, small_disk,
                                                                          capsys):
    """Room for the free-space probe, not for the PNG: one line saying the disk is full, and
    the earlier curve (--force) is left as it was, with no temporary beside it."""
    from bertperf.__main__ import main
    disk = small_disk("disk", kib=8)
    earlier = disk / "curves.png"
    earlier.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 8)
    log = write_log(tmp_path / "result_0.txt")
    assert main(["plot", str(log), "--output", str(earlier), "--force"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bertperf: error: {earlier}: cannot write: no space left on device (in "
                   f"{disk}); nothing under that name changed"], err
    assert [p.name for p in disk.iterdir()] == ["curves.png"]
    assert earlier.read_bytes() == b"\x89PNG\r\n\x1a\n" + b"\0" * 8
