"""`python -m bertperf export` and INIT_CHECKPOINT=<HF folder> (bertperf.train.export,
bertperf.model.convert_cli): a run trained here exports to a folder that transformers loads as
BertForPreTraining, BertForMaskedLM and AutoModel with bertperf's logits and NSP scores; the
folder starts a run with the same weights; its tokenizer gives prep create's ids; bad input is
one line and leaves no partial folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertperf.__main__ import main
from bertperf.errors import UserError
from bertperf.formats.outputs import MARKER
from bertperf.model import BertForPreTraining, PaddedBatch, unpad
from tests.support.copy_task import make_dataset, tiny_bert_config
from tests.support.models import MAX_PRED, assert_same_logits_as_hf, samples
from tests.support.paths import PYTHONPATH

WORDS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]", *(f"w{i}" for i in range(27))]
"""A vocab of the copy task's 32 ids."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A run of 2 steps of the copy task's tiny BERT (hidden size 32, dropout on) that ends by
    reaching its target: its checkpoint folder, log, model config and a vocab of its 32 ids."""
    from bertperf import config
    from bertperf.train import loop
    root = tmp_path_factory.mktemp("export")
    env = {**make_dataset(root / "data", n_train=64, n_eval=16), "BATCHSIZE": "4",
           "GRADIENT_STEPS": "2", "LR": "0.01", "MAX_STEPS": "20", "EVAL_ITER_SAMPLES": "16",
           "TARGET_MLM_ACCURACY": "0.01", "SUBMISSION_DIVISION": "open", "SEED": "3",
           "LOG_FREQ": "0", "LOGDIR": str(root), "MLLOG_FILE": str(root / "log.txt"),
           "CHECKPOINT_DIR": str(root / "ck")}
    env["BERT_CONFIG"] = str(tiny_bert_config(root / "bert.json", dropout=0.1))
    assert loop.main(config.load(env)) == 0
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(WORDS) + "\n")
    return {"ck": root / "ck", "log": root / "log.txt", "bert": env["BERT_CONFIG"],
            "vocab": vocab, "env": env}


def export(trained: dict, out: Path, *extra: str) -> int:
    return main(["export", "--checkpoint", "auto", "--checkpoint-dir", str(trained["ck"]),
                 "--vocab", str(trained["vocab"]), "--output", str(out), *extra])


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hf") / "model"
    assert export(trained, out) == 0
    return out


def ours(trained: dict) -> BertForPreTraining:
    """bertperf's model with the weights of the run's checkpoint, in eval mode."""
    from bertperf.model.bert_config import BertConfig
    from bertperf.train import checkpoint
    model = BertForPreTraining(BertConfig.from_json(trained["bert"]))
    state = checkpoint.read(checkpoint.newest_first(trained["ck"])[0])
    model.load_state_dict(state["model"])
    return model.eval()


def test_the_success_checkpoint_exports_with_its_card(trained, exported, capsys):
    """The run reached its target at step 2: its checkpoint is written after run_stop, and the
    folder holds HF's files, the card telling the run's log, switches, data and command."""
    assert [p.name for p in trained["ck"].iterdir()] == ["ckpt_00000002.pt"]
    assert sorted(p.name for p in exported.iterdir()) == [
        MARKER, "README.md", "config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt"]
    assert json.loads((exported / "config.json").read_text())["vocab_size"] == 32
    card = (exported / "README.md").read_text()
    for fact in ("ckpt_00000002.pt: step 2, 16 samples trained",
                 "run_stop success after 16 samples", "(target 0.01); division open",
                 "LAYERWISE off, GRAD_COMM allreduce, FP8 off, PRECISION fp32",
                 "64 samples, max_seq_length 16", "TARGET_MLM_ACCURACY=0.01",
                 "python -m bertperf train` on 1 rank(s)"):
        assert fact in card, fact


def test_without_transformers_it_writes_the_same_folder(trained, exported, tmp_path):
    """With transformers unimportable, export writes the same files (safetensors alone) and
    says where transformers comes from; a log that is not where the checkpoint says is a
    note, the card telling the checkpoint only."""
    log = trained["log"].rename(trained["log"].with_suffix(".moved"))
    out = tmp_path / "model"
    code = ("import sys\nsys.modules['transformers'] = None\nfrom bertperf.__main__ import main\n"
            f"sys.exit(main(['export', '--checkpoint', 'auto', '--checkpoint-dir', "
            f"{str(trained['ck'])!r}, '--vocab', {str(trained['vocab'])!r}, '--output', "
            f"{str(out)!r}]))")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": PYTHONPATH}, timeout=120)
    finally:
        log.rename(trained["log"])
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stdout.splitlines() if line.startswith("export: note:")]
    assert notes == [
        f"export: note: the MLPerf log the checkpoint records, {trained['log']}, is not there: "
        "the model card tells the checkpoint only (--log names the log)",
        "export: note: transformers is not installed here; the project's hf extra brings it "
        "(pip install '.[hf]')"]
    for name in ("model.safetensors", "config.json", "vocab.txt", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (exported / name).read_bytes(), name
    assert "MLPerf log" not in (out / "README.md").read_text()


def test_transformers_loads_it_with_the_same_logits(trained, exported):
    """BertForPreTraining (MLM logits at the masked positions, NSP scores), BertForMaskedLM and
    AutoModel load the folder offline; on one batch (padded for HF, unpadded for bertperf) the
    logits equal bertperf's within 1e-5 relative."""
    transformers = pytest.importorskip("transformers")
    batch = PaddedBatch.from_arrays(samples([16, 9, 12, 5], seed=7, vocab=32)
                                    .to_padded(16, MAX_PRED))
    hf = transformers.BertForPreTraining.from_pretrained(exported).eval()
    assert_same_logits_as_hf(ours(trained), hf, batch, rtol=1e-5, atol=1e-6)
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.input_mask,
              "token_type_ids": batch.segment_ids}
    mlm = transformers.BertForMaskedLM.from_pretrained(exported).eval()
    auto = transformers.AutoModel.from_pretrained(exported).eval()
    assert type(auto).__name__ == "BertModel"
    with torch.no_grad():
        want = hf(**inputs)
        torch.testing.assert_close(mlm(**inputs).logits, want.prediction_logits)
        torch.testing.assert_close(auto(**inputs).last_hidden_state,
                                   hf.bert(**inputs).last_hidden_state)


def test_the_folder_starts_a_run_with_the_same_weights(trained, exported, tmp_path, capsys):
    """INIT_CHECKPOINT=<the folder> reads the checkpoint's weights back bit for bit (the
    vocabulary padded again), so the same logits, and a run started from it evaluates them at
    the accuracy the exported run ended with."""
    from bertperf import config
    from bertperf.mlperf.check import log_events
    from bertperf.train import loop
    env = {**trained["env"], "INIT_CHECKPOINT": str(exported), "MAX_STEPS": "1",
           "LOGDIR": str(tmp_path), "MLLOG_FILE": str(tmp_path / "log.txt"),
           "CHECKPOINT_DIR": str(tmp_path / "ck")}
    assert loop.main(config.load(env)) == 0
    ended = [e["value"] for e in log_events(trained["log"]) if e["key"] == "eval_accuracy"][-1]
    assert f"init checkpoint: mlm accuracy {ended:.5f} before training" in capsys.readouterr().err
    from bertperf.model.bert_config import BertConfig
    from bertperf.model.convert_cli import load_init_checkpoint
    model = ours(trained)
    back = load_init_checkpoint(exported, model.config)
    assert back.keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(back[name], tensor), name
    started = BertForPreTraining(BertConfig.from_json(trained["bert"]))
    started.load_state_dict(back, strict=True)
    batch = PaddedBatch.from_arrays(samples([16, 9], seed=8, vocab=32).to_padded(16, MAX_PRED))
    with torch.no_grad():
        a, b = (m.eval()(**unpad(batch).inputs()) for m in (model, started))
    assert torch.equal(a.mlm_logits, b.mlm_logits) and torch.equal(a.nsp_logits, b.nsp_logits)


def test_the_tokenizer_gives_prep_creates_ids(tmp_path, vocab_file):
    """AutoTokenizer on the exported tokenizer files (the MLPerf vocab) gives the ids of `prep
    create`'s tokenizer on sample sentences, between [CLS] and [SEP]."""
    transformers = pytest.importorskip("transformers")
    from bertperf.prep.samples.tokenization import Tokenizer
    from bertperf.train.export import write_tokenizer
    write_tokenizer(tmp_path, vocab_file, 512)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    lines = ["The Free On-line Dictionary of Computing (FOLDOC) defines ALGOL 68.",
             "Café naïve résumé: accents are stripped, CASE is lowered!",
             "x86-64's 512-bit AVX-512 registers, e.g. zmm0..zmm31; 3.14159 ≈ π.",
             "Unbelievably, antidisestablishmentarianism tokenizes into word pieces."]
    reference = Tokenizer(vocab_file)
    for line, ids in zip(lines, reference.encode_lines(lines)):
        assert hf(line)["input_ids"] == [reference.cls_id, *ids, reference.sep_id], line
    assert hf.mask_token_id == reference.mask_id and hf.pad_token_id == reference.pad_id


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err.strip()


def test_bad_inputs_are_one_line(trained, exported, tmp_path, capsys):
    """No checkpoint; an output folder export did not write, with or without --force (kept as
    it was); an earlier export, replaced with --force only; a vocab of another size."""
    assert main(["export", "--checkpoint", str(tmp_path / "none.pt"), "--output",
                 str(tmp_path / "o")]) == 1
    assert error_line(capsys) == f"bertperf: error: checkpoint {tmp_path / 'none.pt'}: no such file"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export", "--checkpoint", "auto", "--checkpoint-dir", str(empty), "--output",
                 str(tmp_path / "o")]) == 1
    assert error_line(capsys) == ("bertperf: error: --checkpoint auto: no checkpoint "
                                  f"(ckpt_<step>.pt) in {empty}")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep")
    for force in ((), ("--force",)):
        assert export(trained, taken, *force) == 1
        assert error_line(capsys) == (f"bertperf: error: --output {taken}: is a folder export "
                                      "did not write (it holds other files): name a new or "
                                      "empty folder")
        assert [p.name for p in taken.iterdir()] == ["mine.txt"]
    again = tmp_path / "again"
    assert export(trained, again) == 0
    assert export(trained, again) == 1
    assert error_line(capsys) == (f"bertperf: error: --output {again}: exists, an earlier "
                                  "export output (--force replaces it)")
    assert export(trained, again, "--force") == 0
    assert sorted(p.name for p in again.iterdir()) == sorted(p.name for p in exported.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "empty", "taken"]
    capsys.readouterr()
    for flag, name, text, why in [
            ("--log", "notes.txt", "not a log\n", "not an MLPerf log (no :::MLLOG line)"),
            ("--vocab", "vocab.txt", "[PAD]\n[UNK]\n", "2 tokens, the model's vocabulary has 32 "
             "(name the vocab the data was made with)")]:
        given = tmp_path / name
        given.write_text(text)
        assert main(["export", "--checkpoint", str(next(trained["ck"].iterdir())), flag,
                     str(given), "--output", str(tmp_path / "o")]) == 1
        assert error_line(capsys) == f"bertperf: error: {flag} {given}: {why}"
        given.unlink()


def test_a_full_disk_leaves_no_partial_folder(trained, exported, small_disk, capsys):
    """The disk fills while the weights are written: one line naming the folder, no folder or
    temporary left; with --force, the earlier export that was there stays whole."""
    size = (exported / "model.safetensors").stat().st_size
    disk = small_disk("disk", kib=size // 1024 // 2)
    out = disk / "model"
    assert export(trained, out) == 1
    assert error_line(capsys) == (f"bertperf: error: {out}: cannot write: no space left on "
                                  f"device (in {disk}); nothing under that name changed")
    assert list(disk.iterdir()) == []
    out.mkdir()
    (out / MARKER).write_text("export\n")  # an earlier export's folder, as small as it gets
    (out / "config.json").write_text("{}")
    assert export(trained, out, "--force") == 1
    capsys.readouterr()
    assert [p.name for p in disk.iterdir()] == ["model"]
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "config.json"]


def hf_folder(exported: Path, tmp_path: Path, changes: dict[str, dict | None]) -> Path:
    """A copy of the exported folder with `changes` ({file: {key: value}}) made to its JSON
    files (None: the file removed)."""
    folder = tmp_path / "hf"
    folder.mkdir()
    for path in exported.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    for name, change in changes.items():
        if change is None:
            os.remove(folder / name)
        else:
            data = json.loads((folder / name).read_text())
            (folder / name).write_text(json.dumps({**data, **change}))
    return folder


@pytest.mark.parametrize("changes, message", [
    ({"config.json": {"hidden_size": 64}},
     "config.json has hidden_size 64, this run's BERT (BERT_CONFIG) has 32"),
    ({"config.json": {"num_hidden_layers": 24}},
     "config.json has num_hidden_layers 24, this run's BERT (BERT_CONFIG) has 2"),
    ({"tokenizer_config.json": {"do_lower_case": False}},
     "a cased model (tokenizer_config.json has do_lower_case false); the MLPerf data is "
     "lower-cased"),
    ({"model.safetensors": None}, "no model.safetensors, model.safetensors.index.json or "
     "pytorch_model.bin in the folder"),
    ({"config.json": None}, "no config.json in the folder (not a HuggingFace model folder)"),
], ids=["wider", "deeper", "cased", "no-weights", "no-config"])
def test_an_hf_folder_that_does_not_fit_is_one_line(trained, exported, tmp_path, changes,
                                                    message):
    from bertperf.model.bert_config import BertConfig
    from bertperf.model.convert_cli import load_init_checkpoint
    folder = hf_folder(exported, tmp_path, changes)
    with pytest.raises(UserError) as err:
        load_init_checkpoint(folder, BertConfig.from_json(trained["bert"]))
    assert str(err.value) == f"init checkpoint {folder}: {message}"


def test_a_sharded_hf_folder_loads_as_the_whole_one(trained, exported, tmp_path):
    """model.safetensors split into two shards with transformers' index: the same tensors."""
    from safetensors.torch import load_file, save_file

    from bertperf.model.bert_config import BertConfig
    from bertperf.model.convert_cli import load_init_checkpoint
    config = BertConfig.from_json(trained["bert"])
    whole = load_init_checkpoint(exported, config)
    folder = hf_folder(exported, tmp_path, {})
    tensors = load_file(folder / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, part in shards.items():
        save_file({n: tensors[n].contiguous() for n in part}, folder / shard)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: shard for shard, part in shards.items() for n in part}}))
    os.remove(folder / "model.safetensors")
    sharded = load_init_checkpoint(folder, config)
    assert sharded.keys() == whole.keys()
    assert all(torch.equal(sharded[k], whole[k]) for k in whole)
    os.remove(folder / "model-00002-of-00002.safetensors")
    with pytest.raises(UserError) as err:
        load_init_checkpoint(folder, config)
    assert str(err.value) == (f"init checkpoint {folder}: model.safetensors.index.json names "
                              "model-00002-of-00002.safetensors, which is not in the folder")


def test_an_hf_folders_file_or_cut_vocab_is_one_line(trained, exported, tmp_path):
    """INIT_CHECKPOINT naming the folder's model.safetensors: the folder is what it takes; a
    vocab.txt of another size than config.json's vocab_size: refused, not trained on."""
    from bertperf.model.bert_config import BertConfig
    from bertperf.model.convert_cli import load_init_checkpoint
    config = BertConfig.from_json(trained["bert"])
    weights = exported / "model.safetensors"
    with pytest.raises(UserError) as err:
        load_init_checkpoint(weights, config)
    assert str(err.value) == (f"init checkpoint {weights}: a file of a HuggingFace model folder; "
                              f"INIT_CHECKPOINT takes the folder itself ({exported})")
    folder = hf_folder(exported, tmp_path, {})
    (folder / "vocab.txt").write_text("".join(f"t{i}\n" for i in range(10)))
    with pytest.raises(UserError) as err:
        load_init_checkpoint(folder, config)
    assert str(err.value) == (f"init checkpoint {folder}: vocab.txt has 10 tokens, the model's "
                              "vocabulary 32 (config.json's vocab_size)")


def test_train_check_reads_the_hf_folders_config(trained, exported, tmp_path):
    """`train --check` (train.checks.prepare) refuses a folder whose config.json does not fit
    the run, as the run itself would, before anything is written."""
    from bertperf.config import load
    from bertperf.train.checks import prepare
    data = trained["ck"].parent / "data"
    folder = hf_folder(exported, tmp_path, {"config.json": {"hidden_size": 64}})
    env = {"DATADIR_PHASE2": str(data / "train"), "EVAL_FILE": str(data / "eval.hdf5"),
           "BERT_CONFIG": trained["bert"], "BATCHSIZE": "4", "LR": "0.01", "MAX_STEPS": "20",
           "INIT_CHECKPOINT": str(folder), "LOGDIR": str(tmp_path / "logs")}
    with pytest.raises(UserError) as err:
        prepare(load(env))
    assert str(err.value) == (f"init checkpoint {folder}: config.json has hidden_size 64, this "
                              "run's BERT (BERT_CONFIG) has 32")
    assert not (tmp_path / "logs").exists()


def test_auto_passes_over_a_damaged_newest_checkpoint_as_resume_does(trained, tmp_path, capsys):
    """--checkpoint auto with the newest checkpoint damaged: the newest that loads is exported,
    the note says which was passed over and why (RESUME_FROM=auto's rule); none that loads is
    one line."""
    folder = tmp_path / "ck"
    folder.mkdir()
    good = next(trained["ck"].iterdir())
    (folder / good.name).write_bytes(good.read_bytes())
    damaged = folder / "ckpt_00000009.pt"
    damaged.write_bytes(b"cut short")
    argv = ["export", "--checkpoint", "auto", "--checkpoint-dir", str(folder), "--vocab",
            str(trained["vocab"])]
    assert main([*argv, "--output", str(tmp_path / "model")]) == 0
    out = capsys.readouterr().out
    assert f"export: {folder / good.name} -> {tmp_path / 'model'}" in out
    (note,) = [line for line in out.splitlines() if "the newest checkpoint that loads" in line]
    assert note.startswith(f"export: note: checkpoint {damaged}: ") and note.endswith(
        f"; exporting the newest checkpoint that loads, {folder / good.name}")
    (folder / good.name).write_bytes(b"cut short too")
    assert main([*argv, "--output", str(tmp_path / "other")]) == 1
    assert error_line(capsys).startswith(f"bertperf: error: --checkpoint auto: none of the 2 "
                                         f"checkpoints in {folder} can be read (the newest: ")


def test_a_layerwise_checkpoint_exports_its_stages_layers(tmp_path, trained, capsys):
    """A LAYERWISE run's checkpoint in its first stage (1 of the 2 layers) exports as a BERT of
    1 layer, the card saying so; transformers loads it."""
    from bertperf import config
    from bertperf.train import loop
    data = trained["ck"].parent / "data"
    env = {"DATADIR_PHASE2": str(data / "train"), "EVAL_FILE": str(data / "eval.hdf5"),
           "BERT_CONFIG": trained["bert"], "BATCHSIZE": "4", "LR": "0.01", "MAX_STEPS": "20",
           "TARGET_MLM_ACCURACY": "0.99", "SUBMISSION_DIVISION": "open", "LAYERWISE": "1:40,2",
           "MAX_SAMPLES_TERMINATION": "8", "LOG_FREQ": "0", "LOGDIR": str(tmp_path),
           "MLLOG_FILE": str(tmp_path / "log.txt"), "CHECKPOINT_DIR": str(tmp_path / "ck")}
    assert loop.main(config.load(env)) == 0
    out = tmp_path / "model"
    assert main(["export", "--checkpoint", "auto", "--checkpoint-dir", str(tmp_path / "ck"),
                 "--vocab", str(trained["vocab"]), "--output", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
    assert "1 of 2 layers (a LAYERWISE stage)" in (out / "README.md").read_text()
    assert "BertForPreTraining, 1 of 2 layers (a LAYERWISE stage) of " in capsys.readouterr().out
    transformers = pytest.importorskip("transformers")
    assert transformers.BertForPreTraining.from_pretrained(out).config.num_hidden_layers == 1
