"""WordPiece tokenization, bit-exact with the MLPerf reference `tokenization.py` (FullTokenizer,
do_lower_case=True, preserve_unused_tokens=False): one token of difference changes the random
draws of a whole output file, so `Tokenizer.encode_lines(lines)` returns the reference's ids for
every line. `ReferenceTokenizer` re-implements FullTokenizer.tokenize with C-level string
operations and a bounded word -> ids memo (after the first whitespace split every step depends on
the word alone), shared by a process's Tokenizers of one vocab and casing; its character tables
are the running Python's (`UNICODE_VERSION`). HF `tokenizers` (`fast=True`) takes only the lines
whose characters all lie in SAFE_RANGES, blocks proven identical by tests/unit/test_tokenization.py;
other lines take the reference path. `Tokenizer` defaults to the memoised Python path, the faster
one (docs/design.md, "Tokenizer"). Importing this module sets TOKENIZERS_PARALLELISM=false unless
set. `python -m bertperf.prep.samples.tokenization VOCAB FILE...` measures the paths' speeds."""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import Sequence

from bertperf.errors import UserError

# One tokenizer per worker process, each on its own core (see prep/parallel.py): rayon threads inside
# `tokenizers` would only oversubscribe the cores, and the library warns (then disables them) after a
# fork anyway. Set before `tokenizers` is imported; an explicit user setting wins.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MLPERF_VOCAB_MD5 = "64800d5d8528ce344256daf115d4965e"
# The Unicode tables the reference behaviour is reproduced with (Python 3.11: "14.0.0"); worth recording
# with prepared data: the MLPerf data was made with Python 3.7 ("11.0.0").
UNICODE_VERSION = unicodedata.unidata_version
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
UNK_TOKEN = "[UNK]"
MAX_INPUT_CHARS_PER_WORD = 200  # reference WordpieceTokenizer default (HF's BertWordPieceTokenizer uses 100)
DEFAULT_CACHE_WORDS = 1 << 19  # memoised words per vocab/case in a process (~140 B each, ~75 MB)

# ----------------------------------------------------------------------------------------------------
# Vocabulary
# ----------------------------------------------------------------------------------------------------


def _read_bytes(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: {what} is a directory, expected a file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None


def load_vocab(path: str | os.PathLike) -> dict[str, int]:
    """Read a WordPiece vocab like the reference `load_vocab`.

    Lines are split on "\\n" only (the reference reads with GFile.readline), each line is `str.strip()`ped,
    a token already present is skipped and ids are dense in first-seen order (an empty line yields the
    token "" once, as in the reference). Raises UserError naming the file when it is missing, empty, not
    UTF-8 (naming the line) or lacks one of [PAD] [UNK] [CLS] [SEP] [MASK].
    """
    path = Path(path)
    data = _read_bytes(path, "vocab file")
    if not data.strip():
        raise UserError(f"{path}: vocab file is empty")
    raw_lines = data.split(b"\n")
    if raw_lines[-1] == b"":
        raw_lines.pop()
    vocab: dict[str, int] = {}
    for lineno, raw in enumerate(raw_lines, 1):
        try:
            token = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise UserError(
                f"{path}: line {lineno}: vocab file is not valid UTF-8 (byte {exc.start + 1} of the line)"
            ) from None
        if token not in vocab:
            vocab[token] = len(vocab)
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        bom = " (the file starts with a UTF-8 byte-order mark)" if data.startswith(b"\xef\xbb\xbf") else ""
        raise UserError(f"{path}: vocab file lacks the special token(s) {' '.join(missing)}{bom}")
    return vocab


def vocab_md5_warning(path: str | os.PathLike) -> str | None:
    """A one-line warning when the vocab file is not byte-identical to the MLPerf BERT vocab, else None."""
    path = Path(path)
    md5 = hashlib.md5(_read_bytes(path, "vocab file")).hexdigest()
    if md5 == MLPERF_VOCAB_MD5:
        return None
    return (
        f"{path}: md5 {md5} differs from the MLPerf BERT vocab ({MLPERF_VOCAB_MD5}); "
        "token ids and samples will not match the reference data"
    )


# ----------------------------------------------------------------------------------------------------
# Unicode tables of the running Python, filled per code point as characters are met
# ----------------------------------------------------------------------------------------------------

# CJK ranges of the reference `_is_chinese_char` (it includes U+2B820-U+2CEAF, HF does not).
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)


def _class_run(lo: int, hi: int) -> str:
    esc = lambda cp: "\\U%08x" % cp  # noqa: E731  (escapes keep the pattern ASCII and unambiguous)
    return esc(lo) if lo == hi else f"{esc(lo)}-{esc(hi)}"


def _clean(cp: int, category: str) -> int | str | None:
    """_clean_text: U+0000, U+FFFD and Cc/Cf (but \\t \\n \\r) are dropped; \\t, \\n, \\r and Zs
    become " "."""
    if cp in (9, 10, 13) or (category == "Zs" and cp != 0x20):
        return " "
    if cp in (0, 0xFFFD) or category in ("Cc", "Cf"):
        return None
    return cp


def _strip_mark(cp: int, category: str) -> int | None:
    """_run_strip_accents after NFD: Mn is dropped."""
    return None if category == "Mn" else cp


def _space_punctuation(cp: int, category: str) -> int | str:
    """_run_split_on_punc: a punctuation character (ASCII 33-47, 58-64, 91-96, 123-126, or any P*
    category) becomes a piece of its own; spaced out, str.split() then cuts it off."""
    ascii_punct = 33 <= cp <= 126 and not chr(cp).isalnum()
    return f" {chr(cp)} " if ascii_punct or category[0] == "P" else cp


class _TranslateTable(dict):
    """A str.translate table that fills itself: the first lookup of a code point computes its entry
    from its Unicode category (`rule`) and keeps it, so only the characters a text holds are ever
    classified (a scan of all code points took about 0.15 s of every process's start-up)."""

    def __init__(self, rule) -> None:
        super().__init__()
        self.rule = rule

    def __missing__(self, cp: int):
        value = self[cp] = self.rule(cp, unicodedata.category(chr(cp)))
        return value


class _Tables:
    """Per-character behaviour of the reference, from `unicodedata` of the running Python."""

    def __init__(self) -> None:
        self.clean_map = _TranslateTable(_clean)
        # Words come from str.split() as in the reference: besides " " it splits on U+2028/U+2029 (Zl/Zp,
        # kept by _clean_text); \x0b \x0c \x1c-\x1f \x85 are Cc, so dropped before the split.
        self.cjk_re = re.compile(f"[{''.join(_class_run(lo, hi) for lo, hi in _CJK_RANGES)}]")
        self.mn_map = _TranslateTable(_strip_mark)
        self.punct_map = _TranslateTable(_space_punctuation)
        self.ascii_drop_re = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
        self.ascii_punct_split_re = re.compile(r"[!-/:-@\[-`{-~]|[^!-/:-@\[-`{-~]+")


@lru_cache(maxsize=None)
def _tables() -> _Tables:
    return _Tables()


# ----------------------------------------------------------------------------------------------------
# Pure-Python reference path
# ----------------------------------------------------------------------------------------------------

# Word -> ids memo shared by every ReferenceTokenizer of this process with the same vocab and casing
# (results depend only on those and on the word), so successive files in one worker start warm.
_SHARED_CACHES: dict[tuple, dict[str, tuple[int, ...]]] = {}


class ReferenceTokenizer:
    """Exact pure-Python re-implementation of the reference `FullTokenizer.tokenize`
    (preserve_unused_tokens=False), under the running Python's `unicodedata` and `str` methods.

    Same steps as the reference, with C-level string operations instead of per-character Python loops:
    _clean_text (str.translate), spaces around CJK ideographs (regex), str.split(); then per
    whitespace-separated word: str.lower() + NFD + drop Mn (only when lowercasing), split on punctuation,
    split on whitespace again, greedy longest-match-first WordPiece with "##" (a piece longer than 200
    characters, or one with an unmatchable remainder, becomes [UNK]).
    Every step after the first str.split() depends only on the word, so word -> ids results are memoised
    (at most `cache_words` entries, emptied when full; 0 disables the memo).
    """

    def __init__(self, vocab: dict[str, int], do_lower_case: bool = True,
                 cache_words: int = DEFAULT_CACHE_WORDS) -> None:
        self.vocab = vocab
        self.do_lower_case = bool(do_lower_case)
        self.unk_token = UNK_TOKEN
        self.max_input_chars_per_word = MAX_INPUT_CHARS_PER_WORD
        self._max_len = max(map(len, vocab), default=0)  # no longer substring can be in the vocab
        self._t = _tables()
        self._cache: dict[str, tuple[int, ...]] = {}
        self._cache_words = max(0, int(cache_words))

    # -- line level ---------------------------------------------------------------------------------

    def words(self, text: str) -> list[str]:
        """_clean_text, CJK spacing and whitespace split: the reference's `orig_tokens`."""
        t = self._t
        if text.isascii():
            if t.ascii_drop_re.search(text):
                text = text.translate(t.clean_map)
            return text.split()  # \t \n \r split like the " " that _clean_text makes of them
        text = text.translate(t.clean_map)
        if t.cjk_re.search(text):
            text = t.cjk_re.sub(r" \g<0> ", text)
        # str.split() also splits on U+2028/U+2029 (kept by _clean_text): the reference splits the same way.
        return text.split()

    def tokenize(self, text: str) -> list[str]:
        """Exactly `FullTokenizer.tokenize(text)`."""
        out: list[str] = []
        for word in self.words(text):
            out.extend(self.word_tokens(word))
        return out

    def tokenize_ids(self, text: str) -> list[int]:
        """Exactly `FullTokenizer.convert_tokens_to_ids(FullTokenizer.tokenize(text))`."""
        words = self.words(text)
        found = list(map(self._cache.get, words))
        try:
            return list(chain.from_iterable(found))
        except TypeError:  # a word not memoised yet (None is not iterable)
            pass
        word_ids = self.word_ids
        return list(chain.from_iterable(
            ids if ids is not None else word_ids(w) for w, ids in zip(words, found)))

    # -- word level ---------------------------------------------------------------------------------

    def word_ids(self, word: str) -> tuple[int, ...]:
        """Ids of one whitespace-free word (memoised)."""
        ids = self._cache.get(word)
        if ids is None:
            vocab = self.vocab
            ids = tuple([vocab[tok] for tok in self.word_tokens(word)])
            if self._cache_words:
                if len(self._cache) >= self._cache_words:
                    self._cache.clear()
                self._cache[word] = ids
        return ids

    def word_tokens(self, word: str) -> list[str]:
        """The reference's steps after the first whitespace split, for one word."""
        t = self._t
        if word.isascii():  # NFD is the identity and nothing is Mn or whitespace: skip those steps
            if self.do_lower_case:
                word = word.lower()
            pieces = t.ascii_punct_split_re.findall(word)
        else:
            if self.do_lower_case:
                word = unicodedata.normalize("NFD", word.lower()).translate(t.mn_map)
            # _run_split_on_punc, then the second whitespace_tokenize(" ".join(...)).
            pieces = word.translate(t.punct_map).split()
        vocab = self.vocab
        out: list[str] = []
        for piece in pieces:
            if piece in vocab and len(piece) <= self.max_input_chars_per_word:
                out.append(piece)  # what wordpiece() returns first, without the call
            else:
                out.extend(self.wordpiece(piece))
        return out

    def wordpiece(self, piece: str) -> list[str]:
        """The reference WordpieceTokenizer on one whitespace-free piece."""
        n = len(piece)
        if n > self.max_input_chars_per_word:
            return [self.unk_token]
        vocab = self.vocab
        if piece in vocab:
            return [piece]
        max_len = self._max_len
        out = []
        start = 0
        while start < n:
            end = min(n, start + max_len)  # longer candidates cannot be in the vocab
            while start < end:
                sub = piece[start:end] if start == 0 else "##" + piece[start:end]
                if sub in vocab:
                    break
                end -= 1
            else:
                return [self.unk_token]
            out.append(sub)
            start = end
        return out


# ----------------------------------------------------------------------------------------------------
# HF `tokenizers` path
# ----------------------------------------------------------------------------------------------------

# Code points for which HF gives the reference result, proven exhaustively by
# tests/unit/test_tokenization.py (each one alone and in 9 contexts, lower- and cased, against
# ReferenceTokenizer). Excluded from the candidate blocks: U+03A3 (Python's context-sensitive final
# sigma) and U+061D (assigned in Unicode 14: Po for Python 3.11, unknown to HF). Everything else (CJK
# ideographs, private use, surrogates, emoji, U+FFFD, other scripts...) takes the reference path.
SAFE_RANGES: tuple[tuple[int, int], ...] = (
    (0x0000, 0x03A2),  # ASCII incl. controls, Latin-1, Latin Extended-A/B, IPA, spacing modifiers,
    (0x03A4, 0x058F),  #   combining diacriticals, Greek and Coptic (but U+03A3), Cyrillic, Armenian
    (0x0590, 0x061C),  # Hebrew, Arabic (but U+061D)
    (0x061E, 0x06FF),
    (0x0900, 0x097F),  # Devanagari
    (0x0E00, 0x0E7F),  # Thai
    (0x10A0, 0x10FF),  # Georgian
    (0x1E00, 0x1FFF),  # Latin Extended Additional, Greek Extended
    (0x2000, 0x2BFF),  # general punctuation, super/subscripts, currency, letterlike, number forms,
                       #   arrows, math operators, technical, enclosed, box/blocks, shapes, symbols...
    (0x3000, 0x30FF),  # CJK symbols and punctuation, Hiragana, Katakana (not ideographs)
    (0xAC00, 0xD7A3),  # Hangul syllables
    (0xFF00, 0xFFEF),  # half- and full-width forms
)

_UNSAFE_RE = re.compile(f"[^{''.join(_class_run(lo, hi) for lo, hi in SAFE_RANGES)}]")


def is_fast_safe(text: str) -> bool:
    """True when every character of `text` is in SAFE_RANGES (HF then gives the reference result)."""
    return text.isascii() or _UNSAFE_RE.search(text) is None


def build_hf_tokenizer(vocab: dict[str, int], do_lower_case: bool = True):
    """The HF `tokenizers` pipeline equal to the reference on SAFE_RANGES text (add_special_tokens=False).

    A bare Tokenizer: BertWordPieceTokenizer would register [CLS] etc. as special tokens (the reference
    splits literal "[CLS]" into "[", "cl", "##s", "]") and default to 100 characters per word (not 200).
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    hf = HFTokenizer(WordPiece(dict(vocab), unk_token=UNK_TOKEN,
                               max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    hf.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True,
        strip_accents=None if do_lower_case else False, lowercase=bool(do_lower_case))
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return hf


def _tokenizers_available() -> bool:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------------------------------
# Facade
# ----------------------------------------------------------------------------------------------------


class Tokenizer:
    """What the data prep uses: `encode_lines` gives exactly the reference ids, as fast as measured best.

    fast=None (default) or False: the memoised pure-Python path (the fastest exact path measured, see the
    module docstring). fast=True: lines made only of SAFE_RANGES characters go through HF `tokenizers`
    (`encode_batch_fast`), the others through the reference path; UserError if `tokenizers` is missing.
    """

    def __init__(self, vocab_path: str | os.PathLike, do_lower_case: bool = True,
                 fast: bool | None = None, cache_words: int = DEFAULT_CACHE_WORDS) -> None:
        self.vocab_path = Path(vocab_path)
        self.vocab = load_vocab(self.vocab_path)
        self.ids_to_tokens = list(self.vocab)  # ids are dense in file order
        self.do_lower_case = bool(do_lower_case)
        self.pad_id, self.unk_id = self.vocab["[PAD]"], self.vocab["[UNK]"]
        self.cls_id, self.sep_id, self.mask_id = self.vocab["[CLS]"], self.vocab["[SEP]"], self.vocab["[MASK]"]
        self.reference = ReferenceTokenizer(self.vocab, self.do_lower_case, cache_words)
        if cache_words:
            key = (tuple(self.vocab), self.do_lower_case, int(cache_words))
            self.reference._cache = _SHARED_CACHES.setdefault(key, {})
        if fast and not _tokenizers_available():
            raise UserError("fast tokenization requested but the 'tokenizers' package is not installed "
                            "(pip install tokenizers==0.23.3)")
        self.fast = bool(fast)
        self._hf = build_hf_tokenizer(self.vocab, self.do_lower_case) if self.fast else None

    def tokenize(self, text: str) -> list[str]:
        """Reference word pieces of one text (strings; for inspection and tests)."""
        return self.reference.tokenize(text)

    def encode_lines(self, lines: Sequence[str]) -> list[list[int]]:
        """For each line, exactly `ReferenceTokenizer.tokenize_ids(line)` (the reference token ids)."""
        if self._hf is None:
            return list(map(self.reference.tokenize_ids, lines))
        out: list = [None] * len(lines)
        safe_idx = []
        ref_ids = self.reference.tokenize_ids
        for i, line in enumerate(lines):
            if line.isascii() or _UNSAFE_RE.search(line) is None:
                safe_idx.append(i)
            else:
                out[i] = ref_ids(line)
        if safe_idx:
            encs = self._hf.encode_batch_fast([lines[i] for i in safe_idx], add_special_tokens=False)
            for i, enc in zip(safe_idx, encs):
                out[i] = enc.ids
        return out


# ----------------------------------------------------------------------------------------------------
# Speed measurement: python3 -m bertperf.prep.samples.tokenization VOCAB TEXTFILE...
# ----------------------------------------------------------------------------------------------------


def _bench(argv: Sequence[str], repeats: int = 5) -> None:
    import statistics
    import time

    if len(argv) < 2:
        raise SystemExit("usage: python3 -m bertperf.prep.samples.tokenization VOCAB TEXTFILE...")
    vocab_path, files = argv[0], argv[1:]
    lines = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            lines += [s for s in (raw.strip() for raw in fh)
                      if s and not s.startswith("<doc") and not s.startswith("</doc")]
    mb = sum(len(s.encode("utf-8")) for s in lines) / 1e6
    print(f"{len(lines)} lines, {mb:.2f} MB, Python {'.'.join(map(str, __import__('sys').version_info[:3]))}, "
          f"Unicode {UNICODE_VERSION}, TOKENIZERS_PARALLELISM={os.environ['TOKENIZERS_PARALLELISM']}; "
          f"MB/s best / median of {repeats}")
    vocab = load_vocab(vocab_path)
    speeds: dict[str, list[float]] = {}

    def timed(name: str, encode) -> None:
        t0 = time.perf_counter()
        for start in range(0, len(lines), 4096):
            encode(lines[start:start + 4096])
        speeds.setdefault(name, []).append(mb / (time.perf_counter() - t0))

    for _ in range(repeats):
        plain = ReferenceTokenizer(vocab, cache_words=0)
        timed("ReferenceTokenizer without memo", lambda ls: list(map(plain.tokenize_ids, ls)))
        for fast in (False, True):
            _SHARED_CACHES.clear()
            t = Tokenizer(vocab_path, fast=fast)
            timed(f"Tokenizer(fast={fast}) first pass (cold)", t.encode_lines)
            timed(f"Tokenizer(fast={fast}) second pass (warm)", t.encode_lines)
    for name, v in speeds.items():
        print(f"  {name:<42} {max(v):6.2f} / {statistics.median(v):6.2f}")


if __name__ == "__main__":
    import sys

    _bench(sys.argv[1:])
