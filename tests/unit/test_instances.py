"""The instance algorithm: golden vectors of the reference, and the C fast path == pure Python."""

from __future__ import annotations

import numpy as np
import pytest

from bertperf.prep.samples.create import build_instances, fast_engine_available
from bertperf.prep.samples.instances import Documents, Params, SpecialIds

needs_c = pytest.mark.skipif(not fast_engine_available(), reason="C extension not built")


def random_documents(seed: int, n_docs: int, max_sents: int, max_len: int) -> Documents:
    r = np.random.default_rng(seed)
    sent_lengths, doc_offsets = [], [0]
    for _ in range(n_docs):
        k = int(r.integers(1, max_sents + 1))
        sent_lengths += [int(x) for x in r.integers(1, max_len + 1, size=k)]
        doc_offsets.append(len(sent_lengths))
    total = sum(sent_lengths)
    return Documents(r.integers(1000, 2000, size=total, dtype=np.int32),
                     np.concatenate([[0], np.cumsum(sent_lengths)]).astype(np.int64),
                     np.asarray(doc_offsets, dtype=np.int64))


def same(a, b) -> None:
    assert a.samples.equals(b.samples)
    np.testing.assert_array_equal(a.order, b.order)


IDS = SpecialIds(cls=101, sep=102, mask=103, vocab_size=30522)


@needs_c
@pytest.mark.parametrize("params,shape", [
    (Params(512, 76, 0.15, 3, 0.1, 12345), (40, 12, 60)),
    (Params(128, 20, 0.15, 2, 0.1, 7), (30, 8, 40)),
    (Params(64, 10, 0.2, 2, 0.5, 99), (25, 6, 200)),    # sentences longer than max_seq_length
    (Params(5, 1, 0.15, 2, 0.9, 3), (10, 3, 4)),        # the smallest legal length
    (Params(512, 76, 0.15, 2, 0.1, 1), (1, 5, 30)),     # one document: random next from itself
    (Params(512, 76, 0.15, 2, 0.1, 2), (20, 1, 30)),    # one-sentence documents: always random
    (Params(512, 0, 0.15, 1, 0.1, 4), (10, 5, 30)),     # no predictions
    (Params(30, 76, 1.0, 1, 0.0, 5), (10, 5, 30)),      # mask everything allowed
])
def test_c_engine_equals_python(params, shape):
    docs = random_documents(sum(shape), *shape)
    same(build_instances(docs, params, IDS, "c"), build_instances(docs, params, IDS, "python"))


def test_round_half_to_even_and_caps():
    """num_to_predict uses Python's round(): 30 tokens * 0.15 = 4.5 -> 4, not 5."""
    docs = Documents(np.arange(1000, 1027, dtype=np.int32), np.array([0, 13, 27], dtype=np.int64),
                     np.array([0, 2], dtype=np.int64))
    inst = build_instances(docs, Params(30, 76, 0.15, 1, 0.0, 3), IDS, "python")
    lengths, counts = inst.samples.lengths, inst.samples.mlm_counts
    for n, c in zip(lengths, counts):
        assert c == min(76, max(1, round(n * 0.15)))
    assert 30 in lengths.tolist() and counts[lengths.tolist().index(30)] == 4


def test_instance_structure():
    docs = random_documents(3, 20, 10, 50)
    inst = build_instances(docs, Params(128, 20, 0.15, 2, 0.1, 11), IDS, "python")
    assert sorted(inst.order.tolist()) == list(range(len(inst)))
    s = inst.samples
    for i in range(len(inst)):
        t = s.input_ids[s.offsets[i]:s.offsets[i + 1]]
        a = s.b_starts[i] - 2
        assert len(t) <= 128 and t[0] == IDS.cls and t[a + 1] == IDS.sep and t[-1] == IDS.sep
        assert a >= 1 and len(t) - a - 3 >= 1
        pos = s.mlm_positions[s.mlm_offsets[i]:s.mlm_offsets[i + 1]]
        assert np.all(np.diff(pos) > 0) and 0 not in pos and a + 1 not in pos
        assert len(t) - 1 not in pos


def test_params_checked():
    from bertperf.errors import UserError

    with pytest.raises(UserError, match="max_seq_length"):
        Params(4, 1, 0.15, 1, 0.1, 1).check()


def test_c_extension_built_when_a_compiler_exists():
    """`pip install` builds the C path wherever cc exists; a silent build failure must not hide."""
    import shutil

    if shutil.which("cc") is None:
        pytest.skip("no C compiler on this machine: the pure-Python path is used")
    assert fast_engine_available(), "C compiler present but bertperf.prep.samples._fastcreate not built"
