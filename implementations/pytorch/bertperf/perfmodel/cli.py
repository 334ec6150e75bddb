"""`python -m bertperf model <name>`: the performance model, each command printing a table of
predictions (not measurements). Each module defines add_arguments(parser) and run(args); it is
imported only when it runs (bertperf.commands)."""

COMMANDS = {
    "step": ("bertperf.perfmodel.step",
             "BERT-large's step on an A100 and an H100: the trainer's traced step priced by a "
             "roofline calibrated on published kernel measurements, with and without each of "
             "its switches"),
    "scale": ("bertperf.perfmodel.scale",
              "step time and time to train of the DGX A100 configs from 8 to 1,024 GPUs, the "
              "dominant term at each, and the published MLPerf times"),
    "commodity": ("bertperf.perfmodel.commodity",
                  "time to train on nodes of PCIe GPUs on 10/25 Gb/s Ethernet, each GRAD_COMM "
                  "mode"),
    "layerwise": ("bertperf.perfmodel.layerwise",
                  "BERT-large's step in each stage of progressive stacking and MSLT on one DGX "
                  "A100 node, and the time to train against normal training's"),
    "results": ("bertperf.perfmodel.results",
                "published MLPerf BERT result folders summarised, one CSV line each: runs, "
                "olympic-mean minutes, samples trained, evals, global batch"),
    "validate": ("bertperf.perfmodel.validate",
                 "time to train of every published result of NVIDIA's MLPerf BERT code, "
                 "predicted by perfmodel/cluster.py against the logs' olympic means, held out "
                 "(--split generation or round)"),
}
