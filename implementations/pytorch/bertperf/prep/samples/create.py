"""Pretraining samples from sentence-per-line text, sample for sample as the MLPerf reference.

Same flags and defaults as the reference `create_pretraining_data.py`; for the same input, vocab and
flags the output holds the same instances, masks and NSP labels in the same order, written as padded
HDF5 (see docs/data_format.md). Two ways to call it:

  reference style   --input_file a.txt[,b.txt,glob*] --output_file out.hdf5[,out2.hdf5]
                    one random stream over all inputs; outputs filled round-robin, as the reference
  per part file     --input_dir parts/ --output_dir hdf5/ [--workers N]
                    each part-* file is its own run (its own Random(seed)), as MLPerf makes its 500
                    parts; parts are spread over N local processes and, under `mpirun -np K`, over
                    K ranks (rank r takes parts r, r+K, ...). Finished parts are skipped on rerun.

MLPerf flags: --max_seq_length=512 --max_predictions_per_seq=76 --masked_lm_prob=0.15
--random_seed=12345 --dupe_factor=10 (short_seq_prob stays 0.1).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import glob
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from bertperf.errors import UserError
from bertperf.formats import manifest, padded
from bertperf.formats.files import atomic_output, read_utf8, remove_stale_temporaries
from bertperf.formats.outputs import claim
from bertperf.formats.samples import Samples
from bertperf.prep.parallel import World, default_workers, run_tasks
from bertperf.prep.samples.instances import (Documents, Instances, Params, SpecialIds,
                                             create_instances)

STAGE = "create"


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "t", "yes", "y"):
        return True
    if value in ("0", "false", "f", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input_file", help="input text file(s): comma-separated paths or globs")
    p.add_argument("--output_file", help="output HDF5 file(s), comma-separated (round-robin)")
    p.add_argument("--input_dir", help="folder of part files, each made into its own HDF5 file")
    p.add_argument("--output_dir", help="folder for the per-part HDF5 files (with --input_dir)")
    p.add_argument("--input_glob", default="part-*", help="part files to take from --input_dir")
    p.add_argument("--vocab_file", required=True, help="WordPiece vocab (MLPerf: vocab.txt)")
    p.add_argument("--do_lower_case", type=parse_bool, nargs="?", const=True, default=True,
                   help="lower-case and strip accents (default true; --do_lower_case=false)")
    p.add_argument("--nodo_lower_case", dest="do_lower_case", action="store_false",
                   help=argparse.SUPPRESS)
    defaults = Params()
    p.add_argument("--max_seq_length", type=int, default=defaults.max_seq_length)
    p.add_argument("--max_predictions_per_seq", type=int, default=defaults.max_predictions_per_seq)
    p.add_argument("--random_seed", type=int, default=defaults.random_seed)
    p.add_argument("--dupe_factor", type=int, default=defaults.dupe_factor)
    p.add_argument("--masked_lm_prob", type=float, default=defaults.masked_lm_prob)
    p.add_argument("--short_seq_prob", type=float, default=defaults.short_seq_prob)
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="local worker processes for --input_dir (default: all cores)")
    p.add_argument("--engine", choices=("auto", "c", "python"), default="auto",
                   help="instance builder: the C fast path or the pure-Python one (same output)")
    p.add_argument("--tokenizer", choices=("python", "hf"), default="python",
                   help="the pure-Python reference tokenizer (word-cached, the fastest here) or HF "
                        "`tokenizers` for lines proven to tokenize identically (same output)")


@dataclass(frozen=True)
class Task:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    vocab_file: str
    do_lower_case: bool
    params: Params
    engine: str
    tokenizer: str
    key_params: tuple  # (name, value) pairs identifying the run, with the inputs' md5s (the key)


# ---- reading ------------------------------------------------------------------------------------

@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a block that allocates many objects and makes no
    cycles: its passes over the growing word memo cost about 10% of `create`'s time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_TOKENIZERS: dict[tuple, object] = {}


def get_tokenizer(vocab_file: str, do_lower_case: bool, kind: str):
    from bertperf.prep.samples.tokenization import Tokenizer

    key = (vocab_file, do_lower_case, kind)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = Tokenizer(vocab_file, do_lower_case=do_lower_case, fast=kind == "hf")
    return _TOKENIZERS[key]


def reference_lines(text: str) -> list[str]:
    """Lines as the reference's readline loop sees them: split on '\\n' only, then str.strip()."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the text after the final newline is not a line
    return [line.strip() for line in lines]


def read_documents(paths: list[str], tokenizer) -> Documents:
    """Documents across all `paths` in order: a blank line ends a document, files do not."""
    lines: list[str] = []
    for path in paths:
        text = read_utf8(path)
        if not text.strip():
            raise UserError(f"{path}: empty input file (no text)")
        lines.extend(reference_lines(text))
    encoded = tokenizer.encode_lines(lines)
    sent_lengths: list[int] = []
    doc_offsets = [0]
    flat: list[int] = []
    for line, ids in zip(lines, encoded):
        if not line and sent_lengths and len(sent_lengths) != doc_offsets[-1]:
            doc_offsets.append(len(sent_lengths))  # blank line: the current document ends
        if ids:
            sent_lengths.append(len(ids))
            flat.extend(ids)
    if len(sent_lengths) != doc_offsets[-1]:
        doc_offsets.append(len(sent_lengths))
    if len(doc_offsets) < 2:
        raise UserError(f"{paths[0]}: no tokens in the input (nothing to make samples from)")
    sent_offsets = np.zeros(len(sent_lengths) + 1, dtype=np.int64)
    np.cumsum(sent_lengths, out=sent_offsets[1:])
    return Documents(np.asarray(flat, dtype=np.int32), sent_offsets,
                     np.asarray(doc_offsets, dtype=np.int64))


# ---- building -----------------------------------------------------------------------------------

def fast_engine_available() -> bool:
    try:
        from bertperf.prep.samples import _fastcreate  # noqa: F401
    except ImportError:
        return False
    return True


def build_instances(docs: Documents, params: Params, ids: SpecialIds, engine: str) -> Instances:
    rng = random.Random(params.random_seed)
    if engine == "python" or (engine == "auto" and not fast_engine_available()):
        return create_instances(docs, params, ids, rng)
    try:
        from bertperf.prep.samples import _fastcreate
    except ImportError:
        raise UserError("--engine=c: the C extension is not built (pip install needs a C compiler);"
                        " use --engine=python") from None
    state = np.asarray(rng.getstate()[1], dtype=np.uint32)
    out = _fastcreate.create_instances(
        docs.tokens.tobytes(), docs.sent_offsets.tobytes(), docs.doc_offsets.tobytes(),
        state.tobytes(), params.max_seq_length, params.max_predictions_per_seq,
        params.masked_lm_prob, params.dupe_factor, params.short_seq_prob,
        ids.cls, ids.sep, ids.mask, ids.vocab_size)
    types = (np.int32, np.int64, np.int32, np.int8, np.int32, np.int32, np.int64, np.int64)
    tokens, offsets, a_lengths, nsp, positions, labels, mlm_offsets, order = (
        np.frombuffer(b, dtype=t) for b, t in zip(out, types))
    return Instances(Samples(tokens, offsets, a_lengths + 2, positions, labels, mlm_offsets, nsp),
                     order)


def run_task(task: Task) -> tuple[str, int]:
    """Make one run's samples and write its outputs, unless they exist and verify.

    Returns ("made" or "skipped", number of samples). Hashing inputs and outputs happens here, in
    the workers, so resuming a 500-part run does not hash 350 GB in one process.
    """
    key = manifest.task_key(STAGE, dict(task.key_params), [*task.inputs, task.vocab_file])
    outs = [Path(o) for o in task.outputs]
    entries = {d: manifest.load(d) for d in {o.parent for o in outs}}
    if all(manifest.is_done(o.parent, o.name, key, entries[o.parent]) for o in outs):
        return "skipped", sum(entries[o.parent][o.name].samples or 0 for o in outs)
    tokenizer = get_tokenizer(task.vocab_file, task.do_lower_case, task.tokenizer)
    with gc_paused():  # millions of short-lived lists and tuples, no reference cycles
        docs = read_documents(list(task.inputs), tokenizer)
    ids = SpecialIds(tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, len(tokenizer.vocab))
    inst = build_instances(docs, task.params, ids, task.engine)
    for k, out in enumerate(task.outputs):
        rows = inst.order[k::len(task.outputs)]  # the reference's round-robin writers
        with atomic_output(out) as tmp:
            padded.write_samples(tmp, inst.samples, rows, task.params.max_seq_length,
                                 task.params.max_predictions_per_seq, ids.vocab_size)
        out_path = Path(out)
        manifest.record(out_path.parent, out_path.name,
                        manifest.entry_for(out_path, STAGE, key, samples=len(rows)))
    return "made", len(inst)


# ---- planning -----------------------------------------------------------------------------------

def _expand_inputs(spec: str) -> list[str]:
    paths: list[str] = []
    for pattern in (s.strip() for s in spec.split(",")):
        if not pattern:
            continue
        hits = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not hits:
            raise UserError(f"{pattern}: no input file matches")
        paths.extend(hits)
    for path in paths:
        if Path(path).is_dir():
            raise UserError(f"{path}: is a folder; --input_file takes files (a folder of part "
                            "files goes to --input_dir, with --output_dir)")
        if not Path(path).is_file():
            raise UserError(f"{path}: no such input file")
    return paths


def plan(args: argparse.Namespace, params: Params) -> list[Task]:
    common = dict(vocab_file=str(args.vocab_file), do_lower_case=args.do_lower_case, params=params,
                  engine=args.engine, tokenizer=args.tokenizer)
    key_params = tuple(sorted({"do_lower_case": args.do_lower_case, **asdict(params)}.items()))
    if args.input_file or args.output_file:
        if not (args.input_file and args.output_file) or args.input_dir or args.output_dir:
            raise UserError("give --input_file with --output_file, or --input_dir with --output_dir")
        inputs = _expand_inputs(args.input_file)
        outputs = [s.strip() for s in args.output_file.split(",") if s.strip()]
        return [Task(tuple(inputs), tuple(outputs), key_params=key_params + (("outputs", len(outputs)),),
                     **common)]
    if not (args.input_dir and args.output_dir):
        raise UserError("give --input_file with --output_file, or --input_dir with --output_dir")
    in_dir = Path(args.input_dir)
    if not in_dir.is_dir():
        raise UserError(f"{in_dir}: no such input folder")
    inputs = sorted(p for p in in_dir.glob(args.input_glob) if p.is_file())
    if not inputs:
        raise UserError(f"{in_dir}: no files match {args.input_glob!r}")
    out_dir = Path(args.output_dir)
    if out_dir.resolve() == in_dir.resolve():
        raise UserError(f"--output_dir {out_dir}: is --input_dir: name another folder (a rerun "
                        f"would read its {args.input_glob} outputs as text)")
    return [Task((str(p),), (str(out_dir / f"{p.name}.hdf5"),),
                 key_params=key_params + (("outputs", 1),), **common)
            for p in inputs]


def run(args: argparse.Namespace) -> int:
    params = Params(args.max_seq_length, args.max_predictions_per_seq, args.masked_lm_prob,
                    args.dupe_factor, args.short_seq_prob, args.random_seed)
    params.check()
    from bertperf.prep.samples.tokenization import load_vocab, vocab_md5_warning

    load_vocab(args.vocab_file)  # fail early, in the coordinator, on a bad vocab
    world = World()
    if world.rank == 0 and (warning := vocab_md5_warning(args.vocab_file)):
        print(f"bertperf: warning: {warning}", file=sys.stderr)
    tasks = plan(args, params)
    flag = "--output_file" if args.output_file else "--output_dir"
    sources = [(f"input {i}", i) for t in tasks for i in t.inputs]
    for output in (o for t in tasks for o in t.outputs):
        claim(flag, output, "prep create", inputs=[*sources, ("--vocab_file", args.vocab_file)])
    out_dirs = sorted({str(Path(o).parent) for t in tasks for o in t.outputs})
    with manifest.stage_outputs(out_dirs, world.rank == 0):
        if world.rank == 0:
            for d in out_dirs:
                remove_stale_temporaries(d)
        world.barrier()
        results = run_tasks(run_task, tasks, workers=args.workers, desc="create", world=world)
        if world.rank == 0:
            for d in out_dirs:
                manifest.finalize(d)
    if world.rank == 0:
        made = [n for status, n in results if status == "made"]
        skipped = len(results) - len(made)
        note = f", {skipped} already made and verified (skipped)" if skipped else ""
        print(f"create: {sum(made)} samples from {len(made)} run(s){note}", file=sys.stderr)
    return 0
