"""Our whole chain on the Wikipedia sample against the MLCommons reference's own outputs.

Expected values are facts from running the reference scripts unmodified (mlcommons/training
@aa344c7f, retired_benchmarks/bert/cleanup_scripts; create_pretraining_data.py and
tokenization.py under TensorFlow stubs that record the written features; nltk 3.4.5, as MLPerf
used, with NLTK's English Punkt parameters) on ../shared/data/wiki_sample with
seperate_test_set.py --num_test_articles=40 and do_gather.py --block_size=2.0 --num_outputs=2.
Digests are md5 over the padded rows as written (tests/conftest.py: padded_digest).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from bertperf.__main__ import main
from bertperf.formats import padded as hdf5io
from tests.support.corpus import padded_digest

pytestmark = pytest.mark.slow

TEXT_MD5 = {
    "part-00000-of-00002": "535230afa687cc7341c69098309e9d92",
    "part-00001-of-00002": "511eafe7028f64f6bc3fe9937b5f8b6a",
    "eval.txt": "dd4b23f02c2d3c08908dccfd0e8b29fb",
    "eval.md5": "00bb902a4aaf3625774bf94ee88835bd",
}
MLPERF = ["--max_seq_length=512", "--max_predictions_per_seq=76", "--masked_lm_prob=0.15",
          "--random_seed=12345", "--dupe_factor=10", "--do_lower_case=True"]
CUSTOM = ["--max_seq_length=128", "--max_predictions_per_seq=20", "--dupe_factor=2",
          "--random_seed=7", "--masked_lm_prob=0.2", "--short_seq_prob=0.3", "--do_lower_case=False"]
CREATE = [  # (input, flags, samples, digest of the reference's output)
    ("part-00000-of-00002", MLPERF, 9868, "6866a435312c61394e2c3b74f46bd659"),
    ("part-00001-of-00002", MLPERF, 10134, "8e45dc0317880c2ca0c537baec9b21d0"),
    ("eval.txt", MLPERF, 8092, "f207fa2d86e6299dc5240d048351feac"),
    ("part-00000-of-00002", [], 35039, "cfa932444238e712baaf1a8bdd818d22"),
    ("part-00000-of-00002", CUSTOM, 7789, "8c8aca3a0983ab297ec0487838352e4a"),
]


@pytest.fixture(scope="module")
def text(tmp_path_factory, wiki_sample) -> Path:
    work = tmp_path_factory.mktemp("parity")
    for argv in (["clean", "--input", str(wiki_sample), "--output", str(work / "clean")],
                 ["segment", "--input", str(work / "clean"), "--output", str(work / "seg")],
                 ["split", "--input", str(work / "seg"), "--raw_dir", str(wiki_sample),
                  "--output", str(work / "text"), "--num_test_articles", "40",
                  "--block_size", "2.0", "--num_outputs", "2"]):
        assert main(["prep", *argv, "--workers", "2"]) == 0
    return work / "text"


def test_text_parts_equal_reference(text):
    got = {name: hashlib.md5((text / name).read_bytes()).hexdigest() for name in TEXT_MD5}
    assert got == TEXT_MD5


@pytest.fixture(scope="module")
def create(text, vocab_file, tmp_path_factory):
    """create(name, flags): `prep create`'s output for that text part, made once a module (the
    eval part's is read by two tests)."""
    made = {}

    def run(name: str, flags: list[str]) -> Path:
        key = (name, *flags)
        if key not in made:
            out = tmp_path_factory.mktemp("create") / "out.hdf5"
            assert main(["prep", "create", "--input_file", str(text / name), "--output_file",
                         str(out), "--vocab_file", str(vocab_file), *flags]) == 0
            made[key] = out
        return made[key]
    return run


@pytest.mark.parametrize("name,flags,samples,digest", CREATE,
                         ids=["part0-mlperf", "part1-mlperf", "eval-mlperf", "part0-defaults",
                              "part0-custom"])
def test_create_equals_reference(create, name, flags, samples, digest):
    arrays = hdf5io.read_samples(create(name, flags))
    assert len(arrays["input_ids"]) == samples
    assert padded_digest(arrays) == digest


def test_eval_pick_equals_reference(create, tmp_path):
    assert main(["prep", "eval", "--input_file", str(create("eval.txt", MLPERF)), "--output_file",
                 str(tmp_path / "eval100.hdf5"), "--num_examples_to_pick", "100"]) == 0
    assert padded_digest(hdf5io.read_samples(tmp_path / "eval100.hdf5")) == \
        "cebbe77cb7e052eb9aef9d768acfd315"
