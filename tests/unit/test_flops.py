"""The model FLOPs formula (bertperf.model.flops) against BERT-large's written out."""

from __future__ import annotations

from bertperf.model import BertConfig
from bertperf.model.flops import forward_flops, train_flops


def test_bert_large_flops_per_sequence():
    """BERT-large's forward, written out: 24 layers x 2 x (3 d^2 + d^2 + 2 d f) per token, 24 x
    4 d L^2 per sequence, (2 d^2 + 2 d V) per masked token, 2 d^2 + 4 d per sequence."""
    large = BertConfig.large()
    d, f, V = 1024, 4096, 30522
    per_token = 24 * 2 * (3 * d * d + d * d + 2 * d * f)
    assert per_token == 603_979_776  # 603.98 MFLOP a token
    L, m = 300, 45
    expected = per_token * L + 24 * 4 * d * L * L + (2 * d * d + 2 * d * V) * m + 2 * d * d + 4 * d
    assert forward_flops(d, f, 24, V, [L], m) == expected
    assert train_flops(large, [L], m) == 3 * expected
    # a batch is the sum of its sequences (the L^2 term per sequence, not of the total)
    two = train_flops(large, [300, 100], 60)
    assert two == train_flops(large, [300], 45) + train_flops(large, [100], 15)
    assert two < train_flops(large, [400], 60)
