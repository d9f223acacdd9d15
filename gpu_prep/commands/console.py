"""What the commands print: the two consoles, warning and error lines, a run's progress and its summary,
and samples as text with their trained tokens marked. cli.py parses the arguments and prints through these.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from gpu_prep.errors import ConfigError, GpuPrepError

err = Console(stderr=True, soft_wrap=True)  # error lines stay whole, for grep and for logs
# Off a terminal (a log, a pipe) rich would lay output out in 80 columns, cutting tables' numbers to "…" and
# commands in two: lines stay whole there, and tables get room (COLUMNS, where set, still decides).
_PIPED = not sys.stdout.isatty() and "COLUMNS" not in os.environ
out = Console(soft_wrap=_PIPED, width=200 if _PIPED else None)


def warn(message: str) -> None:
    """A warning line on stderr."""
    err.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)


def fail(exc: GpuPrepError) -> typer.Exit:
    """The error line on stderr, and the exit (with the error's code) for the caller to raise."""
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
    return typer.Exit(exc.exit_code)


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


def resume_command() -> str:
    """The command line that finishes this interrupted run: the same, with --resume (and no --overwrite)."""
    import shlex

    args = [a for a in sys.argv[1:] if a not in ("--overwrite", "--resume")]
    return shlex.join(["gpu-prep", *args, "--resume"])


def run_summary(manifest: dict[str, Any], out_dir: Path) -> None:
    """The table a finished run prints (rows, drops, tokens, speed, domains, datasets), then its warnings."""
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
        warn(warning)



def show_samples(output: Path, domain: str | None, samples: int, start: int, ids: bool, plain: bool) -> None:
    """Samples of a run's output as text, decoded by the tokenizer copy that travels with the shards."""
    import gpu_prep
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    try:
        dataset = gpu_prep.open_dataset(output)
        manifest = json.loads((output / "manifest.json").read_text(encoding="utf-8"))
        # The copy of the tokenizer that made the shards, which travels with them.
        tok = load_tokenizer(str(output / manifest["tokenizer"]["files"]))
    except (OSError, KeyError, ValueError) as exc:
        raise fail(GpuPrepError(f"{output}: cannot inspect it: {exc}")) from None
    except GpuPrepError as exc:
        raise fail(exc) from None
    names = list(dataset)
    if not names:
        out.print(f"{output}: no samples were written", highlight=False)
        return
    if domain is not None and domain not in names:
        raise fail(ConfigError(f"--domain {domain!r} is not in {output}; domains: {', '.join(names)}"))
    chosen = dataset[domain or names[0]]
    if start >= len(chosen):
        raise fail(ConfigError(f"--start {start}: {domain or names[0]} holds {len(chosen):,} samples "
                                f"(0 to {len(chosen) - 1:,})"))
    try:
        _print_samples(chosen, domain or names[0], tok, range(start, min(start + samples, len(chosen))), ids, plain)
    except (OSError, KeyError, ValueError) as exc:  # a shard damaged since the run (pyarrow's errors included)
        raise fail(GpuPrepError(f"{output}: cannot read its samples: {exc}; `gpu-prep verify {output}` checks "
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
