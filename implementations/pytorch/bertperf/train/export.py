"""`python -m bertperf export`: a run's checkpoint as a HuggingFace model folder, which
`transformers` loads offline (BertForPreTraining, BertForMaskedLM, AutoModel; AutoTokenizer):

  config.json            HF's BertConfig of the run's model (the vocabulary unpadded)
  model.safetensors      the fp32 weights under HF's names, the decoder tied to the embeddings
  vocab.txt              the vocab the data was made with (--vocab)
  tokenizer_config.json  BERT's tokenizer: lower case, [PAD] [UNK] [CLS] [SEP] [MASK]
  README.md              a model card: the run's MLPerf log, switches, data and command
  .bertperf-output       export's marker (formats/outputs.py): --force replaces this folder

Writing it needs `safetensors` only (not `transformers`). The folder is written under a
temporary name and renamed when complete (docs/design.md, "Export to HuggingFace")."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertperf import config
from bertperf.errors import UserError
from bertperf.formats.files import md5_file, read_utf8
from bertperf.formats.outputs import claim, output_folder

if TYPE_CHECKING:  # the model package imports torch
    import torch

    from bertperf.model.bert_config import BertConfig

SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                  "cls_token": "[CLS]", "mask_token": "[MASK]"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, metavar="FILE|auto",
                   help="a run's checkpoint (CHECKPOINT_DIR/ckpt_<step>.pt), or auto: the newest "
                        "in --checkpoint-dir")
    p.add_argument("--checkpoint-dir", type=Path,
                   help="where --checkpoint auto looks (default: CHECKPOINT_DIR)")
    p.add_argument("--output", required=True, type=Path, help="the folder to write")
    p.add_argument("--force", action="store_true",
                   help="replace --output where it is an earlier export's folder (once the new "
                        "one is complete); a folder export did not write is never replaced")
    p.add_argument("--vocab", type=Path,
                   help="the vocab the training data was made with (`prep create --vocab_file`); "
                        "default: the MLPerf vocab ($BERTPERF_VOCAB, else the one make setup "
                        "installs)")
    p.add_argument("--log", type=Path,
                   help="the run's MLPerf log for the model card (default: the one the "
                        "checkpoint records)")


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    candidates = checkpoint_files(args.checkpoint, args.checkpoint_dir)
    inputs = [("--checkpoint", candidates[0]), ("--checkpoint-dir", candidates[0].parent),
              ("--vocab", args.vocab), ("--log", args.log)]
    out = claim("--output", args.output, "export", inputs=inputs, force=args.force)
    if args.log is not None and not args.log.is_file():
        raise UserError(f"--log {args.log}: no such MLPerf log")
    if args.log is not None and ":::MLLOG " not in args.log.read_text(errors="replace"):
        raise UserError(f"--log {args.log}: not an MLPerf log (no :::MLLOG line)")
    from safetensors.torch import save

    from bertperf.model.hf import HF_CONFIG, HF_WEIGHTS, hf_config, hf_saved_tensors
    from bertperf.resources import find_vocab
    from bertperf.train import checkpoint
    path, state, passed = newest_that_reads(candidates)
    bert, settings = run_model(state, path)
    vocab = args.vocab or find_vocab()
    check_vocab(vocab, bert.vocab_size)
    weights = model_weights(state["model"], bert, path)
    record = state.get(checkpoint.RECORD) or {}
    log = args.log or (Path(record["log"]) if "log" in record else None)
    notes = [f"{'; '.join(passed)}; exporting the newest checkpoint that loads, {path}"
             ] if passed else []
    if log is not None and not log.is_file():
        notes.append(f"the MLPerf log the checkpoint records, {log}, is not there: the model "
                     "card tells the checkpoint only (--log names the log)")
        log = None
    card = model_card(bert, settings, record, state["progress"], path, vocab, log)
    tensors = hf_saved_tensors(weights, bert)
    claim("--output", out, "export", inputs=[*inputs, ("the vocab", vocab), ("the log", log)],
          force=args.force)
    with output_folder(out, "export") as tmp:
        # the bytes through Python's file, as checkpoints: a full disk raises ENOSPC, named
        (tmp / HF_WEIGHTS).write_bytes(save(tensors, metadata={"format": "pt"}))
        (tmp / HF_CONFIG).write_text(json.dumps(hf_config(bert), indent=2) + "\n")
        write_tokenizer(tmp, vocab, bert.max_position_embeddings)
        (tmp / "README.md").write_text(card)
    params = sum(t.numel() for t in tensors.values())
    print(f"export: {path} -> {out}: BertForPreTraining, {depth(bert, settings)} of "
          f"{bert.hidden_size}, {params:,} parameters, {time.perf_counter() - start:.1f} s")
    if importlib.util.find_spec("transformers") is None:
        notes.append("transformers is not installed here; the project's hf extra brings it "
                     "(pip install '.[hf]')")
    for note in notes:
        print(f"export: note: {note}")
    print(f"export: load with: from transformers import AutoTokenizer, BertForPreTraining; "
          f"BertForPreTraining.from_pretrained({str(out)!r}); "
          f"AutoTokenizer.from_pretrained({str(out)!r})")
    return 0


def checkpoint_files(given: str, folder: Path | None) -> list[Path]:
    """--checkpoint's file, or with "auto" the checkpoints in `folder` (default CHECKPOINT_DIR),
    newest first."""
    if given != "auto":
        return [Path(given)]
    from bertperf.train.checkpoint import newest_first
    folder = folder or config.checkpoint_settings().checkpoint_dir
    if folder is None:
        raise UserError("--checkpoint auto: set --checkpoint-dir or CHECKPOINT_DIR (the run's "
                        "checkpoint folder)")
    found = newest_first(folder)
    if not found:
        raise UserError(f"--checkpoint auto: no checkpoint (ckpt_<step>.pt) in {folder}")
    return found


def newest_that_reads(candidates: list[Path]) -> tuple[Path, dict[str, Any], list[str]]:
    """The first of `candidates` that reads, as RESUME_FROM=auto picks (Checkpointer.pick), its
    state, and why each newer one was passed over; a named file that does not read, or none of
    several, is one line."""
    from bertperf.train import checkpoint
    passed = []
    for path in candidates:
        try:
            return path, checkpoint.read(path), passed
        except UserError as exc:
            if len(candidates) == 1:
                raise
            passed.append(str(exc))
    raise UserError(f"--checkpoint auto: none of the {len(candidates)} checkpoints in "
                    f"{candidates[0].parent} can be read (the newest: {passed[0]})")


def run_model(state: dict[str, Any], path: Path) -> tuple[BertConfig, dict[str, Any]]:
    """(the BertConfig of the model in checkpoint `state`, the run's curve settings), from its
    fingerprint. A LAYERWISE checkpoint holds the layers of its stage: the config has as many."""
    from bertperf.model.bert_config import BertConfig, layer_part
    saved = state.get("config")
    if not isinstance(saved, dict) or "model.vocab_size" not in saved:
        raise UserError(f"checkpoint {path}: has no model config (not a training checkpoint?)")
    names = {f.name for f in fields(BertConfig)}
    bert = BertConfig(**{k[len("model."):]: v for k, v in saved.items()
                         if k.startswith("model.") and k[len("model."):] in names})
    layers = {part[0] for name in state["model"] if (part := layer_part(name))}
    if layers and len(layers) < bert.num_hidden_layers:
        bert = replace(bert, num_hidden_layers=len(layers))
    return bert, {**config.fingerprint_defaults(), **saved}


def model_weights(saved: dict[str, torch.Tensor], bert: BertConfig,
                  path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's model tensors, checked as a resume checks them (names and shapes of
    `bert`'s model: one line naming the first that differs)."""
    import torch

    from bertperf.model import BertForPreTraining
    from bertperf.train.checkpoint import ModelWeights
    with torch.device("meta"):
        model = BertForPreTraining(bert)
    model = model.to_empty(device="cpu")
    try:
        ModelWeights(model).load_state_dict(saved)
    except UserError as exc:
        raise UserError(f"checkpoint {path}: {exc}") from None
    return model.state_dict()


def check_vocab(vocab: Path, vocab_size: int) -> None:
    """The vocab has the model's vocab_size tokens, BERT's special tokens among them."""
    tokens = read_utf8(vocab).splitlines()
    if len(tokens) != vocab_size:
        raise UserError(f"--vocab {vocab}: {len(tokens):,} tokens, the model's vocabulary has "
                        f"{vocab_size:,} (name the vocab the data was made with)")
    missing = [t for t in SPECIAL_TOKENS.values() if t not in tokens]
    if missing:
        raise UserError(f"--vocab {vocab}: no {missing[0]} token (not a BERT vocab)")


def write_tokenizer(folder: Path, vocab: Path, max_length: int) -> None:
    """BERT's tokenizer as HF reads it from `folder`: `vocab` as vocab.txt and
    tokenizer_config.json (lower case and accents stripped, as MLPerf's data, BERT's special
    tokens, `max_length` tokens at most)."""
    from bertperf.model.hf import HF_TOKENIZER_CONFIG, HF_VOCAB
    shutil.copyfile(vocab, folder / HF_VOCAB)
    tokenizer = {"tokenizer_class": "BertTokenizer", "do_lower_case": True,
                 "model_max_length": max_length, **SPECIAL_TOKENS}
    (folder / HF_TOKENIZER_CONFIG).write_text(json.dumps(tokenizer, indent=2) + "\n")


def log_summary(log: Path) -> dict[str, Any]:
    """What the model card tells of an MLPerf log: samples trained, the last eval's accuracy,
    run_stop's status, the division, max_sequence_length, the global batch."""
    from bertperf.mlperf.check import log_events
    found: dict[str, Any] = {}
    for event in log_events(log):
        key = event.get("key")
        if key == "run_stop":
            found["status"] = event.get("metadata", {}).get("status")
        elif key in ("train_samples", "eval_accuracy", "submission_division",
                     "max_sequence_length", "global_batch_size"):
            found[key] = event.get("value")
    return found


def depth(bert: BertConfig, settings: dict[str, Any]) -> str:
    """The exported model's layers: "24 layers", or "12 of 24 layers (a LAYERWISE stage)" where
    the checkpoint is a stage's."""
    full = settings["model.num_hidden_layers"]
    return (f"{bert.num_hidden_layers} of {full} layers (a LAYERWISE stage)"
            if bert.num_hidden_layers != full else f"{full} layers")


def model_card(bert: BertConfig, settings: dict[str, Any], record: dict[str, Any],
               progress: dict[str, int], path: Path, vocab: Path, log: Path | None) -> str:
    """README.md of the exported folder (module docstring)."""
    from bertperf.resources import VOCAB_MD5
    summary = log_summary(log) if log is not None else {}
    rows = [("model", f"BERT, {depth(bert, settings)} of {bert.hidden_size}, "
                      f"{bert.num_attention_heads} heads, "
                      f"vocabulary {bert.vocab_size:,} (lower case)"),
            ("checkpoint", f"{path.name}: step {progress['step']:,}, {progress['samples']:,} "
                           "samples trained")]
    if log is not None:
        accuracy, samples = summary.get("eval_accuracy"), summary.get("train_samples")
        target = record.get("target")
        rows.append(("MLPerf log", f"{log.name}: run_stop {summary.get('status', 'missing')} "
                     f"after {'?' if samples is None else f'{samples:,}'} samples; final "
                     f"masked-LM accuracy {'?' if accuracy is None else f'{accuracy:.4f}'}"
                     f"{'' if target is None else f' (target {target})'}; division "
                     f"{summary.get('submission_division', '?')}"))
    elif "target" in record:
        rows.append(("target", f"masked-LM accuracy {record['target']}, division "
                               f"{record['division']}"))
    rows.append(("switches", ", ".join(
        f"{key} {'off' if settings.get(key) in (None, '0') else settings[key]}"
        for key in ("LAYERWISE", "GRAD_COMM", "FP8", "PRECISION"))))
    if "data" in record:
        unit = "packed rows" if record["packed"] else "samples"
        rows.append(("data", f"{record['data']}: {record['data_samples']:,} {unit}, "
                             f"max_seq_length {record['max_seq_length']}"))
    elif "max_sequence_length" in summary:
        rows.append(("data", f"max_seq_length {summary['max_sequence_length']}"))
    if "command" in record:
        rows.append(("command", f"`{record['command']}` on {record['ranks']} rank(s)"))
    md5 = md5_file(vocab)
    rows.append(("vocab", "MLPerf's vocab.txt" if md5 == VOCAB_MD5
                 else f"{vocab.name} (md5 {md5})"))
    table = "\n".join(f"| {key} | {value.replace('|', '/')} |" for key, value in rows)
    return (f"---\nlibrary_name: transformers\ntags: [bert, fill-mask, mlperf]\n---\n\n"
            f"# BERT pretrained with bertperf\n\n"
            f"Masked-LM and next-sentence pretraining by bertperf, an MLPerf Training BERT "
            f"harness; exported from its checkpoint with `python -m bertperf export`.\n\n"
            f"| | |\n|---|---|\n{table}\n\n"
            f"```python\nfrom transformers import AutoTokenizer, BertForPreTraining\n"
            f"tokenizer = AutoTokenizer.from_pretrained(\"<this folder>\")\n"
            f"model = BertForPreTraining.from_pretrained(\"<this folder>\")\n```\n")
