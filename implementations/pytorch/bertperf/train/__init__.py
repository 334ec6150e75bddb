"""Pretraining: `python -m bertperf train`, and `python -m bertperf launch` to start its ranks.

  allowed.py     what a run may combine: every refused combination of settings (with each
                 other, the data, the model, the run's length, this machine), one table
  checkpoint.py  save/resume the whole training state (CHECKPOINT_DIR, CHECKPOINT_EVERY,
                 RESUME_FROM): model, optimizer, schedule, loss scale, loader position, RNG
  checks.py      the checks before any log (train --check): layout, allowed.py's table, the
                 data's sequence lengths against the model and each other, the output folders
  comm.py        GRAD_COMM's modes (compressed, low-rank, local SGD) and the bytes counted
  cli.py         the `train` subcommand: flags (one per bertperf.config field) -> RunConfig -> run
  dist.py        torch.distributed from the launcher's variables (gloo on CPU, NCCL on CUDA);
                 a dead peer or SIGTERM as one-line errors
  evaluation.py  masked-LM accuracy over the whole eval file, from counts summed over ranks
  export.py      the `export` subcommand: a checkpoint as a HuggingFace model folder
  launch.py      the `launch` subcommand: this node's ranks through torch.distributed's launcher,
                 its failure report as one line naming the rank that failed first
  loop.py        the inputs read and checked before the MLPerf log opens (data, checkpoints),
                 init (seeds, model, optimizer, schedule, MLPerf init logging) and the training
                 loop: accumulation, clipped steps, evals, stopping
  layerwise.py   LAYERWISE's stages: the encoder grown, the stage's plan and schedule returned
  layout.py      LAYOUT: the dataset, loader and batch class of each layout
  parallel.py    the parallelism plan around the one-device model (kernels, FP8, optimizer,
                 reduction, compile, CUDA graphs)
  preflight.py   data checks against the manifests and the model's vocab, before the log opens
  rank.py        the `rank` subcommand: this process's rank, world size and local rank
  scalars.py     TENSORBOARD: the loop's scalars as TensorBoard event files, by rank 0
  warmstart.py   the sanity eval after loading INIT_CHECKPOINT
"""
