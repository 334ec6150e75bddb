"""Check folders against their checksum manifests (and optionally a published md5sum list).

Every stage writes MANIFEST.json (md5, size, sample count per file) into its output folder. This
names each file that is missing, truncated, corrupt or has the wrong sample count, and lists files
the manifest does not know. --md5sum_list takes a list in `md5sum` format (such as the reference's
published bert_reference_results_text_md5.txt) and checks the files it names in the folder.
Exit status 1 when anything is bad. --vocab_file also checks the vocab against the MLPerf md5.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bertperf.errors import UserError
from bertperf.formats import detect, manifest
from bertperf.formats.files import md5_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folders", nargs="+", help="output folders of prep stages")
    p.add_argument("--md5sum_list", help="published checksums, `md5sum` format, for these folders")
    p.add_argument("--vocab_file", help="also compare this vocab with the MLPerf vocab md5")


def check_folder(folder: Path) -> list[str]:
    """One line per problem in `folder`."""
    if not folder.is_dir():
        return [f"{folder}: no such folder"]
    if not (folder / manifest.MANIFEST_NAME).exists():
        return [f"{folder}: no {manifest.MANIFEST_NAME} (was this folder written by a prep stage?)"]
    entries = manifest.load(folder)
    problems = []
    for name, entry in sorted(entries.items()):
        path = folder / name
        why = manifest.check_file(path, entry)
        if why is None and path.suffix in detect.SUFFIXES and entry.samples is not None:
            try:
                if (n := detect.header(path).count) != entry.samples:
                    why = f"{n} samples, manifest says {entry.samples}"
            except UserError as exc:
                why = str(exc)
        if why:
            problems.append(f"{path}: {why}")
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and not path.name.startswith(".") and rel != manifest.MANIFEST_NAME \
                and rel not in entries:
            print(f"verify: note: {path} is not in the manifest", file=sys.stderr)
    return problems


def check_md5sum_list(list_file: Path, folders: list[Path]) -> list[str]:
    problems = []
    try:
        lines = list_file.read_text().splitlines()
    except OSError as exc:
        raise UserError(f"{list_file}: cannot read ({exc.strerror})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split(None, 1)
        if len(parts) != 2 or len(parts[0]) != 32:
            raise UserError(f"{list_file}:{lineno}: not an md5sum line")
        want, name = parts[0].lower(), parts[1].lstrip("*").strip()
        hits = [f / Path(name).name for f in folders if (f / Path(name).name).is_file()]
        if not hits:
            problems.append(f"{name}: listed in {list_file} but not found")
        elif (got := md5_file(hits[0])) != want:
            problems.append(f"{hits[0]}: md5 {got} differs from published {want}")
    return problems


def run(args: argparse.Namespace) -> int:
    folders = [Path(f) for f in args.folders]
    problems = [p for f in folders for p in check_folder(f)]
    if args.md5sum_list:
        problems += check_md5sum_list(Path(args.md5sum_list), folders)
    if args.vocab_file:
        from bertperf.prep.samples.tokenization import vocab_md5_warning

        if warning := vocab_md5_warning(args.vocab_file):
            print(f"verify: warning: {warning}", file=sys.stderr)
    for p in problems:
        print(f"verify: BAD {p}", file=sys.stderr)
    n = sum(len(manifest.load(f)) for f in folders if (f / manifest.MANIFEST_NAME).exists())
    print(f"verify: {n} file(s) checked, {len(problems)} problem(s)")
    return 1 if problems else 0
