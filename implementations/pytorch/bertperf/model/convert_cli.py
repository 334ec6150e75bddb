"""`python -m bertperf convert-ckpt`: Google's TF1 BERT checkpoint (MLPerf's model.ckpt-28252) to a
PyTorch file, without TensorFlow; `load_init_checkpoint`, which reads either for training,
NVIDIA's conversion of the same checkpoint (`model.ckpt-28252.pt`) or a HuggingFace model folder
(`export`'s, or bert-large-uncased's); and `read_torch_file`, how every checkpoint of ours is
read (the trainer's own too: one-line errors).

The converted file is `torch.save` of one dict (loadable with `weights_only=True`):

  model        BertForPreTraining's state dict (float32, vocabulary padded with zero rows)
  bert_config  the BertConfig it was converted for, as a dict
  source       the TF checkpoint prefix it came from

NVIDIA's file is `torch.save({'model': state_dict})` of its BertForPreTraining: HF's names, with
LayerNorm parameters sometimes called gamma/beta, the vocabulary padded 30522 -> 30528 and the
decoder weight tied to the word embeddings (hf.from_hf_state_dict reads both forms).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bertperf.errors import UserError
from bertperf.formats.files import atomic_output
from bertperf.formats.outputs import claim
from bertperf.model.bert import BertForPreTraining
from bertperf.model.bert_config import NAMED, BertConfig
from bertperf.model.hf import (HF_CONFIG, HF_SHAPE_KEYS, HF_TOKENIZER_CONFIG, HF_TORCH_WEIGHTS,
                               HF_VOCAB, HF_WEIGHTS, HF_WEIGHTS_INDEX, from_hf_state_dict,
                               renamed)
from bertperf.model.tf_checkpoint import checkpoint_prefix, state_dict_from_tf


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tf-checkpoint", required=True, metavar="PREFIX",
                   help="the checkpoint's prefix, e.g. .../model.ckpt-28252, or one of its "
                        "files (.index, .data-00000-of-00001, .meta)")
    p.add_argument("--bert-config", default="large",
                   help='"large" (default; MLPerf\'s), "tiny", or the path of a bert_config.json')
    p.add_argument("--output", required=True, type=Path, help="the .pt file to write")
    p.add_argument("--force", action="store_true",
                   help="replace --output where it is an earlier convert-ckpt file (never "
                        "another file)")


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    config = BertConfig.named(args.bert_config)
    prefix = checkpoint_prefix(args.tf_checkpoint)
    sources = [("--tf-checkpoint", p) for p in prefix.parent.glob(prefix.name + ".*")]
    config_file = None if args.bert_config in NAMED else args.bert_config
    claim("--output", args.output, "convert-ckpt",
          inputs=[*sources, ("--bert-config", config_file)], force=args.force)
    state_dict = state_dict_from_tf(prefix, config)
    with atomic_output(args.output) as tmp:
        torch.save({"model": state_dict, "bert_config": asdict(config), "source": str(prefix)},
                   tmp)
    params = sum(t.numel() for t in state_dict.values())
    print(f"convert-ckpt: {prefix} -> {args.output}: {len(state_dict)} tensors, "
          f"{params:,} parameters, {time.perf_counter() - start:.1f} s")
    return 0


def check_init_checkpoint(path: Path, config: BertConfig) -> str:
    """What INIT_CHECKPOINT `path` is wrong about without reading a tensor (train --check runs
    it): a HuggingFace folder's check_hf_folder, one of such a folder's files named instead of
    the folder; the source its lines start with."""
    source = f"init checkpoint {path}"
    if path.is_dir():
        check_hf_folder(path, config, source)
    elif path.suffix == ".safetensors" or path.name == HF_WEIGHTS_INDEX:
        raise UserError(f"{source}: a file of a HuggingFace model folder; INIT_CHECKPOINT takes "
                        f"the folder itself ({path.parent})")
    return source


def load_init_checkpoint(path: str | Path, config: BertConfig) -> dict[str, torch.Tensor]:
    """BertForPreTraining's state dict from `path`: a TF checkpoint (its prefix, or one of its
    files), a file written by convert-ckpt, NVIDIA's converted checkpoint or a HuggingFace model
    folder (read_hf_folder). Every tensor is checked against `config`'s model (one-line
    UserError naming the file and the first tensor missing, unknown or misshapen, by its name in
    the file)."""
    path = Path(path)
    source = check_init_checkpoint(path, config)
    if path.is_dir():
        saved = read_hf_folder(path, config, source)
    else:
        prefix = checkpoint_prefix(path)
        if prefix != path or Path(f"{path}.index").is_file():
            return state_dict_from_tf(prefix, config)
        if not path.is_file():
            raise UserError(f"{source}: neither a TF checkpoint prefix ({path}.index), a "
                            "PyTorch checkpoint file nor a HuggingFace model folder")
        checkpoint = read_torch_file(path, "init checkpoint")
        if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("model"), dict):
            raise UserError(f"{source}: not a convert-ckpt or NVIDIA checkpoint (no 'model' "
                            "state dict)")
        saved = checkpoint["model"]
    state_dict = from_hf_state_dict(saved, config, source)
    in_file = {renamed(key): key for key in saved}
    with torch.device("meta"):
        mine = BertForPreTraining(config).state_dict()
    for name, tensor in mine.items():
        if name not in state_dict:
            raise UserError(f"{source}: has no tensor {name}")
        if tuple(state_dict[name].shape) != tuple(tensor.shape):
            raise UserError(f"{source}: tensor {in_file.get(name, name)} has shape "
                            f"{tuple(state_dict[name].shape)}, the BERT config needs "
                            f"{tuple(tensor.shape)}")
    extra = [name for name in state_dict if name not in mine]
    if extra:
        raise UserError(f"{source}: tensor {in_file.get(extra[0], extra[0])} is not in this "
                        "model")
    return state_dict


def check_hf_folder(folder: Path, config: BertConfig, source: str) -> list[Path]:
    """What of HuggingFace model folder `folder` can be checked without reading a tensor, as
    one-line UserErrors starting with `source` (train --check runs it): config.json (model type,
    size against `config`'s HF_SHAPE_KEYS, activation), a cased tokenizer (tokenizer_config.json's
    do_lower_case false: the MLPerf data is lower-cased), a vocab.txt of another size than the
    model's vocabulary; the weight files: model.safetensors, the shards its index
    (model.safetensors.index.json) names, or pytorch_model.bin."""
    if not (folder / HF_CONFIG).is_file():
        raise UserError(f"{source}: no {HF_CONFIG} in the folder (not a HuggingFace model "
                        "folder)")
    hf = read_json_object(folder / HF_CONFIG, source)
    if hf.get("model_type") != "bert":
        raise UserError(f"{source}: {HF_CONFIG} has model_type {hf.get('model_type')!r}, not "
                        "'bert'")
    for key in HF_SHAPE_KEYS:
        mine = getattr(config, key)
        if hf.get(key, mine) != mine:
            raise UserError(f"{source}: {HF_CONFIG} has {key} {hf[key]}, this run's BERT "
                            f"(BERT_CONFIG) has {mine}")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise UserError(f"{source}: {HF_CONFIG} has hidden_act {hf['hidden_act']!r}; only "
                        "'gelu' is supported")
    tokenizer = folder / HF_TOKENIZER_CONFIG
    if tokenizer.is_file() and read_json_object(tokenizer, source).get("do_lower_case") is False:
        raise UserError(f"{source}: a cased model ({HF_TOKENIZER_CONFIG} has do_lower_case "
                        "false); the MLPerf data is lower-cased")
    vocab = folder / HF_VOCAB
    if vocab.is_file():
        tokens = len(vocab.read_bytes().splitlines())
        if tokens != config.vocab_size:
            raise UserError(f"{source}: {HF_VOCAB} has {tokens} tokens, the model's vocabulary "
                            f"{config.vocab_size} ({HF_CONFIG}'s vocab_size)")
    if (folder / HF_WEIGHTS).is_file():
        return [folder / HF_WEIGHTS]
    index = folder / HF_WEIGHTS_INDEX
    if index.is_file():
        weight_map = read_json_object(index, source).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserError(f"{source}: {HF_WEIGHTS_INDEX} has no weight_map")
        shards = [folder / name for name in dict.fromkeys(weight_map.values())]
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise UserError(f"{source}: {HF_WEIGHTS_INDEX} names {missing[0]}, which is not in "
                            "the folder")
        return shards
    if (folder / HF_TORCH_WEIGHTS).is_file():
        return [folder / HF_TORCH_WEIGHTS]
    raise UserError(f"{source}: no {HF_WEIGHTS}, {HF_WEIGHTS_INDEX} or {HF_TORCH_WEIGHTS} in "
                    "the folder")


def read_hf_folder(folder: Path, config: BertConfig, source: str) -> dict[str, torch.Tensor]:
    """The tensors of HuggingFace model folder `folder` (check_hf_folder first), by their names
    there: every safetensors shard's, or pytorch_model.bin's."""
    files = check_hf_folder(folder, config, source)
    if files[0].name == HF_TORCH_WEIGHTS:
        return read_torch_file(files[0], source)
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            tensors.update(load_file(path))
        except (SafetensorError, OSError) as exc:
            raise UserError(f"{source}: {path.name} is damaged, cannot be read "
                            f"({first_sentence(str(exc)) or type(exc).__name__})") from None
    return tensors


def read_json_object(path: Path, source: str) -> dict:
    """The JSON object in `path`; one line starting with `source` where it is none."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{source}: {path.name} cannot be read "
                        f"({first_sentence(str(exc)) or type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise UserError(f"{source}: {path.name} is not a JSON object")
    return data


def first_sentence(text: str, limit: int = 120) -> str:
    """The first sentence of `text` on one line, whole words up to `limit` characters."""
    sentence = " ".join(text.split()).split(". ")[0].rstrip(".")
    if len(sentence) > limit:
        sentence = sentence[:limit].rsplit(" ", 1)[0] + " ..."
    return sentence


WEIGHTS_ONLY = "WeightsUnpickler error:"
"""Where torch's refusal of a file that holds more than tensors gives its cause (the text
before it advises loading the file with weights_only=False, which a checkpoint never needs)."""


def read_torch_file(path: Path, what: str) -> Any:
    """`torch.load` of `path` onto the CPU, tensors and plain containers only (weights_only);
    what cannot be read is one UserError "<what> <path>: ...": no such file, a folder, damaged
    (the cause's first sentence), or not a checkpoint of tensors (weights_only's cause, without
    torch's advice)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UserError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{what} {path}: is a folder, expected a file") from None
    except Exception as exc:  # truncated zip, bad pickle, foreign file: torch raises many kinds
        text = str(exc)
        if WEIGHTS_ONLY in text:
            cause = text.split(WEIGHTS_ONLY, 1)[1].strip().split("\n\n")[0]
            why = f"cannot be read (not a checkpoint of tensors: {first_sentence(cause)})"
        else:
            why = ("damaged, cannot be read (truncated or corrupt: "
                   f"{first_sentence(text) or type(exc).__name__})")
        raise UserError(f"{what} {path}: {why}") from None
