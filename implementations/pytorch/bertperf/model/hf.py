"""Parameter names and state dicts of the other BERT implementations: HuggingFace's
BertForPreTraining (our names are HF's; HF has the unpadded vocabulary and the tied decoder as
extra keys), NVIDIA's MLPerf PyTorch checkpoint (`model.ckpt-28252.pt`: HF's names, LayerNorm
parameters sometimes called gamma/beta, the vocabulary padded to a multiple of 8, a decoder
without bias) and Google's TF1 checkpoint (`model.ckpt-28252` of MLPerf); what HF's model folder
holds (`save_pretrained`'s tensors and config.json)."""

from __future__ import annotations

import re
from typing import Mapping

import torch

from bertperf.errors import UserError
from bertperf.model.bert_config import BertConfig

_WORD = "bert.embeddings.word_embeddings.weight"
_BIAS = "cls.predictions.bias"
_DECODER = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
_LAYER_NORM_TF = re.compile(r"\.LayerNorm\.(gamma|beta)$")
_TF_LEAVES = {"gamma": "weight", "beta": "bias"}
NVIDIA_VOCAB_MULTIPLE = 8
"""NVIDIA pads the vocabulary of its MLPerf checkpoint to a multiple of this (30522 -> 30528)."""
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


def renamed(key: str) -> str:
    """Our name for a key of HF's or NVIDIA's state dict: `LayerNorm.gamma`/`LayerNorm.beta`
    (TF's names, which NVIDIA's checkpoints sometimes keep) become `LayerNorm.weight`/`.bias`;
    every other key is already ours."""
    return _LAYER_NORM_TF.sub(lambda m: f".LayerNorm.{_TF_LEAVES[m.group(1)]}", key)


def from_hf_state_dict(hf_state_dict: Mapping[str, torch.Tensor], config: BertConfig,
                       source: str = "HF state dict") -> dict[str, torch.Tensor]:
    """HF's or NVIDIA's BertForPreTraining state dict (or ours) as BertForPreTraining loads it:
    keys `renamed`; the vocabulary (`vocab_size` rows, or already padded to `padded_vocab_size`
    or to NVIDIA's multiple of 8) cut to `vocab_size` and padded with zero rows; the decoder
    keys, which must be tied to the embeddings, and the `position_ids` buffer of older HF
    versions dropped. The other tensors are not checked here (a strict load_state_dict does
    that). Errors are one line starting with `source`."""
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    for key, value in hf_state_dict.items():
        name = renamed(key)
        if name in out:
            raise UserError(f"{source}: tensors {origin[name]} and {key} are both {name}")
        out[name], origin[name] = value, key
    for key, tied in zip(_DECODER, (_WORD, _BIAS)):
        if key in out and tied in out and not torch.equal(out[key], out[tied]):
            raise UserError(f"{source}: {key} is not tied to {tied}")
        out.pop(key, None)
    out.pop("bert.embeddings.position_ids", None)
    rows = sorted({config.vocab_size, config.padded_vocab_size,
                   -(-config.vocab_size // NVIDIA_VOCAB_MULTIPLE) * NVIDIA_VOCAB_MULTIPLE})
    for name in (_WORD, _BIAS):
        tensor = out.get(name)
        if tensor is None:
            continue
        if tensor.dim() == 0 or tensor.shape[0] not in rows:
            raise UserError(f"{source}: tensor {name} has shape {tuple(tensor.shape)}, the BERT "
                            f"config needs {' or '.join(map(str, rows))} rows (vocab_size "
                            f"{config.vocab_size}, padded or not)")
        real = tensor[:config.vocab_size]
        padding = real.new_zeros(config.padded_vocab_size - config.vocab_size, *real.shape[1:])
        out[name] = torch.cat([real, padding])
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
        leaf = {ours: tf for tf, ours in _TF_LEAVES.items()}[leaf]
    elif leaf == "weight":
        leaf = "kernel"
    return f"{path}/{leaf}"


def tf_transposed(name: str) -> bool:
    """Whether the TF variable of parameter `name` is stored transposed ([in, out] kernels)."""
    return tf_name(name).endswith("/kernel")


# ---- HuggingFace's model folder (`export`, INIT_CHECKPOINT=<folder>) --------------------------

HF_WEIGHTS = "model.safetensors"
HF_CONFIG = "config.json"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"
HF_TORCH_WEIGHTS = "pytorch_model.bin"
"""The older name of a folder's weights (torch.save of the state dict), read where it has no
HF_WEIGHTS."""
HF_WEIGHTS_INDEX = "model.safetensors.index.json"
"""Where HF_WEIGHTS is sharded (transformers' save_pretrained of a large model): its
weight_map names each tensor's shard file."""
HF_VOCAB = "vocab.txt"
HF_SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "max_position_embeddings", "type_vocab_size")
"""The config.json keys that must equal the run's BertConfig for its weights to load."""


def hf_saved_tensors(state_dict: Mapping[str, torch.Tensor],
                     config: BertConfig) -> dict[str, torch.Tensor]:
    """The tensors of HF's `save_pretrained` of BertForPreTraining for our state dict: the
    vocabulary unpadded, the tied decoder left out (HF ties it to the word embeddings on load),
    each tensor float32, contiguous and in storage of its own (safetensors refuses shared
    storage: our query/key/value are views of one qkv parameter)."""
    out = to_hf_state_dict(state_dict, config)
    for key in _DECODER:
        out.pop(key)
    return {name: tensor.detach().to(torch.float32).contiguous().clone()
            for name, tensor in out.items()}


def hf_config(config: BertConfig) -> dict[str, object]:
    """config.json of HF's BertForPreTraining for `config` (the unpadded vocabulary)."""
    return {"architectures": ["BertForPreTraining"], "model_type": "bert",
            "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "intermediate_size": config.intermediate_size, "hidden_act": config.hidden_act,
            "hidden_dropout_prob": config.hidden_dropout_prob,
            "attention_probs_dropout_prob": config.attention_probs_dropout_prob,
            "max_position_embeddings": config.max_position_embeddings,
            "type_vocab_size": config.type_vocab_size,
            "initializer_range": config.initializer_range,
            "layer_norm_eps": config.layer_norm_eps, "pad_token_id": 0,
            "tie_word_embeddings": True, "dtype": "float32"}
