"""cluster: one run spread over a Dask cluster (`--cluster local:N`, or a scheduler's address).

plan.py cuts the input into parts and the row stream into ranges; shuffle.py is the scan and the dedup
shuffle; worker.py runs a range through the stages run/stages.py lists; driver.py connects, submits and yields
the workers' chunks in input order to the pipeline, which commits them as in one process.

The process that runs `gpu-prep run` (the driver) cuts the inputs into parts and is the only one that
writes. Workers read, format, filter, render, tokenize and mask; the driver accounts for their chunks and
writes them in input order, through the same code a single-process run uses. So the output is the
single-process output byte for byte, checkpoints and --resume work as they do there (a run stopped on a
cluster can be finished by either), and a worker that dies costs only its tasks being run again
elsewhere: tasks have no side effects.

1. scan: each part (whole lines of an uncompressed JSON Lines file, or a whole file) is read once,
   counting its rows and lines (later parts' line numbers and the mixing order need them) and, with
   deduplicate, giving the MD5 digest of every row that passes the length rules.
2. dedup shuffle: the digests are hash-partitioned into buckets. Each bucket finds every digest's first
   position in the row stream (input order, or the datasets' mixed order) and, for each range of the
   stream, the digests of its rows that occurred before the range starts.
3. ranges: the stream is cut into ranges (a part each, or slices of the mixed order). A worker runs its
   range through the single-process stages with a Deduplicator that starts out knowing those digests, so
   it drops exactly the rows a single process drops.

The decisions a run makes on its first rows (whether Jinja-free rendering is trusted, which tokenizer
engine) are made once, by the driver, on the rows a single process makes them on, and handed to every
worker.
"""


__all__ = ["driver", "plan", "shuffle", "worker"]
