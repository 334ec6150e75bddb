"""nltk 3.4.5's Punkt sentence splitting, built on the installed nltk (3.10.4). MLPerf's Wikipedia
text was segmented with nltk 3.4.5 (the reference process_wiki.sh pins it), and Punkt has changed
since. The classes here subclass nltk 3.10.4's PunktLanguageVars, PunktToken and
PunktSentenceTokenizer and undo every change that reaches tokenize(), so that
`PunktSentenceTokenizer345(params).tokenize(text)` is nltk 3.4.5's
`PunktSentenceTokenizer(params).tokenize(text)` for every text: patterns compiled with `re`
again (not `regex`, no timeout), 3.4.5's candidate sentence ends and their contexts (found in
linear time), its non-word characters and boundary realignment (without curly quotes and
guillemets); docs/design.md ("Sentences") details each change. Character classes and case follow
the running Python's Unicode tables, as 3.4.5's did. Only tokenize() (with span_tokenize and
sentences_from_text, which it uses) is meant to be 3.4.5's; debug_decisions and training are not."""

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
