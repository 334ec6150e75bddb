"""Shard stages: padded sample files to the training layouts, and their statistics.

Stages (`python -m bertperf prep <stage>`): unpad.py, chop.py, pack.py, stratify.py, stats.py.
Library: packing.py (histogram packing of lengths into rows).
"""
