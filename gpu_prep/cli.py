"""The command line: parses arguments and calls gpu_prep.pipeline and gpu_prep.commands (what it prints goes
through commands/console.py). Nothing else lives here."""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from gpu_prep.commands.console import Reporter, err, fail, out, resume_command, run_summary, show_samples, warn
from gpu_prep.config import load_config
from gpu_prep.errors import ConfigError, GpuPrepError, Interrupted
from gpu_prep.plugins import check_registered, load_plugins
from gpu_prep.run.overlap import deaf_to_ctrl_c

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Turn raw LLM training data into token shards with exact loss masks.")

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Pipeline config (JSON or YAML).")]
PluginOpt = Annotated[Optional[list[str]], typer.Option("--plugin", help="A module or .py file that registers input types; repeatable.")]


# Exit codes: 0 done; 1 the run failed (bad data under --strict, a damaged input, a cluster that gave up);
# 2 a config, option or input that cannot be used; 3 the run finished but is not useful (no rows written,
# a dataset of a mix that wrote none, more rows dropped than preprocessing.max_drop_share); 130 Ctrl-C.
NOT_USEFUL, INTERRUPTED = 3, 130


def _version(value: bool) -> None:
    if value:
        from gpu_prep import __version__

        out.print(f"gpu-prep {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                   help="Print the version and exit.")] = False) -> None:
    """Turn raw LLM training data into token shards with exact loss masks."""


@app.command()
def run(
    config: ConfigOpt,
    inputs: Annotated[Optional[list[str]], typer.Argument(help="Input files, globs or folders (.jsonl, .json, .parquet); none when the config lists datasets.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output directory (not with --stats-only).")] = None,
    tokenizer: Annotated[Optional[str], typer.Option(help="Tokenizer directory or bundled name; overrides the config.")] = None,
    device: Annotated[Optional[str], typer.Option(help="auto | cpu | gpu; overrides the config.")] = None,
    chunk_rows: Annotated[int, typer.Option(min=1, help="Rows per chunk; output does not depend on it.")] = 2048,
    overwrite: Annotated[bool, typer.Option(help="Replace a previous run in OUTPUT.")] = False,
    resume: Annotated[bool, typer.Option(help="Finish an interrupted run in OUTPUT from its last checkpoint; the result is byte for byte an uninterrupted run's.")] = False,
    checkpoint_every: Annotated[float, typer.Option(min=0, help="Seconds between checkpoints (what --resume carries on from).")] = 30.0,
    workers: Annotated[Optional[int], typer.Option(min=1, help="Tokenizer threads (default: every core); output does not depend on it.")] = None,
    rejects: Annotated[Optional[Path], typer.Option(help="Write every dropped row, with file, line and reason, to this JSONL file.")] = None,
    strict: Annotated[bool, typer.Option(help="Stop at the first bad row (malformed, wrong type, ...), naming file:line and the cause.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar and no summary.")] = False,
    plugin: PluginOpt = None,
    stats_only: Annotated[bool, typer.Option(help="Write nothing: run into a temporary directory, print the statistics of what would be written, and delete it.")] = False,
    debug_samples: Annotated[int, typer.Option(min=0, help="After the run, show this many samples with their trained text marked.")] = 0,
    cluster: Annotated[Optional[str], typer.Option(help="Run on Dask: local:N starts N local workers (dask-cuda workers, one per GPU, with the GPU backend); tcp://host:port uses a running scheduler. The output is the same as without.")] = None,
    part_mb: Annotated[float, typer.Option(min=0.001, help="With --cluster: JSON Lines files are cut into parts of about this many MB; output does not depend on it.")] = 64.0,
    progress_interval: Annotated[float, typer.Option(min=0.1, help="Off a terminal: seconds between plain progress lines.")] = 10.0,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key: --set preprocessing.max_seq_len=4096 (the value is YAML: numbers, true, \\[a, b], {k: v}; a list entry by index or name: datasets.web.sampling=0.2); repeatable, checked like the file.")] = None,
) -> None:
    """Run the pipeline described by CONFIG over INPUTS into OUTPUT."""
    import shutil
    import tempfile

    from gpu_prep.pipeline import Options
    from gpu_prep.pipeline import run as run_pipeline

    if stats_only == (output is not None):
        raise fail(ConfigError("give --output, or --stats-only (which writes nothing), but not both"))
    if stats_only:
        output = Path(tempfile.mkdtemp(prefix="gpu-prep-stats-")) / "out"
    if overwrite and resume:
        raise fail(ConfigError("--overwrite and --resume contradict each other; pass one"))
    if device not in (None, "auto", "cpu", "gpu"):
        raise fail(ConfigError(f"--device {device!r} is not allowed; allowed: auto, cpu, gpu"))
    if workers is not None:  # read by HF tokenizers' thread pool when it starts, so set before any tokenizing
        os.environ["RAYON_NUM_THREADS"] = str(workers)
    try:
        load_plugins(plugin or [])
        cfg = load_config(config, set_ or [])
        check_registered(cfg, str(config))
        for warning in [] if quiet else cfg.warnings():
            warn(warning)
        with Reporter(quiet, progress_interval) as report:
            announce = None if quiet else lambda link: err.print(f"Dask dashboard: {link}", highlight=False)
            options = Options(tokenizer=tokenizer, device=device, chunk_rows=chunk_rows, workers=workers,
                              overwrite=overwrite, resume=resume, rejects=rejects, strict=strict,
                              checkpoint_seconds=checkpoint_every, progress=report,
                              cluster=cluster, announce=announce, warn=None if quiet else warn,
                              plugins=tuple(plugin or []),
                              part_bytes=int(part_mb * (1 << 20)), config_file=config)
            manifest = run_pipeline(cfg, inputs or [], output, options)
    except GpuPrepError as exc:
        if isinstance(exc, Interrupted):
            err.print(f"resume it with: {escape(resume_command())}", highlight=False)
        raise fail(exc) from None
    except KeyboardInterrupt:
        if not stats_only:
            with deaf_to_ctrl_c():  # another press while this is said would only print a traceback
                err.print(f"[yellow]interrupted[/]: what is done is kept; resume it with: "
                          f"{escape(resume_command())}", highlight=False)
        raise typer.Exit(INTERRUPTED) from None
    except OSError as exc:  # an unwritable output or rejects path, an unreadable input
        raise fail(GpuPrepError(f"{exc.filename}: {exc.strerror or exc}" if exc.filename else str(exc))) from None
    finally:
        if stats_only and not (output / "manifest.json").exists():
            shutil.rmtree(output.parent, ignore_errors=True)
    if stats_only:
        try:
            stats(output)
        finally:
            shutil.rmtree(output.parent, ignore_errors=True)
        from gpu_prep.run.manifest import drop_lines

        for line in drop_lines(manifest):
            out.print(f"dropped {escape(line)}", highlight=False, soft_wrap=True)
        _not_useful(manifest, cfg)
        return
    if not quiet:
        run_summary(manifest, output)
    if debug_samples:
        show_samples(output, None, debug_samples, 0, ids=True, plain=True)
    _not_useful(manifest, cfg)


def _not_useful(manifest: dict[str, Any], cfg: Any) -> None:
    """Exit 3, saying why, when the run wrote nothing useful: each drop reason with its first example."""
    from gpu_prep.run.manifest import drop_lines, run_problems

    problems = run_problems(manifest, cfg)
    if not problems:
        return
    for problem in problems:
        err.print(f"[bold red]error:[/] {escape(problem)}", highlight=False)
    for line in drop_lines(manifest):
        err.print(f"  dropped {escape(line)}", highlight=False, soft_wrap=True)
    raise typer.Exit(NOT_USEFUL)


@app.command()
def validate(
    config: ConfigOpt,
    data: Annotated[Optional[list[str]], typer.Argument(help="Input files to check the config against (a sample of their first rows); the config's datasets when none.")] = None,
    sample: Annotated[int, typer.Option(min=1, help="Rows of the data to read and run.")] = 100,
    tokenizer: Annotated[Optional[str], typer.Option(help="Tokenizer directory, bundled name or model id; overrides the config, as for run.")] = None,
    plugin: PluginOpt = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key, as for run.")] = None,
) -> None:
    """Check a config: its schema, and with data (or datasets) a sample run against it: mask roles the data
    never has, roles no rule names, rows the input type cannot read, the tokenizer and template; one
    rendered sample with its trained text marked, and the drop reasons the sample gets."""
    from gpu_prep.commands.validate import check_sample, remove_sample, run_sample
    from gpu_prep.run.context import DEFAULT_TOKENIZER

    try:
        load_plugins(plugin or [])
        cfg = load_config(config, set_ or [])
        check_registered(cfg, str(config))
    except GpuPrepError as exc:
        raise fail(exc) from None
    digest = cfg.sha256()[:12]  # the file's, as run's manifest has it (run's --tokenizer is not part of it)
    if tokenizer is not None:  # what is checked is what run --tokenizer would run
        cfg = cfg.model_copy(update={"tokenizer": cfg.tokenizer.model_copy(update={"name": tokenizer})})
    shown = cfg.model_dump(mode="json")
    shown["tokenizer"]["name"] = cfg.tokenizer.name or DEFAULT_TOKENIZER  # what a run resolves it to
    out.print_json(json.dumps(shown))
    for warning in cfg.warnings():
        warn(warning)
    if not data and not cfg.datasets:
        out.print(f"[green]ok[/]: {escape(str(config))} is a valid config (sha256 {digest}); give data "
                  "to check it against a sample", highlight=False)
        return
    report = None
    try:
        report = check_sample(cfg, data or [], sample)
        if not report.errors:
            run_sample(cfg, data or [], report)
        for warning in report.warnings:
            warn(warning)
        for error in report.errors:
            err.print(f"[bold red]error:[/] {escape(error)}", highlight=False)
        if report.manifest is not None:
            from gpu_prep.run.manifest import drop_lines

            totals = report.manifest["totals"]
            out.print(f"sample: {totals['rows_read']:,} rows read, {totals['rows_written']:,} would be written, "
                      f"tokenizer {escape(report.manifest['tokenizer']['source'])}", highlight=False)
            for line in drop_lines(report.manifest):
                out.print(f"  dropped {escape(line)}", highlight=False, soft_wrap=True)
            if totals["rows_written"]:
                show_samples(report.out_dir, None, 1, 0, ids=False, plain=not out.is_terminal)
    except GpuPrepError as exc:
        raise fail(exc) from None
    finally:
        if report is not None:
            remove_sample(report)
    if report.errors:
        raise typer.Exit(2)
    out.print(f"[green]ok[/]: {escape(str(config))} is a valid config for this data (sha256 {digest})",
              highlight=False)


@app.command()
def init(
    data: Annotated[list[str], typer.Argument(help="Input files, globs or folders to look at.")],
    tokenizer: Annotated[Optional[str], typer.Option(help="Tokenizer folder, bundled name or model id.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the config here (default: print it).")] = None,
) -> None:
    """Write a starter config for DATA: the input type its first rows' keys say, and what that type trains."""
    from gpu_prep.commands.init import starter_config

    try:
        text = starter_config(data, tokenizer)
    except GpuPrepError as exc:
        raise fail(exc) from None
    if output is None:
        import sys

        sys.stdout.write(text)  # as it is: rich would wrap the comments
        return
    if output.exists():
        raise fail(ConfigError(f"{output} exists; give another --output"))
    output.write_text(text, encoding="utf-8")
    out.print(f"wrote {escape(str(output))}; check it with: gpu-prep validate -c {escape(str(output))} "
              f"{escape(' '.join(data))}", highlight=False)


@app.command()
def verify(output: Annotated[Path, typer.Argument(help="A run's output directory.")]) -> None:
    """Re-read a run's shards and check sizes, dtypes, sample offsets, checksums, masks and counts."""
    from gpu_prep.output.verify import verify as verify_output

    faults = verify_output(output)
    for fault in faults:
        err.print(f"[bold red]fault:[/] {escape(fault)}", highlight=False)
    if faults:
        raise typer.Exit(1)
    out.print(f"[green]ok[/]: {escape(str(output))} is complete and consistent", highlight=False)


@app.command()
def stats(
    output: Annotated[Path, typer.Argument(help="A run's output directory.")],
    html_file: Annotated[Optional[Path], typer.Option("--html", help="Also write the table and a length histogram to this HTML file.")] = None,
) -> None:
    """Sample lengths (percentiles), trained-token share and truncation, per domain; trained tokens by role."""
    from gpu_prep.commands.stats import cell, role_line, summarize, write_html

    try:
        summary = summarize(output)
    except (OSError, KeyError, ValueError) as exc:
        raise fail(GpuPrepError(f"{output}: cannot read its statistics: {exc}")) from None
    table = Table(title=f"gpu-prep stats: {output} (max_seq_len {summary['max_seq_len']})")
    columns = list(next(iter(summary["domains"].values())))
    for name in ["domain", *columns]:
        table.add_column(name, justify="left" if name == "domain" else "right")
    for name, row in summary["domains"].items():
        table.add_row(name, *(cell(v) for v in row.values()))
    out.print(table)
    out.print(f"rows truncated: {summary['rows_truncated']:,} of {summary['rows_written']:,} "
              f"({summary['truncation_rate']:.1%})", highlight=False)
    out.print(role_line(summary), highlight=False)
    if html_file is not None:
        write_html(summary, html_file, f"gpu-prep stats: {output}")
        out.print(f"histogram: {html_file}", highlight=False)


@app.command()
def inspect(
    output: Annotated[Path, typer.Argument(help="A run's output directory.")],
    domain: Annotated[Optional[str], typer.Option(help="Domain directory (default: the first).")] = None,
    samples: Annotated[int, typer.Option("--samples", "-n", min=1, help="How many samples.")] = 3,
    start: Annotated[int, typer.Option(min=0, help="Index of the first sample.")] = 0,
    ids: Annotated[bool, typer.Option(help="Also print each token id with its loss_mask.")] = False,
    plain: Annotated[bool, typer.Option(help="Mark trained text with ⟦ ⟧ instead of colour.")] = False,
) -> None:
    """Show samples as text, trained tokens in green (or between ⟦ ⟧), masked ones dimmed."""
    show_samples(output, domain, samples, start, ids, plain)


def exit_status(code: Any) -> int:
    """A SystemExit's code as the process's exit status, as the interpreter makes it: None is 0, a message
    is printed on stderr and is 1."""
    if isinstance(code, int):
        return code
    if code is not None:
        print(code, file=sys.stderr)
    return 0 if code is None else 1


def main() -> None:
    """The console script. A run allocates millions of short-lived containers (parsed rows, rendered
    pieces): the collector's first generation waits for 100,000 of them, not 700, which spares a few
    percent of a run. And once the command is done (every file written, closed and renamed; the cluster, if
    any, shut down) the process leaves without the interpreter's teardown, which would free the tokenizers
    and collect every object one last time, about 0.1 s of a run that has nothing left to do."""
    gc.set_threshold(100_000, 50, 100)
    try:
        try:
            app()
            code: Any = 0
        except SystemExit as exc:
            code = exc.code
        finally:  # the command is over (an interrupted one has said how to resume): Ctrl-C again changes nothing
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:  # pressed again while it was ending, before the line above: no traceback either
        code = 130
    code = exit_status(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (| head) or a stream closed
            pass
    os._exit(code)
