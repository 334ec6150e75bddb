"""Files on disk: the sample layouts and the mechanics every writer and reader shares.

  samples.py   Samples, the one in-memory form of pretraining samples (flat, unpadded)
  padded.py    the padded HDF5 layout of `prep create` / `prep eval` (and NVIDIA's fixed-length files)
  unpadded.py  bertperf-unpadded/1 shards
  packed.py    bertperf-packed/1 shards: up to 3 sequences per fixed-size row
  nvidia.py    NVIDIA's variable-length and packed layouts
  detect.py    which layout a file is in, its header, and a folder's sample files
  hdf5.py      a file's datasets read whole, with one-line errors
  reading.py   a file of any of several layouts as Samples (stages and the trainer's eval set)
  manifest.py  MANIFEST.json: md5/size/count per output, resume keys, inputs checked against it
  files.py     atomic outputs (temporary name, then rename), strict UTF-8 reading, md5
  outputs.py   what a command that writes may replace (one rule, one entry per writer)

numpy and h5py only: no torch, and nothing of bertperf but errors.py and benchmark.py.
"""
