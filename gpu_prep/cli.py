"""The command line: parses arguments and calls gpu_prep.pipeline. Nothing else lives here."""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.markup import escape
from rich.table import Table

from gpu_prep.config import load_config
from gpu_prep.errors import ConfigError, GpuPrepError, Interrupted
from gpu_prep.plugins import check_registered, load_plugins
from gpu_prep.run.overlap import deaf_to_ctrl_c

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Turn raw LLM training data into token shards with exact loss masks.")
err = Console(stderr=True, soft_wrap=True)  # error lines stay whole, for grep and for logs
# Off a terminal (a log, a pipe) rich would lay output out in 80 columns, cutting tables' numbers to "…" and
# commands in two: lines stay whole there, and tables get room (COLUMNS, where set, still decides).
_PIPED = not sys.stdout.isatty() and "COLUMNS" not in os.environ
out = Console(soft_wrap=_PIPED, width=200 if _PIPED else None)

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Pipeline config (JSON or YAML).")]
PluginOpt = Annotated[Optional[list[str]], typer.Option("--plugin", help="A module or .py file that registers input types; repeatable.")]


# Exit codes: 0 done; 1 the run failed (bad data under --strict, a damaged input, a cluster that gave up);
# 2 a config, option or input that cannot be used; 3 the run finished but is not useful (no rows written,
# a dataset of a mix that wrote none, more rows dropped than preprocessing.max_drop_share); 130 Ctrl-C.
NOT_USEFUL, INTERRUPTED = 3, 130


def _warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)


def _fail(exc: GpuPrepError) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
    return typer.Exit(exc.exit_code)


def _version(value: bool) -> None:
    if value:
        from gpu_prep import __version__

        out.print(f"gpu-prep {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                   help="Print the version and exit.")] = False) -> None:
    """Turn raw LLM training data into token shards with exact loss masks."""


class Reporter:
    """Progress while a run goes: on a terminal a bar (bytes of the input read of the total, rows/s, tokens/s,
    ETA); off one, a plain line every `interval` seconds; nothing with --quiet."""

    def __init__(self, quiet: bool, interval: float) -> None:
        import time

        self.quiet, self.interval, self.clock = quiet, interval, time.monotonic
        self.terminal = err.is_terminal
        self.started = self.last = self.clock()
        columns = (SpinnerColumn(), BarColumn(), DownloadColumn(), TaskProgressColumn(), TextColumn("{task.description}"),
                   TimeRemainingColumn())
        self.bar = Progress(*columns, console=err, disable=quiet or not self.terminal, transient=True)
        self.task = self.bar.add_task("reading", total=None)

    def __enter__(self) -> Reporter:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    def __call__(self, rows: int, tokens: int, done: int | None, total: int) -> None:
        now = self.clock()
        seconds = max(now - self.started, 1e-9)
        rates = f"{rows:,} rows ({rows / seconds:,.0f}/s), {tokens:,} tokens ({tokens / seconds:,.0f}/s)"
        if self.terminal:
            self.bar.update(self.task, completed=done or 0, total=total or None, description=rates)
            return
        if self.quiet or now - self.last < self.interval:
            return
        self.last = now
        if done:
            left = seconds * (total - done) / done
            eta = f", ETA {int(left // 3600)}:{int(left % 3600 // 60):02d}:{int(left % 60):02d}"
            err.print(f"progress: {done / total:.0%} of the input ({done / 1e6:,.1f} of {total / 1e6:,.1f} MB), "
                      f"{rates}{eta}", highlight=False)
        else:
            err.print(f"progress: {rates}", highlight=False)


def _resume_command() -> str:
    """The command line that finishes this interrupted run: the same, with --resume (and no --overwrite)."""
    import shlex
    import sys

    args = [a for a in sys.argv[1:] if a not in ("--overwrite", "--resume")]
    return shlex.join(["gpu-prep", *args, "--resume"])


def _summary(manifest: dict[str, Any], out_dir: Path) -> None:
    from gpu_prep.run.manifest import summary_warnings

    totals = manifest["totals"]
    seconds = manifest["seconds"]["total"] or 1e-9
    table = Table(title=f"gpu-prep: {out_dir}", show_header=True)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("rows read", f"{totals['rows_read']:,}")
    table.add_row("rows written", f"{totals['rows_written']:,}")
    table.add_row("  of which truncated", f"{totals['rows_truncated']:,}")
    for reason, n in totals["rows_dropped"].items():
        table.add_row(f"dropped: {reason}", f"{n:,}")
    share = totals["trained_tokens"] / totals["tokens"] if totals["tokens"] else 0.0
    table.add_row("tokens written", f"{totals['tokens']:,}")
    table.add_row("trained-token share", f"{share:.1%}")
    table.add_row("tokens per second", f"{totals['tokens'] / seconds:,.0f}")
    table.add_row("seconds", f"{seconds:.2f}")
    table.add_row("device, tokenizer engine", f"{manifest['device']}, {manifest['tokenizer']['engine']}")
    if "cluster" in manifest:
        where = manifest["cluster"]
        table.add_row("Dask cluster", f"{where['workers']} workers at {where['scheduler']}, {where['parts']} parts, "
                      f"{where['ranges']} ranges")
    for name, meta in manifest["domains"].items():
        packed = meta.get("packing")
        what = f"{meta['num_samples']:,} samples" if packed is None else \
            (f"{packed['num_segments']:,} samples in {meta['num_samples']:,} sequences ({packed['strategy']}, "
             f"{packed['padding_share']:.1%} padding)")
        table.add_row(f"domain {name}", f"{what}, {len(meta['shards'])} shard(s)")
    for d in manifest.get("datasets", []):
        asked = "" if d["sampling"] is None else f" (asked {d['sampling']:.0%})"
        dropped = sum(d["rows_dropped"].values())
        unread = f", {d['rows_not_drawn']:,} not drawn" if d.get("rows_not_drawn") else ""
        table.add_row(f"dataset {d['name']}", f"{d['rows_read']:,} read, {d['rows_written']:,} written, {dropped:,} "
                      f"dropped{unread}; {d['share_of_rows']:.1%} of rows, {d['share_of_tokens']:.1%} of tokens{asked}")
    out.print(table)
    for warning in summary_warnings(manifest):
        _warn(warning)


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
        raise _fail(ConfigError("give --output, or --stats-only (which writes nothing), but not both"))
    if stats_only:
        output = Path(tempfile.mkdtemp(prefix="gpu-prep-stats-")) / "out"
    if overwrite and resume:
        raise _fail(ConfigError("--overwrite and --resume contradict each other; pass one"))
    if device not in (None, "auto", "cpu", "gpu"):
        raise _fail(ConfigError(f"--device {device!r} is not allowed; allowed: auto, cpu, gpu"))
    if workers is not None:  # read by HF tokenizers' thread pool when it starts, so set before any tokenizing
        os.environ["RAYON_NUM_THREADS"] = str(workers)
    try:
        load_plugins(plugin or [])
        cfg = load_config(config, set_ or [])
        check_registered(cfg, str(config))
        for warning in [] if quiet else cfg.warnings():
            _warn(warning)
        with Reporter(quiet, progress_interval) as report:
            announce = None if quiet else lambda link: err.print(f"Dask dashboard: {link}", highlight=False)
            options = Options(tokenizer=tokenizer, device=device, chunk_rows=chunk_rows, workers=workers,
                              overwrite=overwrite, resume=resume, rejects=rejects, strict=strict,
                              checkpoint_seconds=checkpoint_every, progress=report,
                              cluster=cluster, announce=announce, warn=None if quiet else _warn,
                              plugins=tuple(plugin or []),
                              part_bytes=int(part_mb * (1 << 20)), config_file=config)
            manifest = run_pipeline(cfg, inputs or [], output, options)
    except GpuPrepError as exc:
        if isinstance(exc, Interrupted):
            err.print(f"resume it with: {escape(_resume_command())}", highlight=False)
        raise _fail(exc) from None
    except KeyboardInterrupt:
        if not stats_only:
            with deaf_to_ctrl_c():  # another press while this is said would only print a traceback
                err.print(f"[yellow]interrupted[/]: what is done is kept; resume it with: "
                          f"{escape(_resume_command())}", highlight=False)
        raise typer.Exit(INTERRUPTED) from None
    except OSError as exc:  # an unwritable output or rejects path, an unreadable input
        raise _fail(GpuPrepError(f"{exc.filename}: {exc.strerror or exc}" if exc.filename else str(exc))) from None
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
        _summary(manifest, output)
    if debug_samples:
        _show_samples(output, None, debug_samples, 0, ids=True, plain=True)
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
        raise _fail(exc) from None
    digest = cfg.sha256()[:12]  # the file's, as run's manifest has it (run's --tokenizer is not part of it)
    if tokenizer is not None:  # what is checked is what run --tokenizer would run
        cfg = cfg.model_copy(update={"tokenizer": cfg.tokenizer.model_copy(update={"name": tokenizer})})
    shown = cfg.model_dump(mode="json")
    shown["tokenizer"]["name"] = cfg.tokenizer.name or DEFAULT_TOKENIZER  # what a run resolves it to
    out.print_json(json.dumps(shown))
    for warning in cfg.warnings():
        _warn(warning)
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
            _warn(warning)
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
                _show_samples(report.out_dir, None, 1, 0, ids=False, plain=not out.is_terminal)
    except GpuPrepError as exc:
        raise _fail(exc) from None
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
        raise _fail(exc) from None
    if output is None:
        import sys

        sys.stdout.write(text)  # as it is: rich would wrap the comments
        return
    if output.exists():
        raise _fail(ConfigError(f"{output} exists; give another --output"))
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
        raise _fail(GpuPrepError(f"{output}: cannot read its statistics: {exc}")) from None
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
    _show_samples(output, domain, samples, start, ids, plain)


def _show_samples(output: Path, domain: str | None, samples: int, start: int, ids: bool, plain: bool) -> None:
    import gpu_prep
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    try:
        dataset = gpu_prep.open_dataset(output)
        manifest = json.loads((output / "manifest.json").read_text(encoding="utf-8"))
        # The copy of the tokenizer that made the shards, which travels with them.
        tok = load_tokenizer(str(output / manifest["tokenizer"]["files"]))
    except (OSError, KeyError, ValueError) as exc:
        raise _fail(GpuPrepError(f"{output}: cannot inspect it: {exc}")) from None
    except GpuPrepError as exc:
        raise _fail(exc) from None
    names = list(dataset)
    if not names:
        out.print(f"{output}: no samples were written", highlight=False)
        return
    if domain is not None and domain not in names:
        raise _fail(ConfigError(f"--domain {domain!r} is not in {output}; domains: {', '.join(names)}"))
    chosen = dataset[domain or names[0]]
    if start >= len(chosen):
        raise _fail(ConfigError(f"--start {start}: {domain or names[0]} holds {len(chosen):,} samples "
                                f"(0 to {len(chosen) - 1:,})"))
    try:
        _print_samples(chosen, domain or names[0], tok, range(start, min(start + samples, len(chosen))), ids, plain)
    except (OSError, KeyError, ValueError) as exc:  # a shard damaged since the run (pyarrow's errors included)
        raise _fail(GpuPrepError(f"{output}: cannot read its samples: {exc}; `gpu-prep verify {output}` checks "
                                 "every file")) from None


def _print_samples(chosen: Any, name: str, tok: Any, indices: range, ids: bool, plain: bool) -> None:
    from gpu_prep.commands.inspect import marked_text, runs

    for k in indices:
        sample_ids, mask = chosen[k]
        bounds = chosen.segments(k)
        packed = f", {len(bounds) - 1} samples packed at {bounds[1:-1].tolist()}" if chosen.packed else ""
        out.print(f"[bold]# {name} sample {k}[/]: {len(sample_ids)} tokens, "
                  f"{int(mask.sum())} trained{packed}", highlight=False)
        if plain:
            out.print(marked_text(tok, sample_ids, mask), markup=False, highlight=False, soft_wrap=True)
        else:
            for trained, text in runs(tok, sample_ids, mask):
                out.print(text, style="bold green" if trained else "dim", end="", markup=False, highlight=False,
                          soft_wrap=True)
            out.print()
        if ids:
            out.print(" ".join(f"{int(i)}{'*' if m else ''}" for i, m in zip(sample_ids, mask)), highlight=False,
                      soft_wrap=True)
            out.print("(* = in the loss)", style="dim")


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
    if not isinstance(code, int):  # SystemExit("message"): printed, and status 1, as the interpreter does
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (| head) or a stream closed
            pass
    os._exit(code)
