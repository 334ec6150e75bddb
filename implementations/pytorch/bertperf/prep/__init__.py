"""Data preparation: Wikipedia text to the MLPerf reference's exact BERT pretraining samples, and
those samples to the training shards. One `python -m bertperf prep <stage>` command per stage
(cli.py lists them), grouped by what they take in:

  text/     wikiextractor text -> sentence-per-line parts (dictd, clean, segment, split)
  samples/  parts -> padded HDF5 samples (create, eval)
  shards/   samples -> unpadded, chopped, packed or stratified shards, and stats (unpad, chop,
            pack, stratify, stats)
  verify.py folders against their manifests (verify)
  parallel.py  the runner every per-file stage uses: local worker processes and MPI ranks

Nothing outside prep/ imports it; the file formats it writes live in bertperf.formats.
"""
