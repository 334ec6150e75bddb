"""nltk 3.4.5's Punkt sentence splitting, built on the installed nltk (3.10.4).

MLPerf's BERT Wikipedia text was segmented with nltk 3.4.5 (the reference process_wiki.sh pins it)
and nltk's Punkt has changed since. The classes here subclass nltk 3.10.4's PunktLanguageVars,
PunktToken and PunktSentenceTokenizer and undo every change that reaches
PunktSentenceTokenizer.tokenize(), so that `PunktSentenceTokenizer345(params).tokenize(text)` is
nltk 3.4.5's `PunktSentenceTokenizer(params).tokenize(text)` for every text. Undone:

1. Regex engine (after 3.8.1; nltk.redos in 3.10.4): every Punkt pattern is compiled with the
   third-party `regex` module and run under a 5 s timeout (TimeoutError past it). Its classes are
   not `re`'s: its \\s leaves out U+001C..U+001F, its \\w adds combining marks (U+0300.. etc.)
   and connector punctuation and leaves out numerals such as '²' and '½', its \\d follows a newer
   Unicode. Here every pattern is compiled with `re` again, as 3.4.5 did, with no time limit.
2. Candidate contexts (3.6.6 ReDoS fix, nltk#2869, reworked in 3.8, nltk#3014): 3.4.5 found the
   candidates with `\\S*[.?!]` plus a lookahead, so each run of non-whitespace (whitespace being
   str.isspace(), as in re's \\s) gives at most one candidate, its last [.?!] that is followed by a
   non-word character or by whitespace and a token, and the text handed to the sentence-break
   test starts at the run's start. Since 3.6.6 every [.?!] is a candidate, with the word before
   it found separately, and since 3.8 that word starts after the last *ASCII* whitespace
   (string.whitespace), so U+00A0 and the other Unicode spaces no longer end a word; earlier
   candidates of a run can be tested too (3.10.4 drops only those overlapping the next word).
   `_match_potential_end_contexts` gives 3.4.5's candidates and contexts again (in linear time;
   the `\\S*` scan of 3.4.5 was quadratic on long runs, which is what 3.6.6 fixed).
3. Non-word characters (after 3.8.1; in 3.10.4): `_re_non_word_chars` gained the curly quotes
   U+2018, U+2019, U+201C, U+201D and the guillemets U+00AB, U+00BB. It ends word tokens and may
   follow a candidate; back to 3.4.5's ?!)";}]*:@'({[ . (3.6 also made it a property built from
   sent_end_chars: the same ?! for English.)
4. Boundary realignment (after 3.8.1; in 3.10.4): `re_boundary_realignment` gained the same six
   quote characters, so a closing curly quote or guillemet after a break was moved into the
   sentence before it. Back to 3.4.5's ["')\\]}].
5. PunktToken's patterns (ellipsis, numeric type, initial, alphabetic) and `is_non_punct` use
   nltk.redos like the rest (1.): `re` again, in PunktToken345.

Unchanged between the two versions, and inherited as they are: word splitting into lines and
tokens (_tokenize_words), the first and second annotation passes, the orthographic, collocation
and sentence-starter heuristics, _slices_from_text (given the contexts of 2.), the realignment
loop, span_tokenize and sentences_from_text, PunktParameters and PunktToken's other properties.
The other 3.10.4 changes (type hints, renames, pickle and path hardening, punkt_tab loading,
trainer log-likelihood guards, debug_decisions' token loop) do not reach tokenize().

Character classes and case follow the running Python's Unicode database, as 3.4.5's did: on
Python 3.11 (Unicode 14.0) a text containing characters assigned in Unicode 12.0..14.0 can split
differently than nltk 3.4.5 on Python 3.7 (Unicode 11.0) did, exactly as nltk 3.4.5 itself does
when run on Python 3.11.

Only tokenize() (and span_tokenize / sentences_from_text, which it uses) is meant to be 3.4.5's;
debug_decisions and training a model with these classes are not covered.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from nltk.tokenize.punkt import PunktLanguageVars, PunktSentenceTokenizer, PunktToken

# The last whitespace character before `endpos`, found in linear time (\Z is endpos in search()).
_LAST_SPACE = re.compile(r"\s(?=\S*\Z)")

# 3.4.5's module-level `_re_non_punct`, compiled with re (3.10.4 uses nltk.redos).
_RE_NON_PUNCT = re.compile(r"[^\W\d]", re.UNICODE)


class PunktLanguageVars345(PunktLanguageVars):
    """English language variables with nltk 3.4.5's character sets and the `re` engine."""

    __slots__ = ()

    # 3.4.5's: no curly quotes or guillemets (added after 3.8.1).
    re_boundary_realignment = re.compile(r'["\')\]}]+?(?:\s+|(?=--)|$)', re.MULTILINE)

    # 3.4.5's literal, in place of 3.10.4's property (which adds the quotes above).
    _re_non_word_chars = r"(?:[?!)\";}\]\*:@\'\({\[])"

    def _word_tokenizer_re(self) -> re.Pattern:
        """3.4.5's (and 3.10.4's) word-token pattern, compiled with re instead of nltk.redos."""
        try:
            return self._re_word_tokenizer
        except AttributeError:
            self._re_word_tokenizer = re.compile(
                self._word_tokenize_fmt
                % {
                    "NonWord": self._re_non_word_chars,
                    "MultiChar": self._re_multi_char_punct,
                    "WordStart": self._re_word_start,
                },
                re.UNICODE | re.VERBOSE,
            )
            return self._re_word_tokenizer

    def period_context_re(self) -> re.Pattern:
        """One [.?!] with its lookahead (after_tok, next_tok), compiled with re.

        This is 3.10.4's _period_context_fmt, i.e. 3.4.5's without the leading `\\S*`; the word
        material before the candidate is added back by
        PunktSentenceTokenizer345._match_potential_end_contexts.
        """
        try:
            return self._re_period_context
        except AttributeError:
            self._re_period_context = re.compile(
                self._period_context_fmt
                % {
                    "NonWord": self._re_non_word_chars,
                    "SentEndChars": self._re_sent_end_chars,
                },
                re.UNICODE | re.VERBOSE,
            )
            return self._re_period_context


class PunktToken345(PunktToken):
    """PunktToken with its patterns compiled with re (3.10.4 routes them through nltk.redos)."""

    __slots__ = ()

    _RE_ELLIPSIS = re.compile(r"\.\.+$")
    _RE_NUMERIC = re.compile(r"^-?[\.,]?\d[\d,\.-]*\.?$")
    _RE_INITIAL = re.compile(r"[^\W\d]\.$", re.UNICODE)
    _RE_ALPHA = re.compile(r"[^\W\d]+$", re.UNICODE)

    @property
    def is_non_punct(self):
        """True if the token is either a number or is alphabetic."""
        return _RE_NON_PUNCT.search(self.type)


class PunktSentenceTokenizer345(PunktSentenceTokenizer):
    """nltk 3.4.5's PunktSentenceTokenizer: `PunktSentenceTokenizer345(params).tokenize(text)`."""

    def __init__(self, train_text=None, verbose=False, lang_vars=None, token_cls=PunktToken345):
        if lang_vars is None:
            lang_vars = PunktLanguageVars345()
        super().__init__(train_text, verbose, lang_vars=lang_vars, token_cls=token_cls)

    def _match_potential_end_contexts(self, text: str) -> Iterator[tuple[re.Match, str]]:
        """(candidate, context) pairs as nltk 3.4.5's `\\S*[.?!](?=...)` finditer gave them.

        For each run of non-whitespace, 3.4.5's greedy `\\S*` backtracked from the run's end to
        the run's last valid candidate, so only that one was tested, with the context
        text[run start : candidate + 1] + after_tok; finditer then resumed after it, where the rest
        of the run holds no valid candidate. The same pairs are built here from the one-character
        candidates: keep the last candidate of each run and yield it when the next candidate lies
        in a later run (some whitespace between them) or the text ends. A candidate followed by
        whitespace always ends its run; one followed by a non-word character does not.
        """
        last = None  # the last candidate seen, not yet yielded
        run_start = 0  # where the run holding `last` (or the next candidate) starts
        for match in self._lang_vars.period_context_re().finditer(text):
            space = _LAST_SPACE.search(text, last.end() if last else 0, match.start())
            if space:  # whitespace since `last`: `match` starts a new run
                if last:
                    yield last, text[run_start : last.end()] + last.group("after_tok")
                run_start = space.end()
            last = match
        if last:
            yield last, text[run_start : last.end()] + last.group("after_tok")
