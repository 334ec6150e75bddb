"""What a run may combine: every refusal of a combination of settings (with each other, with what
the training folder holds, with the model and the run's length, with this machine) is one row of
REFUSED, and `check` says the first that fires in one line before any log is written
(train.checks.prepare: `train` and `train --check`). A row reads a Facts, which works out what
rows ask (the model's shapes, the warm-up's end, CUDA, Triton, installed packages) once, when one
first asks: a run that sets nothing needing a GPU probes none. The values a setting takes alone are
config.py's (`choices`, `validate`); checks of the data itself are train.checks'."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

from bertperf import versions
from bertperf.benchmark import CLOSED, OPEN, TARGET_ACCURACY
from bertperf.config import RunConfig, layerwise_stages
from bertperf.errors import UserError
from bertperf.kernels import backend
from bertperf.mlperf.rcp import check_global_batch
from bertperf.model import BertForPreTraining, fp8
from bertperf.model.bert_config import BertConfig
from bertperf.optim import use_flat_lamb, warmup_end
from bertperf.train import comm, layout

SETTINGS, DATA, MACHINE = "settings", "data", "machine"
"""What a row reads besides the settings: nothing more; the training folder, the model's shape
or the global batch; this machine (CUDA, GPUs, Triton, torchao, tensorboard)."""


def on_cpu(cfg: RunConfig) -> bool:
    """The run trains on the CPU (DEVICE=cpu, or auto where CUDA is not available)."""
    return cfg.train.device == "cpu" or (cfg.train.device == "auto"
                                         and not torch.cuda.is_available())


class Facts:
    """What the rows of REFUSED read about a run (`cfg`, its layout resolved), each worked out
    the first time a row asks."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg, self.o, self.t = cfg, cfg.optim, cfg.train

    @cached_property
    def holds(self) -> str:
        """The layout the training folder's shards are made for."""
        return layout.holds(self.cfg.data.train_dir)

    @cached_property
    def fixed_shapes(self) -> bool:
        return layout.layout_of(self.cfg).fixed_shapes

    @cached_property
    def global_batch(self) -> int:
        """Sequences per step as MLPerf counts them."""
        return layout.layout_of(self.cfg).global_batch_size(self.cfg)

    @cached_property
    def bert(self) -> BertConfig:
        return BertConfig.named(self.cfg.model.bert_config)

    @cached_property
    def rcp_problem(self) -> str | None:
        """Why MLPerf's RCP checker could not judge this global batch (mlperf.rcp), or None."""
        try:
            check_global_batch(self.global_batch)
        except UserError as exc:
            return str(exc)
        return None

    @cached_property
    def compressing_rank(self) -> int:
        """The highest POWERSGD_RANK at which one of the model's gradients is sent compressed."""
        with torch.device("meta"):  # the shapes only: no memory, no random numbers drawn
            model = BertForPreTraining(self.bert)
        return comm.compressing_rank([p.shape for p in model.parameters() if p.ndim == 2])

    @cached_property
    def warmup_end(self) -> int:
        return warmup_end(self.cfg.optim)

    @cached_property
    def mode(self) -> comm.Mode:
        """GRAD_COMM's mode."""
        return comm.MODES[self.o.grad_comm]

    @cached_property
    def comm_start(self) -> int:
        return comm.comm_start(self.cfg)

    @cached_property
    def stages(self) -> list[tuple[int, int | None, str | None]]:
        return layerwise_stages(self.cfg.layerwise.layerwise)

    @cached_property
    def stage_adding_none(self) -> int | None:
        """The first stage (its index) that trains only new layers and adds none, or None."""
        lw = self.cfg.layerwise
        return next((i for i, (layers, _, mode) in enumerate(self.stages[1:], 1)
                     if (mode or lw.layerwise_train) == "new" and layers == self.stages[i - 1][0]),
                    None)

    @cached_property
    def wants_cuda(self) -> str | None:
        """The setting that needs a CUDA device (as the user wrote it), or None."""
        return "DEVICE=cuda" if self.t.device == "cuda" else \
            "USE_CUDA_GRAPH=1" if self.t.use_cuda_graph else \
            "FUSED_KERNELS=1" if self.t.fused_kernels else None

    @cached_property
    def cuda(self) -> bool:
        return torch.cuda.is_available()

    @cached_property
    def gpus(self) -> int:
        return torch.cuda.device_count()

    @cached_property
    def on_gpu(self) -> bool:
        """The run trains on CUDA (a GPU of its own or not)."""
        return self.cuda and not on_cpu(self.cfg)

    @cached_property
    def triton(self) -> bool:
        return backend.triton_installed()

    @cached_property
    def torchao(self) -> bool:
        return importlib.util.find_spec("torchao") is not None

    @cached_property
    def tensorboard(self) -> bool:
        return importlib.util.find_spec("tensorboard") is not None

    @cached_property
    def fp8_problem(self) -> str | None:
        """Why FP8 GEMMs do not run on the run's device (model.fp8.supported), or None."""
        return fp8.supported(torch.device("cuda", self.cfg.dist.local_rank) if self.on_gpu
                             else torch.device("cpu"))


@dataclass(frozen=True)
class Refusal:
    """A combination a run may not have: one row of REFUSED."""

    name: str
    reads: str
    """SETTINGS, DATA or MACHINE."""
    when: Callable[[Facts], bool]
    why: Callable[[Facts], str]
    """The line said, naming the settings and their values."""


def _torchao_hint() -> str:
    """How to install the torchao release built for this torch (bertperf.versions)."""
    line = versions.torch_line(torch.__version__)
    if line in versions.TORCHAO:
        return f"pip install torchao=={versions.TORCHAO[line]}, the release built for torch {line}"
    return (f"torch {torch.__version__} is outside bertperf's supported torch lines, "
            f"{versions.supported_range()}")


def _cuda_build() -> str:
    return "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"


REFUSED: tuple[Refusal, ...] = (
    Refusal("checkpoint_every_without_dir", SETTINGS,
            lambda f: f.cfg.checkpoint.checkpoint_every > 0
            and f.cfg.checkpoint.checkpoint_dir is None,
            lambda f: f"CHECKPOINT_EVERY={f.cfg.checkpoint.checkpoint_every} needs CHECKPOINT_DIR "
                      "(--checkpoint-dir)"),
    Refusal("resume_auto_without_dir", SETTINGS,
            lambda f: f.cfg.checkpoint.resume_from == "auto"
            and f.cfg.checkpoint.checkpoint_dir is None,
            lambda f: "RESUME_FROM=auto needs CHECKPOINT_DIR (--checkpoint-dir)"),
    Refusal("grad_comm_outside_open", SETTINGS,
            lambda f: f.mode.division == OPEN and f.t.submission_division != OPEN,
            lambda f: f"GRAD_COMM={f.o.grad_comm} is an open-division method: set "
                      f"SUBMISSION_DIVISION=open (not {f.t.submission_division})"),
    Refusal("target_in_closed", SETTINGS,
            lambda f: f.t.submission_division == CLOSED and f.t.target_accuracy != TARGET_ACCURACY,
            lambda f: f"TARGET_MLM_ACCURACY={f.t.target_accuracy}: the closed division's target "
                      f"is {TARGET_ACCURACY} (set SUBMISSION_DIVISION=open for another target)"),
    Refusal("layerwise_new_stage_adds_none", SETTINGS,
            lambda f: f.cfg.layerwise.layerwise is not None and f.stage_adding_none is not None,
            lambda f: f"LAYERWISE={f.cfg.layerwise.layerwise!r}: stage {f.stage_adding_none + 1} "
                      f"trains only new layers and adds none ({f.stages[f.stage_adding_none][0]} "
                      f"after {f.stages[f.stage_adding_none][0]}); end it in :all"),
    Refusal("layerwise_outside_open", SETTINGS,
            lambda f: f.cfg.layerwise.layerwise is not None and f.t.submission_division != OPEN,
            lambda f: f"LAYERWISE is an open-division method: set SUBMISSION_DIVISION=open (not "
                      f"{f.t.submission_division})"),
    Refusal("layout_not_in_folder", DATA,
            lambda f: f.cfg.data.layout != f.holds,
            lambda f: f"LAYOUT={f.cfg.data.layout}, but {f.cfg.data.train_dir} holds "
                      f"{layout.LAYOUTS[f.holds].holds} shards (prep pack makes packed shards "
                      "from unpadded ones, --unpack the reverse; prep stratify makes "
                      "length-stratified ones)"),
    Refusal("layout_needs_global_batch_split", SETTINGS,
            lambda f: f.cfg.data.layout in ("packed", "stratified")
            and f.cfg.data.loader_split != "global_batch",
            lambda f: f"LAYOUT={f.cfg.data.layout} "
                      + ("counts each global batch's sequences on every rank"
                         if f.cfg.data.layout == "packed"
                         else "composes each global batch from every length bin")
                      + f": it needs LOADER_SPLIT=global_batch, not {f.cfg.data.loader_split}"),
    Refusal("sharded_lamb_without_flat_lamb", SETTINGS,
            lambda f: f.o.sharded_lamb and f.o.flat_lamb is False,
            lambda f: "SHARDED_LAMB=1 shards FlatLamb's flat buffer: it cannot go with "
                      "FLAT_LAMB=0 (set FLAT_LAMB=auto or 1)"),
    Refusal("sharded_lamb_with_bucket_clip", SETTINGS,
            lambda f: f.o.sharded_lamb and f.o.clip_before_allreduce,
            lambda f: "CLIP_BEFORE_ALLREDUCE=1 clips DDP's all-reduce buckets, which "
                      "SHARDED_LAMB=1 replaces by its reduce-scatter: set one of them to 0"),
    Refusal("compile_without_fixed_shapes", SETTINGS,
            lambda f: (f.t.compile != "none" or f.t.use_cuda_graph) and not f.fixed_shapes,
            lambda f: "COMPILE and USE_CUDA_GRAPH need LAYOUT=packed (varlen batches change "
                      "shape every step)"),
    Refusal("cuda_graph_without_inductor", SETTINGS,
            lambda f: f.t.use_cuda_graph and f.t.compile not in ("none", "inductor"),
            lambda f: f"USE_CUDA_GRAPH=1 replays inductor's code: COMPILE={f.t.compile} cannot "
                      "go with it (use none or inductor)"),
    Refusal("cuda_graph_on_cpu", SETTINGS,
            lambda f: f.t.use_cuda_graph and f.t.device == "cpu",
            lambda f: "USE_CUDA_GRAPH=1 needs a CUDA device, not DEVICE=cpu"),
    Refusal("fp8_without_bf16", SETTINGS,
            lambda f: f.t.fp8 != "0" and f.t.precision != "bf16",
            lambda f: f"FP8={f.t.fp8} runs the encoder's GEMMs in FP8 around bf16 activations: "
                      f"it needs PRECISION=bf16, not {f.t.precision}"),
    Refusal("cuda_graph_accumulating_per_tensor", MACHINE,
            lambda f: f.t.use_cuda_graph and f.t.gradient_steps > 1 and not f.o.sharded_lamb
            and not use_flat_lamb(f.o.flat_lamb, f.t.fused_kernels, cuda=True),
            lambda f: f"USE_CUDA_GRAPH=1 with GRADIENT_STEPS={f.t.gradient_steps} accumulates "
                      "gradients across graph replays, which only FlatLamb's preallocated "
                      "gradient buffer survives (a replay frees the graph's outputs, the "
                      "per-tensor LAMB's first gradients among them): FLAT_LAMB=1, or auto with "
                      "FUSED_KERNELS auto or 1 and Triton installed"),
    Refusal("grad_comm_with_sharded_lamb", SETTINGS,
            lambda f: f.mode.hooked and f.o.sharded_lamb,
            lambda f: f"GRAD_COMM={f.o.grad_comm} is a DDP communication hook, and "
                      "SHARDED_LAMB=1 has no DDP (it reduce-scatters at the step): set "
                      "GRAD_COMM=allreduce or SHARDED_LAMB=0"),
    Refusal("grad_comm_with_bucket_clip", SETTINGS,
            lambda f: f.mode.hooked and f.o.clip_before_allreduce,
            lambda f: f"GRAD_COMM={f.o.grad_comm} and CLIP_BEFORE_ALLREDUCE=1 are both DDP "
                      "communication hooks and DDP takes one: set CLIP_BEFORE_ALLREDUCE=0 (the "
                      "step clips the decompressed average)"),
    Refusal("stateful_grad_comm_with_layerwise", SETTINGS,
            lambda f: f.mode.stateful and f.cfg.layerwise.layerwise is not None,
            lambda f: f"GRAD_COMM={f.o.grad_comm} keeps per-bucket state that a LAYERWISE "
                      "stage's new DDP buckets would not match: use a GRAD_COMM that keeps none "
                      f"({', '.join(n for n, m in comm.MODES.items() if not m.stateful)}) with "
                      "LAYERWISE"),
    Refusal("powersgd_with_fp16", SETTINGS,
            lambda f: f.mode.family == "powersgd" and f.t.precision == "fp16",
            lambda f: f"GRAD_COMM={f.o.grad_comm} with PRECISION=fp16: an overflowed step's inf "
                      "would stay in PowerSGD's error feedback for good: use PRECISION=bf16 or "
                      "fp32"),
    Refusal("powersgd_before_warmup_end", SETTINGS,
            lambda f: f.mode.family == "powersgd" and f.o.powersgd_start is not None
            and f.o.powersgd_start < max(2, f.warmup_end),
            lambda f: f"POWERSGD_START={f.o.powersgd_start} is before the end of the LR warm-up "
                      f"(step {max(2, f.warmup_end)}; and PowerSGD's error feedback needs 2 plain "
                      f"steps): compress from step {max(2, f.warmup_end)} or later (unset: from "
                      "there)"),
    Refusal("localsgd_period_beyond_run", SETTINGS,
            lambda f: f.mode.family == "localsgd"
            and f.o.localsgd_period >= f.o.max_steps - f.comm_start,
            lambda f: f"LOCALSGD_PERIOD={f.o.localsgd_period}: the ranks step alone for the last "
                      f"{f.o.max_steps - f.comm_start} of MAX_STEPS={f.o.max_steps} steps (from "
                      "LOCALSGD_START, or the end of the LR warm-up), too few for this period: "
                      "their parameters would be averaged after the first of those steps and "
                      f"never again (LOCALSGD_PERIOD below {f.o.max_steps - f.comm_start})"),
    Refusal("global_batch_without_rcp", DATA,
            lambda f: f.bert.is_mlperf_large and f.rcp_problem is not None,
            lambda f: f.rcp_problem),
    Refusal("warmup_past_max_steps", SETTINGS,
            lambda f: f.warmup_end >= f.o.max_steps,
            lambda f: f"the LR warm-up (WARMUP_STEPS={f.o.warmup_steps:g}, START_WARMUP_STEP="
                      f"{f.o.start_warmup_step:g}, WARMUP_PROPORTION={f.o.warmup_proportion:g}) "
                      f"ends at step {f.warmup_end}, not before MAX_STEPS={f.o.max_steps}: the LR "
                      f"would never reach its peak, LR={f.o.lr:g}"),
    Refusal("powersgd_rank_compresses_nothing", DATA,
            lambda f: f.mode.family == "powersgd"
            and f.o.powersgd_rank > f.compressing_rank,
            lambda f: f"POWERSGD_RANK={f.o.powersgd_rank}: PowerSGD sends a gradient as P and Q "
                      f"only where they are {comm.MIN_COMPRESSION_RATE}x smaller than it, and "
                      f"none of BERT_CONFIG {f.cfg.model.bert_config}'s is at this rank: every "
                      f"gradient would go whole (POWERSGD_RANK at most {f.compressing_rank})"),
    Refusal("layerwise_stages_outlast_run", DATA,  # the last stage begins the step after them
            lambda f: f.cfg.layerwise.layerwise is not None
            and sum(samples for _, samples, _ in f.stages[:-1])
            > (f.o.max_steps - 1) * f.global_batch,
            lambda f: f"LAYERWISE={f.cfg.layerwise.layerwise!r}: the stages before the last take "
                      f"{sum(samples for _, samples, _ in f.stages[:-1])} samples, but "
                      f"MAX_STEPS={f.o.max_steps} steps of {f.global_batch} end the run before "
                      "the last stage, the whole model, trains a step (at most "
                      f"{(f.o.max_steps - 1) * f.global_batch} samples before it)"),
    Refusal("layerwise_last_not_whole_model", DATA,
            lambda f: f.cfg.layerwise.layerwise is not None
            and f.stages[-1][0] != f.bert.num_hidden_layers,
            lambda f: f"LAYERWISE={f.cfg.layerwise.layerwise!r}: the last stage must be the "
                      f"whole model, BERT_CONFIG {f.cfg.model.bert_config}'s "
                      f"{f.bert.num_hidden_layers} layers, not {f.stages[-1][0]}"),
    Refusal("fp8_without_torchao", MACHINE,
            lambda f: f.t.fp8 != "0" and not f.torchao,
            lambda f: f"FP8={f.t.fp8} trains with torchao's float8 training, which is not "
                      f"installed here ({_torchao_hint()}; or make setup)"),
    Refusal("tensorboard_without_package", MACHINE,
            lambda f: f.t.tensorboard and not f.tensorboard,
            lambda f: "TENSORBOARD=1 writes through torch.utils.tensorboard, which needs the "
                      "tensorboard package, and it is not installed here (pip install "
                      "'bertperf[tensorboard]', or pip install tensorboard)"),
    Refusal("fp8_without_fp8_gpu", MACHINE,  # a rank without a GPU: rank_without_gpu says it
            lambda f: f.t.fp8 == "1" and not (f.on_gpu and f.cfg.dist.local_rank >= f.gpus)
            and f.fp8_problem is not None,
            lambda f: f.fp8_problem),
    Refusal("fused_kernels_on_cpu", SETTINGS,
            lambda f: f.t.fused_kernels and f.t.device == "cpu",
            lambda f: "FUSED_KERNELS=1 runs Triton kernels on CUDA tensors: not with DEVICE=cpu "
                      "(FUSED_KERNELS=auto or 0)"),
    Refusal("fused_kernels_without_triton", MACHINE,
            lambda f: f.t.fused_kernels and not f.triton,
            lambda f: "FUSED_KERNELS=1 needs Triton (pip install triton; torch's CUDA wheels "
                      "bring the version they need), and it is not installed here"),
    Refusal("cuda_without_device", MACHINE,
            lambda f: f.wants_cuda is not None and not f.cuda,
            lambda f: f"{f.wants_cuda} needs a CUDA device, and torch {torch.__version__} "
                      f"({_cuda_build()}) sees none here (DEVICE=cpu or auto runs on the CPU)"),
    Refusal("rank_without_gpu", MACHINE,
            lambda f: f.wants_cuda is not None and f.cuda and f.cfg.dist.local_rank >= f.gpus,
            lambda f: f"{f.wants_cuda}: local rank {f.cfg.dist.local_rank} has no GPU of its "
                      f"own (this node has {f.gpus}; DGXNGPU ranks per node at most)"),
)
"""Every combination refused, in the order they are checked."""

EVERY = (SETTINGS, DATA, MACHINE)


def refusal(facts: Facts, reads: tuple[str, ...] = EVERY) -> Refusal | None:
    """The first row of REFUSED reading only `reads` that fires for `facts`, or None."""
    return next((row for row in REFUSED if row.reads in reads and row.when(facts)), None)


def check(cfg: RunConfig, reads: tuple[str, ...] = EVERY) -> None:
    """A one-line UserError for the first row of REFUSED (of those reading `reads`) that fires
    for `cfg`, its layout resolved (train.layout.resolve)."""
    facts = Facts(cfg)
    if (row := refusal(facts, reads)) is not None:
        raise UserError(row.why(facts))
