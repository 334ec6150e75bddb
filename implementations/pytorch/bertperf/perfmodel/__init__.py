"""The performance model: predictions of the trainer's speed on GPUs it does not run on (the
traced step priced by a roofline, the all-reduce, clusters, layerwise training), calibrated on
published measurements (anchors.csv, results.csv). A model, not a measurement: bench/ measures."""

TOLERANCE = 0.15
"""How far a prediction of the model may be from the published measurement it is checked
against: the step model's A100 rate against NVIDIA's MLPerf rates (model scale's calibration;
model step quotes it), and a held-out time to train against its result (model validate)."""
