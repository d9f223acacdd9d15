"""run: how a run goes, chunk by chunk (the pipeline's driver, gpu_prep/pipeline.py, puts these together).

context.py   the run context every stage is handed (built once per process), Options, Decisions
stages.py    the per-chunk stages in a table, each input -> named result, and those results (Rows, Prepared, Done)
prepare.py   the host stages: format, filter, render (prepare runs them over each chunk)
tokenize.py  the tokenize stage: the engine the first rows chose, checked against HF as the run goes
masking.py   the mask stage: loss masks and truncation on xp (mask/), and mask_chunk
handlers.py  the built-in data handlers a dataset may name (registered in read/mix.py's registry)
commit.py    accounting and writing, in input order: the only place either happens
local.py     the stages in one process: one after another, or overlapping in threads (overlap.py)
accounting.py, checkpoint.py, outdir.py, manifest.py   counts, --resume, the output directory, manifest.json
"""

__all__ = ["accounting", "checkpoint", "commit", "context", "handlers", "local", "manifest", "masking", "outdir",
           "overlap", "prepare", "stages", "tokenize"]
