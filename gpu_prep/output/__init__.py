"""output: what a run writes, and reading it back.

writer.py is the write stage (samples -> per-domain shards, meta.json); shards.py holds a shard while it is
written; bin.py, h5.py, megatron.py and parquet.py are the storage formats; pack.py lays packed sequences
out; dataset.py reads any format back (gpu_prep.open). Every file is made durable by gpu_prep/durable.py.
"""
