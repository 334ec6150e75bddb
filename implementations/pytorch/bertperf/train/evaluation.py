"""Masked-LM accuracy over the whole eval file (MLPerf's metric): correct masked predictions over
masked tokens, from counts summed over ranks, so that a sharded eval reduces exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bertperf.data.collate import collate_varlen
from bertperf.formats import detect
from bertperf.formats.reading import read_samples
from bertperf.formats.samples import Samples
from bertperf.model import UnpaddedBatch
from bertperf.train.dist import Dist

EVAL_KINDS = (detect.PADDED, detect.NVIDIA)
"""Eval files: padded (`prep eval`) or NVIDIA's variable-length one (eval_varlength/)."""


def load_eval_share(path: Path, rank: int, world_size: int) -> tuple[Samples, int]:
    """Rank `rank`'s samples of the eval file (rows rank, rank + W, ...) and the file's total
    number of samples."""
    samples, _, _ = read_samples(path, EVAL_KINDS)
    return samples.take(np.arange(rank, len(samples), world_size)), len(samples)


def eval_batches(samples: Samples, batch_size: int, device: torch.device):
    """The model's inputs of each batch on `device`: on CUDA pinned and copied non_blocking (no
    wait for the device per batch)."""
    cuda = device.type == "cuda"
    for start in range(0, len(samples), batch_size):
        part = samples.take(np.arange(start, min(start + batch_size, len(samples))))
        batch = UnpaddedBatch.from_arrays(collate_varlen(part))
        yield (batch.pin_memory() if cuda else batch).to(device, non_blocking=cuda).inputs()


def mlm_counts(mlm_logits: torch.Tensor, masked_lm_ids: torch.Tensor) -> torch.Tensor:
    """[correct, total] masked predictions (float64, on the logits' device; the total is the
    labels' count, known on the host, filled in there without a copy)."""
    correct = (mlm_logits.argmax(-1) == masked_lm_ids).sum(dtype=torch.float64)
    return torch.stack([correct, torch.full_like(correct, masked_lm_ids.numel())])


@torch.no_grad()
def mlm_accuracy(model: torch.nn.Module, samples: Samples, batch_size: int, dist: Dist,
                 device: torch.device, autocast) -> float:
    """Accuracy over every rank's share: sum(correct) / sum(masked) after summing over ranks,
    the counts accumulated on the device and read once, at the end."""
    was_training = model.training
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for batch in eval_batches(samples, batch_size, device):
        with autocast():
            out = model(**{k: v for k, v in batch.items() if k != "next_sentence_labels"})
        counts += mlm_counts(out.mlm_logits, batch["masked_lm_ids"])
    model.train(was_training)
    correct, total = dist.sum(counts).tolist()
    return correct / total if total else 0.0
