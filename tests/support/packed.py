"""Real packed shards (bertperf-packed/1 files, written by bench.loader's helpers: 3 shards of 200
synthetic sequences in rows of L tokens, a 32-sample eval file) and the tiny BERT they train,
with the Trainer set up on them as the loop runs it: the step audits on the CPU
(test_step_audits.py) and on CUDA (tests/gpu/test_packed_step_gpu.py), and the packed runs of
test_train_packed.py (tiny_config)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

from bertperf.data.synthetic import synthetic_packed, synthetic_samples
from bertperf.formats.packed import write_packed
from bertperf.formats.padded import write_samples

L, MAX_PRED, VOCAB = 64, 10, 1100  # synthetic ids lie in 999..VOCAB-1


def tiny_config(path: Path, dropout: float) -> Path:
    """A bert_config.json of a 2-layer BERT of hidden size 32 for VOCAB ids and L positions."""
    path.write_text(json.dumps({"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2,
                                "num_attention_heads": 2, "intermediate_size": 64,
                                "max_position_embeddings": L, "hidden_dropout_prob": dropout,
                                "attention_probs_dropout_prob": dropout}))
    return path


@pytest.fixture(scope="module")
def packed_env(tmp_path_factory) -> dict:
    """The settings of a run on the packed shards (dropout 0.1, 4 rows x GA 2 a step, no eval)."""
    root = tmp_path_factory.mktemp("packed")
    (root / "train").mkdir()
    for i in range(3):
        s = synthetic_samples(200, 40 + i, L, MAX_PRED, VOCAB)
        write_packed(root / "train" / f"part_{i:05d}.h5", synthetic_packed(s, L), L, MAX_PRED, 3)
    write_samples(root / "eval.hdf5", synthetic_samples(32, 9, L, MAX_PRED, VOCAB),
                  np.arange(32), L, MAX_PRED, VOCAB)
    return {"DATADIR_PHASE2": str(root / "train"), "EVAL_FILE": str(root / "eval.hdf5"),
            "BERT_CONFIG": str(tiny_config(root / "bert_config.json", 0.1)),
            "BATCHSIZE": "4", "GRADIENT_STEPS": "2", "LR": "0.002", "MAX_STEPS": "1000",
            "EVAL_ITER_START_SAMPLES": "100000", "SUBMISSION_DIVISION": "open",
            "TARGET_MLM_ACCURACY": "0.9", "DATA_VERIFY": "none", "PREFETCH": "2",
            "LOGDIR": str(root / "out")}


def trainer_for(env: dict, tmp_path: Path, **extra: str):
    """The Trainer `train.loop.setup` makes for env + extra (the layout read from the folder)."""
    from bertperf.config import load
    from bertperf.mlperf.log import MLPerfLogger
    from bertperf.train.checks import prepare
    from bertperf.train.loop import read_inputs, setup
    cfg = load({**env, **extra, "MLLOG_FILE": str(tmp_path / "log.txt")})
    assert cfg.data.layout is None  # the folder says packed
    trainer = setup(read_inputs(prepare(cfg)), MLPerfLogger(cfg.log_path, echo=False))
    assert trainer.cfg.data.layout == "packed"
    return trainer


@contextlib.contextmanager
def no_host_sync_outside_reports(monkeypatch):
    """CUDA's sync debug mode at "error" (a host sync raises) except inside Interval.read, the
    loop's one wait for the device, and while torch.compile compiles (dynamo's compile callbacks:
    the first step's tracing, the lazy backward's compile, CUDA-graph recording; inductor's
    constant folding reads device values once, there); the mode, Interval.read and the callbacks
    restored on leaving."""
    import torch
    from torch._dynamo.callback import callback_handler

    from bertperf.train import loop
    real_read = loop.Interval.read

    def read(interval, *args):
        torch.cuda.set_sync_debug_mode("default")
        try:
            return real_read(interval, *args)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    def compiling(*_):
        torch.cuda.set_sync_debug_mode("default")

    def compiled(*_):
        torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(loop.Interval, "read", read)
    callback_handler.register_start_callback(compiling)
    callback_handler.register_end_callback(compiled)
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
        callback_handler.remove_start_callback(compiling)
        callback_handler.remove_end_callback(compiled)
        monkeypatch.setattr(loop.Interval, "read", real_read)


class HostReads:
    """Counts the host reads of the training loop outside its reports: Interval.read (the one
    place the loop waits for the device) marks a report, and every call of the Tensor methods
    `names` outside one is recorded in `syncs`; the reports' values go to `reports`."""

    def __init__(self, monkeypatch, names: tuple[str, ...]) -> None:
        import torch

        from bertperf.train import loop
        self.reporting, self.syncs, self.reports = False, [], []
        real_read = loop.Interval.read

        def read(interval, *args):
            self.reporting = True
            try:
                self.reports.append(real_read(interval, *args))
                return self.reports[-1]
            finally:
                self.reporting = False

        monkeypatch.setattr(loop.Interval, "read", read)
        for name in names:
            real = getattr(torch.Tensor, name)

            def counted(tensor, *args, _real=real, _name=name, **kwargs):
                if not self.reporting:
                    self.syncs.append(_name)
                return _real(tensor, *args, **kwargs)
            monkeypatch.setattr(torch.Tensor, name, counted)
