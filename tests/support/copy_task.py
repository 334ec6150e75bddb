"""The copy task: tiny learnable data for real runs of the trainer in seconds. Every token of a
sequence is one word t in 4..31 and MAX_PRED of them are masked, so the model can read the answer
off the other tokens (the tiny BERT of tiny_bert_config reaches MLPerf's 0.720 within a few
thousand samples). make_dataset writes it as the trainer reads it: unpadded training shards, a
padded eval file and a bert_config.json; add_manifests, packed_copy and env_for build on that."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bertperf.formats.padded import write_samples
from bertperf.formats.samples import Samples, offsets_from_lengths
from bertperf.formats.unpadded import write_shard

VOCAB, MSL, MAX_PRED = 32, 16, 4
CLS, SEP, MASK = 1, 2, 3


def copy_task(n: int, seed: int) -> Samples:
    """n learnable samples: every token of a sequence is one word t in 4..31, MAX_PRED of them
    masked ([MASK] input, label t), so the model can read the answer off the other tokens."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(10, MSL + 1, n)
    offsets = offsets_from_lengths(lengths)
    words = rng.integers(4, VOCAB, n)
    ids = np.repeat(words, lengths)
    ids[offsets[:-1]] = CLS
    ids[offsets[1:] - 1] = SEP
    b_starts = lengths // 2
    ids[offsets[:-1] + b_starts - 1] = SEP
    # two masks in segment A (positions 1..3), two in B (from b_start on): never a [SEP]
    positions = np.concatenate([np.stack([np.sort(rng.choice(np.arange(1, 4), 2, replace=False)),
                                          b + np.sort(rng.choice(3, 2, replace=False))])
                                for b in b_starts]).reshape(-1)
    mlm_ids = np.repeat(words, MAX_PRED)
    ids[np.repeat(offsets[:-1], MAX_PRED) + positions] = MASK
    return Samples(ids, offsets, b_starts, positions, mlm_ids,
                   offsets_from_lengths(np.full(n, MAX_PRED)), rng.integers(0, 2, n))


def tiny_bert_config(path: Path, dropout: float = 0.0, positions: int = MSL) -> Path:
    path.write_text(json.dumps({"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2,
                                "num_attention_heads": 2, "intermediate_size": 64,
                                "max_position_embeddings": positions,
                                "hidden_dropout_prob": dropout,
                                "attention_probs_dropout_prob": dropout}))
    return path


def make_dataset(root: Path, n_train: int = 512, n_eval: int = 64, shards: int = 2,
                 msl: int = MSL) -> dict:
    """Unpadded training shards, a padded eval file and a bert_config.json under root, the
    files' max_seq_length `msl` (the position table's length; above MSL, packed_copy's rows
    of that length hold several sequences)."""
    train = root / "train"
    train.mkdir(parents=True)
    s = copy_task(n_train, seed=1)
    per = n_train // shards
    for i in range(shards):
        write_shard(train / f"part_{i}.h5", s.take(np.arange(i * per, (i + 1) * per)), msl,
                    MAX_PRED)
    ev = copy_task(n_eval, seed=2)
    write_samples(root / "eval.hdf5", ev, np.arange(n_eval), msl, MAX_PRED, VOCAB)
    return {"DATADIR_PHASE2": str(train), "EVAL_FILE": str(root / "eval.hdf5"),
            "BERT_CONFIG": str(tiny_bert_config(root / "bert_config.json", positions=msl))}


def add_manifests(env: dict) -> dict:
    """Record the training shards and the eval file of `make_dataset` in MANIFEST.json files,
    as the prep stages do (the trainer verifies data against them)."""
    import h5py

    from bertperf.formats import manifest
    train, eval_file = Path(env["DATADIR_PHASE2"]), Path(env["EVAL_FILE"])
    for path in [*sorted(train.glob("*.h5")), eval_file]:
        with h5py.File(path, "r") as f:
            count = len(f["nsp"] if "nsp" in f else f["next_sentence_labels"])
        manifest.record(path.parent, path.name, manifest.entry_for(path, "test", "-", count))
    manifest.finalize(train)
    manifest.finalize(eval_file.parent)
    return env


def packed_copy(env: dict, folder: Path, row: int = MSL) -> dict:
    """env with DATADIR_PHASE2 = its training shards packed into `folder` (bench.loader's greedy
    packing: up to 3 sequences per `row`-token row, in order; a row longer than MSL holds
    several of the copy task's sequences, whose positions the model's table must then reach)."""
    from bertperf.data.synthetic import synthetic_packed
    from bertperf.formats.packed import write_packed
    from bertperf.formats.unpadded import read_shard
    folder.mkdir(parents=True)
    for shard in sorted(Path(env["DATADIR_PHASE2"]).glob("*.h5")):
        write_packed(folder / shard.name, synthetic_packed(read_shard(shard)[0], row), row,
                     MAX_PRED, 3)
    return {**env, "DATADIR_PHASE2": str(folder)}


def env_for(tmp_path: Path, **extra: str) -> dict:
    """The settings of a short run (BATCHSIZE 4, LR 0.01, 50 steps) on a fresh copy task under
    tmp_path, `extra` on top."""
    return {**make_dataset(tmp_path / "data"), "BATCHSIZE": "4", "LR": "0.01", "MAX_STEPS": "50",
            "LOGDIR": str(tmp_path / "out"), **extra}
