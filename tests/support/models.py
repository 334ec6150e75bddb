"""Tiny BERTs and their batches: tiny_bert (one layer, for optimizer tests), TINY (two layers, for
the model's numerics, in float64) with random samples of given lengths as padded, unpadded or
packed batches, and HuggingFace's BertForPreTraining of the same config to compare logits with
(test_model.py, test_tf_checkpoint.py, test_triton_kernels.py, tests/gpu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertperf.data.collate import collate_packed
from bertperf.formats.packed import Packed
from bertperf.formats.samples import Samples, offsets_from_lengths
from bertperf.model import BertConfig, BertForPreTraining, PackedBatch, PaddedBatch, unpad


def tiny_bert() -> BertForPreTraining:
    """A one-layer BERT (vocab 40, hidden size 16), its weights drawn after manual_seed(0)."""
    torch.manual_seed(0)
    return BertForPreTraining(BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=32,
                                         max_position_embeddings=16))


TINY = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=48, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  max_position_embeddings=512, initializer_range=0.2)
MAX_PRED = 76


def samples(lengths: list[int], seed: int = 0, vocab: int = TINY.vocab_size) -> Samples:
    """Random sequences [CLS] A [SEP] B [SEP] of the given lengths (>= 3), ~15% masked."""
    rng = np.random.default_rng(seed)
    ids, b_starts, positions, labels, counts = [], [], [], [], []
    for n in lengths:
        seq = rng.integers(5, vocab, n)
        b = int(rng.integers(2, n)) if n > 3 else n  # B starts after A's [SEP]
        seq[0], seq[b - 1], seq[-1] = 1, 2, 2
        m = max(1, min(MAX_PRED, round(0.15 * n)))
        pos = np.sort(rng.choice(np.arange(1, n), size=min(m, n - 1), replace=False))
        ids.append(seq)
        b_starts.append(b)
        positions.append(pos)
        labels.append(rng.integers(5, vocab, len(pos)))
        counts.append(len(pos))
    return Samples(np.concatenate(ids), offsets_from_lengths(np.array(lengths)),
                   np.array(b_starts), np.concatenate(positions), np.concatenate(labels),
                   offsets_from_lengths(np.array(counts)), rng.integers(0, 2, len(lengths)))


def padded_batch(lengths: list[int], seed: int = 0) -> PaddedBatch:
    return PaddedBatch.from_arrays(samples(lengths, seed).to_padded(max(lengths), MAX_PRED))


def packed_batch(s: Samples, sizes: list[int], row_len: int, masks_per_row: int,
                 order: list[int] | None = None) -> PackedBatch:
    """The samples packed into rows of `sizes` sequences (in `order`), as the loader gives them."""
    rows = Packed.from_samples(s, np.arange(len(s)) if order is None else np.array(order),
                               np.array(sizes))
    return PackedBatch.from_arrays(collate_packed(rows.batch(max_seq_length=row_len,
                                                             max_pred=MAX_PRED), masks_per_row))


def hf_model(config: BertConfig):
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size, hidden_act=config.hidden_act,
        hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size, layer_norm_eps=config.layer_norm_eps,
        attn_implementation="eager")
    return transformers.BertForPreTraining(hf_config).double().eval()


def assert_same_logits_as_hf(model, hf, padded, rtol: float = 1e-10,
                             atol: float = 1e-12) -> None:
    """Our unpadded model and HF's BertForPreTraining give the same MLM logits at the masked
    positions and the same NSP logits (float64; float32 models need a looser `rtol`)."""
    with torch.no_grad():
        out = model(**unpad(padded).inputs())
        hf_out = hf(input_ids=padded.input_ids, attention_mask=padded.input_mask,
                    token_type_ids=padded.segment_ids)
    real = padded.masked_lm_positions != 0
    rows = torch.arange(len(real))[:, None].expand_as(real)
    hf_mlm = hf_out.prediction_logits[rows[real], padded.masked_lm_positions[real]]
    torch.testing.assert_close(out.mlm_logits, hf_mlm, rtol=rtol, atol=atol)
    torch.testing.assert_close(out.nsp_logits, hf_out.seq_relationship_logits,
                               rtol=rtol, atol=atol)
