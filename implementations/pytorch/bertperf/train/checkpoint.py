"""bertperf's own checkpoints: save a run's whole training state and resume it exactly.

A checkpoint (`torch.save` of one dict, loadable with `weights_only=True`) holds:

  model      the core model's state_dict (never the DDP wrapper's "module."-prefixed one)
  optimizer  LAMB's state_dict (moments, per-group step and hyper-parameters), whole tensors
             also with SHARDED_LAMB=1 (bertperf.optim.ShardedLamb gathers its ranks' shards),
             so it loads into Lamb, FlatLamb or ShardedLamb at any world size
  scheduler  LinearWarmupPolyDecay's state_dict (completed steps, base LRs)
  scaler     DynamicLossScaler's state_dict (fp16 only, else None)
  loader     ShardLoader.state_dict() after the last batch trained (the loop's DeviceBatches
             holds one more, copied ahead): (epoch, position), shard fingerprint
  rng        python `random`, numpy and torch CPU states, and every CUDA device's when present
  step, samples, next_eval   the loop's counters (next_eval: sample count of the next eval)
  config     fingerprint(): the model's BertConfig and every setting that changes the loss curve
             (BATCHSIZE and WORLD_SIZE may change together at the same global micro-batch: the
             loader's state then moves its position to the new batch size, data/loader.py)

Rank 0 writes it, to a temporary name renamed into place (formats.files.atomic_output), so a file
named ckpt_<step>.pt is always complete. Every rank loads it; parameters and optimizer state are
the same on all ranks under DDP and the loader position is too (a sharded optimizer keeps its
rank's shard of the state). Only rank 0's RNG states are
saved: other ranks reseed from (SEED, rank, step), so with dropout and WORLD_SIZE > 1 a resumed
run's dropout masks on ranks > 0 differ from an uninterrupted run's (a single process, or no
dropout, resumes bitwise).

Resuming restores all of it after `setup` (i.e. after init's seeding), so steps k+1.. of a run
resumed from step k compute the same losses, bitwise on CPU, as the uninterrupted run. A resumed
run writes a new MLPerf log (its own init/run_start; a `resumed` event during init naming the
checkpoint, its step and samples; block_start at the restored sample count) and says on the
console where it goes on; RESUME_FROM=auto with no checkpoint yet says that it starts from scratch,
and passes over checkpoints that cannot be read (a run killed while a disk filled), saying so.
Errors are one-line UserErrors naming the file, said once: a damaged file, a checkpoint of
another model (first mismatching tensor named), a different run configuration, a full disk.
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from bertperf.errors import UserError
from bertperf.formats.files import atomic_output
from bertperf.model.bert_config import BertConfig
from bertperf.train.dist import FollowOnError

FORMAT = "bertperf-checkpoint-3"  # 2: step counts and LR on the device; 3: q/k/v one parameter
NAME = re.compile(r"^ckpt_(\d+)\.pt$")


@dataclass(frozen=True)
class Position:
    """Where a resumed loop continues: completed optimizer steps, samples trained, next eval
    (a sample count), and the checkpoint that said so."""

    step: int
    samples: int
    next_eval: int
    checkpoint: Path


def file_name(step: int) -> str:
    return f"ckpt_{step:08d}.pt"


def newest_first(folder: Path) -> list[Path]:
    """The checkpoints in `folder`, the highest step first."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def fingerprint(cfg) -> dict[str, Any]:
    """The settings a resumed run must share with the saved one to continue the same curve."""
    model = {f"model.{k}": v for k, v in asdict(BertConfig.named(cfg.model.bert_config)).items()}
    o, t = cfg.optim, cfg.train
    run = {"LAYOUT": cfg.data.layout, "BATCHSIZE": t.batch_size,
           "GRADIENT_STEPS": t.gradient_steps,
           "WORLD_SIZE": cfg.dist.world_size, "SEED": t.seed, "PRECISION": t.precision,
           "LR": o.lr, "MAX_STEPS": o.max_steps, "WARMUP_STEPS": o.warmup_steps,
           "WARMUP_PROPORTION": o.warmup_proportion, "START_WARMUP_STEP": o.start_warmup_step,
           "OPT_LAMB_BETA_1": o.beta1, "OPT_LAMB_BETA_2": o.beta2,
           "WEIGHT_DECAY_RATE": o.weight_decay, "EPSILON": o.epsilon,
           "MAX_GRAD_NORM": o.max_grad_norm}
    if o.clip_before_allreduce:  # only then: checkpoints without the key clipped after it
        run["CLIP_BEFORE_ALLREDUCE"] = True
    return {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
            for k, v in {**model, **run}.items()}


# ---- RNG ---------------------------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    out = {"python": random.getstate(),
           "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                     float(gauss)),
           "torch": torch.get_rng_state(), "cuda": None}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- save --------------------------------------------------------------------------------------

def save(path: str | Path, trainer, step: int, samples: int, next_eval: int) -> Path | None:
    """Write the trainer's state after `step` optimizer steps. Every rank calls it (a sharded
    optimizer gathers its state from all ranks); rank 0 writes, the others return None."""
    optimizer = trainer.optimizer.state_dict()
    if trainer.dist.rank != 0:
        return None
    path = Path(path)
    state = {
        "format": FORMAT,
        "model": trainer.core.state_dict(),
        "optimizer": optimizer,
        "scheduler": trainer.scheduler.state_dict(),
        "scaler": trainer.scaler.state_dict() if trainer.scaler is not None else None,
        "loader": trainer.batches.state_dict(),
        "rng": rng_state(),
        "step": int(step), "samples": int(samples), "next_eval": int(next_eval),
        "config": fingerprint(trainer.cfg),
    }
    try:
        with atomic_output(path) as tmp, open(tmp, "wb") as f:
            torch.save(state, f)  # through Python's file: a full disk raises ENOSPC, named
    except UserError as exc:
        raise UserError(f"checkpoint {exc}") from None
    return path


def maybe_save(trainer, step: int, samples: int, next_eval: int) -> Path | None:
    """The loop's hook after each step: save every CHECKPOINT_EVERY steps and at the step where
    MAX_STEPS or MAX_SAMPLES_TERMINATION ends the run (nothing without CHECKPOINT_DIR)."""
    cfg = trainer.cfg
    ck = cfg.checkpoint
    if ck.checkpoint_dir is None:
        return None
    last = samples >= cfg.train.max_samples_termination or step >= cfg.optim.max_steps
    if not last and not (ck.checkpoint_every and step % ck.checkpoint_every == 0):
        return None
    return save(ck.checkpoint_dir / file_name(step), trainer, step, samples, next_eval)


# ---- load --------------------------------------------------------------------------------------

def _read(path: Path) -> dict[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UserError(f"checkpoint {path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"checkpoint {path}: is a folder, expected a file") from None
    except Exception as exc:  # truncated zip, bad pickle, foreign file: torch raises many kinds
        raise UserError(f"checkpoint {path}: damaged, cannot be read (truncated or corrupt: "
                        f"{first_sentence(exc)})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UserError(f"checkpoint {path}: not a bertperf checkpoint (format "
                        f"{state.get('format') if isinstance(state, dict) else type(state).__name__!r})")
    return state


def first_sentence(exc: BaseException, limit: int = 120) -> str:
    """The first sentence of an exception's message, whole words up to `limit` characters."""
    text = " ".join(str(exc).split())
    sentence = text.split(". ")[0].rstrip(".") or type(exc).__name__
    if len(sentence) > limit:
        sentence = sentence[:limit].rsplit(" ", 1)[0] + " ..."
    return sentence


def _check_model(path: Path, saved: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    mine = model.state_dict()
    for name, tensor in mine.items():
        if name not in saved:
            raise UserError(f"checkpoint {path}: has no tensor {name} (a different model?)")
        if tuple(saved[name].shape) != tuple(tensor.shape):
            raise UserError(f"checkpoint {path}: tensor {name} has shape "
                            f"{tuple(saved[name].shape)}, this model's is {tuple(tensor.shape)}")
    extra = [n for n in saved if n not in mine]
    if extra:
        raise UserError(f"checkpoint {path}: tensor {extra[0]} is not in this model "
                        "(a different model?)")


def _check_config(path: Path, saved: dict[str, Any], mine: dict[str, Any]) -> None:
    """Every setting equal, except that BATCHSIZE and WORLD_SIZE may change together when their
    product (the global micro-batch) does not: the loader's state then decides whether its
    order allows that (data/loader.py: split global_batch, data not stratified)."""
    keys = set(saved) | set(mine)
    product = [(d.get("BATCHSIZE") or 0) * (d.get("WORLD_SIZE") or 0) for d in (saved, mine)]
    if product[0] == product[1]:
        keys -= {"BATCHSIZE", "WORLD_SIZE"}
    for key in sorted(keys):
        if saved.get(key) != mine.get(key):
            raise UserError(f"checkpoint {path}: saved with {key}={saved.get(key)!r}, this run has "
                            f"{mine.get(key)!r}; an exact resume needs the same settings")


def restore(path: Path, state: dict[str, Any], trainer) -> Position:
    """Restore `state`, read from `path`, into `trainer` (after setup); where the loop goes on."""
    try:
        _check_model(path, state["model"], trainer.core)  # shapes first: names the tensor
        _check_config(path, state["config"], fingerprint(trainer.cfg))
        trainer.core.load_state_dict(state["model"])
        trainer.optimizer.load_state_dict(state["optimizer"])
        trainer.scheduler.load_state_dict(state["scheduler"])
        if trainer.scaler is not None:
            if state["scaler"] is None:
                raise UserError(f"checkpoint {path}: has no fp16 loss-scaler state")
            trainer.scaler.load_state_dict(state["scaler"])
        loader_state = dict(state["loader"], rank=trainer.loader.rank)  # same position on all ranks
        try:
            trainer.loader.load_state_dict(loader_state)
        except UserError as exc:
            raise UserError(f"checkpoint {path}: {exc}") from None
        step = int(state["step"])
        if trainer.dist.rank == 0:
            set_rng_state(state["rng"])
        else:
            seed = trainer.cfg.train.seed
            random.seed(f"{seed}-{trainer.dist.rank}-{step}")
            np.random.seed([seed % 2**32, trainer.dist.rank, step])
            torch.manual_seed(seed * 1_000_003 + trainer.dist.rank * 10_007 + step)
        return Position(step, int(state["samples"]), int(state["next_eval"]), path)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise UserError(f"checkpoint {path}: inconsistent contents "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})"
                        ) from None


def read_on_every_rank(path: Path, dist, device: torch.device
                       ) -> tuple[dict | None, str | None, int]:
    """(the state, None, -1) when every rank read `path`; else (None, this rank's one-line
    error or None where this rank read it, the lowest rank that could not). Collective."""
    try:
        state, problem = _read(path), None
    except UserError as exc:
        state, problem = None, str(exc)
    failed = torch.zeros(dist.world_size, dtype=torch.float64, device=device)
    failed[dist.rank] = float(problem is not None)
    ranks = dist.sum(failed).nonzero().flatten().tolist()
    return (state, None, -1) if not ranks else (None, problem, ranks[0])


def pick(trainer, report: Callable[[str], None]) -> tuple[Path, dict] | None:
    """The checkpoint RESUME_FROM names, read on every rank: the file, or with "auto" the newest
    in CHECKPOINT_DIR that every rank reads, saying which damaged ones it passed over; None for
    a fresh start (auto, no checkpoint yet). A file that cannot be read is said once, by the
    lowest rank that cannot read it; the others fail with a FollowOnError."""
    ck, dist = trainer.cfg.checkpoint, trainer.dist
    auto = ck.resume_from == "auto"
    candidates = newest_first(ck.checkpoint_dir) if auto else [Path(ck.resume_from)]
    if not candidates:
        report(f"RESUME_FROM=auto: no checkpoint in {ck.checkpoint_dir}; starting from scratch")
        return None
    passed = []
    for path in candidates:
        state, problem, first = read_on_every_rank(path, dist, trainer.device)
        if state is not None:
            if passed:
                report(f"RESUME_FROM=auto: {'; '.join(passed)}; resuming from the newest "
                       f"checkpoint that loads, {path}")
            return path, state
        passed.append(problem or f"checkpoint {path}: rank {first} cannot read it")
    if dist.rank != first:
        raise FollowOnError(f"rank {dist.rank}: cannot resume (rank {first} says why)")
    if auto:
        raise UserError(f"RESUME_FROM=auto: none of the {len(candidates)} checkpoints in "
                        f"{ck.checkpoint_dir} can be read (the newest: {passed[0]})")
    raise UserError(problem)


def resume(trainer, report: Callable[[str], None]) -> Position | None:
    """The init hook: load RESUME_FROM (a file, or "auto" = the newest in CHECKPOINT_DIR that
    loads) into the trainer and `report` where the run goes on; None for a fresh start
    (reported for "auto" when CHECKPOINT_DIR holds no checkpoint yet)."""
    if trainer.cfg.checkpoint.resume_from is None:
        return None
    found = pick(trainer, report)
    if found is None:
        return None
    path, state = found
    start = restore(path, state, trainer)
    cfg = trainer.cfg
    if start.step >= cfg.optim.max_steps or start.samples >= cfg.train.max_samples_termination:
        raise UserError(f"checkpoint {path}: the run already ended there (step {start.step}, "
                        f"{start.samples} samples); nothing to resume")
    report(f"resuming from {path}: step {start.step}, {start.samples} samples trained, next "
           f"eval at {start.next_eval} samples")
    return start
