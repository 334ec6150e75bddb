"""Data preparation: Wikipedia text to the MLPerf reference's exact BERT pretraining samples."""
