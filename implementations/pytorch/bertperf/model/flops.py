"""Model FLOPs of BERT pretraining, counted on real tokens: what a training step must compute,
whatever the implementation pads or recomputes; the benchmarks' and the performance model's
MFU count them (docs/performance.md).

With d = hidden size, f = intermediate size, V = vocab size (real, not padded), n layers, a
sequence of L real tokens with m masked tokens:

    forward = n * (2*(3*d*d + d*d + 2*d*f) * L   QKV, attention output, FFN (matmuls per token)
                   + 4*d*L^2)                    QK^T and PV (per sequence)
              + (2*d*d + 2*d*V) * m              MLM transform and decoder, masked tokens only
              + 2*d*d + 2*d*2                    pooler and NSP classifier
    training step = 3 * forward                  (backward = 2 * forward)

Embedding gathers, LayerNorm, softmax, GeLU, dropout and the optimizer are not counted (memory
traffic, not matmul FLOPs). BERT-large (d 1024, f 4096, n 24, V 30522): 603.98 MFLOP * L +
98,304 * L^2 + 64.6 MFLOP * m + 2.1 MFLOP per sequence, forward.
"""

from __future__ import annotations

from collections.abc import Iterable


def forward_flops(hidden: int, intermediate: int, layers: int, vocab: int,
                  lengths: Iterable[int], masked: int) -> float:
    """Forward matmul FLOPs of a batch of sequences of `lengths` real tokens with `masked`
    masked tokens in all (module docstring)."""
    lengths = [int(n) for n in lengths]
    d, f = hidden, intermediate
    per_token = layers * 2 * (3 * d * d + d * d + 2 * d * f)
    attention = layers * 4 * d * sum(n * n for n in lengths)
    mlm = (2 * d * d + 2 * d * vocab) * masked
    nsp = (2 * d * d + 2 * d * 2) * len(lengths)
    return float(per_token * sum(lengths) + attention + mlm + nsp)


def train_flops(config, lengths: Iterable[int], masked: int) -> float:
    """Model FLOPs of a training step (forward + backward = 3 x forward) of a BertConfig on
    these sequences."""
    return 3 * forward_flops(config.hidden_size, config.intermediate_size,
                             config.num_hidden_layers, config.vocab_size, lengths, masked)
