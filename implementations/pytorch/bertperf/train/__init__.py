"""Pretraining: `python -m bertperf train`, and `python -m bertperf launch` to start its ranks.

  checkpoint.py  save/resume the whole training state (CHECKPOINT_DIR, CHECKPOINT_EVERY,
                 RESUME_FROM): model, optimizer, schedule, loss scale, loader position, RNG
  checks.py      configuration checks that need the model or the RCP table (train --check)
  cli.py         the `train` subcommand: flags (one per bertperf.config field) -> RunConfig -> run
  dist.py        torch.distributed from the launcher's variables (gloo on CPU, NCCL on CUDA);
                 a dead peer or SIGTERM as one-line errors
  evaluation.py  masked-LM accuracy over the whole eval file, from counts summed over ranks
  launch.py      the `launch` subcommand: this node's ranks through torch.distributed's launcher,
                 its failure report as one line naming the rank that failed first
  loop.py        the inputs read and checked before the MLPerf log opens (data, checkpoints),
                 init (seeds, model, optimizer, schedule, MLPerf init logging) and the training
                 loop: accumulation, clipped steps, evals, stopping
  preflight.py   data checks against the manifests and the model's vocab, before the log opens
  warmstart.py   the sanity eval after loading INIT_CHECKPOINT
"""
