"""output: what a run writes, and reading it back.

writer.py is the write stage (samples -> per-domain shards, meta.json); shards.py holds a shard while it is
written; bin.py, h5.py, megatron.py and parquet.py are the storage formats; pack.py lays packed sequences
out; shuffle.py holds output.shuffle's buckets; dataset.py reads any format back (gpu_prep.open), through
load.py's checks, which verify.py (gpu-prep verify) shares. Every file is made durable by gpu_prep/durable.py.
"""

__all__ = ["bin", "dataset", "h5", "load", "megatron", "pack", "parquet", "shards", "shuffle", "verify", "writer"]
