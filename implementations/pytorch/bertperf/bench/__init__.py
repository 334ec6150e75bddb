"""Benchmarks: measurements of the trainer, each printing a table; results are recorded in
docs/performance.md. Predictions are the performance model's (bertperf.perfmodel)."""
