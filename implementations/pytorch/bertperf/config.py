"""The trainer's configuration: typed dataclasses, filled from environment variables (the names of
NVIDIA's `run_and_time.sh` where it has one) and then from command-line flags.

This is the only module of bertperf that reads environment variables. Every tunable field is a
`setting`: its variable's name, parser, help text, the values it takes and whether it shapes
the loss curve live in its metadata; its flag is the field name with dashes (`batch_size` ->
`--batch-size`). Defaults are run_and_time.sh's; BATCHSIZE, LR and MAX_STEPS have none there and
are required here too. Combinations of settings are checked in bertperf.train.allowed."""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from bertperf.benchmark import CLOSED, DIVISIONS, TARGET_ACCURACY
from bertperf.errors import UserError

PRECISIONS = ("fp32", "bf16", "fp16")
LAYOUTS = ("varlen", "packed", "stratified")
COMPILE_BACKENDS = ("none", "inductor", "aot_eager", "eager")
LOADER_SPLITS = ("global_batch", "shards")
VERIFY_MODES = ("md5", "size", "none")
DEVICES = ("auto", "cuda", "cpu")
GRAD_COMMS = ("allreduce", "bf16", "fp16", "powersgd", "powersgd_bf16", "localsgd")
_MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def process_environment() -> Mapping[str, str]:
    """The process's environment variables (every reader in bertperf goes through this module)."""
    return os.environ


def mpi_world_size(environ: Mapping[str, str] | None = None) -> int:
    """Ranks started by mpirun (OpenMPI or a PMI launcher), 1 when not under MPI. Used by the
    data-preparation stages, which spread files over ranks with mpi4py."""
    environ = os.environ if environ is None else environ
    for var in _MPI_SIZE_VARS:
        if var in environ:
            return _parse(environ, var, int)
    return 1


def vocab_override(environ: Mapping[str, str] | None = None) -> str | None:
    """$BERTPERF_VOCAB: a vocab file to use instead of the PyPI package's (bertperf.resources)."""
    environ = os.environ if environ is None else environ
    return environ.get("BERTPERF_VOCAB") or None


def yes_no(text: str) -> bool:
    """A yes/no variable: 1/true/yes/on or 0/false/no/off."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


yes_no.what = "yes/no value (1/0, true/false, yes/no, on/off)"


def auto_yes_no(text: str) -> bool | None:
    """"auto" (None: the trainer decides) or a yes/no value."""
    return None if text.strip().lower() == "auto" else yes_no(text)


auto_yes_no.what = "auto or yes/no value (1/0, true/false, yes/no, on/off)"


def fp8_mode(text: str) -> str:
    """FP8's value: "1" or "0" (any yes/no spelling), or "emulate"."""
    value = text.strip().lower()
    if value == "emulate":
        return value
    return "1" if yes_no(value) else "0"


fp8_mode.what = "yes/no value (1/0, true/false, yes/no, on/off) or emulate"


def setting(env: str, conv: Callable[[str], Any], default: Any = None, *, doc: str,
            curve: bool = False, choices: tuple[str, ...] | None = None) -> Any:
    """A field set by the variable `env` (and its flag), parsed by `conv`. `doc` is its help
    text (`train --help`); `curve`: the value shapes the loss curve, so a run resuming a
    checkpoint must have the checkpoint's value (`fingerprint`); `choices`: the values it takes
    (`validate`)."""
    return field(default=default, metadata={"env": env, "conv": conv, "doc": doc,
                                            "curve": curve, "choices": choices})


def default_text(value: Any) -> str | None:
    """A setting's value (or default) as its variable would be written (None: none to
    write)."""
    if value is None or value is MISSING:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def doc(f: Any) -> str:
    """A field's help text, whitespace folded."""
    return " ".join(f.metadata.get("doc", "").split())


def reference_eval_interval(global_batch_size: int) -> int:
    """MLPerf's eval cadence: floor(0.05 * (230.23 * GBS + 3e6) / 25000) * 25000 samples."""
    return int(math.floor(0.05 * (230.23 * global_batch_size + 3_000_000) / 25_000) * 25_000)


@dataclass(frozen=True)
class ModelConfig:
    bert_config: str = setting("BERT_CONFIG", str, "large", doc="""
        A named model shape ("large": the MLPerf checkpoint's sizes; "base"; "tiny": 2 layers of
        128, for tests and the demo; bertperf.model.bert_config.NAMED) or the path of a
        bert_config.json.""")
    init_checkpoint: Path | None = setting("INIT_CHECKPOINT", Path, doc="""
        Weights to start from: MLPerf's TF1 checkpoint model.ckpt-28252 (its prefix or any of
        its files; read without TensorFlow), a `convert-ckpt` output (.pt), NVIDIA's converted
        model.ckpt-28252.pt or a HuggingFace model folder (an `export` output, a copy of
        bert-large-uncased); unset = random init (seeded by SEED).""")
    init_eval: bool = setting("INIT_EVAL", yes_no, True, doc="""
        With INIT_CHECKPOINT: evaluate right after loading it (during init, not logged as an
        MLPerf eval) and warn when a BERT-large checkpoint is far from the reference's 0.34085.""")


@dataclass(frozen=True)
class DataConfig:
    train_dir: Path | None = setting("DATADIR_PHASE2", Path, doc="""
        Folder of training shards: unpadded (`prep unpad`, `prep chop`), packed (`prep pack`) or
        length-stratified (a `prep stratify` output: its bin folders and stratify.json).""")
    layout: str | None = setting("LAYOUT", str, curve=True, choices=LAYOUTS, doc="""
        How the trainer batches them: "varlen" (unpadded shards: BATCHSIZE sequences of their
        own lengths per micro-batch) or "packed" (packed shards: BATCHSIZE rows of
        max_seq_length tokens holding up to 3 sequences each; every tensor of the step keeps one
        shape for the whole run) or "stratified" (a `prep stratify` output, batched as varlen:
        every rank's micro-batch draws the same number of samples from each length bin, in
        proportion to the bins' sizes; bertperf.data.order.StratifiedPlan); default: what
        DATADIR_PHASE2 holds.""")
    masked_lm_prob: float = setting("MASKED_LM_PROB", float, 0.15, doc="""
        LAYOUT=packed: the masking rate the data was made with (`prep create --masked_lm_prob`);
        it bounds the masked tokens a row can hold (78 for MLPerf's 512-token rows), the fixed
        number of masked-token slots per row. A row with more stops the run with an error naming
        it.""")
    packing_factor: float = setting("PACKING_FACTOR", float, 2.0, doc="""
        LAYOUT=packed: sequences per row as the logged global_batch_size counts them (rows per
        step x this; MLPerf's eval cadence and RCP row follow it), NVIDIA's average packing rate
        (MLPerf's packed data holds 1.999 per row). Samples (samples_count, train_samples) are
        the sequences actually trained.""")
    eval_file: Path | None = setting("EVAL_FILE", Path, doc="""
        The eval HDF5 file: padded (`prep eval`'s `eval_10k.hdf5`) or NVIDIA's variable-length
        one (`eval_varlength/part_eval_10k.hdf5`); every sample of it is evaluated.""")
    prefetch: int = setting("PREFETCH", int, 2, doc="""
        Training micro-batches built ahead on the loader's thread (0 = none).""")
    verify: str = setting("DATA_VERIFY", str, "md5", choices=VERIFY_MODES, doc="""
        Check the shards and the eval file against their folders' MANIFEST.json before training
        (bertperf.train.preflight): "md5" (sizes, and md5s spread over the ranks), "size" or
        "none".""")
    loader_split: str = setting("LOADER_SPLIT", str, "global_batch", curve=True,
                                choices=LOADER_SPLITS, doc="""
        How ranks share the epoch (bertperf.data.order): "global_batch" (default): each global
        batch of WORLD_SIZE*BATCHSIZE consecutive samples of the one epoch stream is cut into
        per-rank parts, so the run's batches, and so its result, do not depend on the number of
        ranks; "shards": each rank reads its own contiguous slice of the stream (fewer shards
        per rank).""")
    balance: bool = setting("BALANCE", yes_no, False, curve=True, doc="""
        Place each global batch's samples (rows, when packed) on the ranks so that every rank
        gets nearly the same tokens and sum of squared lengths (bertperf.data.balance; each rank
        still BATCHSIZE of them, every rank reading the shards of the samples placed on it). The
        global batches, and so the gradients, are unchanged: only which rank trains which
        sample. Off is the MLPerf reference's behaviour.""")


@dataclass(frozen=True)
class OptimConfig:
    lr: float | None = setting("LR", float, curve=True, doc="""
        Base learning rate of LAMB (required; > 0; above 1 draws a warning, as such a run
        diverges).""")
    max_steps: int | None = setting("MAX_STEPS", int, curve=True, doc="""
        Optimizer steps of the LR schedule; the run aborts after this many (required).""")
    warmup_steps: float = setting("WARMUP_STEPS", float, 0.0, curve=True, doc="""
        Linear warm-up, in optimizer steps (a whole number; it must end before MAX_STEPS); 0
        means int(MAX_STEPS * WARMUP_PROPORTION) from step 0.""")
    warmup_proportion: float = setting("WARMUP_PROPORTION", float, 0.0, curve=True, doc="""
        Warm-up as a fraction of MAX_STEPS, used only when WARMUP_STEPS is 0.""")
    start_warmup_step: float = setting("START_WARMUP_STEP", float, 0.0, curve=True, doc="""
        Optimizer step at which warm-up starts (NVIDIA's offset semantics; usually <= 0).""")
    beta1: float = setting("OPT_LAMB_BETA_1", float, 0.9, curve=True, doc="""
        LAMB's first-moment decay, in [0, 1).""")
    beta2: float = setting("OPT_LAMB_BETA_2", float, 0.999, curve=True, doc="""
        LAMB's second-moment decay, in [0, 1).""")
    weight_decay: float = setting("WEIGHT_DECAY_RATE", float, 0.01, curve=True, doc="""
        Decoupled weight decay of the decayed group (not biases and LayerNorm), >= 0.""")
    epsilon: float = setting("EPSILON", float, 1e-6, curve=True, doc="""
        LAMB's epsilon, > 0.""")
    max_grad_norm: float = setting("MAX_GRAD_NORM", float, 1.0, curve=True, doc="""
        Global gradient-norm clip before each step (0 = no clipping).""")
    clip_before_allreduce: bool = setting("CLIP_BEFORE_ALLREDUCE", yes_no, False, curve=True, doc="""
        1: with several ranks, each rank clips its own (accumulated) gradient bucket by bucket
        in a DDP communication hook, to MAX_GRAD_NORM * sqrt(bucket size / model size), and
        starts the bucket's all-reduce at once, overlapping backward
        (bertperf.optim.bucket_clip); the step then skips non-finite steps without clipping
        again. 0 (default): the global norm of the all-reduced gradient is clipped before the
        step. A single process clips the global norm either way.""")
    init_loss_scale: float = setting("INIT_LOSS_SCALE", float, 2.0 ** 20, doc="""
        fp16 only: the dynamic loss scale's initial value.""")
    flat_lamb: bool | None = setting("FLAT_LAMB", auto_yes_no, doc="""
        1: LAMB over one flat fp32 buffer of all parameters, gradients and moments (FlatLamb:
        three Triton launches a step on CUDA, plain PyTorch elsewhere; clipping on the one
        gradient buffer); 0: LAMB with foreach ops over the parameters (Lamb); auto (default): 1
        on CUDA with Triton installed, else 0. The same LAMB either way, and checkpoints of one
        resume with the other.""")
    sharded_lamb: bool = setting("SHARDED_LAMB", yes_no, False, doc="""
        1: shard LAMB's state and update over the ranks (ZeRO-1, bertperf.optim.ShardedLamb over
        FlatLamb's buffer: gradients reduce-scattered instead of DDP's all-reduce, each rank
        keeping the moments of 1/WORLD_SIZE of the parameters and updating those, weights all-
        gathered; trust ratios still per whole tensor). 0 (default): every rank holds and steps
        the whole optimizer, as MLPerf's reference. The same training within rounding;
        checkpoints hold whole tensors either way and resume with either setting.""")
    grad_comm: str = setting("GRAD_COMM", str, "allreduce", curve=True, choices=GRAD_COMMS,
                             doc="""
        How gradients cross the network between ranks (bertperf.train.comm; allreduce, bf16
        and fp16 in either division, the others open division only, for slow networks):
        "allreduce" (default: DDP's fp32 all-reduce), "bf16" / "fp16" (each gradient bucket
        all-reduced in that type, a format MLPerf's closed division pre-approves: half the
        bytes), "powersgd" / "powersgd_bf16" (rank-POWERSGD_RANK PowerSGD with error feedback
        from POWERSGD_START; _bf16: its matrices in bf16), "localsgd" (post-local SGD: from
        LOCALSGD_START each node steps on its own gradient, the parameters averaged over all
        ranks every LOCALSGD_PERIOD steps; LAMB's moments stay each rank's own). No effect with
        one rank.""")
    powersgd_rank: int = setting("POWERSGD_RANK", int, 4, curve=True, doc="""
        GRAD_COMM=powersgd*: the rank of PowerSGD's approximation of each weight gradient
        (1-4 typical; higher sends more and approximates better; one at which no gradient of
        the model is sent compressed is refused).""")
    powersgd_start: int | None = setting("POWERSGD_START", int, curve=True, doc="""
        GRAD_COMM=powersgd*: the optimizer step from which gradients are compressed (plain
        all-reduce before); unset: the end of the LR warm-up (at least 2); an earlier step is
        refused.""")
    localsgd_period: int = setting("LOCALSGD_PERIOD", int, 8, curve=True, doc="""
        GRAD_COMM=localsgd: steps between two averagings of the parameters over all ranks
        (below the steps from LOCALSGD_START to MAX_STEPS).""")
    localsgd_start: int | None = setting("LOCALSGD_START", int, curve=True, doc="""
        GRAD_COMM=localsgd: the optimizer step from which nodes step alone (DDP's all-reduce
        before); unset: the end of the LR warm-up.""")


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int | None = setting("BATCHSIZE", int, curve=True, doc="""
        Sequences (LAYOUT=packed: rows) per micro-batch per rank (required).""")
    gradient_steps: int = setting("GRADIENT_STEPS", int, 1, curve=True, doc="""
        Micro-batches accumulated into one optimizer step.""")
    eval_batch_size: int = setting("EVAL_BATCHSIZE", int, 128, doc="""
        Sequences per eval batch per rank.""")
    eval_iter_start_samples: int | None = setting("EVAL_ITER_START_SAMPLES", int, doc="""
        Samples trained before the first eval; default EVAL_ITER_SAMPLES.""")
    eval_iter_samples: int | None = setting("EVAL_ITER_SAMPLES", int, doc="""
        Samples between evals; default MLPerf's formula of the global batch
        (reference_eval_interval).""")
    max_samples_termination: int = setting("MAX_SAMPLES_TERMINATION", int, 14_000_000, doc="""
        The run aborts once this many samples (sequences) are trained without reaching the
        target.""")
    target_accuracy: float = setting("TARGET_MLM_ACCURACY", float, TARGET_ACCURACY, doc="""
        Masked-LM accuracy at which the run stops with status success.""")
    seed: int = setting("SEED", int, 0, curve=True, doc="""
        Seed of model init, dropout and data order: 0 to 2**32 - 1 (what numpy's and torch's
        generators both take).""")
    precision: str = setting("PRECISION", str, "fp32", curve=True, choices=PRECISIONS, doc="""
        fp32, bf16 (autocast) or fp16 (autocast + dynamic loss scaling). Meant for GPUs: on a
        CPU without bf16/fp16 matmul instructions they are emulated, many times slower than
        fp32: the trainer then warns with the matmul slowdown it measures (docs/performance.md).""")
    device: str = setting("DEVICE", str, "auto", choices=DEVICES, doc="""
        cuda, cpu or auto (cuda:LOCAL_RANK when CUDA is available).""")
    log_every: int = setting("LOG_FREQ", int, 10, doc="""
        A progress line every this many optimizer steps (0 = none); the losses, kept on the
        device meanwhile, are read then and at evals.""")
    fused_kernels: bool | None = setting("FUSED_KERNELS", auto_yes_no, doc="""
        Whether the model and FlatLamb run bertperf.kernels' fused Triton kernels: auto
        (default) and 1 where they can (CUDA tensors, Triton installed; 1 refuses a machine
        where they cannot), 0 plain PyTorch everywhere (the baseline `bench train` compares
        with). The same numerics within rounding either way.""")
    compile: str = setting("COMPILE", str, "none", choices=COMPILE_BACKENDS, doc="""
        LAYOUT=packed: torch.compile the micro-step (forward, loss, backward) with this backend:
        none, inductor, or aot_eager / eager (no code generation; tests).""")
    use_cuda_graph: bool = setting("USE_CUDA_GRAPH", yes_no, False, doc="""
        LAYOUT=packed, CUDA only: replay the micro-step as CUDA graphs (torch.compile
        mode="reduce-overhead"; with COMPILE=none, inductor).""")
    fp8: str = setting("FP8", fp8_mode, "0", curve=True, doc="""
        1: the encoder's linear layers (qkv, attention output, intermediate, output: 4 a layer)
        train in FP8 with torchao's float8 training, "tensorwise" recipe: dynamic per-tensor
        scales, E4M3 inputs and weights, E5M2 output gradients (bertperf.model.fp8). Needs
        PRECISION=bf16 and a GPU of sm_89 or newer (Ada, Hopper); embeddings, heads, LayerNorm,
        attention, the optimizer and checkpoints (fp32) stay as they are. 0 (default): off.
        emulate: the same casts and scales emulated in high precision on any device (tests).""")
    output_dir: Path = setting("LOGDIR", Path, Path("results"), doc="""
        Folder for the MLPerf log.""")
    log_file: Path | None = setting("MLLOG_FILE", Path, doc="""
        The MLPerf log; default output_dir/result_0.txt.""")
    submission_org: str = setting("SUBMISSION_ORG", str, "bertperf", doc="""
        submission_org of the MLPerf log.""")
    submission_platform: str = setting("SUBMISSION_PLATFORM", str, "unknown", doc="""
        submission_platform of the MLPerf log.""")
    submission_division: str = setting("SUBMISSION_DIVISION", str, CLOSED, choices=DIVISIONS,
                                       doc="""
        closed (the benchmark as defined: target 0.720) or open (anything else, e.g. the demo's
        tiny BERT and its own target; the open-division rules have no accuracy target).""")
    cache_clear: bool = setting("CACHE_CLEAR", yes_no, False, doc="""
        Whether the launcher dropped the page cache before this run (run.sub / run_and_time.sh
        set it); logged as MLPerf's cache_clear.""")
    plot: bool = setting("PLOT", yes_no, False, doc="""
        At the end of the run, draw loss and accuracy curves into <MLPerf log>.png (`python -m
        bertperf plot` draws them from any log).""")
    tensorboard: bool = setting("TENSORBOARD", yes_no, False, doc="""
        Rank 0 writes the run's scalars (train loss, LR, sequences and tokens a second, eval
        accuracy; by optimizer step) as TensorBoard event files into TENSORBOARD_DIR (the
        `tensorboard` extra: pip install 'bertperf[tensorboard]'). A resumed run goes on along
        the same curves: what an earlier run logged after its checkpoint is hidden, its files
        kept.""")
    tensorboard_dir: Path | None = setting("TENSORBOARD_DIR", Path, doc="""
        TENSORBOARD=1's folder; default <MLPerf log>.tensorboard (`tensorboard --logdir LOGDIR`
        shows each log's run).""")


# ---- checkpoints (bertperf.train.checkpoint) ---------------------------------------------------

@dataclass(frozen=True)
class CheckpointConfig:
    """Saving and resuming bertperf's own checkpoints (model, optimizer, schedule, loss scale,
    loader position, RNG states, step/sample/eval counters). A resumed run writes a new MLPerf log
    (its own init and run_start); what carries over is the training state, so the loss curve
    continues exactly where the checkpoint left it."""

    checkpoint_dir: Path | None = setting("CHECKPOINT_DIR", Path, doc="""
        Folder for checkpoints (ckpt_<step>.pt, written by rank 0 atomically); unset = none
        saved.""")
    checkpoint_every: int = setting("CHECKPOINT_EVERY", int, 0, doc="""
        Save every this many optimizer steps, and at the end of a run stopped by MAX_STEPS or
        MAX_SAMPLES_TERMINATION or by reaching its target (after run_stop; 0 = only at the end).
        Needs CHECKPOINT_DIR.""")
    resume_from: str | None = setting("RESUME_FROM", str, doc="""
        A checkpoint file to resume from, or "auto": the latest in CHECKPOINT_DIR (a fresh start
        when there is none). The run's configuration must match the checkpoint's.""")
    preempt_check_every: int = setting("PREEMPT_CHECK_EVERY", int, 10, doc="""
        With CHECKPOINT_DIR: steps between the ranks' agreement on whether the preemption
        warning (SIGUSR1: Slurm's --signal before the time limit or a preemption, which run.sub
        asks for) has come. At the first agreement after it every rank saves a checkpoint at
        that step, the MLPerf log ends with run_stop aborted ("preempted, checkpoint at step
        N") and the trainer exits with status 75, on which run.sub requeues the job (resuming
        with RESUME_FROM=auto). One all-reduce and one host sync every this many steps (none
        with one rank); 0 = the warning is ignored.""")
    checkpoint_grace: float = setting("CHECKPOINT_GRACE", float, 0.0, doc="""
        With PREEMPT_CHECK_EVERY: seconds a SIGTERM with no warning before it leaves the run
        before it is killed (Slurm's KillWait after a time limit or a preemption, 30 by
        default). Where the steps to the next agreement and a checkpoint, at this run's measured
        step and checkpoint times, fit in them, the SIGTERM is taken as the warning; else (no
        checkpoint written yet to time, or 0, the default) it ends the run as a failure.""")


# ---- end of checkpoints ----------------------------------------------------------------------


# ---- layerwise training (bertperf.train.layerwise) ----------------------------------------------

LAYERWISE_TRAIN = ("all", "new")
LAYERWISE_INIT = ("copy", "fresh")
LAYERWISE_OPTIMIZER = ("reset", "copy")
LAYERWISE_SCHEDULE = ("continue", "restart")
LAYERWISE_EMBEDDINGS = ("frozen", "trained")


@dataclass(frozen=True)
class LayerwiseConfig:
    """Training the encoder in stages of growing depth (open division only): progressive stacking
    (every layer trains) or multi-stage layerwise training, MSLT (only a stage's new top layers
    train; the layers below run forward only). Unset: the whole model from the first step."""

    layerwise: str | None = setting("LAYERWISE", str, curve=True, doc="""
        The stages, comma-separated: LAYERS:SAMPLES (this many encoder layers for this many
        samples), the last one LAYERS alone (it runs to the end of the run and must be the whole
        model, BERT_CONFIG's num_hidden_layers); layer counts grow from stage to stage. A stage
        may end in :all or :new to override LAYERWISE_TRAIN for itself, e.g.
        "3:50000,6:70000,12" (progressive stacking 3 -> 6 -> 12) or
        "4:20000,8:20000,12:40000,12:all" (MSLT, then the whole model). A stage begins at the
        first step after the samples of the earlier ones are trained; the last must begin within
        MAX_STEPS. Needs SUBMISSION_DIVISION=open.""")
    layerwise_train: str = setting("LAYERWISE_TRAIN", str, "all", curve=True,
                                   choices=LAYERWISE_TRAIN, doc="""
        Which parameters a stage after the first trains: "all" (progressive stacking) or "new"
        (MSLT: only the layers the stage adds, the pooler and the heads, and the word embeddings
        as LAYERWISE_EMBEDDINGS says; the layers below are frozen: requires_grad off, run
        forward under no_grad, in no optimizer or gradient reduction). The first stage trains
        everything.""")
    layerwise_init: str = setting("LAYERWISE_INIT", str, "copy", curve=True,
                                  choices=LAYERWISE_INIT, doc="""
        A stage's new layers: "copy" of the top trained layers (layer j of the new ones takes
        the weights of layer L-k+(j mod k), L the old depth, k = min(L, layers added): 3 -> 6
        stacks layers 0-2 on themselves) or "fresh" (BERT's random init, drawn with the whole
        model at the start).""")
    layerwise_optimizer: str = setting("LAYERWISE_OPTIMIZER", str, "reset", curve=True,
                                       choices=LAYERWISE_OPTIMIZER, doc="""
        LAMB at a stage boundary: "reset" (moments and step count from zero) or "copy" (a
        parameter that trained before keeps its moments, a copied layer takes its source's, the
        step count goes on; the rest start at zero).""")
    layerwise_schedule: str = setting("LAYERWISE_SCHEDULE", str, "continue", curve=True,
                                      choices=LAYERWISE_SCHEDULE, doc="""
        The LR schedule at a stage boundary: "continue" (the one schedule over MAX_STEPS goes on)
        or "restart" (warm-up again from the boundary, then the decay over the steps left to
        MAX_STEPS).""")
    layerwise_embeddings: str = setting("LAYERWISE_EMBEDDINGS", str, "trained", curve=True,
                                        choices=LAYERWISE_EMBEDDINGS, doc="""
        The embeddings in a stage that trains only new layers (LAYERWISE_TRAIN=new): "trained"
        (default: the word embeddings, and with them the MLM decoder's tied output projection,
        train from the MLM head's gradient alone: no backward runs through the frozen layers;
        the position and segment embeddings and their LayerNorm stay frozen) or "frozen" (with
        the layers below, the word embeddings and the tied projection too: the literal reading
        of MSLT's "the parameters of the other layers"). docs/performance.md measures both.""")


def layerwise_stages(text: str) -> list[tuple[int, int | None, str | None]]:
    """LAYERWISE parsed: [(layers, samples or None for the last stage, "all"/"new" or None)];
    a one-line UserError for what does not parse."""
    stages = []
    items = [item.strip() for item in text.split(",")]
    for i, item in enumerate(items):
        fields_ = item.split(":")
        mode = fields_.pop().strip() if fields_[-1].strip() in LAYERWISE_TRAIN else None
        last = i == len(items) - 1
        try:
            numbers = [int(x) for x in fields_]
        except ValueError:
            numbers = []
        if len(numbers) != (1 if last else 2):
            want = "LAYERS[:all|new]" if last else "LAYERS:SAMPLES[:all|new]"
            raise UserError(f"LAYERWISE={text!r}: stage {i + 1} {item!r} is not {want} (whole "
                            "numbers; the last stage has no SAMPLES: it runs to the end)")
        layers, samples = numbers[0], (None if last else numbers[1])
        if layers < 1 or (samples is not None and samples < 1):
            raise UserError(f"LAYERWISE={text!r}: stage {i + 1} {item!r} needs at least 1 layer "
                            "and 1 sample")
        if stages and layers < stages[-1][0]:
            raise UserError(f"LAYERWISE={text!r}: stage {i + 1} has fewer layers ({layers}) than "
                            f"the one before ({stages[-1][0]}); stages only add layers")
        stages.append((layers, samples, mode))
    return stages


# ---- end of layerwise training ------------------------------------------------------------------


@dataclass(frozen=True)
class DistConfig:
    """Where this process sits in the job: from torchrun (RANK/WORLD_SIZE/LOCAL_RANK), OpenMPI
    (OMPI_COMM_WORLD_*) or a Slurm job step (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID with
    SLURM_STEP_ID), in that order: the innermost launcher wins (torchrun under srun or mpirun,
    mpirun inside a Slurm job). run_and_time.sh asks this same reader."""

    rank: int = field(default=0, metadata={"doc": """
        Global rank of this process."""})
    world_size: int = field(default=1, metadata={"doc": """
        Number of processes.""", "curve": True, "name": "WORLD_SIZE"})
    local_rank: int = field(default=0, metadata={"doc": """
        Rank on this node (picks the GPU)."""})
    master_addr: str = setting("MASTER_ADDR", str, "127.0.0.1", doc="""
        Host of rank 0's rendezvous store (run.sub: the allocation's first node).""")
    master_port: int = setting("MASTER_PORT", int, 29500, doc="""
        TCP port of that store, 1-65535.""")
    dist_timeout: float = setting("DIST_TIMEOUT", float, 1800.0, doc="""
        Seconds a collective may wait for the other ranks before the job fails, naming the ranks
        gone silent.""")
    launcher_store: bool = field(default=False, metadata={"doc": """
        True under torchrun (TORCHELASTIC_RUN_ID set): its agent already serves the rendezvous
        store on MASTER_ADDR:MASTER_PORT, so the group joins it with env:// instead of opening
        its own tcp:// store there (which would clash on that port and hang)."""})

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> DistConfig:
        # (rank, size, local rank, variables that must be there too). Slurm's describe a task only
        # inside a step (srun): a batch script has SLURM_PROCID=0 and the job's SLURM_NTASKS.
        for rank, size, local, *needs in (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                                          ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                           "OMPI_COMM_WORLD_LOCAL_RANK"),
                                          ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                           "SLURM_STEP_ID")):
            if all(var in environ for var in (rank, size, *needs)):
                got = {"rank": _parse(environ, rank, int), "world_size": _parse(environ, size, int),
                       "local_rank": _parse(environ, local, int) if local in environ else 0}
                break
        else:
            got = {}
        got.update(_read_section(cls, environ))
        got["launcher_store"] = bool(environ.get("TORCHELASTIC_RUN_ID"))
        out = cls(**got)
        if not 0 <= out.rank < out.world_size:
            raise UserError(f"rank {out.rank} outside 0..{out.world_size - 1} (from the launcher's "
                            "environment)")
        if not 1 <= out.master_port <= 65535:
            raise UserError(f"MASTER_PORT must be a TCP port, 1-65535, got {out.master_port}")
        if not (math.isfinite(out.dist_timeout) and out.dist_timeout > 0):
            raise UserError(f"DIST_TIMEOUT must be a number of seconds > 0, got {out.dist_timeout}")
        return out


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"doc": """
        Which BERT."""})
    data: DataConfig = field(default_factory=DataConfig, metadata={"doc": """
        Where the samples are."""})
    optim: OptimConfig = field(default_factory=OptimConfig, metadata={"doc": """
        LAMB and its schedule."""})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"doc": """
        Batching, evaluation, stopping, logging."""})
    dist: DistConfig = field(default_factory=DistConfig, metadata={"doc": """
        This process's place in the job: its rank, world size and local rank come from the
        launcher's variables (torchrun, OpenMPI, a Slurm step); these say where the ranks meet."""})
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig, metadata={"doc": """
        Checkpoint saving and resuming (bertperf.train.checkpoint)."""})
    layerwise: LayerwiseConfig = field(default_factory=LayerwiseConfig, metadata={"doc": """
        Layerwise training: the encoder grown in stages (bertperf.train.layerwise)."""})

    @property
    def rows_per_step(self) -> int:
        """Sequences (LAYOUT=packed: rows) per optimizer step over all ranks."""
        return self.train.batch_size * self.train.gradient_steps * self.dist.world_size

    def eval_interval(self, global_batch_size: int) -> int:
        """Samples between evals: EVAL_ITER_SAMPLES, or MLPerf's formula of the global batch
        (as MLPerf counts it: train.layout.Layout.global_batch_size)."""
        return self.train.eval_iter_samples or reference_eval_interval(global_batch_size)

    def first_eval(self, global_batch_size: int) -> int:
        """Samples trained before the first eval."""
        return self.train.eval_iter_start_samples or self.eval_interval(global_batch_size)

    @property
    def log_path(self) -> Path:
        return self.train.log_file or self.train.output_dir / "result_0.txt"

    @property
    def tensorboard_path(self) -> Path:
        return self.train.tensorboard_dir or Path(f"{self.log_path}.tensorboard")


SECTIONS = ("model", "data", "optim", "train", "checkpoint", "layerwise", "dist")


def section_fields() -> Iterator[tuple[str, Any]]:
    """(section name, dataclass field) of every field of every section."""
    for name in SECTIONS:
        yield from ((name, f) for f in fields(RunConfig.__dataclass_fields__[name].default_factory))


def _curve_fields() -> Iterator[tuple[str, str, Any]]:
    for section, f in section_fields():
        if f.metadata.get("curve"):
            yield f.metadata.get("env") or f.metadata["name"], section, f


def fingerprint(cfg: RunConfig) -> dict[str, Any]:
    """{variable: value} of every setting marked `curve` (a resumed run must share them with
    the checkpoint), values as plain JSON types."""
    out = {}
    for key, section, f in _curve_fields():
        value = getattr(getattr(cfg, section), f.name)
        out[key] = value if isinstance(value, (int, float, str, bool, type(None))) else str(value)
    return out


def fingerprint_defaults() -> dict[str, Any]:
    """{variable: default} of the `curve` settings: the value a checkpoint written before a
    setting existed was trained with."""
    return {key: f.default for key, _, f in _curve_fields()}


def tunables() -> Iterator[tuple[str, Any]]:
    """(section name, dataclass field) of every field set by a variable and a flag (the dist
    section's rank fields come from the launcher's variables only)."""
    for name, f in section_fields():
        if "env" in f.metadata:
            yield name, f


def _parse(environ: Mapping[str, str], key: str, conv: Callable[[str], Any]) -> Any:
    try:
        return conv(environ[key])
    except ValueError:
        what = getattr(conv, "what", conv.__name__)
        raise UserError(f"{key}={environ[key]!r} is not a valid {what}") from None


def _read_section(cls: type, environ: Mapping[str, str]) -> dict[str, Any]:
    """{field: value} of the fields of `cls` whose variable `environ` sets (not empty)."""
    values = {}
    for f in fields(cls):
        env = f.metadata.get("env")
        if env is not None and environ.get(env, "") != "":
            values[f.name] = _parse(environ, env, f.metadata["conv"])
    return values


def checkpoint_settings(environ: Mapping[str, str] | None = None) -> CheckpointConfig:
    """CHECKPOINT_DIR and the other checkpoint settings from the environment alone (`export
    --checkpoint auto`, which needs no run's other settings)."""
    return CheckpointConfig(**_read_section(CheckpointConfig,
                                            os.environ if environ is None else environ))


def load(environ: Mapping[str, str], flags: Mapping[str, str] | None = None) -> RunConfig:
    """The configuration from `environ`, overridden by `flags` ({"section.field": text}), checked."""
    flags = flags or {}
    sections = {}
    for name in SECTIONS:
        cls = RunConfig.__dataclass_fields__[name].default_factory
        given = {f.metadata["env"]: flags[f"{name}.{f.name}"] for section, f in tunables()
                 if section == name and f"{name}.{f.name}" in flags}
        source = {**environ, **given}
        sections[name] = cls.from_env(source) if name == "dist" else \
            cls(**_read_section(cls, source))
    cfg = RunConfig(**sections)
    validate(cfg)
    return cfg


def _check_numbers(cfg: RunConfig) -> None:
    """The numeric settings in their ranges (a NaN fails every test here)."""
    o, t = cfg.optim, cfg.train
    rules = (
        ("LR", o.lr, o.lr > 0 and math.isfinite(o.lr), "> 0 (0 would train nothing)"),
        ("OPT_LAMB_BETA_1", o.beta1, 0 <= o.beta1 < 1, "in [0, 1)"),
        ("OPT_LAMB_BETA_2", o.beta2, 0 <= o.beta2 < 1, "in [0, 1)"),
        ("EPSILON", o.epsilon, 0 < o.epsilon < math.inf, "> 0"),
        ("WEIGHT_DECAY_RATE", o.weight_decay, 0 <= o.weight_decay < math.inf, ">= 0"),
        ("MAX_GRAD_NORM", o.max_grad_norm, 0 <= o.max_grad_norm < math.inf,
         ">= 0 (0: no clipping)"),
        ("WARMUP_STEPS", o.warmup_steps, 0 <= o.warmup_steps < math.inf
         and o.warmup_steps == int(o.warmup_steps), "a whole number of steps >= 0"),
        ("START_WARMUP_STEP", o.start_warmup_step, math.isfinite(o.start_warmup_step)
         and o.start_warmup_step == int(o.start_warmup_step), "a whole number of steps"),
        ("WARMUP_PROPORTION", o.warmup_proportion, 0 <= o.warmup_proportion <= 1, "in [0, 1]"),
        ("INIT_LOSS_SCALE", o.init_loss_scale, 0 < o.init_loss_scale < math.inf, "> 0"),
        ("MAX_SAMPLES_TERMINATION", t.max_samples_termination, t.max_samples_termination >= 1,
         "at least 1 sample"),
        ("EVAL_ITER_SAMPLES", t.eval_iter_samples,
         t.eval_iter_samples is None or t.eval_iter_samples >= 1, "at least 1 sample"),
        ("EVAL_ITER_START_SAMPLES", t.eval_iter_start_samples,
         t.eval_iter_start_samples is None or t.eval_iter_start_samples >= 0, ">= 0 samples"),
        ("LOG_FREQ", t.log_every, t.log_every >= 0, ">= 0 steps (0: no progress lines)"),
        ("PREFETCH", cfg.data.prefetch, cfg.data.prefetch >= 0, ">= 0 batches"),
        ("POWERSGD_RANK", o.powersgd_rank, o.powersgd_rank >= 1, "at least 1"),
        ("LOCALSGD_PERIOD", o.localsgd_period, o.localsgd_period >= 1, "at least 1 step"),
        ("POWERSGD_START", o.powersgd_start, o.powersgd_start is None or o.powersgd_start >= 0,
         ">= 0 steps"),
        ("LOCALSGD_START", o.localsgd_start, o.localsgd_start is None or o.localsgd_start >= 0,
         ">= 0 steps"),
        ("SEED", t.seed, 0 <= t.seed < 2**32,
         "in [0, 2**32 - 1] (what numpy's and torch's generators both take)"),
    )
    for key, value, ok, wanted in rules:
        if not ok:
            raise UserError(f"{key} must be {wanted}, got {value}")


LR_WARN_ABOVE = 1.0
"""LR above this draws a warning (config.warnings): MLPerf's BERT-large recipes use 1e-4 to
4e-3 and the demo's tiny model 0.02; LAMB's step is LR times each tensor's norm, so LR >= 1
changes the weights by more than their own size every step."""


def warnings(cfg: RunConfig) -> list[str]:
    """What a valid configuration still does that a user probably did not mean (printed by
    `train` and `train --check`, which go on)."""
    out = []
    if cfg.optim.lr > LR_WARN_ABOVE:
        out.append(f"LR={cfg.optim.lr:g} is above {LR_WARN_ABOVE:g}: LAMB moves every tensor by "
                   "LR times its own norm a step, so this run will diverge (MLPerf's recipes use "
                   "1e-4 to 4e-3)")
    if cfg.optim.grad_comm != "allreduce" and cfg.dist.world_size == 1:
        out.append(f"GRAD_COMM={cfg.optim.grad_comm} with one rank: no gradient leaves it, so "
                   "the setting has no effect")
    return out


MISSPELLING_CUTOFF = 0.85
"""difflib's similarity ratio from which a variable that is no setting counts as a misspelling of
one (environment_warnings): BATCHSZIE 0.89, GRAD_COMMS 0.95, LAYERWIZE 0.89; the launchers' and
shells' own variables (RANK, WORLD_SIZE, SLURM_*, OMPI_*, OMP_NUM_THREADS, PATH, ...) stay
below 0.7."""


def environment_warnings(environ: Mapping[str, str],
                         flags: Mapping[str, str] | None = None) -> list[str]:
    """What the variables (and flags, as `load` takes them) set that no setting reads: a variable
    named like a setting but none (a misspelling), LAYERWISE's options without LAYERWISE.
    Warnings, not errors: a shell carries other programs' variables and earlier runs' ones."""
    names = sorted(f.metadata["env"] for _, f in tunables())
    out = []
    for var in sorted(environ):
        close = difflib.get_close_matches(var, names, n=1, cutoff=MISSPELLING_CUTOFF)
        if environ[var] != "" and var not in names and close:
            out.append(f"{var} is not a setting; did you mean {close[0]}?")
    given = {f.metadata["env"] for section, f in tunables()
             if environ.get(f.metadata["env"], "") != "" or f"{section}.{f.name}" in (flags or {})}
    options = sorted(given & {f.metadata["env"] for f in fields(LayerwiseConfig)} - {"LAYERWISE"})
    if options and "LAYERWISE" not in given:
        out.append(f"{', '.join(options)} without LAYERWISE: ignored (the whole model trains "
                   "from the first step)")
    return out


def validate(cfg: RunConfig) -> None:
    """One-line UserErrors for what would fail later (or silently do the wrong thing); the
    combinations of settings are train.allowed's."""
    _check_choices(cfg)
    for key, value in (("BATCHSIZE", cfg.train.batch_size), ("LR", cfg.optim.lr),
                       ("MAX_STEPS", cfg.optim.max_steps)):
        if value is None:
            raise UserError(f"{key} is required (environment variable or flag)")
    for key, value in (("BATCHSIZE", cfg.train.batch_size), ("GRADIENT_STEPS", cfg.train.gradient_steps),
                       ("MAX_STEPS", cfg.optim.max_steps), ("EVAL_BATCHSIZE", cfg.train.eval_batch_size)):
        if value < 1:
            raise UserError(f"{key} must be at least 1, got {value}")
    _check_numbers(cfg)
    if why := _path_problem(cfg.data.train_dir, "folder"):
        raise UserError(f"training data folder {cfg.data.train_dir} (DATADIR_PHASE2 / --train-dir)"
                        f" {why}")
    if why := _path_problem(cfg.data.eval_file, "file"):
        raise UserError(f"eval file {cfg.data.eval_file} (EVAL_FILE / --eval-file) {why}")
    if not 0.0 < cfg.data.masked_lm_prob <= 1.0 or not cfg.data.packing_factor >= 1.0:
        raise UserError(f"MASKED_LM_PROB must be in (0, 1] and PACKING_FACTOR at least 1, got "
                        f"{cfg.data.masked_lm_prob} and {cfg.data.packing_factor}")
    if not 0.0 < cfg.train.target_accuracy <= 1.0:
        raise UserError(f"TARGET_MLM_ACCURACY must be in (0, 1], got {cfg.train.target_accuracy}")
    init = cfg.model.init_checkpoint
    if init is not None and not (init.exists() or Path(f"{init}.index").is_file()):
        raise UserError(f"INIT_CHECKPOINT {init}: neither a file, a folder nor a TF checkpoint "
                        f"prefix ({init}.index)")
    _validate_checkpoint(cfg.checkpoint)
    if cfg.layerwise.layerwise is not None:
        layerwise_stages(cfg.layerwise.layerwise)


def _check_choices(cfg: RunConfig) -> None:
    """Every setting with `choices` holds one of them (or is unset)."""
    for section, f in section_fields():
        value, choices = getattr(getattr(cfg, section), f.name), f.metadata.get("choices")
        if choices is not None and value is not None and value not in choices:
            raise UserError(f"{f.metadata['env']} must be one of {', '.join(choices)}, "
                            f"not {value!r}")


def _path_problem(path: Path | None, want: str) -> str | None:
    """None when `path` is an existing `want` ("file" or "folder"); else "does not exist", or
    what it is instead."""
    if path is None or not path.exists():
        return "does not exist"
    if want == "folder" and not path.is_dir():
        return "is a file, not a folder"
    if want == "file" and not path.is_file():
        return "is a folder, not a file"
    return None


def _validate_checkpoint(ck: CheckpointConfig) -> None:
    """CHECKPOINT_EVERY's, PREEMPT_CHECK_EVERY's and CHECKPOINT_GRACE's ranges and RESUME_FROM's
    file (what they need of CHECKPOINT_DIR: train.allowed)."""
    if ck.checkpoint_every < 0:
        raise UserError(f"CHECKPOINT_EVERY must be >= 0, got {ck.checkpoint_every}")
    if not 0 <= ck.checkpoint_grace < math.inf:
        raise UserError(f"CHECKPOINT_GRACE must be >= 0 seconds, got {ck.checkpoint_grace}")
    if ck.preempt_check_every < 0:
        raise UserError(f"PREEMPT_CHECK_EVERY must be >= 0 steps (0: the warning is ignored), "
                        f"got {ck.preempt_check_every}")
    if ck.resume_from not in (None, "auto") and \
            (why := _path_problem(Path(ck.resume_from), "file")):
        auto = " (RESUME_FROM=auto takes the newest checkpoint in CHECKPOINT_DIR)" \
            if Path(ck.resume_from).is_dir() else ""
        raise UserError(f"checkpoint {ck.resume_from} (RESUME_FROM / --resume-from) {why}{auto}")
