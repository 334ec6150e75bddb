"""prep dictd: a dictd database (Debian's dict-* packages) to wikiextractor-format articles."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bertperf.errors import UserError
from bertperf.prep.text.dictd import article_text, decode_number, read_index
from tests.support.dictd import ENTRY, b64, make_db
from tests.support.paths import ROOT


def test_numbers_are_dictd_base64():
    assert decode_number("A", Path("x"), 1) == 0 and decode_number("BA", Path("x"), 1) == 64
    assert decode_number(b64(2_278_322), Path("x"), 1) == 2_278_322
    with pytest.raises(UserError, match=r"x:7: '\*' is not a dictd base-64 number"):
        decode_number("*", Path("x"), 7)


def test_article_text_joins_paragraphs_and_strips_markup():
    title, paragraphs = article_text(ENTRY)
    assert title == "Lisp"
    assert paragraphs == ["A functional programming language designed by John McCarthy.",
                          "It has garbage collection."]


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bertperf", "prep", "dictd", *args],
                          capture_output=True, text=True,
                          env={"PYTHONPATH": f"{ROOT / 'implementations' / 'pytorch'}",
                               "PATH": "/usr/bin:/bin"})


def test_cli_writes_wikiextractor_docs(tmp_path):
    db = make_db(tmp_path / "db", [("00-database-info", "metadata\n"), ("Lisp", ENTRY),
                                   ("empty", "empty\n\n   (2001-01-01)\n")],
                 aliases=[("LISP", "Lisp")])
    run = run_cli(["--dict", str(db), "--output", str(tmp_path / "out")])
    assert run.returncode == 0, run.stderr
    text = (tmp_path / "out" / "AA" / "wiki_00").read_text()
    assert text == ('<doc id="1" url="dictd:test" title="Lisp">\nLisp\n\n'
                    "A functional programming language designed by John McCarthy.\n"
                    "It has garbage collection.\n</doc>\n")
    assert "1 articles" in run.stdout


def test_bad_databases_are_one_line_errors(tmp_path):
    db = make_db(tmp_path / "db", [("Lisp", ENTRY)])
    index = db.with_name("test.index")
    index.write_text("Lisp\tA\n")
    run = run_cli(["--dict", str(db), "--output", str(tmp_path / "out")])
    assert run.returncode == 1 and f"{index}:1: expected" in run.stderr
    index.write_text(f"Lisp\tA\t{b64(10**6)}\n")
    run = run_cli(["--dict", str(db), "--output", str(tmp_path / "out")])
    assert run.returncode == 1 and "past the end of" in run.stderr
    index.unlink()
    run = run_cli(["--dict", str(db), "--output", str(tmp_path / "out")])
    assert run.returncode == 1 and f"{index}: no such file" in run.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("wiki_*"))


def test_read_index_rejects_non_utf8(tmp_path):
    bad = tmp_path / "bad.index"
    bad.write_bytes(b"\xff\tA\tB\n")
    with pytest.raises(UserError, match="not UTF-8"):
        read_index(bad)


def test_a_bad_late_entry_leaves_no_files(tmp_path):
    """Every entry is checked before anything is written (--file_mb small: one file each)."""
    db = make_db(tmp_path / "db", [("Lisp", ENTRY), ("Scheme", ENTRY.replace("Lisp", "Scheme"))])
    index = db.with_name("test.index")
    lines = index.read_text().splitlines()
    index.write_text(lines[0] + "\n" + f"Scheme\tA\t{b64(10**6)}\n")
    run = run_cli(["--dict", str(db), "--output", str(tmp_path / "out"), "--file_mb", "0.00001"])
    assert run.returncode == 1 and "past the end of" in run.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*"))


def tree(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_a_rerun_leaves_exactly_its_own_files(tmp_path):
    """Another database or a larger --file_mb: the earlier run's extra wiki_NN files go (clean
    would read them), files prep dictd did not write stay."""
    words = [f"Word{i}" for i in range(6)]
    big = make_db(tmp_path / "big", [(w, ENTRY.replace("Lisp", w)) for w in words])
    small = make_db(tmp_path / "small", [("Lisp", ENTRY)])
    out = tmp_path / "out"
    run = run_cli(["--dict", str(big), "--output", str(out), "--file_mb", "0.00001"])
    assert run.returncode == 0, run.stderr
    assert tree(out) == ["AA/" + f"wiki_{i:02d}" for i in range(6)] + ["MANIFEST.json"]
    (out / "notes.txt").write_text("mine\n")
    run = run_cli(["--dict", str(big), "--output", str(out), "--file_mb", "1"])
    assert run.returncode == 0, run.stderr
    assert tree(out) == ["AA/wiki_00", "MANIFEST.json", "notes.txt"]
    assert (out / "AA" / "wiki_00").read_text().count("<doc ") == 6
    run = run_cli(["--dict", str(big), "--output", str(out), "--file_mb", "0.00001"])
    assert run.returncode == 0, run.stderr
    run = run_cli(["--dict", str(small), "--output", str(out)])
    assert run.returncode == 0, run.stderr
    assert tree(out) == ["AA/wiki_00", "MANIFEST.json", "notes.txt"]
    assert 'url="dictd:test" title="Lisp"' in (out / "AA" / "wiki_00").read_text()
    assert json.loads((out / "MANIFEST.json").read_text())["files"]["AA/wiki_00"]["samples"] == 1


def test_files_it_did_not_write_are_never_replaced(tmp_path):
    db = make_db(tmp_path / "db", [("Lisp", ENTRY)])
    out = tmp_path / "out"
    (out / "AA").mkdir(parents=True)
    (out / "AA" / "wiki_00").write_text("real WikiExtractor text\n")
    run = run_cli(["--dict", str(db), "--output", str(out)])
    assert run.returncode == 1
    assert run.stderr.strip() == (f"bertperf: error: {out / 'AA' / 'wiki_00'}: exists and was not "
                                  "written by prep dictd; choose another --output or remove the file")
    assert tree(out) == ["AA/wiki_00"]
    assert (out / "AA" / "wiki_00").read_text() == "real WikiExtractor text\n"
