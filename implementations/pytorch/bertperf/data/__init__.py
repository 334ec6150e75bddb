"""The training input: per-rank batches from training shards.

  readers.py  one shard, memory-mapped: the rows asked for, copied out
  dataset.py  a training set: its shards and their counts, opened lazily
  order.py    which samples each rank reads in an epoch, in which order (exact resume)
  collate.py  samples to padded, varlen or packed batch arrays (and torch tensors)
  loader.py   ShardLoader: the above, prefetched on a thread, with a resumable position
"""
