"""The optimizer side of the trainer, each part usable on its own: LAMB per tensor with foreach ops
(`Lamb`), over one flat fp32 buffer (`FlatLamb`, stepped by bertperf.kernels.lamb_step) or with
its state sharded over the ranks (`ShardedLamb`, ZeRO-1), built by name (`make_optimizer`;
`use_flat_lamb` picks between the first two, `mlperf_hparams` gives the log keys); the parameter
groups (`param_groups`: bias and LayerNorm without decay or trust ratio); NVIDIA's LR schedule on
the device (`LinearWarmupPolyDecay`, `lr_at`; a run's from its settings: `run_schedule`,
`warmup_end`); global-norm clipping, fp16 loss scaling and the
step skipped on a non-finite norm (`clipped_step`, `DynamicLossScaler`; what it asks of the
optimizer: `ClippedOptimizer`), or clipping per DDP bucket before the all-reduce
(`bucket_clip`). A step, after the trainer has accumulated its micro-batches into the
gradients:

    outcome = clipped_step(opt, max_grad_norm=1.0, scaler=scaler)   # scaler None unless fp16
    sched.step(outcome.ok)  # a skipped step does not count
    opt.zero_grad(set_to_none=True)"""

from bertperf.optim.clip import (ClippedOptimizer, DynamicLossScaler, StepOutcome, clip_grad_norm_,
                                 clipped_step, global_grad_norm)
from bertperf.optim.factory import make_optimizer, mlperf_hparams, use_flat_lamb
from bertperf.optim.flat_lamb import FlatLamb
from bertperf.optim.groups import NO_DECAY_PATTERNS, is_no_decay, param_groups
from bertperf.optim.lamb import Lamb
from bertperf.optim.schedule import (LinearWarmupPolyDecay, lr_at, resolve_warmup, run_schedule,
                                    tf_reference_lr_at, warmup_end)
from bertperf.optim.sharded_lamb import ShardedLamb

__all__ = [
    "NO_DECAY_PATTERNS",
    "ClippedOptimizer",
    "DynamicLossScaler",
    "FlatLamb",
    "Lamb",
    "LinearWarmupPolyDecay",
    "ShardedLamb",
    "StepOutcome",
    "clip_grad_norm_",
    "clipped_step",
    "global_grad_norm",
    "is_no_decay",
    "lr_at",
    "make_optimizer",
    "mlperf_hparams",
    "param_groups",
    "resolve_warmup",
    "run_schedule",
    "tf_reference_lr_at",
    "use_flat_lamb",
    "warmup_end",
]
