"""bertperf.prep.samples.tokenization: exact parity with the MLPerf reference tokenization.py (FullTokenizer)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bertperf.errors import UserError
from bertperf.prep.samples import tokenization as tk
from bertperf.prep.samples.tokenization import (MLPERF_VOCAB_MD5, SAFE_RANGES, ReferenceTokenizer,
                                                Tokenizer, build_hf_tokenizer, is_fast_safe,
                                                load_vocab, vocab_md5_warning)
from tests.support.paths import WIKI_SAMPLE

# Contexts a whitelisted code point is tried in: alone, inside/around letters (cased, accented,
# digits), doubled, next to punctuation and spaces.
CONTEXTS = ("{c}", "ab{c}cd", "A{c}", "{c}{c}x", "x {c}. y", "É{c}Ab", "{c}é", "1{c}2", "[{c}]")

# Characters the fast path must not take (or that are tricky for it), each checked through the facade.
SPECIAL_CHARS = {
    "private use U+E000": "\ue000",
    "GREEK CAPITAL SIGMA": "\u03a3",
    "CJK ext. U+2B820": "\U0002b820",
    "U+061D (Unicode 14)": "\u061d",
    "CJK ideograph": "\u6f22",
    "NUL": "\x00",
    "U+FFFD": "\ufffd",
    "ZERO WIDTH SPACE": "\u200b",
    "LINE SEPARATOR": "\u2028",
    "NBSP": "\u00a0",
    "emoji": "\U0001f642",
    "lone surrogate": "\ud800",
    "U+0085": "\x85",
    "U+001C": "\x1c",
}
NOT_SAFE = ("\ue000", "\u03a3", "\U0002b820", "\u061d", "\u6f22", "\ufffd", "\U0001f642", "\ud800")

# Output of the real reference tokenization.py FullTokenizer (MLPerf vocab; uncased, cased), CPython 3.11.
GOLDEN = [
    ("Hello [CLS] world", ["hello", "[", "cl", "##s", "]", "world"], ["[UNK]", "[", "[UNK]", "]", "world"]),
    ("ΣΟΦΟΣ σοφός", ["σ", "##ο", "##φ", "##ος", "σ", "##ο", "##φ", "##ος"], ["[UNK]", "[UNK]"]),
    ("x\ue000y ok", ["[UNK]", "ok"], ["[UNK]", "ok"]),
    ("a\U0002b820b", ["a", "[UNK]", "b"], ["a", "[UNK]", "b"]),
    ("a\u061db", ["a", "[UNK]", "b"], ["a", "[UNK]", "b"]),
    ("漢字abc", ["漢", "[UNK]", "abc"], ["漢", "[UNK]", "abc"]),
    ("a\x00b\ufffdc d\u200be", ["abc", "de"], ["abc", "de"]),
    ("a\u2028b", ["a", "b"], ["a", "b"]),
    ("a\xa0b", ["a", "b"], ["a", "b"]),
    ("I \u2764\ufe0f \U0001f642 emoji!", ["i", "[UNK]", "[UNK]", "em", "##oj", "##i", "!"],
     ["[UNK]", "[UNK]", "[UNK]", "em", "##oj", "##i", "!"]),
    ("Café naïve", ["cafe", "naive"], ["[UNK]", "[UNK]"]),
    ("İstanbul ﬁ ½", ["istanbul", "ﬁ", "½"], ["[UNK]", "ﬁ", "½"]),
    ("\x1cx\x1fy\x85z", ["x", "##y", "##z"], ["x", "##y", "##z"]),
    ("The Ελληνικά and Русский text",
     ["the", "ε", "##λ", "##λ", "##η", "##ν", "##ι", "##κ", "##α", "and", "р", "##у", "##с", "##с", "##к",
      "##ии", "text"],
     ["[UNK]", "[UNK]", "and", "[UNK]", "text"]),
    ("unaffable ¿qué?", ["una", "##ffa", "##ble", "¿", "que", "?"], ["una", "##ffa", "##ble", "¿", "[UNK]", "?"]),
]

SMALL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[", "]", "cl", "##s", "a", "##a", "b", "##b",
                "cafe", "naive", "Café", "naïve", "hello", "world", ".", ",", "!", "un", "##aff", "##able",
                "x", "##y", "##z"]


def _write_vocab(tmp_path: Path, tokens, name="vocab.txt") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def small_vocab(tmp_path):
    return _write_vocab(tmp_path, SMALL_TOKENS)


@pytest.fixture(scope="module")
def real_vocab(vocab_file):
    return load_vocab(vocab_file)


def _fast_modes():
    """fast=False always; fast=True only when HF tokenizers is installed."""
    try:
        import tokenizers  # noqa: F401
        return [False, True]
    except ImportError:
        return [False]


# ---------------------------------------------------------------------------------------------------
# Vocab loading
# ---------------------------------------------------------------------------------------------------


def test_load_vocab_reference_semantics(tmp_path):
    path = tmp_path / "v.txt"
    path.write_bytes("[PAD]\n  [UNK] \r\n[CLS]\n[SEP]\n[MASK]\n\nhello\n[UNK]\nhello\t\nwörld".encode())
    vocab = load_vocab(path)
    # stripped, duplicates skipped, "" from the blank line, dense first-seen ids, no final newline needed
    assert vocab == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "": 5, "hello": 6, "wörld": 7}


def test_load_vocab_errors(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(UserError, match="nope.txt.*not found"):
        load_vocab(missing)
    with pytest.raises(UserError, match="nope.txt"):
        vocab_md5_warning(missing)

    no_mask = _write_vocab(tmp_path, [t for t in SMALL_TOKENS if t != "[MASK]"], "nomask.txt")
    with pytest.raises(UserError, match=r"nomask.txt.*\[MASK\]"):
        load_vocab(no_mask)

    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("\n".join(SMALL_TOKENS[:5] + ["naïve"]).encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1.txt: line 6: .*UTF-8"):
        load_vocab(latin1)

    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(UserError, match="empty.txt.*empty"):
        load_vocab(empty)

    for bad in (missing, no_mask, latin1, empty):
        with pytest.raises(UserError) as info:
            Tokenizer(bad)
        assert "\n" not in str(info.value) and bad.name in str(info.value)


def test_vocab_md5_warning(small_vocab, vocab_file):
    warning = vocab_md5_warning(small_vocab)
    assert warning and str(small_vocab) in warning and MLPERF_VOCAB_MD5 in warning and "\n" not in warning
    assert vocab_md5_warning(vocab_file) is None


# ---------------------------------------------------------------------------------------------------
# Specific behaviours (small vocab; both paths)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fast", _fast_modes())
def test_specific_cases(small_vocab, fast):
    t = Tokenizer(small_vocab, fast=fast)
    ref = t.reference
    cases = {
        "[CLS]": ["[", "cl", "##s", "]"],  # literal special-token text is split like any text
        "a" * 200: ["a"] + ["##a"] * 199,
        "a" * 201: ["[UNK]"],  # longer than 200 characters
        "Café naïve": ["cafe", "naive"],  # lower-cased, accents stripped
        "unaffable": ["un", "##aff", "##able"],
        "unaffableq": ["[UNK]"],  # an unmatched remainder makes the whole word [UNK]
        "hello,world!": ["hello", ",", "world", "!"],
        "a\x00b\x07\u200bb\ufffd \x7fx\x1fy\x85z": ["a", "##b", "##b", "x", "##y", "##z"],  # controls removed
        "x\ta\nb\r\u00a0\u3000a": ["x", "a", "b", "a"],  # all whitespace kinds separate words
        "": [],
        " \t\u00a0\u2028 ": [],
    }
    for text, expected in cases.items():
        assert ref.tokenize(text) == expected, repr(text)
    got = t.encode_lines(list(cases))
    assert got == [[t.vocab[p] for p in exp] for exp in cases.values()]
    assert [t.ids_to_tokens[i] for i in got[0]] == ["[", "cl", "##s", "]"]


@pytest.mark.parametrize("fast", _fast_modes())
def test_cased_keeps_case_and_accents(small_vocab, fast):
    t = Tokenizer(small_vocab, do_lower_case=False, fast=fast)
    assert t.tokenize("Café naïve cafe") == ["Café", "naïve", "cafe"]
    assert t.tokenize("Hello [CLS]") == ["[UNK]", "[", "[UNK]", "]"]
    assert t.encode_lines(["Café naïve", "Cafe"]) == [[t.vocab["Café"], t.vocab["naïve"]], [t.unk_id]]


def test_facade_attributes(small_vocab):
    t = Tokenizer(small_vocab, fast=False)
    assert t.vocab == {tok: i for i, tok in enumerate(SMALL_TOKENS)}
    assert t.ids_to_tokens == SMALL_TOKENS
    assert (t.pad_id, t.unk_id, t.cls_id, t.sep_id, t.mask_id) == (0, 1, 2, 3, 4)
    assert t.fast is False and Tokenizer(small_vocab).fast is False  # default: memoised pure Python


def test_fast_without_tokenizers_is_a_user_error(small_vocab, monkeypatch):
    monkeypatch.setattr(tk, "_tokenizers_available", lambda: False)
    with pytest.raises(UserError, match="tokenizers"):
        Tokenizer(small_vocab, fast=True)
    assert Tokenizer(small_vocab).encode_lines(["cafe"]) == [[SMALL_TOKENS.index("cafe")]]


def test_memo_is_exact_when_full_or_off(small_vocab):
    vocab = load_vocab(small_vocab)
    lines = ["hello, world!", "Café naïve", "unaffable b ab", "hello x.y.z", "[CLS] a"] * 3
    plain = ReferenceTokenizer(vocab, cache_words=0)
    expected = [plain.tokenize_ids(s) for s in lines]
    assert not plain._cache
    tiny = ReferenceTokenizer(vocab, cache_words=2)
    assert [tiny.tokenize_ids(s) for s in lines] == expected
    assert len(tiny._cache) <= 2
    # instances with the same vocab/casing share the memo; the casing is part of the key
    t1, t2 = Tokenizer(small_vocab), Tokenizer(small_vocab)
    assert t1.reference._cache is t2.reference._cache
    assert Tokenizer(small_vocab, do_lower_case=False).reference._cache is not t1.reference._cache
    assert t1.encode_lines(lines) == t2.encode_lines(lines) == expected


# ---------------------------------------------------------------------------------------------------
# Real vocab: golden outputs of the real reference, fast-path proof, real text
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lower", [True, False])
def test_golden_reference_outputs(real_vocab, vocab_file, lower):
    ref = ReferenceTokenizer(real_vocab, lower, cache_words=0)
    texts = [g[0] for g in GOLDEN]
    expected = [g[1] if lower else g[2] for g in GOLDEN]
    assert [ref.tokenize(s) for s in texts] == expected
    ids = [[real_vocab[p] for p in exp] for exp in expected]
    for fast in _fast_modes():
        assert Tokenizer(vocab_file, do_lower_case=lower, fast=fast).encode_lines(texts) == ids


def _safe_code_points():
    return [cp for lo, hi in SAFE_RANGES for cp in range(lo, hi + 1)]


def test_safe_set_excludes_known_differences():
    for ch in NOT_SAFE:
        assert not is_fast_safe("abc " + ch), hex(ord(ch))
    assert is_fast_safe("plain ASCII\t\x00 text") and is_fast_safe("Café – “quoted” → ½ Ελλάδα")
    cps = _safe_code_points()
    assert len(cps) == len(set(cps)) and all(is_fast_safe(chr(cp)) for cp in cps[::97])
    assert not any(is_fast_safe(chr(cp)) for cp in (0x3A3, 0x61D, 0x4E00, 0xE000, 0xFFFD, 0x1F642))


@pytest.mark.parametrize("lower", [True, False])
def test_whitelist_exhaustive(real_vocab, lower):
    """Every SAFE_RANGES code point, alone and in CONTEXTS: HF ids == reference ids."""
    pytest.importorskip("tokenizers")
    hf = build_hf_tokenizer(real_vocab, lower)
    ref = ReferenceTokenizer(real_vocab, lower)
    cps = _safe_code_points()
    bad = []
    for ctx in CONTEXTS:
        texts = [ctx.replace("{c}", chr(cp)) for cp in cps]
        for cp, text, enc in zip(cps, texts, hf.encode_batch_fast(texts, add_special_tokens=False)):
            if enc.ids != ref.tokenize_ids(text):
                bad.append(f"U+{cp:04X} in {ctx!r}")
    assert not bad, f"{len(bad)} whitelisted cases differ: {bad[:20]}"
    assert len(cps) > 15000


@pytest.mark.parametrize("lower", [True, False])
def test_whitelist_random_strings(real_vocab, vocab_file, lower):
    """Random mixes of whitelisted characters (multi-character interactions): fast == reference."""
    pytest.importorskip("tokenizers")
    rng = random.Random(20240607)
    cps = _safe_code_points()
    common = [ord(c) for c in " .,'-()Aaeé\u0301\u00a0\u2013"] + list(range(0x61, 0x7B))
    texts = []
    for _ in range(3000):
        n = rng.randrange(1, 40)
        texts.append("".join(chr(rng.choice(cps) if rng.random() < 0.4 else rng.choice(common))
                             for _ in range(n)))
    ref = ReferenceTokenizer(real_vocab, lower, cache_words=0)
    got = Tokenizer(vocab_file, do_lower_case=lower, fast=True).encode_lines(texts)
    bad = [s for s, g in zip(texts, got) if g != ref.tokenize_ids(s)]
    assert not bad, f"{len(bad)} of {len(texts)} differ, e.g. {bad[:5]!r}"


@pytest.mark.parametrize("lower", [True, False])
def test_special_characters_take_the_reference_result(real_vocab, vocab_file, lower):
    ref = ReferenceTokenizer(real_vocab, lower, cache_words=0)
    texts = [ctx.replace("{c}", ch) for ch in SPECIAL_CHARS.values() for ctx in CONTEXTS]
    texts += ["ΣΟΦΟΣ", "ΟΔΟΣ.", "aΣ b", "xΣy", "word\ue000 other", "ab\U0002b820\U0002b821cd"]
    expected = [ref.tokenize_ids(s) for s in texts]
    for fast in _fast_modes():
        got = Tokenizer(vocab_file, do_lower_case=lower, fast=fast).encode_lines(texts)
        bad = [s for s, g, e in zip(texts, got, expected) if g != e]
        assert not bad, f"fast={fast}: {bad!r}"


def _wiki_lines():
    files = sorted(WIKI_SAMPLE.glob("wiki_0*"))
    if len(files) != 4:
        pytest.skip(f"wiki sample not found under {WIKI_SAMPLE}")
    lines = []
    for path in files:
        with open(path, encoding="utf-8") as fh:
            lines += [s for s in (raw.strip() for raw in fh)
                      if not s.startswith("<doc") and not s.startswith("</doc")]
    return lines


def test_wiki_sample_fast_and_memo_equal_reference(real_vocab, vocab_file):
    lines = _wiki_lines()
    ref = ReferenceTokenizer(real_vocab, cache_words=0)
    expected = [ref.tokenize_ids(s) for s in lines]
    n_tokens = sum(map(len, expected))
    assert n_tokens > 500_000
    for fast in _fast_modes():
        t = Tokenizer(vocab_file, fast=fast)
        got = []
        for start in range(0, len(lines), 1000):
            got += t.encode_lines(lines[start:start + 1000])
        bad = [i for i, (g, e) in enumerate(zip(got, expected)) if g != e]
        assert len(got) == len(lines) and not bad, (
            f"fast={fast}: {len(bad)} of {len(lines)} lines ({n_tokens} tokens) differ, first: {lines[bad[0]]!r}"
            if bad else f"fast={fast}: {len(got)} results for {len(lines)} lines")
    n_non_ascii = sum(not s.isascii() for s in lines)
    assert n_non_ascii > 1000, f"{len(lines)} lines, {n_non_ascii} non-ASCII"


def test_whitespace_is_a_hard_boundary(small_vocab):
    """What the word memo relies on: tokens(a + whitespace + b) == tokens(a) + tokens(b), for any a, b."""
    vocab = load_vocab(small_vocab)
    rng = random.Random(7)
    alphabet = "abxyz.,![]-ÉéΣς\u0301\u00a0\u2028\x00\ufffd\u200b\ue000漢\U0002b820 \t"
    for lower in (True, False):
        ref = ReferenceTokenizer(vocab, lower, cache_words=0)
        for _ in range(2000):
            a = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
            b = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
            for sep in (" ", "\n", "\t", "\u00a0", "\u2028", "\u3000"):
                assert ref.tokenize(a + sep + b) == ref.tokenize(a) + ref.tokenize(b), repr((a, sep, b))


def test_tables_fill_per_code_point():
    """The translate tables classify a code point when a text first holds it, and keep it."""
    from bertperf.prep.samples.tokenization import _Tables

    t = _Tables()
    assert len(t.clean_map) == len(t.mn_map) == len(t.punct_map) == 0
    assert "a\u00ad\u3000b\x00\ufffd\t".translate(t.clean_map) == "a b "
    assert "e\u0301\u0300x".translate(t.mn_map) == "ex"
    assert "a\u00bfb,c\u2014".translate(t.punct_map).split() == ["a", "\u00bf", "b", ",", "c",
                                                                   "\u2014"]
    assert t.clean_map[0xAD] is None and t.clean_map[ord("a")] == ord("a")
    assert len(t.clean_map) == 7
