"""The pipeline: one run, from input files to token shards and a manifest.

Every row goes through these stages, in order (run/stages.py runs each over a chunk of rows):

    read      files -> rows in bounded chunks, each row keeping (file, line)        read/
    format    rows -> one canonical shape: a conversation, or text pieces           format/
    filter    length rules and prefix-hash dedup over the rows' own text            filter/
    render    shape -> one string + trained byte spans (the real chat template)     render/
    tokenize  strings -> flat ids + offsets (the fastest exact engine)              tokenization/
    mask      spans + token byte positions -> loss_mask; truncation                 mask/
    commit    in input order: counts per file and reason, then the write stage      run/commit.py
    write     per domain, sharded by token count, atomically, with meta.json        output/

The stages run in this process (run/local.py: in turn, or overlapping in threads) or on a Dask cluster
(cluster/); either way chunks are committed here in input order, so the output is byte for byte the same.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from gpu_prep.backend import CPU, select_backend
from gpu_prep.config import PipelineConfig, output_sha256
from gpu_prep.errors import ConfigError, Interrupted, WriteError
from gpu_prep.failpoint import failpoint
from gpu_prep.filter.dedup import Deduplicator
from gpu_prep.filter.fuzzy import NearIndex
from gpu_prep.durable import journal, settle_journal, sha256_file, write_json_atomic
from gpu_prep.output.shards import Storage
from gpu_prep.output.writer import DatasetWriter
from gpu_prep.mask.pairs import PAIR_META
from gpu_prep.plugins import check_registered
from gpu_prep.run.accounting import Accounting
from gpu_prep.run.checkpoint import Checkpointer, has_checkpoint, load_for_resume, run_identity
from gpu_prep.run.commit import Committer
from gpu_prep.read.inputs import InputFile, LeftOut, check_unchanged
from gpu_prep.run.context import (Decisions, Options, RunContext, build_context, chat_turn_ends_documents,
                                  responses_without_eos, run_inputs, turn_marks_not_tokens)
from gpu_prep.run.local import run_chunks, run_here
from gpu_prep.run.manifest import Outcome, build_manifest, copy_tokenizer
from gpu_prep.run.outdir import (MANIFEST, check_output, check_paths, check_rejects, output_lock, prepare_output,
                                 rejects_name, remove_partial_files)
from gpu_prep.run.overlap import Stopwatch, deaf_to_ctrl_c, in_background
from gpu_prep.run.prepare import first_rows_formatted
from gpu_prep.read.files import local_path
from gpu_prep.tokenization.tokenizer import load_tokenizer

__all__ = ["MANIFEST", "Options", "run"]


def run(config: PipelineConfig, inputs: list[str], out_dir: str | Path, options: Options | None = None) -> dict[str, Any]:
    """Run the whole pipeline and return the manifest (also written to OUT_DIR/manifest.json).

    With options.resume, the interrupted run in OUT_DIR is finished from its last checkpoint (a finished
    run is returned as it is), byte for byte as an uninterrupted run would have written it. One run at a
    time writes a directory: another live run's lock is refused, a killed run's is taken over."""
    options = options or Options()
    clock = Stopwatch()
    check_registered(config)
    left_out = LeftOut()  # recorded in the manifest, and told to options.warn
    files, datasets = run_inputs(config, inputs, left_out)
    for warning in left_out.warnings() if options.warn is not None else []:
        options.warn(warning)
    out_dir = Path(out_dir)
    rejects = Path(options.rejects) if options.rejects else None
    named = [p for spec in config.datasets or [] for p in spec.data_paths or []]
    check_paths(out_dir, rejects, [*map(local_path, [*inputs, *named]), *(f.path for f in files)],
                [options.config_file, config.chat_template, options.tokenizer_for(config), *options.plugins])
    if options.resume and (out_dir / MANIFEST).exists():  # finished already: nothing to do (nor written)
        return _finished(config, files, out_dir, options)
    if rejects is not None:
        resumed = options.resume and has_checkpoint(out_dir)  # its own rejects file: checked by Accounting
        check_rejects(rejects, out_dir, options.overwrite or resumed, config.output.splits or {})
    with output_lock(out_dir):
        check_output(out_dir, options.overwrite, options.resume)
        run_ctx = _context(config, files, datasets, options, clock)
        prepare_output(out_dir, options.overwrite, options.resume)
        with journal(out_dir):
            manifest = _run(run_ctx, out_dir, options, clock, left_out)
        settle_journal(out_dir)
        return manifest


def _context(config: PipelineConfig, files: list[InputFile], datasets: Any, options: Options,
             clock: Stopwatch) -> RunContext:
    """The run context (tokenizer, backend, chat template), built before the output directory is touched:
    a tokenizer, template, device or option that cannot be used (exit 2) must not cost an --overwrite run
    the previous output, nor leave a fresh folder with gpu-prep's files in it."""
    tok = clock.time("load tokenizer", load_tokenizer, options.tokenizer_for(config), config.tokenizer.revision)
    clock.time("load tokenizer", tok.prepare_engines, config.tokenizer.engine)
    device = options.device_for(config)
    if options.cluster is not None:
        from gpu_prep.cluster.driver import check_cluster

        check_cluster(options.cluster, device)
    # On a cluster this process only decides, accounts and writes: the workers take the GPUs.
    backend = CPU if options.cluster is not None else select_backend(device, config.gpu.rmm_pool_size, config.gpu.spill)
    run_ctx = build_context(config, tok, backend, files, datasets, options.workers, options.strict)
    Storage.from_config(config, run_ctx.render.vocab_size)  # refuses an output.token_dtype too narrow for the ids
    first_rows_formatted(run_ctx)  # where the rows' shape says whether they need the chat template the run lacks
    if options.warn is not None:
        for warning in (chat_turn_ends_documents(config, tok, run_ctx.render.eod_text),
                        turn_marks_not_tokens(run_ctx.render, tok), responses_without_eos(config, tok)):
            if warning:
                options.warn(warning)
    return run_ctx


def _finished(config: PipelineConfig, files: list[InputFile], out_dir: Path, options: Options) -> dict[str, Any]:
    """The manifest of the finished run in out_dir that --resume names, where it is this run: the same
    config, inputs (paths and sizes) and tokenizer, and the rejects file it kept where one is asked for."""
    manifest = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
    changed = []
    if output_sha256(manifest.get("config", {})) != config.output_sha256():
        changed.append("config")
    if [(i.get("path"), i.get("size_bytes")) for i in manifest.get("inputs", [])] != \
            [(f.path, f.size_bytes) for f in files]:
        changed.append("inputs")
    if manifest.get("tokenizer", {}).get("name") != options.tokenizer_for(config):
        changed.append("tokenizer")
    if changed:
        raise ConfigError(f"cannot resume {str(out_dir)!r}: it holds a finished run, and the {', '.join(changed)} "
                          "differ from this one's; run with --overwrite to replace it")
    if options.rejects and not Path(options.rejects).exists():
        raise ConfigError(f"cannot resume {str(out_dir)!r}: it holds a finished run that kept no rejects file at "
                          f"{options.rejects}; run with --overwrite to run again with one")
    return manifest


def _run(run_ctx: RunContext, out_dir: Path, options: Options, clock: Stopwatch, left_out: LeftOut) -> dict[str, Any]:
    """The run proper, in an output directory this process holds and journals (left_out: what the input
    folders hold that is not read)."""
    config, files, tok = run_ctx.config, run_ctx.files, run_ctx.tok
    identity = {"config_sha256": config.sha256(), "tokenizer": tok.identity()}  # hashes files: once a run
    resume_identity = run_identity(config.output_sha256(), files, identity["tokenizer"])
    resumed = load_for_resume(out_dir, resume_identity) if options.resume else None
    checkpoints = Checkpointer(out_dir, resume_identity, options.checkpoint_seconds, resumed)
    # The inputs' checksums are taken beside the run (hashing releases the GIL), not after it.
    checksums = in_background(lambda: [sha256_file(f.path) for f in files])
    try:
        outcome = _process(run_ctx, out_dir, options, checkpoints, resumed or {}, clock)
        hashes = clock.time("checksums", checksums)
        for f in files:  # a change after the last read; the checksums describe what was read
            check_unchanged(f)
        seconds = {"total": time.perf_counter() - clock.started, **clock.seconds}
        manifest = build_manifest(run_ctx, outcome, identity, hashes, seconds, out_dir, left_out)
        failpoint("manifest", out_dir / MANIFEST)
        write_json_atomic(out_dir / MANIFEST, manifest)
    except BaseException as exc:
        # After a Ctrl-C, further ones wait until what was done is put in order: a hurried second press could
        # leave it half done, or print a traceback.
        with deaf_to_ctrl_c() if isinstance(exc, KeyboardInterrupt) else contextlib.nullcontext():
            checkpoints.close(failed=True)
            resumable = isinstance(exc, (KeyboardInterrupt, Interrupted)) or checkpoints.rows_saved is not None
            if not resumable:  # what a checkpoint refers to stays for --resume; else the temporaries go
                remove_partial_files(out_dir)
        if isinstance(exc, OSError):
            raise WriteError(exc, checkpoints.rows_saved) from None
        raise
    checkpoints.finish()
    for path in outcome.leftovers:  # a resume no longer needs them
        path.unlink(missing_ok=True)
    return manifest


def _process(run: RunContext, out_dir: Path, options: Options, checkpoints: Checkpointer, resumed: dict[str, Any],
             clock: Stopwatch) -> Outcome:
    """Every chunk through every stage, here or on a cluster, committed in input order."""
    config = run.config
    decisions = Decisions.from_state(resumed)
    rejects = Path(options.rejects) if options.rejects else None
    acct = Accounting(run.files, rejects=rejects, strict=options.strict, state=resumed.get("accounting"))
    writer = DatasetWriter(out_dir, Storage.from_config(config, run.render.vocab_size),
                           config.output.max_tokens_per_shard, config.split_windows,
                           about={"tokenizer": run.tokenizer_summary(),
                                  **({"preference": PAIR_META[config.input.type]}
                                     if config.input.type in PAIR_META else {})},
                           not_domains=rejects_name(out_dir, rejects))
    writer.restore(resumed.get("writer", []))
    memory = config.preprocessing.dedup_memory_mb
    dedup = Deduplicator(checkpoints.seen(), None if memory is None else int(memory * (1 << 20)), out_dir) \
        if config.preprocessing.deduplicate else None
    near = NearIndex(checkpoints.near_seen(), None if memory is None else int(memory * (1 << 20)), out_dir) \
        if config.preprocessing.fuzzy_dedup is not None else None
    commit = Committer(run, acct, writer, checkpoints, decisions, options.progress, near)
    outcome = Outcome(acct, {})
    try:
        if options.cluster is not None:
            from gpu_prep.cluster.driver import run_on_cluster

            for done in run_on_cluster(run, dedup, decisions, checkpoints.rows_done, options, clock, outcome.cluster):
                commit(done, clock)
        else:
            chunks = run_chunks(run, options.chunk_rows, checkpoints.rows_done, options.per_file)
            run_here(run, chunks, dedup, decisions, clock, commit, options.overlap)
    except BaseException as exc:
        acct.abort(keep=isinstance(exc, (KeyboardInterrupt, Interrupted)) or checkpoints.rows_saved is not None)
        raise
    # A checkpoint of every row before the rejects file takes its name: a run stopped while it finishes (the
    # shuffle's gather, the renames, the manifest) resumes from here, and its rejects file is one it began.
    if checkpoints.rows_saved != checkpoints.rows_done:
        checkpoints.save(commit.state())
    acct.close()
    outcome.engine_check = decisions.engine_check
    outcome.domains = clock.time("write", writer.finish)
    outcome.leftovers = writer.leftovers() + [path for s in (dedup, near) if s is not None for path in s.seen.files()]
    template = run.render.template
    clock.time("write", copy_tokenizer, run.tok, out_dir, template.source if template is not None else None)
    return outcome
