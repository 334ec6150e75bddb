"""bertperf's own checkpoints: a run's named stateful parts (model, the run's fingerprint,
optimizer, schedule, loss scaler, loader position, progress counters, random states), each saving
and loading its own state, written by rank 0 under a temporary name and resumed exactly
(docs/design.md, "Checkpoint parts"). A checkpoint is `torch.save` of {"format", part name: part
state, ..., "run": the run's record}, loadable with `weights_only=True`; the record (`run_record`,
what `export` writes into its model card) is never loaded back. Every error is one line naming
the file, said once however many ranks read it."""

from __future__ import annotations

import random
import re
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch

from bertperf import config
from bertperf.config import CheckpointConfig, RunConfig
from bertperf.errors import UserError
from bertperf.formats.files import atomic_output
from bertperf.model.bert_config import BertConfig
from bertperf.model.convert_cli import read_torch_file
from bertperf.train.dist import Dist, FollowOnError, grace_by, warned

FORMAT = "bertperf-checkpoint-4"  # 4: the parts' states by name, the counters as "progress"
OLDER = {"bertperf-checkpoint-3"}  # 3: the counters at the top level (upgraded on load)
NAME = re.compile(r"^ckpt_(\d+)\.pt$")
RECORD = "run"
"""The key of the run's record in a checkpoint (`run_record`; absent from older ones)."""


class Part(Protocol):
    """What a checkpoint holds of a run: anything with a state_dict and a load_state_dict."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


@dataclass
class Progress:
    """The loop's counters: optimizer steps done, samples trained, the sample count of the next
    eval."""

    step: int = 0
    samples: int = 0
    next_eval: int = 0

    def state_dict(self) -> dict[str, int]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step, self.samples, self.next_eval = (int(state[k])
                                                   for k in ("step", "samples", "next_eval"))


@dataclass
class RandomState:
    """The host's random generators (python, numpy, torch's CPU and CUDA ones). Rank 0's are
    saved; on load rank 0 takes them back and every other rank reseeds from (seed, rank, step),
    so with dropout on several ranks only rank 0's masks continue exactly."""

    rank: int
    seed: int
    progress: Progress
    """Whose step reseeds the other ranks (loaded before this part)."""

    def state_dict(self) -> dict[str, Any]:
        name, keys, pos, has_gauss, gauss = np.random.get_state()
        out = {"python": random.getstate(),
               "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                         float(gauss)),
               "torch": torch.get_rng_state(), "cuda": None}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda"] = torch.cuda.get_rng_state_all()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.rank != 0:
            step = self.progress.step
            random.seed(f"{self.seed}-{self.rank}-{step}")
            np.random.seed([self.seed % 2**32, self.rank, step])
            torch.manual_seed(self.seed * 1_000_003 + self.rank * 10_007 + step)
            return
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(state["torch"])
        if state.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class ModelWeights:
    """The one-device model's parameters (never DDP's "module."-prefixed names); a checkpoint
    of another shape is named by its first differing tensor before anything is loaded."""

    model: torch.nn.Module

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, saved: dict[str, torch.Tensor]) -> None:
        mine = self.model.state_dict()
        for name, tensor in mine.items():
            if name not in saved:
                raise UserError(f"has no tensor {name} (a different model?)")
            if tuple(saved[name].shape) != tuple(tensor.shape):
                raise UserError(f"tensor {name} has shape {tuple(saved[name].shape)}, this "
                                f"model's is {tuple(tensor.shape)}")
        extra = [n for n in saved if n not in mine]
        if extra:
            raise UserError(f"tensor {extra[0]} is not in this model (a different model?)")
        self.model.load_state_dict(saved)


@dataclass
class LossScale:
    """fp16's dynamic loss scale (a part only when the run scales its loss)."""

    scaler: Any

    def state_dict(self) -> Any:
        return self.scaler.state_dict()

    def load_state_dict(self, state: Any) -> None:
        if state is None:
            raise UserError("has no fp16 loss-scaler state")
        self.scaler.load_state_dict(state)


def fingerprint(cfg: RunConfig, bert: BertConfig) -> dict[str, Any]:
    """What a resumed run must share with the saved one to continue its curve: the settings
    config.py marks `curve`, and the model's shape and dropout (its BertConfig `bert`)."""
    shape = {f"model.{k}": v for k, v in asdict(bert).items()}
    return {**{k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
               for k, v in shape.items()}, **config.fingerprint(cfg)}


@dataclass
class Fingerprint:
    """The run's fingerprint as a part: saved as it is; loading checks the saved one against
    it."""

    mine: dict[str, Any]

    def state_dict(self) -> dict[str, Any]:
        return self.mine

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Every value equal (a setting the checkpoint predates counts with its default),
        except that BATCHSIZE and WORLD_SIZE may change together when their product (the
        global micro-batch) does not: the loader's state then decides whether its order allows
        that."""
        saved, mine = {**config.fingerprint_defaults(), **saved}, self.mine
        keys = set(saved) | set(mine)
        product = [(d.get("BATCHSIZE") or 0) * (d.get("WORLD_SIZE") or 0) for d in (saved, mine)]
        if product[0] == product[1]:
            keys -= {"BATCHSIZE", "WORLD_SIZE"}
        for key in sorted(keys):
            was, now = saved.get(key), mine.get(key)
            if was == now:
                continue
            if now is None:
                raise UserError(f"made with {key}={was!r}, which this run leaves unset; set it "
                                "to resume")
            if was is None:
                raise UserError(f"made without {key}, which this run sets to {now!r}; unset it "
                                "to resume")
            raise UserError(f"saved with {key}={was!r}, this run has {now!r}; an exact resume "
                            "needs the same settings")


def run_record(cfg: RunConfig, data_samples: int, packed: bool,
               max_seq_length: int) -> dict[str, Any]:
    """What a checkpoint tells of the run that wrote it, beyond its parts (for `export`'s model
    card): the command (every setting that differs from its default, as its variable, but the
    launcher's; and the ranks), the MLPerf log, the target and division, and the training data
    (its samples, or packed rows, and max_seq_length)."""
    settings = [f"{f.metadata['env']}={shlex.quote(config.default_text(value))}"
                for section, f in config.tunables() if section != "dist"
                and (value := getattr(getattr(cfg, section), f.name)) != f.default
                and value is not None]
    return {"command": " ".join([*settings, "python -m bertperf train"]),
            "ranks": cfg.dist.world_size, "log": str(cfg.log_path.absolute()),
            "target": cfg.train.target_accuracy, "division": cfg.train.submission_division,
            "data": str(cfg.data.train_dir), "data_samples": data_samples, "packed": packed,
            "max_seq_length": max_seq_length}


def file_name(step: int) -> str:
    return f"ckpt_{step:08d}.pt"


def newest_first(folder: Path) -> list[Path]:
    """The checkpoints in `folder`, the highest step first."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def read(path: Path) -> dict[str, Any]:
    """The checkpoint at `path`, upgraded to FORMAT; one-line UserErrors for what cannot be."""
    state = read_torch_file(path, "checkpoint")
    found = state.get("format") if isinstance(state, dict) else type(state).__name__
    if found in OLDER:
        state["progress"] = {k: state.pop(k) for k in ("step", "samples", "next_eval")}
    elif found != FORMAT:
        raise UserError(f"checkpoint {path}: not a bertperf checkpoint (format {found!r})")
    return state


class Checkpointer:
    """Saves and resumes a run's parts (CHECKPOINT_DIR, CHECKPOINT_EVERY, RESUME_FROM, which
    `resumable` reads and checks before the run's log opens). `parts` is asked for them each
    time, so it names the run's current ones; they load in its order (the model's shapes and
    the run's Fingerprint before the rest). `record` (run_record) is saved with them."""

    def __init__(self, parts: Callable[[], dict[str, Part]], settings: CheckpointConfig,
                 dist: Dist, device: torch.device, record: dict[str, Any] | None = None) -> None:
        self.parts, self.settings, self.dist, self.device = parts, settings, dist, device
        self.record = record
        self.saved: Path | None = None
        """The last checkpoint this run saved (every rank knows it: every rank calls save)."""
        self.save_seconds: float | None = None
        """How long this rank's last save took (None: none yet)."""
        self.step_seconds: float | None = None
        self.last_step: tuple[int, float] | None = None  # (step, when) at the last `preempted`
        if settings.checkpoint_grace and settings.preempt_check_every and \
                settings.checkpoint_dir is not None:
            grace_by(self.fits_in_grace)

    def states(self) -> dict[str, Any]:
        """Every part's state by name. Every rank calls it (a sharded optimizer gathers its
        state from all ranks)."""
        return {name: part.state_dict() for name, part in self.parts().items()}

    def restore(self, states: dict[str, Any]) -> None:
        """Load every part's state from `states`, in the parts' order, each part asked for
        after the ones before it loaded (a LAYERWISE stage rebuilds the optimizer and schedule
        that load after it)."""
        for name in list(self.parts()):
            self.parts()[name].load_state_dict(states[name])

    def save(self, path: Path) -> Path | None:
        """Write every part's state to `path`. Every rank calls it (`states`); rank 0 writes,
        the others return None."""
        start = time.perf_counter()
        states = self.states()
        self.saved = path
        if self.dist.rank != 0:
            self.save_seconds = time.perf_counter() - start
            return None
        try:
            with atomic_output(path) as tmp, open(tmp, "wb") as f:
                # through Python's file: a full disk raises ENOSPC, named
                torch.save({"format": FORMAT, **states,
                            **({RECORD: self.record} if self.record is not None else {})}, f)
        except UserError as exc:
            raise UserError(f"checkpoint {exc}") from None
        self.save_seconds = time.perf_counter() - start
        return path

    def maybe_save(self, step: int, last: bool) -> Path | None:
        """After each step: save every CHECKPOINT_EVERY steps and at the step that ends the run
        by a cap (`last`); nothing without CHECKPOINT_DIR."""
        every, folder = self.settings.checkpoint_every, self.settings.checkpoint_dir
        if folder is None or not (last or (every and step % every == 0)):
            return None
        return self.save(folder / file_name(step))

    def preempted(self, step: int) -> bool:
        """After each step, past maybe_save: every PREEMPT_CHECK_EVERY steps (with CHECKPOINT_DIR)
        the ranks agree whether the preemption warning reached any of them (Dist.any); if it
        did, every rank saves this step's checkpoint (unless maybe_save just did) and the run is
        to stop."""
        now = time.perf_counter()
        if self.last_step is not None and step > self.last_step[0]:
            self.step_seconds = (now - self.last_step[1]) / (step - self.last_step[0])
        self.last_step = (step, now)
        every, folder = self.settings.preempt_check_every, self.settings.checkpoint_dir
        if folder is None or not every or step % every or not self.dist.any(warned(),
                                                                             self.device):
            return False
        if self.saved != folder / file_name(step):
            self.save(folder / file_name(step))
        return True

    def fits_in_grace(self) -> bool:
        """Whether the steps to the next agreement (`preempted`) and a checkpoint, at this
        rank's last measured step and save, fit in CHECKPOINT_GRACE seconds (no save measured
        yet: not known, so no)."""
        if self.save_seconds is None or self.step_seconds is None or self.last_step is None:
            return False
        every = self.settings.preempt_check_every
        steps = every - self.last_step[0] % every
        return steps * self.step_seconds + self.save_seconds <= self.settings.checkpoint_grace

    def load(self, path: Path, state: dict[str, Any]) -> None:
        """Restore every part from `state`, read from `path` (`restore`)."""
        try:
            self.restore(state)
        except UserError as exc:
            raise UserError(f"checkpoint {path}: {exc}") from None
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            text = str(exc).splitlines()[0][:160] if str(exc) else ""
            raise UserError(f"checkpoint {path}: inconsistent contents "
                            f"({type(exc).__name__}: {text})") from None

    def read_on_every_rank(self, path: Path) -> tuple[dict | None, str | None, int]:
        """(the state, None, -1) when every rank read `path`; else (None, this rank's one-line
        error or None where this rank read it, the lowest rank that could not). Collective."""
        try:
            state, problem = read(path), None
        except UserError as exc:
            state, problem = None, str(exc)
        failed = torch.zeros(self.dist.world_size, dtype=torch.float64, device=self.device)
        failed[self.dist.rank] = float(problem is not None)
        ranks = self.dist.sum(failed).nonzero().flatten().tolist()
        return (state, None, -1) if not ranks else (None, problem, ranks[0])

    def pick(self, report: Callable[[str], None]) -> tuple[Path, dict] | None:
        """The checkpoint RESUME_FROM names, read on every rank: the file, or with "auto" the
        newest in CHECKPOINT_DIR that every rank reads, saying which damaged ones it passed
        over; None for a fresh start (auto, no checkpoint yet). A file that cannot be read is
        said once, by the lowest rank that cannot read it; the others fail with a
        FollowOnError."""
        ck, rank = self.settings, self.dist.rank
        auto = ck.resume_from == "auto"
        candidates = newest_first(ck.checkpoint_dir) if auto else [Path(ck.resume_from)]
        if not candidates:
            report(f"RESUME_FROM=auto: no checkpoint in {ck.checkpoint_dir}; starting from "
                   "scratch")
            return None
        passed = []
        for path in candidates:
            state, problem, first = self.read_on_every_rank(path)
            if state is not None:
                if passed:
                    report(f"RESUME_FROM=auto: {'; '.join(passed)}; resuming from the newest "
                           f"checkpoint that loads, {path}")
                return path, state
            passed.append(problem or f"checkpoint {path}: rank {first} cannot read it")
        if rank != first:
            raise FollowOnError(f"rank {rank}: cannot resume (rank {first} says why)")
        if auto:
            raise UserError(f"RESUME_FROM=auto: none of the {len(candidates)} checkpoints in "
                            f"{ck.checkpoint_dir} can be read (the newest: {passed[0]})")
        raise UserError(problem)


def resumable(cfg: RunConfig, bert: BertConfig, dist: Dist, device: torch.device,
              report: Callable[[str], None]) -> tuple[Path, dict] | None:
    """RESUME_FROM's checkpoint and its state, read on every rank (Checkpointer.pick), checked
    as far as it can be before the run's MLPerf log opens: made with this run's settings and
    model (its Fingerprint) and not where this run ends already (MAX_STEPS,
    MAX_SAMPLES_TERMINATION). None for a fresh start. The run's parts load it during init
    (Checkpointer.load)."""
    if cfg.checkpoint.resume_from is None:
        return None
    progress = Progress()
    parts = {"config": Fingerprint(fingerprint(cfg, bert)), "progress": progress}
    early = Checkpointer(lambda: parts, cfg.checkpoint, dist, device)
    found = early.pick(report)
    if found is not None:
        early.load(*found)
        if progress.step >= cfg.optim.max_steps \
                or progress.samples >= cfg.train.max_samples_termination:
            raise UserError(f"checkpoint {found[0]}: the run already ended there (step "
                            f"{progress.step}, {progress.samples} samples); nothing to resume")
    return found
