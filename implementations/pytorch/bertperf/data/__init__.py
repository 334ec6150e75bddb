"""Sample layouts on disk and in memory, and the loaders that feed training."""
