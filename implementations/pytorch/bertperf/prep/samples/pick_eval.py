"""The eval set: pick --num_examples_to_pick samples from `create`'s output on eval.txt.

The reference's `pick_eval_samples.py` rule: with ratio = N / num_examples_to_pick (a float), sample
int(i * ratio) for i in 0..num_examples_to_pick-1, in that order. MLPerf: 10,000 samples from the
samples made from eval.txt with the MLPerf flags. Asking for more samples than the input holds is an
error here (the reference would silently repeat samples).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from bertperf.errors import UserError
from bertperf.formats import manifest, padded
from bertperf.formats.files import atomic_output
from bertperf.formats.outputs import claim

STAGE = "eval"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input_file", required=True, help="HDF5 samples made from eval.txt")
    p.add_argument("--output_file", required=True, help="the eval set (HDF5)")
    p.add_argument("--num_examples_to_pick", type=int, default=10000)
    p.add_argument("--max_seq_length", type=int, default=512, help="expected row length")
    p.add_argument("--max_predictions_per_seq", type=int, default=76, help="expected mask slots")


def pick_indices(num_examples: int, num_to_pick: int) -> np.ndarray:
    ratio = num_examples / num_to_pick
    return np.array([int(i * ratio) for i in range(num_to_pick)], dtype=np.int64)


def run(args: argparse.Namespace) -> int:
    src, dst = Path(args.input_file), Path(args.output_file)
    if not src.is_file():
        raise UserError(f"{src}: no such file")
    claim("--output_file", dst, "prep eval", inputs=[("--input_file", src)])
    params = {"num_examples_to_pick": args.num_examples_to_pick}
    key = manifest.task_key(STAGE, params, [src])
    if manifest.is_done(dst.parent, dst.name, key, manifest.load(dst.parent)):
        print(f"eval: {dst} already made and verified, skipped", file=sys.stderr)
        return 0
    if args.num_examples_to_pick < 1:
        raise UserError("--num_examples_to_pick must be at least 1")
    arrays = padded.read_samples(src)
    n = len(arrays["next_sentence_labels"])
    if arrays["input_ids"].shape[1] != args.max_seq_length or \
            arrays["masked_lm_positions"].shape[1] != args.max_predictions_per_seq:
        raise UserError(f"{src}: rows are {arrays['input_ids'].shape[1]}/"
                        f"{arrays['masked_lm_positions'].shape[1]} long, expected "
                        f"--max_seq_length={args.max_seq_length} "
                        f"--max_predictions_per_seq={args.max_predictions_per_seq}")
    if n < args.num_examples_to_pick:
        raise UserError(f"{src}: holds {n} samples, fewer than --num_examples_to_pick="
                        f"{args.num_examples_to_pick} (the eval set would repeat samples)")
    rows = pick_indices(n, args.num_examples_to_pick)
    with manifest.stage_outputs([dst.parent]):
        with atomic_output(dst) as tmp:
            padded.write_arrays(tmp, {k: v[rows] for k, v in arrays.items()})
        manifest.record(dst.parent, dst.name,
                        manifest.entry_for(dst, STAGE, key, samples=len(rows)))
        manifest.finalize(dst.parent)
    print(f"eval: picked {len(rows)} of {n} samples into {dst}", file=sys.stderr)
    return 0
