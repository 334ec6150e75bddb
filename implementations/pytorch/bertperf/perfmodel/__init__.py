"""The performance model: predictions of the trainer's speed on GPUs it does not run on (the
traced step priced by a roofline, the all-reduce, clusters, layerwise training), calibrated on
published measurements (anchors.csv, results.csv). A model, not a measurement: bench/ measures."""

CALIBRATION_TOLERANCE = 0.15
"""How far the step model's A100 prediction may be from NVIDIA's published MLPerf rates (model
scale's calibration; model step quotes it)."""
