"""`python -m bertperf prep <stage>`: one subcommand per data-preparation stage, in the order a
run of the whole chain takes them. Each stage module defines add_arguments(parser) and run(args);
it is imported only when its stage runs (bertperf.commands)."""

COMMANDS = {
    "dictd": ("bertperf.prep.text.dictd",
              "a dictd database (e.g. Debian's dict-foldoc) as WikiExtractor-format articles"),
    "clean": ("bertperf.prep.text.clean",
              "clean WikiExtractor text (reference cleanup_file.py + clean.sh), one output per "
              "input file"),
    "segment": ("bertperf.prep.text.segment",
                "split cleaned text into one sentence per line (reference "
                "do_sentence_segmentation.py)"),
    "split": ("bertperf.prep.text.split",
              "hold out eval articles and gather the rest into part files (reference "
              "seperate_test_set.py + do_gather.py)"),
    "create": ("bertperf.prep.samples.create",
               "make masked-LM/NSP samples from text parts, identical to the reference (HDF5)"),
    "eval": ("bertperf.prep.samples.pick_eval",
             "pick the eval samples (reference pick_eval_samples.py rule)"),
    "verify": ("bertperf.prep.verify",
               "verify folders against their manifests; name every bad file"),
    "unpad": ("bertperf.prep.shards.unpad",
              "padded HDF5 samples to the unpadded layout (ours or NVIDIA's variable-length one)"),
    "chop": ("bertperf.prep.shards.chop",
             "re-shard unpadded samples into S equal shards with a global seeded shuffle"),
    "pack": ("bertperf.prep.shards.pack",
             "pack up to 3 samples per 512-token row (histogram packing, bounded memory); "
             "--unpack"),
    "stratify": ("bertperf.prep.shards.stratify",
                 "split unpadded shards into length bins (e.g. 1-128 ... 385-512), each shuffled "
                 "and sharded"),
    "stats": ("bertperf.prep.shards.stats",
              "sample count, mean/median length, padding, masks, NSP, packing efficiency; PNG "
              "histogram"),
}
