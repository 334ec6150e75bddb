"""bertperf.model.tf_checkpoint and convert_cli on a checkpoint written by real TensorFlow
(tests/fixtures/tf_ckpt, made by its make_tf_checkpoint.py), read here without TensorFlow: every
tensor's value, the mapping to BertForPreTraining (strict load, transposes, vocabulary padding,
HuggingFace parity), the convert-ckpt file, any of the checkpoint's files standing for its
prefix, NVIDIA's PyTorch form of the checkpoint, and one-line errors naming the file and
variable."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertperf.errors import UserError
from bertperf.model import BertConfig, BertForPreTraining, tf_name, tf_transposed
from bertperf.model import tf_checkpoint
from bertperf.model.convert_cli import add_arguments, load_init_checkpoint, run
from bertperf.model.tf_checkpoint import TFCheckpoint, crc32c_numpy, state_dict_from_tf
from tests.support.models import TINY, assert_same_logits_as_hf, hf_model, padded_batch
from tests.support.paths import TF_CKPT as FIXTURE

PREFIX = FIXTURE / "model.ckpt-7"
DATA = "model.ckpt-7.data-00000-of-00001"


def _load_maker():
    spec = importlib.util.spec_from_file_location("make_tf_checkpoint",
                                                  FIXTURE / "make_tf_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKER = _load_maker()  # imports numpy only; TensorFlow is needed to regenerate, not to test
CONFIG = BertConfig.from_json(FIXTURE / "bert_config.json")


def expected(var: str) -> np.ndarray:
    return MAKER.expected_value(var, *MAKER.checkpoint_variables()[var])


@pytest.fixture(scope="module")
def state_dict() -> dict[str, torch.Tensor]:
    return state_dict_from_tf(PREFIX, CONFIG)


@pytest.fixture
def copy(tmp_path) -> Path:
    """A writable copy of the fixture checkpoint; returns its prefix."""
    for suffix in (".index", ".data-00000-of-00001"):
        shutil.copy(f"{PREFIX}{suffix}", tmp_path / f"model.ckpt-7{suffix}")
    return tmp_path / "model.ckpt-7"


# ---- crc32c --------------------------------------------------------------------------------------

def test_crc32c_numpy_matches_known_values_and_the_bytewise_loop():
    assert crc32c_numpy(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c_numpy(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4
    assert crc32c_numpy(bytes(range(32))) == 0x46DD794E
    assert crc32c_numpy(b"") == 0
    data = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8)
    assert tf_checkpoint._raw_crc(data) == tf_checkpoint._raw_crc_loop(data)  # parallel path


# ---- reading the bundle --------------------------------------------------------------------------

def test_reads_every_tensor_tensorflow_wrote():
    ckpt = TFCheckpoint(PREFIX)
    variables = MAKER.checkpoint_variables()
    assert ckpt.names() == sorted(variables)
    assert len(variables) == 46 * 3 + 1 + 6  # parameters and 2 LAMB slots each, step, probes
    enums = {"float32": 1, "float64": 2, "int32": 3, "string": 7, "int64": 9, "bfloat16": 14,
             "float16": 19}
    for name, (dtype, shape) in variables.items():
        entry = ckpt.entries[name]
        assert (entry.dtype, entry.shape, entry.shard) == (enums[dtype], shape, 0), name
        if dtype == "string":
            continue
        got, want = ckpt.read(name), expected(name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert ckpt.read("global_step") == 7


def test_unsupported_variables_are_user_errors():
    ckpt = TFCheckpoint(PREFIX)
    with pytest.raises(UserError, match=r"model\.ckpt-7\.index: variable dtype_probe/string: "
                                        r"dtype DT_STRING not supported"):
        ckpt.read("dtype_probe/string")
    name = "dtype_probe/float64"
    ckpt.entries[name] = dataclasses.replace(ckpt.entries[name], dtype=8)  # DT_COMPLEX64
    with pytest.raises(UserError, match=f"variable {name}: dtype DataType 8 not supported"):
        ckpt.read(name)
    with pytest.raises(UserError, match="no variable nope"):
        ckpt.read("nope")


# ---- mapping to BertForPreTraining ---------------------------------------------------------------

def test_state_dict_loads_strictly_with_transposes_and_zero_padding(state_dict):
    model = BertForPreTraining(CONFIG)
    model.load_state_dict(state_dict, strict=True)
    assert CONFIG.padded_vocab_size == 104 and len(state_dict) == 46
    for name, tensor in state_dict.items():
        assert tensor.dtype == torch.float32 and tensor.is_contiguous(), name
        want = torch.from_numpy(expected(tf_name(name)))
        want = want.T if tf_transposed(name) else want
        torch.testing.assert_close(tensor[:len(want)], want, rtol=0, atol=0, msg=name)
    word = state_dict["bert.embeddings.word_embeddings.weight"]
    bias = state_dict["cls.predictions.bias"]
    assert word.shape == (104, 8) and bias.shape == (104,)
    assert not word[99:].any() and not bias[99:].any()
    kernel = expected("bert/encoder/layer_1/intermediate/dense/kernel")
    assert kernel.shape == (8, 16)
    assert torch.equal(state_dict["bert.encoder.layer.1.intermediate.dense.weight"],
                       torch.from_numpy(kernel).T)


def hf_state_dict_by_transformers_rules(ckpt: TFCheckpoint) -> dict[str, torch.Tensor]:
    """The checkpoint as HF BertForPreTraining's state dict, by the rules of transformers'
    former load_tf_weights_in_bert (which needs TensorFlow), independent of hf.tf_name."""
    leaves = {"kernel": "weight", "gamma": "weight", "beta": "bias", "bias": "bias",
              "output_weights": "weight", "output_bias": "bias"}
    out = {}
    for var in ckpt.names():
        *scopes, leaf = var.split("/")
        if scopes[:1] not in (["bert"], ["cls"]) or leaf in ("adam_m", "adam_v"):
            continue
        path = [re.sub(r"^layer_(\d+)$", r"layer.\1", s) for s in scopes]
        path += [leaf, "weight"] if leaf.endswith("_embeddings") else [leaves[leaf]]
        value = torch.from_numpy(ckpt.read(var)).double()
        out[".".join(path)] = value.T if leaf == "kernel" else value
    out["cls.predictions.decoder.weight"] = out["bert.embeddings.word_embeddings.weight"]
    out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"]
    return out


def test_forward_matches_huggingface_loaded_from_the_same_checkpoint(state_dict):
    model = BertForPreTraining(CONFIG).double().eval()
    model.load_state_dict(state_dict, strict=True)
    hf = hf_model(CONFIG)
    hf.load_state_dict(hf_state_dict_by_transformers_rules(TFCheckpoint(PREFIX)), strict=True)
    assert_same_logits_as_hf(model, hf, padded_batch([30, 5, 17], seed=3))


def test_config_mismatch_names_the_variable():
    wide = dataclasses.replace(CONFIG, hidden_size=16)
    with pytest.raises(UserError, match=r"model\.ckpt-7\.index: variable "
                                        r"bert/embeddings/word_embeddings is 99x8, the BERT "
                                        r"config needs 99x16"):
        state_dict_from_tf(PREFIX, wide)
    with pytest.raises(UserError, match="word_embeddings is 99x8, the BERT config needs 100x8"):
        state_dict_from_tf(PREFIX, dataclasses.replace(CONFIG, vocab_size=100))
    with pytest.raises(UserError, match="no variable bert/encoder/layer_2/"):
        state_dict_from_tf(PREFIX, dataclasses.replace(CONFIG, num_hidden_layers=3))


# ---- damaged checkpoints -------------------------------------------------------------------------

def test_missing_files(tmp_path, copy):
    with pytest.raises(UserError, match=r"nope\.index: no such file"):
        TFCheckpoint(tmp_path / "nope")
    Path(f"{copy}.data-00000-of-00001").unlink()
    with pytest.raises(UserError, match=f"{DATA}: no such file"):
        state_dict_from_tf(copy, CONFIG)


def test_truncated_data_file(copy):
    data = Path(f"{copy}.data-00000-of-00001")
    size = data.stat().st_size // 2
    with open(data, "r+b") as f:
        f.truncate(size)
    with pytest.raises(UserError, match=rf"{DATA}: truncated: variable bert/\S+ needs bytes "
                                        rf"\[\d+, \d+\), the file has {size}$"):
        state_dict_from_tf(copy, CONFIG)


def test_flipped_byte_is_a_crc_error(copy):
    var = "bert/pooler/dense/kernel"
    entry = TFCheckpoint(copy).entries[var]
    data = Path(f"{copy}.data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[entry.offset + 5] ^= 0x10
    data.write_bytes(raw)
    with pytest.raises(UserError, match=f"{DATA}: crc32c mismatch in variable {var}"):
        state_dict_from_tf(copy, CONFIG)
    TFCheckpoint(copy).read("bert/pooler/dense/bias")  # its neighbours still read


def test_damaged_index(copy):
    index = Path(f"{copy}.index")
    raw = bytearray(index.read_bytes())
    index.write_bytes(raw[:-1])
    with pytest.raises(UserError, match=r"model\.ckpt-7\.index: not a TensorFlow checkpoint index"):
        TFCheckpoint(copy)
    flipped = bytearray(raw)
    flipped[100] ^= 1
    index.write_bytes(flipped)
    with pytest.raises(UserError, match=r"model\.ckpt-7\.index: corrupt TensorFlow checkpoint "
                                        "index: crc32c mismatch in the block at offset 0"):
        TFCheckpoint(copy)


def _data_block(index: bytes) -> tuple[int, int]:
    """(offset, size) of the first data block of an SSTable, through its footer and index."""
    footer = index[-48:]
    _, pos = tf_checkpoint._varint(footer, 0)
    _, pos = tf_checkpoint._varint(footer, pos)  # the metaindex handle
    index_offset, pos = tf_checkpoint._varint(footer, pos)
    index_size, _ = tf_checkpoint._varint(footer, pos)
    handle = next(tf_checkpoint._block_entries(index[index_offset:index_offset + index_size]))[1]
    offset, pos = tf_checkpoint._varint(handle, 0)
    return offset, tf_checkpoint._varint(handle, pos)[0]


def test_snappy_compressed_index_reads_the_same(copy):
    """TF reads indexes with snappy blocks (the fixture's snappy/ copy, made by the snappy
    library); so must we, and a damaged snappy stream is a one-line error."""
    index = Path(f"{copy}.index")
    snappy = (FIXTURE / "snappy" / "model.ckpt-7.index").read_bytes()
    offset, size = _data_block(snappy)
    assert snappy[offset + size] == 1  # compressed
    index.write_bytes(snappy)
    ckpt = TFCheckpoint(copy)
    assert ckpt.entries == TFCheckpoint(PREFIX).entries
    np.testing.assert_array_equal(ckpt.read("cls/predictions/output_bias"),
                                  expected("cls/predictions/output_bias"))
    damaged = bytearray(snappy)
    damaged[offset + 1] += 1  # the stream's uncompressed length (a 2-byte varint) + 128
    crc = tf_checkpoint.masked_crc32c(bytes(damaged[offset:offset + size + 1]))
    damaged[offset + size + 1:offset + size + 5] = crc.to_bytes(4, "little")
    index.write_bytes(damaged)
    with pytest.raises(UserError, match=r"model\.ckpt-7\.index: corrupt TensorFlow checkpoint "
                                        "index: snappy block decodes to 4743 bytes, its header "
                                        "says 4871"):
        TFCheckpoint(copy)


def test_unknown_block_compression_is_refused(copy):
    index = Path(f"{copy}.index")
    raw = bytearray(index.read_bytes())
    offset, size = _data_block(bytes(raw))
    raw[offset + size] = 2  # the data block's compression type, then its crc fixed up
    crc = tf_checkpoint.masked_crc32c(bytes(raw[offset:offset + size + 1]))
    raw[offset + size + 1:offset + size + 5] = crc.to_bytes(4, "little")
    index.write_bytes(raw)
    with pytest.raises(UserError, match="unknown block compression type 2"):
        TFCheckpoint(copy)


def test_snappy_decompress_literals_and_overlapping_copies():
    # 5 literal bytes "abcde", a 1-byte-offset copy of 9 bytes from 2 back (overlapping), a
    # 2-byte-offset copy of 3 bytes from 7 back, and a 61-byte literal with a 1-byte length
    stream = (bytes([5 + 9 + 3 + 61, 4 << 2]) + b"abcde" + bytes([(9 - 4) << 2 | 1, 2])
              + bytes([(3 - 1) << 2 | 2, 7, 0]) + bytes([60 << 2, 60]) + b"z" * 61)
    assert tf_checkpoint.snappy_decompress(stream) == b"abcde" + b"dedededed" + b"ded" + b"z" * 61
    with pytest.raises(ValueError, match="decodes to"):
        tf_checkpoint.snappy_decompress(bytes([9]) + stream[1:])


# ---- convert-ckpt and load_init_checkpoint -------------------------------------------------------

def convert(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return run(parser.parse_args(argv))


def test_convert_cli_writes_a_file_load_init_checkpoint_reads(tmp_path, capsys, state_dict):
    out = tmp_path / "out" / "model.pt"
    assert convert("--tf-checkpoint", str(PREFIX), "--bert-config",
                   str(FIXTURE / "bert_config.json"), "--output", str(out)) == 0
    summary = capsys.readouterr().out
    assert summary.count("\n") == 1 and "46 tensors" in summary and str(out) in summary
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.pt"]  # no temporaries left
    saved = torch.load(out, weights_only=True)
    assert saved["bert_config"] == dataclasses.asdict(CONFIG) and saved["source"] == str(PREFIX)
    for loaded in (load_init_checkpoint(out, CONFIG), load_init_checkpoint(PREFIX, CONFIG)):
        assert loaded.keys() == state_dict.keys()
        assert all(torch.equal(loaded[k], state_dict[k]) for k in state_dict)


def test_convert_cli_and_load_init_checkpoint_errors(tmp_path):
    with pytest.raises(UserError, match=r"word_embeddings is 99x8, the BERT config needs "
                                        r"30522x128"):
        convert("--tf-checkpoint", str(PREFIX), "--bert-config", "tiny",
                "--output", str(tmp_path / "tiny.pt"))
    assert not list(tmp_path.iterdir())
    with pytest.raises(UserError, match="neither a TF checkpoint prefix"):
        load_init_checkpoint(tmp_path / "model.ckpt-8", CONFIG)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a zip")  # read as a pickle, which weights_only refuses
    with pytest.raises(UserError) as err:
        load_init_checkpoint(garbage, CONFIG)
    assert str(err.value) == (f"init checkpoint {garbage}: cannot be read (not a checkpoint of "
                              "tensors: Unsupported operand 110)")  # not torch's advice
    pt = tmp_path / "model.pt"
    convert("--tf-checkpoint", str(PREFIX), "--bert-config", str(FIXTURE / "bert_config.json"),
            "--output", str(pt))
    with pytest.raises(UserError, match=r"model\.pt: tensor bert\.embeddings\.word_embeddings"
                                        r"\.weight has shape \(104, 8\), the BERT config needs "
                                        r"\(104, 16\)"):
        load_init_checkpoint(pt, dataclasses.replace(CONFIG, hidden_size=16))


@pytest.mark.parametrize("suffix", ["", ".index", ".data-00000-of-00001", ".meta"])
def test_any_file_of_the_checkpoint_stands_for_its_prefix(tmp_path, capsys, state_dict, suffix):
    """--tf-checkpoint and INIT_CHECKPOINT take the prefix or one of the checkpoint's own files
    (the fixture has no .meta; TF1 writes one, and its name is enough)."""
    given = f"{PREFIX}{suffix}"
    out = tmp_path / "model.pt"
    assert convert("--tf-checkpoint", given, "--bert-config", str(FIXTURE / "bert_config.json"),
                   "--output", str(out)) == 0
    assert capsys.readouterr().out.startswith(f"convert-ckpt: {PREFIX} -> {out}: 46 tensors")
    assert torch.load(out, weights_only=True)["source"] == str(PREFIX)
    loaded = load_init_checkpoint(given, CONFIG)
    assert loaded.keys() == state_dict.keys()
    assert all(torch.equal(loaded[k], state_dict[k]) for k in state_dict)


def test_a_checkpoint_file_whose_index_is_missing_names_the_index(tmp_path):
    for suffix in (".index", ".data-00000-of-00001"):
        with pytest.raises(UserError, match=r"model\.ckpt-8\.index: no such file"):
            load_init_checkpoint(tmp_path / f"model.ckpt-8{suffix}", CONFIG)


# ---- NVIDIA's PyTorch checkpoint (model.ckpt-28252.pt) -------------------------------------------

MLPERF_VOCAB = dataclasses.replace(TINY, vocab_size=30522)  # a tiny BERT with MLPerf's vocab
PADDED_ROWS = ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight",
               "cls.predictions.bias")


def nvidia_checkpoint(path: Path, hf, gamma_beta: bool, padded: bool) -> Path:
    """`hf`'s weights as NVIDIA's convert_tf_checkpoint.py leaves model.ckpt-28252.pt:
    torch.save({'model': state_dict}) of its BertForPreTraining, HF's names, a decoder without
    bias whose weight is the word embeddings, LayerNorm as gamma/beta or weight/bias, and the
    vocabulary 30522 rows or padded to 30528 (NVIDIA pads with zeros; ones here, to show the
    padding rows are dropped)."""
    sd = {k: v.clone() for k, v in hf.state_dict().items() if k != "cls.predictions.decoder.bias"}
    if padded:
        for name in ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias"):
            sd[name] = torch.cat([sd[name], sd[name].new_ones(6, *sd[name].shape[1:])])
    sd["cls.predictions.decoder.weight"] = sd["bert.embeddings.word_embeddings.weight"]
    if gamma_beta:
        sd = {re.sub(r"LayerNorm\.weight$", "LayerNorm.gamma",
                     re.sub(r"LayerNorm\.bias$", "LayerNorm.beta", k)): v for k, v in sd.items()}
    assert {len(sd[n]) for n in PADDED_ROWS} == {30528 if padded else 30522}
    torch.save({"model": sd}, path)
    return path


@pytest.mark.parametrize("padded", [False, True], ids=["30522", "30528"])
@pytest.mark.parametrize("gamma_beta", [False, True], ids=["weight_bias", "gamma_beta"])
def test_nvidia_checkpoint_gives_the_logits_of_the_model_it_came_from(tmp_path, gamma_beta,
                                                                      padded):
    hf = hf_model(MLPERF_VOCAB)
    path = nvidia_checkpoint(tmp_path / "model.ckpt-28252.pt", hf, gamma_beta, padded)
    state_dict = load_init_checkpoint(path, MLPERF_VOCAB)
    word = state_dict["bert.embeddings.word_embeddings.weight"]
    assert word.shape == (30528, 32) and not word[30522:].any()
    assert not state_dict["cls.predictions.bias"][30522:].any()
    model = BertForPreTraining(MLPERF_VOCAB).double().eval()
    model.load_state_dict(state_dict, strict=True)
    assert_same_logits_as_hf(model, hf, padded_batch([30, 5, 17], seed=3))


LN = "bert.encoder.layer.1.output.LayerNorm"


@pytest.mark.parametrize("damage, message", [
    (lambda sd: sd.update({"cls.extra.weight": torch.zeros(2)}),
     "tensor cls.extra.weight is not in this model"),
    (lambda sd: sd.pop("bert.pooler.dense.bias"), "has no tensor bert.pooler.dense.bias"),
    (lambda sd: sd.update({f"{LN}.gamma": torch.ones(31, dtype=torch.float64)}),
     rf"tensor {LN}.gamma has shape \(31,\), the BERT config needs \(32,\)"),
    (lambda sd: sd.update({f"{LN}.weight": sd[f"{LN}.gamma"]}),
     rf"tensors {LN}.gamma and {LN}.weight are both {LN}.weight"),
    (lambda sd: sd.update({"cls.predictions.bias": torch.zeros(30000, dtype=torch.float64)}),
     r"tensor cls.predictions.bias has shape \(30000,\), the BERT config needs 30522 or 30528 "
     r"rows"),
    (lambda sd: sd.update({"cls.predictions.decoder.weight":
                           sd["cls.predictions.decoder.weight"] + 1}),
     "cls.predictions.decoder.weight is not tied to bert.embeddings.word_embeddings.weight"),
])
def test_nvidia_checkpoint_errors_name_the_first_bad_tensor(tmp_path, damage, message):
    path = nvidia_checkpoint(tmp_path / "model.ckpt-28252.pt", hf_model(MLPERF_VOCAB),
                             gamma_beta=True, padded=True)
    saved = torch.load(path, weights_only=True)
    damage(saved["model"])
    torch.save(saved, path)
    with pytest.raises(UserError, match=rf"^init checkpoint {re.escape(str(path))}: {message}"):
        load_init_checkpoint(path, MLPERF_VOCAB)
