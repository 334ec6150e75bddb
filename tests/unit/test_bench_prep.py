"""`bench prep`: runs end to end on a small text, with the reference row driven through the
TensorFlow stand-in (tools/tf_stub, outside the package) by a script that uses the same TF 1.x
calls as the reference."""

from __future__ import annotations

import importlib.util
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import bertperf
from bertperf.__main__ import main
from bertperf.model.tf_checkpoint import crc32c_numpy
from tests.support.paths import ROOT

STUB = ROOT / "tools" / "tf_stub"

ARTICLE = ('<doc id="{i}" url="u" title="T{i}">\nT{i}\n\n'
           "The first sentence of article {i} is here. It has a second sentence too.\n"
           "Another paragraph follows with more words in it.\n</doc>\n")

# The reference's TensorFlow surface: tf.flags/FLAGS, tf.app.run(), tf.logging, tf.gfile,
# tf.train.Example..., tf.python_io.TFRecordWriter; tensorflow.compat.v1 for tokenization.py.
FAKE_REFERENCE = '''
import tensorflow as tf
import tensorflow.compat.v1 as tf1
flags = tf.flags
FLAGS = flags.FLAGS
flags.DEFINE_string("input_file", None, "")
flags.DEFINE_string("output_file", None, "")
flags.DEFINE_string("vocab_file", None, "")
flags.DEFINE_bool("do_lower_case", True, "")
for name in ("max_seq_length", "max_predictions_per_seq", "random_seed", "dupe_factor"):
    flags.DEFINE_integer(name, 0, "")
flags.DEFINE_float("masked_lm_prob", 0.15, "")

def main(_):
    tf.logging.set_verbosity(tf.logging.INFO)
    files = [f for p in FLAGS.input_file.split(",") for f in tf.gfile.Glob(p)]
    lines = [l for f in files for l in tf1.gfile.GFile(f, "r")]
    writer = tf.python_io.TFRecordWriter(FLAGS.output_file)
    feature = tf.train.Feature(int64_list=tf.train.Int64List(value=[1, 2]))
    for _ in lines:
        example = tf.train.Example(features=tf.train.Features(feature={"x": feature}))
        writer.write(example.SerializeToString())
    writer.close()
    tf.logging.info("Wrote %d total instances", len(lines))

if __name__ == "__main__":
    flags.mark_flag_as_required("input_file")
    tf.app.run()
'''


def masked_crc(data: bytes) -> bytes:
    """TFRecord's masked crc32c, from the project's own crc32c (model.tf_checkpoint)."""
    crc = crc32c_numpy(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def test_tf_stand_in_runs_a_tf1_script(tmp_path):
    (tmp_path / "in.txt").write_text("a\nb\nc\n")
    (tmp_path / "ref.py").write_text(FAKE_REFERENCE)
    run = subprocess.run([sys.executable, "ref.py", "--input_file=in.txt", "--output_file=o",
                          "--vocab_file=v", "--max_seq_length=8"], cwd=tmp_path, text=True,
                         capture_output=True, env={"PYTHONPATH": str(STUB)})
    assert run.returncode == 0, run.stderr
    assert "Wrote 3 total instances" in run.stderr
    records, data = [], (tmp_path / "o").read_bytes()  # TFRecord framing around each Example
    while data:
        n = struct.unpack("<Q", data[:8])[0]
        assert data[8:12] == masked_crc(data[:8])
        assert data[12 + n:16 + n] == masked_crc(data[12:12 + n])
        records.append(data[12:12 + n])
        data = data[16 + n:]
    # Example{features{feature{"x": Feature{int64_list{value: [1, 2]}}}}}, encoded by hand
    assert records == [bytes.fromhex("0a0d0a0b0a017812061a040a020102")] * 3


def test_bench_prep_prints_its_table(tmp_path, capsys, vocab_file):
    text = tmp_path / "text" / "AA"
    text.mkdir(parents=True)
    for k in range(2):
        (text / f"wiki_0{k}").write_text("".join(ARTICLE.format(i=10 * k + i) for i in range(6)))
    assert main(["bench", "prep", "--text", str(tmp_path / "text"), "--repeat", "1",
                 "--skip_python", "--workers", "1", "--vocab_file", str(vocab_file)]) == 0
    out = capsys.readouterr().out
    assert "| prep create (C builder) | 1 |" in out and "start-up: prep create --help" in out
    assert "different numbers of samples" not in out


def test_the_reference_row_runs_under_the_stand_in_it_is_given(tmp_path, capsys, vocab_file):
    """--reference with --tf-stub: the reference script (here one with the reference's TF 1.x
    calls, writing a record a line) runs under the stand-in and is the table's first row."""
    text = tmp_path / "text" / "AA"
    text.mkdir(parents=True)
    (text / "wiki_00").write_text("".join(ARTICLE.format(i=i) for i in range(4)))
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "create_pretraining_data.py").write_text(FAKE_REFERENCE)
    (ref / "tokenization.py").write_text("")
    assert main(["bench", "prep", "--text", str(tmp_path / "text"), "--reference", str(ref),
                 "--tf-stub", str(STUB), "--repeat", "1", "--skip_python", "--workers", "1",
                 "--vocab_file", str(vocab_file)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| reference create_pretraining_data.py | 1 |")
    assert rows[1].split(" | ")[-1] == "1.0x |"


def test_bench_prep_names_a_bad_reference_folder(tmp_path, capsys):
    (tmp_path / "text").mkdir()
    assert main(["bench", "prep", "--text", str(tmp_path / "text"),
                 "--reference", str(tmp_path)]) == 1
    assert "no create_pretraining_data.py, tokenization.py (--reference)" in capsys.readouterr().err


def test_the_stand_in_is_not_part_of_the_package():
    """The TensorFlow stand-in is a tool of the checkout: nothing named tensorflow or tf_stub
    is in the package folder (so the wheel cannot install a `tensorflow` module)."""
    package = Path(bertperf.__file__).parent
    assert (STUB / "tensorflow" / "__init__.py").is_file()
    assert not [p for p in package.rglob("*") if p.name in ("tf_stub", "tensorflow")]


def fake_reference(folder: Path) -> Path:
    folder.mkdir()
    for name in ("create_pretraining_data.py", "tokenization.py"):
        (folder / name).write_text("")
    return folder


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is not None,
                    reason="TensorFlow is installed here")
def test_the_reference_without_tensorflow_or_the_stand_in_is_one_line(tmp_path, capsys):
    (tmp_path / "text").mkdir()
    assert main(["bench", "prep", "--text", str(tmp_path / "text"),
                 "--reference", str(fake_reference(tmp_path / "ref"))]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert "tensorflow" in line and "--tf-stub tools/tf_stub" in line


def test_a_stand_in_folder_without_tensorflow_is_one_line(tmp_path, capsys):
    (tmp_path / "text").mkdir()
    assert main(["bench", "prep", "--text", str(tmp_path / "text"), "--reference",
                 str(fake_reference(tmp_path / "ref")), "--tf-stub", str(tmp_path)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"bertperf: error: {tmp_path}: no tensorflow/__init__.py (--tf-stub")
