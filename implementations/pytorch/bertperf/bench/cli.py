"""`python -m bertperf bench <name>`: benchmarks, each printing a table. Each module defines
add_arguments(parser) and run(args); it is imported only when it runs (bertperf.commands)."""

COMMANDS = {
    "prep": ("bertperf.bench.prep",
             "time `prep create` on the Wikipedia sample (1 worker and all cores)"),
    "loader": ("bertperf.bench.loader",
               "samples/s of the data loader per worker for each batch layout, and its peak memory"),
    "attention": ("bertperf.bench.attention",
                  "variable-length attention paths, forward + backward (prints a table)"),
    "balance": ("bertperf.bench.balance",
                "per-rank token and sum-L^2 imbalance of real global batches, before and after "
                "data/balance.py places them"),
    "clip": ("bertperf.bench.clip",
             "gradient clipping before or after DDP's all-reduce on gloo ranks: the all-reduces' "
             "overlap with backward (profiler) and the difference in the step"),
    "comm": ("bertperf.bench.comm",
             "GRAD_COMM's modes (compressed, low-rank, local SGD) training the demo to its target "
             "across a tbf-throttled veth link between two network namespaces (root)"),
    "layerwise": ("bertperf.bench.layerwise",
                  "layerwise training (progressive stacking, MSLT) against normal training on "
                  "the demo's data: time and samples to a target, step time per stage"),
    "train": ("bertperf.bench.train",
              "training speed of HF BertForPreTraining and of bertperf's switches on the same "
              "samples"),
}
