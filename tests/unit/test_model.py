"""bertperf.model: the unpadded BERT against its padded reference (same loss and gradients in
float64), packing invariance, dropout, vocabulary padding, HuggingFace parity, BERT-large size."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertperf.errors import UserError
from bertperf.data.collate import collate_packed, collate_varlen
from bertperf.formats.packed import Packed
from bertperf.model import (BertConfig, BertForPreTraining, PaddedBatch, PaddedBertForPreTraining,
                            UnpaddedBatch, from_hf_state_dict, pad, tf_name, tf_transposed,
                            to_hf_state_dict, unpack_rows, unpad)
from bertperf.model.layers import PROJECTIONS
from tests.support.models import (MAX_PRED, TINY, assert_same_logits_as_hf, hf_model,
                                  packed_batch, padded_batch, samples)

MLPERF_BERT_CONFIG = {  # the MLPerf checkpoint's bert_config.json
    "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 4096,
    "max_position_embeddings": 512, "num_attention_heads": 16, "num_hidden_layers": 24,
    "type_vocab_size": 2, "vocab_size": 30522,
}
def models(config: BertConfig = TINY, seed: int = 0):
    torch.manual_seed(seed)
    model = BertForPreTraining(config).double()
    ref = PaddedBertForPreTraining(config).double()
    ref.load_state_dict(model.state_dict())
    return model, ref


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every gradient under its state-dict name: qkv's as the query, key and value blocks."""
    out = {}
    for name, p in model.named_parameters():
        if ".qkv." in name:
            module, leaf = name.split(".qkv.")
            out.update({f"{module}.{proj}.{leaf}": g
                        for proj, g in zip(PROJECTIONS, p.grad.chunk(len(PROJECTIONS)))})
        else:
            out[name] = p.grad
    return out


def assert_same_batch(got: UnpaddedBatch, expected: UnpaddedBatch) -> None:
    for name, value in got.inputs().items():
        want = getattr(expected, name)
        assert (value == want) if name == "max_seqlen" else torch.equal(value, want), name


# ---- config and size ---------------------------------------------------------------------------

def test_config_from_mlperf_json(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(MLPERF_BERT_CONFIG))
    config = BertConfig.from_json(path)
    assert config == BertConfig.large()
    assert (config.padded_vocab_size, config.head_size, config.layer_norm_eps) == (30528, 64, 1e-12)
    path.write_text(json.dumps({**MLPERF_BERT_CONFIG, "num_labels": 2}))
    with pytest.raises(UserError, match="num_labels"):
        BertConfig.from_json(path)
    path.write_text(json.dumps({**MLPERF_BERT_CONFIG, "hidden_act": "relu"}))
    with pytest.raises(UserError, match="relu"):
        BertConfig.from_json(path)


def test_bert_large_parameter_count_and_tf_names():
    c = BertConfig.large()
    with torch.device("meta"):
        model = BertForPreTraining(c)
    h, i, v = c.hidden_size, c.intermediate_size, c.padded_vocab_size
    layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h
    expected = ((v + c.max_position_embeddings + c.type_vocab_size) * h + 2 * h  # embeddings
                + c.num_hidden_layers * layer + (h * h + h)  # encoder, pooler
                + (h * h + h) + 2 * h + v + (2 * h + 2))  # MLM transform, bias; NSP
    assert sum(p.numel() for p in model.parameters()) == expected == 336_232_258
    names = list(model.state_dict())  # q, k and v: one parameter, three state-dict tensors
    assert len(list(model.parameters())) == 398 - 2 * 2 * c.num_hidden_layers
    tf = {tf_name(n) for n in names}
    assert len(tf) == len(names) == 398  # the MLPerf checkpoint's 398 weights_initialization names
    assert tf_name("bert.encoder.layer.23.attention.self.query.weight") == \
        "bert/encoder/layer_23/attention/self/query/kernel"
    assert tf_name("bert.encoder.layer.0.output.LayerNorm.weight") == \
        "bert/encoder/layer_0/output/LayerNorm/gamma"
    assert {"bert/embeddings/word_embeddings", "bert/embeddings/LayerNorm/beta",
            "bert/pooler/dense/bias", "cls/predictions/output_bias",
            "cls/predictions/transform/dense/kernel", "cls/seq_relationship/output_weights",
            "cls/seq_relationship/output_bias"} <= tf
    assert tf_transposed("bert.pooler.dense.weight")
    assert not tf_transposed("cls.seq_relationship.weight")
    assert not tf_transposed("bert.embeddings.word_embeddings.weight")


# ---- batches -----------------------------------------------------------------------------------

def test_unpad_and_pad_are_inverse():
    s = samples([9, 3, 17, 4], seed=1)
    padded = PaddedBatch.from_arrays(s.to_padded(20, MAX_PRED))
    u = unpad(padded)
    assert torch.equal(u.input_ids, torch.as_tensor(s.input_ids).long())
    assert u.cu_seqlens.tolist() == s.offsets.tolist() and u.max_seqlen == 17
    assert u.position_ids.tolist() == [p for n in s.lengths for p in range(n)]
    assert u.segment_ids.tolist() == [int(p >= b) for n, b in zip(s.lengths, s.b_starts)
                                      for p in range(n)]
    flat = s.mlm_positions + np.repeat(s.offsets[:-1], s.mlm_counts)
    assert u.masked_lm_positions.tolist() == flat.tolist()
    back = pad(u, 20, MAX_PRED)
    for name, value in back.inputs().items():
        assert torch.equal(value, getattr(padded, name)), name


def test_unpadded_batch_from_varlen_arrays():
    u = unpad(padded_batch([5, 8]))
    arrays = {k: (v.numpy().astype(np.int32) if isinstance(v, torch.Tensor) else np.int32(v))
              for k, v in u.inputs().items()}
    arrays["cu_masked"] = np.array([0, 1, 2])  # extra keys are ignored
    again = UnpaddedBatch.from_arrays(arrays)
    assert_same_batch(again, u)
    assert again.input_ids.dtype == again.cu_seqlens.dtype == torch.int32  # narrow on the host


def test_batches_from_the_data_side():
    """collate_varlen and Packed.batch output convert to the same UnpaddedBatch as the padded
    arrays of the same samples."""
    from bertperf.data.collate import to_torch
    s = samples([30, 7, 12, 5, 40], seed=2)
    expected = unpad(PaddedBatch.from_arrays(s.to_padded(40, MAX_PRED)))
    rows = Packed.from_samples(s, np.arange(5), np.array([3, 2]))
    for got in (UnpaddedBatch.from_arrays(to_torch(collate_varlen(s))),
                unpack_rows(rows.batch(max_seq_length=64, max_pred=MAX_PRED))):
        assert_same_batch(got, expected)


# ---- unpadded model == padded reference (float64) ------------------------------------------------

@pytest.mark.parametrize("lengths", [[512, 512], [3, 4, 5, 3, 5], [512, 7, 200, 3, 64, 129]],
                         ids=["all-512", "all-tiny", "mixed"])
def test_unpadded_matches_padded_reference(lengths):
    model, ref = models()
    model.train()
    ref.train()  # dropout probabilities are 0: train mode is deterministic
    padded = padded_batch(lengths, seed=len(lengths))
    out = model(**unpad(padded).inputs())
    expected = ref(**padded.inputs())
    for name in ("mlm_logits", "nsp_logits", "mlm_loss", "nsp_loss", "loss"):
        torch.testing.assert_close(getattr(out, name), getattr(expected, name),
                                   rtol=1e-10, atol=1e-12, msg=name)
    assert out.mlm_logits.shape == (sum(padded.masked_lm_positions.ne(0).sum(1)), TINY.vocab_size)
    out.loss.backward()
    expected.loss.backward()
    g, g_ref = grads(model), grads(ref)
    assert g.keys() == g_ref.keys()
    for name in g:  # atol: key biases have an exactly-zero gradient (softmax shift invariance)
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-10, atol=1e-13, msg=name)
    assert g["bert.encoder.layer.0.attention.self.key.weight"].abs().max() > 0


def test_sequences_are_independent_of_their_grouping():
    """Packing is only a grouping: each sequence gets the same outputs in any batch."""
    model, _ = models()
    model.eval()
    lengths = [7, 30, 4, 12, 25, 9]
    padded = padded_batch(lengths, seed=3)
    out = model(**unpad(padded).inputs())
    m_cu = F.pad(padded.masked_lm_positions.ne(0).sum(1).cumsum(0), (1, 0)).tolist()
    for i in range(len(lengths)):
        one = PaddedBatch(**{k: v[i:i + 1] for k, v in padded.inputs().items()})
        alone = model(**unpad(one).inputs())
        torch.testing.assert_close(alone.mlm_logits, out.mlm_logits[m_cu[i]:m_cu[i + 1]],
                                   rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(alone.nsp_logits, out.nsp_logits[i:i + 1],
                                   rtol=1e-12, atol=1e-13)


def packed_rows(batch: UnpaddedBatch, rows: list[list[int]], row_len: int,
                max_seqs: int = 3) -> dict[str, np.ndarray]:
    """Packed.batch-style arrays: the sequences of each row, in order, one after another."""
    cu = batch.cu_seqlens.tolist()
    arrays = {k: np.zeros((len(rows), row_len), dtype=np.int64)
              for k in ("input_ids", "input_mask", "segment_ids", "position_ids")}
    arrays["seq_lengths"] = np.zeros((len(rows), max_seqs), dtype=np.int32)
    arrays["next_sentence_labels"] = np.full((len(rows), max_seqs), -1)
    arrays["masked_lm_positions"] = np.zeros((len(rows), max_seqs * MAX_PRED), dtype=np.int64)
    arrays["masked_lm_ids"] = np.zeros_like(arrays["masked_lm_positions"])
    mpos, mids = batch.masked_lm_positions.tolist(), batch.masked_lm_ids.tolist()
    for r, seqs in enumerate(rows):
        col = m = 0
        for k, s in enumerate(seqs):
            a, b = cu[s], cu[s + 1]
            for name, src in (("input_ids", batch.input_ids), ("segment_ids", batch.segment_ids),
                              ("position_ids", batch.position_ids)):
                arrays[name][r, col:col + b - a] = src[a:b].numpy()
            arrays["input_mask"][r, col:col + b - a] = 1
            arrays["seq_lengths"][r, k] = b - a
            arrays["next_sentence_labels"][r, k] = int(batch.next_sentence_labels[s])
            for p, label in zip(mpos, mids):
                if a <= p < b:
                    arrays["masked_lm_positions"][r, m] = col + p - a
                    arrays["masked_lm_ids"][r, m] = label
                    m += 1
            col += b - a
    return arrays


def test_packed_rows_unpack_to_their_sequences():
    model, _ = models()
    model.eval()
    whole = unpad(padded_batch([7, 30, 4, 12, 25, 9], seed=4))
    rows = packed_rows(whole, [[0, 1, 2], [3], [4, 5]], row_len=48)
    unpacked = unpack_rows(rows)
    assert_same_batch(unpacked, whole)
    a, b = model(**whole.inputs()), model(**unpacked.inputs())
    assert torch.equal(a.mlm_logits, b.mlm_logits) and torch.equal(a.nsp_logits, b.nsp_logits)


# ---- dropout, vocabulary padding -----------------------------------------------------------------

def test_dropout():
    config = dataclasses.replace(TINY, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = BertForPreTraining(config).double()
    batch = unpad(padded_batch([20, 9, 33], seed=5))
    model.eval()
    eval_loss = model(**batch.inputs()).loss
    assert torch.equal(eval_loss, model(**batch.inputs()).loss)
    model.train()
    torch.manual_seed(1)
    a = model(**batch.inputs()).loss
    torch.manual_seed(1)
    assert torch.equal(a, model(**batch.inputs()).loss)
    assert not torch.allclose(a, eval_loss)
    model_no_dropout, _ = models()
    model_no_dropout.train()
    train = model_no_dropout(**batch.inputs()).loss
    model_no_dropout.eval()
    assert torch.equal(train, model_no_dropout(**batch.inputs()).loss)


def test_vocabulary_padding_never_matters():
    assert TINY.padded_vocab_size == 104
    model, _ = models()
    batch = unpad(padded_batch([20, 9, 33], seed=6))
    out = model(**batch.inputs())
    assert out.mlm_logits.shape[1] == TINY.vocab_size
    out.loss.backward()
    word = model.bert.embeddings.word_embeddings.weight
    assert not word.grad[TINY.vocab_size:].any()
    assert not model.cls.predictions.bias.grad[TINY.vocab_size:].any()
    with torch.no_grad():
        word[TINY.vocab_size:] = 1e3
        model.cls.predictions.bias[TINY.vocab_size:] = 1e3
    again = model(**batch.inputs())
    assert torch.equal(again.loss, out.loss) and torch.equal(again.mlm_logits, out.mlm_logits)


# ---- HuggingFace parity --------------------------------------------------------------------------

def test_huggingface_bert_gives_the_same_logits():
    model, _ = models()
    model.eval()
    hf = hf_model(TINY)
    hf.load_state_dict(to_hf_state_dict(model.state_dict(), TINY), strict=True)
    assert_same_logits_as_hf(model, hf, padded_batch([40, 5, 17], seed=7))


def test_huggingface_state_dict_round_trip():
    hf = hf_model(TINY)
    ours = from_hf_state_dict(hf.state_dict(), TINY)
    model = BertForPreTraining(TINY).double()
    model.load_state_dict(ours, strict=True)
    word = model.bert.embeddings.word_embeddings.weight
    assert word.shape[0] == 104 and not word[99:].any()
    back = to_hf_state_dict(model.state_dict(), TINY)
    hf_sd = hf.state_dict()
    assert back.keys() == hf_sd.keys()
    assert all(torch.equal(back[k], hf_sd[k]) for k in hf_sd)
    untied = dict(hf_sd)
    untied["cls.predictions.decoder.weight"] = untied["cls.predictions.decoder.weight"] + 1
    with pytest.raises(UserError, match="tied"):
        from_hf_state_dict(untied, TINY)


def test_qkv_is_one_parameter_saved_under_hf_names():
    """Q, K and V are one parameter pair (one GEMM, LAMB blocks marked) that state dicts hold as
    HF's query/key/value tensors, in HF's order; loading concatenates them back, and a state
    dict without one of them does not load."""
    model, _ = models()
    sa = model.bert.encoder.layer[1].attention.self
    prefix = "bert.encoder.layer.1.attention.self."
    assert [n for n, _ in sa.named_parameters()] == ["qkv.weight", "qkv.bias"]
    assert sa.qkv.weight.lamb_row_blocks == sa.qkv.bias.lamb_row_blocks == 3
    state = model.state_dict()
    assert not any(".qkv." in name for name in state)
    assert [n.removeprefix(prefix) for n in state if n.startswith(prefix)] == [
        f"{proj}.{leaf}" for proj in PROJECTIONS for leaf in ("weight", "bias")]
    for leaf in ("weight", "bias"):
        assert torch.equal(torch.cat([state[f"{prefix}{proj}.{leaf}"] for proj in PROJECTIONS]),
                           getattr(sa.qkv, leaf))
    other, _ = models(seed=1)
    other.load_state_dict(state, strict=True)
    assert all(torch.equal(a, b) for a, b in zip(other.parameters(), model.parameters()))
    assert f"{prefix}query.weight" in state and f"{prefix}qkv.weight" not in state  # untouched
    del state[f"{prefix}key.bias"]
    with pytest.raises(RuntimeError, match="qkv.bias"):
        other.load_state_dict(state, strict=True)


# ---- packed, fixed-shape batches ----------------------------------------------------------------

def test_packed_batch_layout():
    s = samples([30, 7, 12, 5, 40], seed=8)
    b = packed_batch(s, [3, 2], row_len=64, masks_per_row=12)
    assert b.cu_seqlens.tolist() == [0, 30, 37, 49, 64, 69, 109, 109, 128]  # K slots, tail
    assert b.max_seqlen == 64 and b.input_ids.shape == b.position_ids.shape == (2, 64)
    assert b.position_ids[0, :38].tolist() == [*range(30), *range(7), 0]
    assert b.cls_positions.tolist() == [[0, 30, 37], [64, 69, 64]]
    assert b.next_sentence_weights.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert b.masked_lm_weights.sum().item() == len(s.mlm_ids)
    m = b.masked_lm_weights.bool()
    assert b.masked_lm_positions[~m].tolist() == [64 * r for r in range(2) for _ in
                                                   range(12 - int(m[r].sum()))]
    assert all(t.dtype == torch.int32 for t in (b.input_ids, b.cu_seqlens, b.masked_lm_positions))
    rows = Packed.from_samples(s, np.arange(5), np.array([3, 2])).batch(max_seq_length=64,
                                                                        max_pred=MAX_PRED)
    with pytest.raises(ValueError, match="row 0 holds 7 masked tokens, more than the 5"):
        collate_packed(rows, 5)


@pytest.mark.parametrize("sizes, row_len", [([3, 2, 1], 64), ([1, 1, 1, 1, 1, 1], 40)],
                         ids=["mixed", "one-per-row"])
def test_packed_forward_backward_equals_varlen(sizes, row_len):
    """The packed model on fixed-shape rows = the unpadded model on the same sequences: MLM
    logits at the real slots, NSP logits of the real slots, losses and every gradient (float64,
    no dropout); padding tails and slots contribute nothing."""
    s = samples([30, 7, 12, 5, 40, 9], seed=9)
    order = [1, 0, 3, 4, 5, 2]
    packed = packed_batch(s, sizes, row_len, masks_per_row=14, order=order)
    varlen = UnpaddedBatch.from_arrays(collate_varlen(s.take(np.array(order))))
    model, _ = models()
    twin, _ = models()
    model.train()
    twin.train()
    p_out = model(**packed.inputs())
    v_out = twin(**varlen.inputs())
    real = packed.masked_lm_weights.reshape(-1).bool()
    torch.testing.assert_close(p_out.mlm_logits[real], v_out.mlm_logits, rtol=1e-12, atol=1e-13)
    seqs = packed.next_sentence_weights.reshape(-1).bool()
    torch.testing.assert_close(p_out.nsp_logits[seqs], v_out.nsp_logits, rtol=1e-12, atol=1e-13)
    for name in ("mlm_loss", "nsp_loss", "loss"):
        torch.testing.assert_close(getattr(p_out, name), getattr(v_out, name), rtol=1e-12,
                                   atol=0, msg=name)
    p_out.loss.backward()
    v_out.loss.backward()
    for (name, g), h in zip(grads(model).items(), grads(twin).values()):
        torch.testing.assert_close(g, h, rtol=1e-10, atol=1e-14, msg=name)
    divisors = torch.tensor([100.0, 10.0], dtype=torch.float64)
    with torch.no_grad():
        a = model(**packed.inputs(), loss_divisors=divisors)
        b = twin(**varlen.inputs(), loss_divisors=divisors)
    torch.testing.assert_close(a.loss, b.loss, rtol=1e-12, atol=0)
