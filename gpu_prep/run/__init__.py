"""run: how a run goes, chunk by chunk (the pipeline's driver, gpu_prep/pipeline.py, puts these together).

context.py   the run context every stage is handed (built once per process), Options, Decisions
stages.py    the per-chunk stages: format, filter, render, tokenize, mask, each input -> named result
commit.py    accounting and writing, in input order: the only place either happens
local.py     the stages in one process: one after another, or overlapping in threads (overlap.py)
accounting.py, checkpoint.py, outdir.py, manifest.py   counts, --resume, the output directory, manifest.json
"""
