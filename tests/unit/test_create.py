"""`prep create`, `prep eval` and `prep verify` through the command line, on real and bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from bertperf.__main__ import main
from bertperf.formats import padded as hdf5io
from bertperf.prep.samples.create import fast_engine_available
from tests.support.corpus import canonical_digest, synthetic_corpus

GOLDEN = {  # data_prep_facts.md §A1.6: the reference script, unmodified, on the synthetic corpus
    (128, 20, 2): (245, "208e2065e43346055933549a7625a100"),
    (512, 76, 10): (1002, "d3f0ea783dc94fed7b48a4aa0deb95a4"),
}
ENGINES = [("c", "python"), ("python", "python"), ("c" if fast_engine_available() else "python", "hf")]


@pytest.fixture(scope="module")
def vocab_words(vocab_file) -> list[str]:
    return vocab_file.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, vocab_words) -> Path:
    text = synthetic_corpus(vocab_words)
    assert hashlib.md5(text.encode()).hexdigest() == "59d61d0c34b634d52414aaf43b76e0c2"
    path = tmp_path_factory.mktemp("corpus") / "synthetic.txt"
    path.write_text(text, encoding="utf-8")
    return path


def create(vocab_file, inputs, outputs, *flags) -> int:
    return main(["prep", "create", "--input_file", ",".join(map(str, inputs)),
                 "--output_file", ",".join(map(str, outputs)), "--vocab_file", str(vocab_file),
                 *flags])


@pytest.mark.parametrize("engine,tokenizer", ENGINES)
@pytest.mark.parametrize("length,preds,dupe", sorted(GOLDEN))
def test_golden_vectors(tmp_path, vocab_file, vocab_words, corpus, engine, tokenizer,
                        length, preds, dupe):
    out = tmp_path / "out.hdf5"
    assert create(vocab_file, [corpus], [out], f"--max_seq_length={length}",
                  f"--max_predictions_per_seq={preds}", f"--dupe_factor={dupe}",
                  f"--engine={engine}", f"--tokenizer={tokenizer}") == 0
    arrays = hdf5io.read_samples(out)
    count, digest = GOLDEN[(length, preds, dupe)]
    assert len(arrays["next_sentence_labels"]) == count
    assert canonical_digest(arrays, vocab_words) == digest


def test_hdf5_layout(tmp_path, vocab_file, corpus):
    out = tmp_path / "out.hdf5"
    assert create(vocab_file, [corpus], [out], "--max_seq_length=512",
                  "--max_predictions_per_seq=76") == 0
    with h5py.File(out) as f:
        assert sorted(f) == sorted(hdf5io.DATASETS)
        assert f["input_ids"].dtype == np.int16 and f["input_ids"].shape[1] == 512
        assert f["input_mask"].dtype == np.int8 and f["segment_ids"].dtype == np.int8
        assert f["masked_lm_positions"].dtype == np.int16 and f["masked_lm_ids"].shape[1] == 76
        assert f["next_sentence_labels"].dtype == np.int8 and f["next_sentence_labels"].ndim == 1
    doc = json.loads((tmp_path / "MANIFEST.json").read_text())
    assert doc["files"]["out.hdf5"]["samples"] == len(h5py.File(out)["next_sentence_labels"])


def test_round_robin_outputs_and_multiple_inputs(tmp_path, vocab_file, corpus):
    """Outputs take instances in turn; input files continue one another (no document break)."""
    text = corpus.read_text()
    cut = text.index("\n", len(text) // 2 + 7) + 1  # mid-document
    (tmp_path / "a.txt").write_text(text[:cut])
    (tmp_path / "b.txt").write_text(text[cut:])
    assert create(vocab_file, [corpus], [tmp_path / "one.hdf5"], "--dupe_factor=2") == 0
    assert create(vocab_file, [tmp_path / "a.txt", tmp_path / "b.txt"],
                  [tmp_path / "r0.hdf5", tmp_path / "r1.hdf5"], "--dupe_factor=2") == 0
    one = hdf5io.read_samples(tmp_path / "one.hdf5")
    r0, r1 = (hdf5io.read_samples(tmp_path / f"r{k}.hdf5") for k in (0, 1))
    np.testing.assert_array_equal(one["input_ids"][0::2], r0["input_ids"])
    np.testing.assert_array_equal(one["input_ids"][1::2], r1["input_ids"])


def test_tolerated_inputs(tmp_path, vocab_file):
    """As the reference: one-sentence articles, sentences longer than max_seq_length, CRLF."""
    long_sentence = " ".join(["word"] * 900) + " ."
    text = "only one sentence here .\n\n" + long_sentence + "\nshort end .\r\n\nx y z .\n"
    (tmp_path / "in.txt").write_text(text)
    assert create(vocab_file, [tmp_path / "in.txt"], [tmp_path / "o.hdf5"],
                  "--max_seq_length=64", "--max_predictions_per_seq=10") == 0
    a = hdf5io.read_samples(tmp_path / "o.hdf5")
    assert a["input_mask"].sum(axis=1).max() <= 64 and len(a["input_ids"]) > 10


def test_dir_mode_workers_and_resume(tmp_path, vocab_file, corpus, capsys):
    parts = tmp_path / "parts"
    parts.mkdir()
    docs = corpus.read_text().split("\n\n")
    for k in range(3):
        (parts / f"part-{k:05d}-of-00003").write_text("\n\n".join(docs[k::3]) + "\n")
    flags = ["--vocab_file", str(vocab_file), "--dupe_factor=2", "--input_dir", str(parts)]
    assert main(["prep", "create", *flags, "--output_dir", str(tmp_path / "w1"),
                 "--workers=1"]) == 0
    assert main(["prep", "create", *flags, "--output_dir", str(tmp_path / "w2"),
                 "--workers=2"]) == 0
    m1 = json.loads((tmp_path / "w1" / "MANIFEST.json").read_text())["files"]
    m2 = json.loads((tmp_path / "w2" / "MANIFEST.json").read_text())["files"]
    assert len(m1) == 3 and {k: v["md5"] for k, v in m1.items()} == \
        {k: v["md5"] for k, v in m2.items()}
    capsys.readouterr()
    # resume: all skipped; a damaged output is made again, the others are not touched
    victim = tmp_path / "w1" / "part-00001-of-00003.hdf5"
    victim.write_bytes(victim.read_bytes()[:1000])
    before = (tmp_path / "w1" / "part-00000-of-00003.hdf5").stat().st_mtime_ns
    assert main(["prep", "create", *flags, "--output_dir", str(tmp_path / "w1"),
                 "--workers=1"]) == 0
    assert "2 already made and verified" in capsys.readouterr().err
    assert (tmp_path / "w1" / "part-00000-of-00003.hdf5").stat().st_mtime_ns == before
    assert main(["prep", "verify", str(tmp_path / "w1")]) == 0


def only_manifest_left(folder: Path) -> bool:
    return not folder.exists() or all(p.name == "MANIFEST.json" for p in folder.iterdir())


@pytest.mark.parametrize("content,needle", [
    (b"good line .\n\nbad \xff byte .\n", ":3: not UTF-8"),
    (b"", "empty input file"),
    (b"\n\n  \n", "empty input file"),
])
def test_bad_text_input(tmp_path, vocab_file, capsys, content, needle):
    src = tmp_path / "in.txt"
    src.write_bytes(content)
    out = tmp_path / "out" / "o.hdf5"
    assert create(vocab_file, [src], [out]) == 1
    err = capsys.readouterr().err.strip()
    assert str(src) in err and needle in err and len(err.splitlines()) == 1
    assert only_manifest_left(tmp_path / "out")


def test_bad_vocab(tmp_path, corpus, capsys, vocab_file):
    small = tmp_path / "vocab.txt"
    small.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")  # no [MASK]
    out = tmp_path / "out" / "o.hdf5"
    assert create(small, [corpus], [out]) == 1
    assert str(small) in capsys.readouterr().err
    assert create(tmp_path / "missing.txt", [corpus], [out]) == 1
    assert "missing.txt" in capsys.readouterr().err
    assert only_manifest_left(tmp_path / "out")


def test_unwritable_output(tmp_path, vocab_file, corpus, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert create(vocab_file, [corpus], [blocker / "sub" / "o.hdf5"]) == 1
    assert str(blocker) in capsys.readouterr().err


def test_bad_flags(tmp_path, vocab_file, corpus, capsys):
    assert create(vocab_file, [corpus], [tmp_path / "o.hdf5"], "--max_seq_length=4") == 1
    assert "max_seq_length" in capsys.readouterr().err
    assert create(vocab_file, [tmp_path / "nope*.txt"], [tmp_path / "o.hdf5"]) == 1
    assert "no input file matches" in capsys.readouterr().err
    assert create(vocab_file, [corpus], [tmp_path / "o.hdf5"], "--max_predictions_per_seq=0") == 1
    assert capsys.readouterr().err == ("bertperf: error: --max_predictions_per_seq=0: must be at "
                                       "least 1 (every sample masks at least one token)\n")
    assert create(vocab_file, [tmp_path], [tmp_path / "o.hdf5"]) == 1
    assert capsys.readouterr().err == (f"bertperf: error: {tmp_path}: is a folder; --input_file "
                                       "takes files (a folder of part files goes to --input_dir, "
                                       "with --output_dir)\n")
    assert not (tmp_path / "o.hdf5").exists()
    folder = tmp_path / "out"
    folder.mkdir()
    assert create(vocab_file, [corpus], [folder]) == 1
    assert capsys.readouterr().err == (f"bertperf: error: --output_file {folder}: is a folder, "
                                       "expected the name of a file to write\n")


# ---- eval --------------------------------------------------------------------------------------

def test_eval_pick_rule(tmp_path, vocab_file, corpus):
    src = tmp_path / "all.hdf5"
    assert create(vocab_file, [corpus], [src], "--dupe_factor=2") == 0
    arrays = hdf5io.read_samples(src)
    n = len(arrays["input_ids"])
    dst = tmp_path / "eval" / "eval_100.hdf5"
    assert main(["prep", "eval", "--input_file", str(src), "--output_file", str(dst),
                 "--num_examples_to_pick", "100", "--max_seq_length=128",
                 "--max_predictions_per_seq=20"]) == 0
    picked = hdf5io.read_samples(dst)
    rows = [int(i * (n / 100)) for i in range(100)]
    for k in hdf5io.DATASETS:
        np.testing.assert_array_equal(picked[k], arrays[k][rows])
        assert picked[k].dtype == arrays[k].dtype


def test_eval_bad_input(tmp_path, vocab_file, corpus, capsys):
    src = tmp_path / "all.hdf5"
    assert create(vocab_file, [corpus], [src], "--dupe_factor=1") == 0
    args = ["prep", "eval", "--output_file", str(tmp_path / "e" / "e.hdf5"),
            "--max_seq_length=128", "--max_predictions_per_seq=20"]
    assert main([*args, "--input_file", str(src), "--num_examples_to_pick", "100000"]) == 1
    assert "fewer than" in capsys.readouterr().err
    broken = tmp_path / "broken.hdf5"
    broken.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    assert main([*args, "--input_file", str(broken), "--num_examples_to_pick", "10"]) == 1
    err = capsys.readouterr().err
    assert str(broken) in err and "corrupt" in err and len(err.strip().splitlines()) == 1
    not_hdf5 = tmp_path / "text.hdf5"
    not_hdf5.write_text("hello")
    assert main([*args, "--input_file", str(not_hdf5), "--num_examples_to_pick", "10"]) == 1
    assert only_manifest_left(tmp_path / "e")


# ---- verify ------------------------------------------------------------------------------------

def test_verify_names_bad_files(tmp_path, vocab_file, corpus, capsys):
    out = tmp_path / "out"
    assert create(vocab_file, [corpus], [out / "a.hdf5", out / "b.hdf5", out / "c.hdf5"],
                  "--dupe_factor=1") == 0
    assert main(["prep", "verify", str(out)]) == 0
    capsys.readouterr()
    (out / "a.hdf5").unlink()
    data = bytearray((out / "b.hdf5").read_bytes())
    data[-10] ^= 0xFF
    (out / "b.hdf5").write_bytes(bytes(data))
    assert main(["prep", "verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert "a.hdf5: missing" in err and "b.hdf5: md5 differs" in err and "c.hdf5" not in err
    md5s = tmp_path / "published.md5"
    md5s.write_text("0" * 32 + "  c.hdf5\n")
    assert main(["prep", "verify", str(out), "--md5sum_list", str(md5s)]) == 1
    assert "differs from published" in capsys.readouterr().err
    assert main(["prep", "verify", str(tmp_path / "nowhere")]) == 1
