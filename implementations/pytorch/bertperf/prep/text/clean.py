"""Clean WikiExtractor output: the reference's cleanup_file.py and clean.sh, in one pass per file.
Every file under --input (a folder, searched recursively in order of relative path, hidden files
and MANIFEST.json ignored; or one file) is written to the same relative path under --output,
byte-identical to what the MLCommons reference (retired_benchmarks/bert/cleanup_scripts) writes
as `wiki_nn.2`. cleanup_file.py: read with universal newlines, a line containing '<doc' and the
title line after it become one empty line, lines containing '</doc>' and empty lines are
dropped. clean.sh: its fixed chain of `grep -v` / `sed` rules, per line in the same order
([[a|b]] and [[a]] links unwrapped, [[Category:..]] lines and File/Media/Image links dropped,
<ref..>, <math>, <div..> and similar tags removed; '</doc>' becomes a CR). Outputs are written
atomically and recorded in --output/MANIFEST.json (a rerun skips what still matches); --workers
local processes, and under `mpirun -np K` rank r takes files r, r+K, ...

example:
  python -m bertperf prep clean --input text/ --output clean/"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Callable

from bertperf.errors import UserError
from bertperf.formats import manifest
from bertperf.formats.files import atomic_output, read_utf8, remove_stale_temporaries
from bertperf.prep.parallel import World, default_workers, run_tasks


STAGE = "clean"

# ---------------------------------------------------------------------------------------------
# The text transformation
# ---------------------------------------------------------------------------------------------


def universal_newlines(text: str) -> str:
    """What Python's io.open(newline=None) reads: '\\r\\n' and a lone '\\r' become '\\n'.

    (str.splitlines would also split at \\x0b, \\x0c, \\x1c-\\x1e, \\x85, \\u2028 and \\u2029;
    io does not.)
    """
    return text.replace("\r\n", "\n").replace("\r", "\n")


def split_lines(text: str) -> list[str]:
    """Lines as `for line in file` yields them from already-translated text, each with its '\\n'."""
    lines = text.split("\n")
    last = lines.pop()  # '' when the text ends with '\n' (or is empty)
    out = [line + "\n" for line in lines]
    if last:
        out.append(last)
    return out


def cleanup_file_lines(text: str) -> tuple[list[str], int]:
    """cleanup_file.py on one file's text: returns the lines it writes (without their '\\n') and
    the number of '<doc' lines seen.

    Every line cleanup_file.py writes ends with '\\n' except possibly the input's unterminated last
    line; the first `grep` of clean.sh terminates that one, so only the content matters here.
    """
    kept: list[str] = []
    docs = 0
    keep_next_line = True
    for line in split_lines(universal_newlines(text)):
        if not keep_next_line:  # the title line after '<doc ...>', whatever it contains
            keep_next_line = True
            continue
        if "<doc" in line:
            keep_next_line = False
            docs += 1
            kept.append("")
            continue
        if "</doc>" in line:
            continue
        if len(line) == 1:  # '\n', or a one-character unterminated last line
            continue
        kept.append(line[:-1] if line.endswith("\n") else line)
    return kept, docs


# clean.sh, rule by rule. grep and sed work on '\n'-separated lines; the sed rules below run on the
# whole text at once, which is the same thing because every character class excludes '\n' and no
# literal or replacement contains one. The BRE -> Python translations (the cmd string is built in
# double quotes, so `\\` reached sed as `\`; sed turns `\/` into `/` outside brackets but copies a
# bracket verbatim, so `[^\/]` excludes both backslash and slash (GNU sed's match_slash /
# snarf_char_class; checked against sed 4.9); `\,` is a literal comma; `[^][]` is "neither ] nor
# ["; `|` is literal in a BRE; `[:]*` is `:*`).
# Each pattern has at most one `*` whose class cannot run past the literal that follows, except
# `<section`/`<meta`/`<hr` ([^\\]*)/> where Python's greedy match is also the longest one, so
# Python's leftmost-first matches equal POSIX leftmost-longest ones.
_GREP_DOC = re.compile(r"<doc [^>]*>")  # grep -v '^<doc [^>]*>$' (fullmatch on the line)
_GREP_CATEGORY = re.compile(r"\[\[Category:[^\]\[]*\]\]")  # grep -vE '\[\[Category:[^][]*\]\]'

_NOT_LINK = r"[^\]|\[\n]"  # [^]|[]
_NOT_BRACKET = r"[^\]\[\n]"  # [^][]


def _literal(tag: str, replacement: str = "", sed_replacement: str = "") -> tuple[str, str, str]:
    """A sed rule without special characters, `s/<tag>//g` ('/' is written '\\/' in clean.sh)."""
    sed = "s/" + tag.replace("/", "\\/") + "/" + sed_replacement + "/g"
    return sed, re.escape(tag), replacement


# (sed expression as clean.sh gives it to sed, Python pattern, replacement), in clean.sh's order.
SED_RULES: list[tuple[str, str, str]] = [
    (r"s/\[\[\([^]|[]*\)\]\]/\1/g", rf"\[\[({_NOT_LINK}*)\]\]", r"\1"),
    (r"s/\[\[\([^]|[]*\)\]\]/\1/g", rf"\[\[({_NOT_LINK}*)\]\]", r"\1"),
    (r"s/\[\[[^]|[]*|\([^]|[]*\)\]\]/\1/g", rf"\[\[{_NOT_LINK}*\|({_NOT_LINK}*)\]\]", r"\1"),
    (r"s/\[\[[^]|[]*|\([^]|[]*\)\]\]/\1/g", rf"\[\[{_NOT_LINK}*\|({_NOT_LINK}*)\]\]", r"\1"),
    (r"s/\[\[[:]*[Ff]ile:[^][]*\]\]//g", rf"\[\[:*[Ff]ile:{_NOT_BRACKET}*\]\]", ""),
    (r"s/\[\[[Mm]edia:[^][]*\]\]//g", rf"\[\[[Mm]edia:{_NOT_BRACKET}*\]\]", ""),
    (r"s/\[\[[Ii]mage:[^][]*\]\]//g", rf"\[\[[Ii]mage:{_NOT_BRACKET}*\]\]", ""),
    (r"s/\[\([^]|[]*\)\]/\1/g", rf"\[({_NOT_LINK}*)\]", r"\1"),
    (r"s/\[\[\([^][]*\)\]\]//g", rf"\[\[({_NOT_BRACKET}*)\]\]", ""),
    _literal("alt="),
    _literal("</doc>", "\r", r"\r"),  # GNU sed writes a carriage return for \r
    (r"s/<chem\([^<]*\)<\/chem>/\1/g", r"<chem([^<\n]*)</chem>", r"\1"),
    (r"s/<ins\([^<]*\)<\/ins>/\1/g", r"<ins([^<\n]*)</ins>", r"\1"),
    (r"s/<\, ref \([^<]*\)<\/ref>//g", r"<, ref ([^<\n]*)</ref>", ""),
    (r"s/<includeonly\([^<]*\)<\/includeonly>//g", r"<includeonly([^<\n]*)</includeonly>", ""),
    (r"s/<graph\([^<]*\)<\/graph>//g", r"<graph([^<\n]*)</graph>", ""),
    (r"s/<section\([^\]*\)\/>//g", r"<section([^\\\n]*)/>", ""),
    (r"s/<meta\([^\]*\)\/>//g", r"<meta([^\\\n]*)/>", ""),
    (r"s/<hr\([^\]*\)\/>//g", r"<hr([^\\\n]*)/>", ""),
    (r"s/<gallery\([^>]*\)>//g", r"<gallery([^>\n]*)>", ""),
    (r"s/<ref\([^<]*\)<\/ref>//g", r"<ref([^<\n]*)</ref>", ""),
    (r"s/<ref\([^>]*\)>//g", r"<ref([^>\n]*)>", ""),
    (r"s/<http\([^>]*\)>//g", r"<http([^>\n]*)>", ""),
    (r"s/<Ref\([^>]*\)>//g", r"<Ref([^>\n]*)>", ""),
    (r"s/<mapframe \([^\/]*\)\/>//g", r"<mapframe ([^\\/\n]*)/>", ""),  # [^\/]: not \ nor /
    (r"s/<mapframe\([^>]*\)>//g", r"<mapframe([^>\n]*)>", ""),
    *map(_literal, ("</mapframe>", "<poem>", "</poem>", "<math>", "</math>", "<ref>", "</ref>")),
    (r"s/<div\([^>]*\)>//g", r"<div([^>\n]*)>", ""),
    (r"s/<\/div\([^>]*\)>//g", r"</div([^>\n]*)>", ""),
    *map(_literal, (
        "</div style>", "</div>", "<sup>", "</sup>", "<br>", "</br>", "<BR>", "</BR>", "<Br>",
        "</Br>", "<del>", "</del>", "<nowiki>", "</nowiki>", "<NOWIKI>", "</NOWIKI>",
        "<onlyinclude>", "</onlyinclude>", "<includeonly>", "</includeonly>", "<small>",
        "</small>", "<chem>", "</chem>", "<noinclude>", "</noinclude>", "<gallery>", "</gallery>",
        "<graph>{", "<graph>", "}</graph>", "</graph>", "</references>",
    )),
    (r"s/<poem \([^>]*\)>//g", r"<poem ([^>\n]*)>", ""),
]

_COMPILED = [(re.compile(pattern), repl) for _, pattern, repl in SED_RULES]


def sed_rules(text: str) -> str:
    """The `sed` part of clean.sh on '\\n'-separated text."""
    for pattern, repl in _COMPILED:
        text = pattern.sub(repl, text)
    return text


def grep_rules(lines: list[str]) -> list[str]:
    """The two `grep -v` filters of clean.sh, on lines without their '\\n'."""
    return [
        line
        for line in lines
        if not (line.startswith("<doc ") and _GREP_DOC.fullmatch(line))
        and not ("[[Category:" in line and _GREP_CATEGORY.search(line))
    ]


def clean_sh(lines: list[str]) -> str:
    """clean.sh on lines (without '\\n'); grep terminates every line it prints with '\\n'."""
    lines = grep_rules(lines)
    if not lines:
        return ""
    return sed_rules("\n".join(lines) + "\n")


def clean_text(text: str, name: str = "<text>") -> tuple[str, int]:
    """One wikiextractor file's text -> the reference's `.2` text, and the number of articles."""
    if "\0" in text:
        # grep would switch to "binary file matches" and drop the rest of the file.
        line = text.count("\n", 0, text.index("\0")) + 1
        raise UserError(f"{name}:{line}: NUL byte in a text file")
    lines, docs = cleanup_file_lines(text)
    return clean_sh(lines), docs


# ---------------------------------------------------------------------------------------------
# The per-file stage machinery shared by clean and segment (and the file listing used by split)
# ---------------------------------------------------------------------------------------------


def add_common_arguments(parser: argparse.ArgumentParser, input_help: str) -> None:
    parser.add_argument("--input", required=True, help=input_help)
    parser.add_argument("--output", required=True, help="output folder (created if missing)")
    parser.add_argument(
        "--workers", type=int, default=default_workers(),
        help="local worker processes per rank (default: the usable CPU cores, %(default)s here)",
    )


def _is_ignored(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts) or rel.name == manifest.MANIFEST_NAME


def find_inputs(input_path: str | os.PathLike, output: str | os.PathLike) -> list[tuple[Path, str]]:
    """(path, relative name) of every input file, sorted by relative name.

    A folder is searched recursively; hidden files, manifests and anything under the output folder
    (when it lies inside the input folder) are ignored. A single file is its own relative name.
    """
    src = Path(input_path)
    if not src.exists():
        raise UserError(f"{src}: no such file or folder")
    if src.is_file():
        found = [(src, src.name)]
    elif src.is_dir():
        out_resolved = Path(output).resolve()
        if src.resolve() == out_resolved:
            raise UserError(f"{src}: --output is the input folder; choose another --output")
        found = []
        for root, dirs, files in os.walk(src, followlinks=True):
            root_path = Path(root)
            if root_path.resolve() == out_resolved:
                dirs[:] = []
                continue
            for fname in files:
                path = root_path / fname
                rel = path.relative_to(src)
                if _is_ignored(rel) or not path.is_file():
                    continue
                found.append((path, rel.as_posix()))
        found.sort(key=lambda item: item[1])
    else:
        raise UserError(f"{src}: not a regular file or folder")
    if not found:
        raise UserError(f"{src}: no input files found")
    return found


def prepare_output(output: str | os.PathLike) -> Path:
    out = Path(output)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{out}: exists and is not a folder") from None
    except OSError as exc:
        raise UserError(f"{out}: cannot create output folder: {exc.strerror}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UserError(f"{out}: output folder is not writable")
    return out


def check_workers(workers: int) -> None:
    if workers < 1:
        raise UserError(f"--workers must be at least 1, not {workers}")


def _file_task(task: tuple) -> tuple[str, bool, int | None]:
    """Worker: transform one input file into one output file (or skip it when already done)."""
    stage, transform, params, in_path, out_root, rel, entry = task
    out_root = Path(out_root)
    key = manifest.task_key(stage, params, [in_path])
    if entry is not None and manifest.is_done(out_root, rel, key, {rel: entry}):
        return rel, True, entry.samples
    text = read_utf8(in_path)
    if not text:
        raise UserError(f"{in_path}: empty input file")
    result, samples = transform(text, str(in_path))
    out_path = out_root / rel
    with atomic_output(out_path) as tmp:
        tmp.write_bytes(result.encode("utf-8"))
    manifest.record(out_root, rel, manifest.entry_for(out_path, stage, key, samples))
    return rel, False, samples


def run_per_file_stage(
    stage: str,
    transform: Callable[[str, str], tuple[str, int]],
    params: dict,
    args: argparse.Namespace,
    unit_name: str,
) -> int:
    """Run `transform(text, name) -> (output text, samples)` on every input file, in parallel,
    writing output/<relative path> and the folder's manifest. `transform` must be module-level."""
    check_workers(args.workers)
    world = World()
    inputs = find_inputs(args.input, args.output)
    out = Path(args.output)
    for path, rel in inputs:
        if (out / rel).resolve() == path.resolve():
            raise UserError(f"{path}: output would overwrite this input; choose another --output")
    manifest.own_outputs(out, stage, [rel for _, rel in inputs])
    folders = sorted({(out / rel).parent for _, rel in inputs})
    with manifest.stage_outputs([out, *folders], world.rank == 0):
        prepare_output(out)
        if world.rank == 0:
            for parent in folders:
                remove_stale_temporaries(parent)
        world.barrier()
        entries = manifest.load(out)
        tasks = [
            (stage, transform, params, str(path), str(out), rel, entries.get(rel))
            for path, rel in inputs
        ]
        results = run_tasks(_file_task, tasks, workers=args.workers, desc=stage, world=world)
        if world.rank == 0:
            manifest.finalize(out)
        skipped = sum(1 for _, was_skipped, _ in results if was_skipped)
        samples = sum(s or 0 for _, _, s in results)
        note = (f"; {skipped} skipped (already done, verified against the manifest)"
                if skipped else "")
        print(
            f"{stage}: {len(results)} file(s) -> {out}: {len(results) - skipped} written{note}; "
            f"{samples} {unit_name}"
        )
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(
        parser,
        "WikiExtractor output: a folder (e.g. text/ with AA/wiki_00 ...) or one wiki_nn file",
    )


def run(args: argparse.Namespace) -> int:
    params = {"reference": "cleanup_file.py+clean.sh", "version": 1}
    return run_per_file_stage(STAGE, clean_text, params, args, "articles")
