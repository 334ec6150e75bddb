"""bertperf: an MLPerf Training BERT (closed division) submission harness."""

__version__ = "0.1.0"
