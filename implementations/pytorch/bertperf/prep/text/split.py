"""Hold out the eval articles and gather the rest into part files: the reference's
seperate_test_set.py, then do_gather.py. Every file under --input (`prep segment`'s output
folder, or one file), in order of relative path, goes to --output byte-identical to the MLCommons
reference's results/: eval.txt and eval.md5 (for input file i of N, int((i+1)*K/N) - int(i*K/N) of
its articles drawn with random.Random(seed + 13*i), K = --num_test_articles; docs/design.md gives
the draw) and part-XXXXX-of-NNNNN, the other articles of each file concatenated in order, a new
part starting when --block_size MiB would be exceeded by the size of the file's RAW WikiExtractor
input (--raw_dir, same relative paths; without it the --input sizes give other parts). NNNNN is
--num_outputs, a label only. MLPerf's setting is the default (10,000 articles, seed 12345, 26.92
MiB, 500). Outputs are atomic and recorded in --output/MANIFEST.json (a rerun skips what still
matches); --workers local processes, and under `mpirun -np K` rank r takes tasks r, r+K, ...

example:
  python -m bertperf prep split --input sentences/ --raw_dir text/ --output results/"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from pathlib import Path

from bertperf.errors import UserError
from bertperf.formats import manifest
from bertperf.formats.files import atomic_output, read_utf8, remove_stale_temporaries
from bertperf.prep.parallel import World, run_tasks
from bertperf.prep.text.clean import (add_common_arguments, check_workers, find_inputs,
                                      prepare_output)


STAGE = "split"
EVAL_TXT = "eval.txt"
EVAL_MD5 = "eval.md5"


def part_name(index: int, num_outputs: int) -> str:
    return f"part-{str(index).zfill(5)}-of-{str(num_outputs).zfill(5)}"


def num_tests_for(file_id: int, num_test_articles: int, num_files: int) -> int:
    """How many eval articles file `file_id` gives (the reference's float expression, verbatim)."""
    return int((file_id + 1) * num_test_articles * 1.0 / num_files) - int(
        file_id * num_test_articles * 1.0 / num_files
    )


def draw_eval_ids(file_id: int, num_articles: int, num_tests: int, seed: int) -> list[int]:
    """The article ids the reference picks, in draw order (needs num_tests <= num_articles)."""
    rng = random.Random(seed + file_id * 13)
    ids: list[int] = []
    seen: set[int] = set()
    while len(ids) < num_tests:
        new_id = int(rng.random() * num_articles)
        if new_id in seen:
            continue
        seen.add(new_id)
        ids.append(new_id)
    return ids


def plan_parts(sizes: list[int], block_size: float, names: list[str]) -> list[list[int]]:
    """Group file indices into parts the way do_gather.py does (one worker)."""
    limit = block_size * 1024 * 1024
    parts: list[list[int]] = []
    current: list[int] | None = None
    total = 0
    for i, size in enumerate(sizes):
        if limit < total + size:
            if current is None:
                # do_gather.py calls out_file.close() on None here and crashes.
                raise UserError(
                    f"{names[i]}: raw size {size} B is larger than --block_size {block_size} MiB "
                    "for the first file of a part (the reference crashes here); raise --block_size"
                )
            parts.append(current)
            current = None
            total = 0
        if current is None:
            current = []
        total += size
        current.append(i)
    if current is not None:
        parts.append(current)
    return parts


def training_text(articles: list[str], eval_ids: list[int]) -> tuple[str, int]:
    """A file's `.4` text as do_gather.py copies it, and how many non-empty articles it holds."""
    held_out = set(eval_ids)
    kept = [a for j, a in enumerate(articles) if j not in held_out]
    content = "".join(a + "\n\n" for a in kept)
    if content.startswith("\ufeff"):  # do_gather reads the .4 file as utf-8-sig
        content = content[1:]
    if len(content) >= 2 and content[-1] == content[-2] == "\n":
        content = content[:-1]
    return content, sum(1 for a in kept if a.strip())


def _holdout_task(task: tuple) -> tuple[list[int], list[str]]:
    """Worker: pick one file's eval articles. Returns (ids in file order, those articles)."""
    file_id, path, num_files, num_test_articles, seed = task
    text = read_utf8(path)
    if not text:
        raise UserError(f"{path}: empty input file")
    articles = text.split("\n\n")
    num_tests = num_tests_for(file_id, num_test_articles, num_files)
    if num_tests > len(articles):
        raise UserError(
            f"{path}: {num_tests} eval article(s) to hold out from this file (--num_test_articles "
            f"{num_test_articles} over {num_files} files) but it has only {len(articles)} "
            "(the reference loops forever here); lower --num_test_articles"
        )
    if num_tests == len(articles):
        raise UserError(
            f"{path}: all {num_tests} article(s) of this file would be held out for eval "
            f"(--num_test_articles {num_test_articles} over {num_files} files), leaving no "
            "training text (the reference's do_gather.py crashes on it); lower --num_test_articles"
        )
    ids = sorted(draw_eval_ids(file_id, len(articles), num_tests, seed))
    return ids, [articles[j] for j in ids]


def _gather_task(task: tuple) -> tuple[str, str, bool, int | None]:
    """Worker: write one part file from its input files minus their eval articles."""
    name, files, params, out_root, entry = task
    out_root = Path(out_root)
    key = manifest.task_key(STAGE, params, [path for path, _ in files])
    if entry is not None and manifest.is_done(out_root, name, key, {name: entry}):
        return name, key, True, entry.samples
    articles_written = 0
    out_path = out_root / name
    with atomic_output(out_path) as tmp, open(tmp, "wb") as f:
        for path, eval_ids in files:
            content, count = training_text(read_utf8(path).split("\n\n"), eval_ids)
            f.write(content.encode("utf-8"))
            articles_written += count
    manifest.record(out_root, name, manifest.entry_for(out_path, STAGE, key, articles_written))
    return name, key, False, articles_written


def _raw_sizes(inputs: list[tuple[Path, str]], raw_dir: str | None, world: World) -> list[int]:
    if raw_dir is None:
        if world.rank == 0:
            print(
                "split: note: no --raw_dir, so parts are cut by the sizes of the --input files; "
                "the reference uses the raw WikiExtractor files' sizes (give --raw_dir to match it)"
            )
        return [path.stat().st_size for path, _ in inputs]
    raw = Path(raw_dir)
    if not raw.exists():
        raise UserError(f"{raw}: no such file or folder (--raw_dir)")
    sizes = []
    for path, rel in inputs:
        raw_path = raw if raw.is_file() and len(inputs) == 1 else raw / rel
        if not raw_path.is_file():
            raise UserError(
                f"{raw_path}: no such file (raw WikiExtractor file for {path}; --raw_dir must hold "
                "the raw files under the same relative paths as --input)"
            )
        sizes.append(raw_path.stat().st_size)
    return sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, "sentence text: the output folder of `prep segment`, or one file")
    parser.add_argument(
        "--raw_dir", default=None,
        help="the raw WikiExtractor files (e.g. text/), whose sizes decide the part boundaries as "
             "in the reference (default: the sizes of the --input files)",
    )
    parser.add_argument("--num_test_articles", type=int, default=10000,
                        help="eval articles held out in all (default %(default)s)")
    parser.add_argument("--seed", type=int, default=12345,
                        help="seed of the eval draw (default %(default)s)")
    parser.add_argument("--block_size", type=float, default=26.92,
                        help="part size in MiB of raw input (default %(default)s)")
    parser.add_argument("--num_outputs", type=int, default=500,
                        help="the NNNNN of part-XXXXX-of-NNNNN (default %(default)s)")


def run(args: argparse.Namespace) -> int:
    check_workers(args.workers)
    if args.num_test_articles < 0:
        raise UserError(f"--num_test_articles must be 0 or more, not {args.num_test_articles}")
    if not args.block_size > 0:
        raise UserError(f"--block_size must be positive, not {args.block_size}")
    if args.num_outputs < 1:
        raise UserError(f"--num_outputs must be at least 1, not {args.num_outputs}")
    world = World()
    inputs = find_inputs(args.input, args.output)
    out = Path(args.output)
    num_files = len(inputs)
    sizes = _raw_sizes(inputs, args.raw_dir, world)
    parts = plan_parts(sizes, args.block_size, [str(path) for path, _ in inputs])
    names = [part_name(p, args.num_outputs) for p in range(len(parts))]
    for path, _ in inputs:
        if path.resolve().parent == out.resolve() and path.name in (*names, EVAL_TXT, EVAL_MD5):
            raise UserError(f"{path}: output would overwrite this input; choose another --output")
    manifest.own_outputs(out, STAGE, [*names, EVAL_TXT, EVAL_MD5])
    common = {
        "reference": "seperate_test_set.py+do_gather.py",
        "num_files": num_files,
        "num_test_articles": args.num_test_articles,
        "seed": args.seed,
        "block_size": args.block_size,
        "num_outputs": args.num_outputs,
    }
    with manifest.stage_outputs([out], world.rank == 0):
        prepare_output(out)
        if world.rank == 0:
            remove_stale_temporaries(out)
        world.barrier()

        holdouts = run_tasks(
            _holdout_task,
            [(i, str(path), num_files, args.num_test_articles, args.seed)
             for i, (path, _) in enumerate(inputs)],
            workers=args.workers, desc="split: eval hold-out", world=world,
        )

        entries = manifest.load(out)
        gather_tasks = []
        for name, members in zip(names, parts):
            params = {**common, "part": name,
                      "files": [[i, inputs[i][1], sizes[i]] for i in members]}
            files = [(str(inputs[i][0]), holdouts[i][0]) for i in members]
            gather_tasks.append((name, files, params, str(out), entries.get(name)))
        gathered = run_tasks(_gather_task, gather_tasks, workers=args.workers,
                             desc="split: gather", unit="part", world=world)

        if world.rank == 0:
            skipped = sum(1 for _, _, was_skipped, _ in gathered if was_skipped)
            eval_params = {**common, "parts": [key for _, key, _, _ in gathered]}
            eval_articles = [a for _, articles in holdouts for a in articles]
            for name in (EVAL_TXT, EVAL_MD5):
                key = manifest.task_key(STAGE, {**eval_params, "output": name}, [])
                if manifest.is_done(out, name, key, entries):
                    skipped += 1
                    continue
                with atomic_output(out / name) as tmp, \
                        open(tmp, "w", encoding="utf-8", newline="\n") as f:
                    for article in eval_articles:
                        if name == EVAL_TXT:
                            f.write(article + "\n\n")
                        else:
                            digest = hashlib.md5(article.rstrip().encode("utf-8")).hexdigest()
                            f.write(digest + "\n")
                entry = manifest.entry_for(out / name, STAGE, key, len(eval_articles))
                manifest.record(out, name, entry)
            manifest.finalize(out)

    if world.rank == 0:
        stale = sorted(n for n in manifest.written_by(out, STAGE) - {*names, EVAL_TXT, EVAL_MD5}
                       if (out / n).exists())
        if stale:
            print(f"split: warning: {out} also holds {len(stale)} part file(s) this run did not "
                  f"produce (e.g. {stale[0]}); remove them before the next stage", file=sys.stderr)
        if len(parts) != args.num_outputs:
            print(f"split: warning: produced {len(parts)} part(s) but --num_outputs is "
                  f"{args.num_outputs} (it only labels the names; the sizes decide the count)",
                  file=sys.stderr)
        train_articles = sum(n or 0 for _, _, _, n in gathered)
        note = (f"; {skipped} skipped (already done, verified against the manifest)"
                if skipped else "")
        print(f"split: {num_files} file(s) -> {out}: {len(eval_articles)} eval articles, "
              f"{len(parts)} part(s) with {train_articles} training articles; "
              f"{len(parts) + 2 - skipped} file(s) written{note}")
    return 0
