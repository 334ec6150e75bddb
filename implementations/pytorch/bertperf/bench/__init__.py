"""Benchmarks: each prints a table; results are recorded in docs/performance.md."""
