"""Pretraining: `python -m bertperf train`.

  checkpoint.py  save/resume the whole training state (CHECKPOINT_DIR, CHECKPOINT_EVERY,
                 RESUME_FROM): model, optimizer, schedule, loss scale, loader position, RNG
  cli.py         the `train` subcommand: flags (one per bertperf.config field) -> RunConfig -> run
  dist.py        torch.distributed from the launcher's variables (gloo on CPU, NCCL on CUDA)
  evaluation.py  masked-LM accuracy over the whole eval file, from counts summed over ranks
  loop.py        init (seeds, model, optimizer, schedule, loader, MLPerf init logging) and the
                 training loop: accumulation, clipped steps, evals, stopping
"""
