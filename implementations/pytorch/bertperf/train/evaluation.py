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
    for start in range(0, len(samples), batch_size):
        part = samples.take(np.arange(start, min(start + batch_size, len(samples))))
        batch = UnpaddedBatch.from_arrays(collate_varlen(part)).inputs()
        yield {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def mlm_counts(mlm_logits: torch.Tensor, masked_lm_ids: torch.Tensor) -> torch.Tensor:
    """[correct, total] masked predictions (float64)."""
    correct = (mlm_logits.argmax(-1) == masked_lm_ids).sum()
    return torch.stack([correct, torch.tensor(masked_lm_ids.numel(), device=correct.device)]).double()


@torch.no_grad()
def mlm_accuracy(model: torch.nn.Module, samples: Samples, batch_size: int, dist: Dist,
                 device: torch.device, autocast) -> float:
    """Accuracy over every rank's share: sum(correct) / sum(masked) after summing over ranks."""
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
