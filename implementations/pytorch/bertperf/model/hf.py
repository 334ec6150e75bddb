"""Parameter names and state dicts of the other BERT implementations: HuggingFace's
BertForPreTraining (our names are HF's; HF has the unpadded vocabulary and the tied decoder as
extra keys) and Google's TF1 checkpoint (`model.ckpt-28252` of MLPerf)."""

from __future__ import annotations

import re
from typing import Mapping

import torch

from bertperf.errors import UserError
from bertperf.model.bert_config import BertConfig

_WORD = "bert.embeddings.word_embeddings.weight"
_BIAS = "cls.predictions.bias"
_DECODER = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
_TF_SPECIAL = {
    "cls.predictions.bias": "cls/predictions/output_bias",
    "cls.seq_relationship.weight": "cls/seq_relationship/output_weights",
    "cls.seq_relationship.bias": "cls/seq_relationship/output_bias",
}


def to_hf_state_dict(state_dict: Mapping[str, torch.Tensor],
                     config: BertConfig) -> dict[str, torch.Tensor]:
    """BertForPreTraining's state dict as HF's BertForPreTraining loads it (strict): the
    vocabulary padding removed, the tied decoder weight and bias added."""
    out = dict(state_dict)
    out[_WORD] = state_dict[_WORD][:config.vocab_size]
    out[_BIAS] = state_dict[_BIAS][:config.vocab_size]
    out[_DECODER[0]], out[_DECODER[1]] = out[_WORD], out[_BIAS]
    return out


def from_hf_state_dict(hf_state_dict: Mapping[str, torch.Tensor],
                       config: BertConfig) -> dict[str, torch.Tensor]:
    """HF's BertForPreTraining state dict as BertForPreTraining loads it (strict): vocabulary
    padded with zero rows; the decoder keys, which must be tied to the embeddings, and the
    `position_ids` buffer of older HF versions dropped."""
    out = {k: v for k, v in hf_state_dict.items()
           if k not in _DECODER and k != "bert.embeddings.position_ids"}
    for key, tied in zip(_DECODER, (_WORD, _BIAS)):
        if key in hf_state_dict and not torch.equal(hf_state_dict[key], hf_state_dict[tied]):
            raise UserError(f"HF state dict: {key} is not tied to {tied}")
    extra = config.padded_vocab_size - config.vocab_size
    word, bias = out[_WORD], out[_BIAS]
    if len(word) != config.vocab_size:
        raise UserError(f"HF state dict: {len(word)} word embeddings, config says "
                        f"{config.vocab_size}")
    out[_WORD] = torch.cat([word, word.new_zeros(extra, word.shape[1])])
    out[_BIAS] = torch.cat([bias, bias.new_zeros(extra)])
    return out


def tf_name(name: str) -> str:
    """The TF checkpoint variable that parameter `name` (ours, = HF's) comes from, e.g.
    bert.encoder.layer.3.attention.self.query.weight -> bert/encoder/layer_3/attention/self/
    query/kernel. TF `kernel`s are the transposes of our weights (`tf_transposed`); TF
    embedding tables are unpadded (30522 rows)."""
    if name in _TF_SPECIAL:
        return _TF_SPECIAL[name]
    path, leaf = name.rsplit(".", 1)
    path = re.sub(r"\blayer\.(\d+)", r"layer_\1", path).replace(".", "/")
    if path.endswith("_embeddings"):
        return path
    if path.endswith("LayerNorm"):
        leaf = {"weight": "gamma", "bias": "beta"}[leaf]
    elif leaf == "weight":
        leaf = "kernel"
    return f"{path}/{leaf}"


def tf_transposed(name: str) -> bool:
    """Whether the TF variable of parameter `name` is stored transposed ([in, out] kernels)."""
    return tf_name(name).endswith("/kernel")
