"""A config checked against a sample of the data it will run on (`gpu-prep validate -c CONFIG DATA...`).

Reads the first rows, builds them as the config says, and finds what a schema check cannot: mask rules for
roles the data never has (a typo, with the closest role that is there), roles no rule names, rows the
input type cannot read (and the type their keys suggest). The sample is then run for real into a folder
that is deleted, so the tokenizer loads, the template renders and the drop reasons are the run's own.
"""

from __future__ import annotations

import difflib
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_prep.format.contract import BuilderTokenizer
from gpu_prep.config import TEMPLATE_ROLES, PipelineConfig
from gpu_prep.errors import Drop
from gpu_prep.format import Conversation, detect_schema, registered
from gpu_prep.read.mix import config_rows
from gpu_prep.read.inputs import LeftOut
from gpu_prep.read.rows import first_rows, read_chunks, sample_shares
from gpu_prep.run.context import DEFAULT_TOKENIZER, dataset_sources, run_inputs
from gpu_prep.run.prepare import format_rows
from gpu_prep.tokenization.tokenizer import load_tokenizer


@dataclass
class SampleReport:
    rows: int = 0
    roles: Counter = field(default_factory=Counter)  # messages by role (after input.roles)
    failed: Counter = field(default_factory=Counter)  # reason -> rows the input type could not build
    first_failure: dict[str, str] = field(default_factory=dict)
    failed_type: dict[str, str] = field(default_factory=dict)  # reason -> the input type that first failed so
    suggested: Counter = field(default_factory=Counter)  # the type each unreadable row's keys suggest
    errors: list[str] = field(default_factory=list)  # mistakes: validate fails
    warnings: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    out_dir: Path | None = None
    shares: list[int] | None = None  # the rows of each input in the sample (None: a mix's first rows)
    sample: int = 0  # the rows read (run_sample runs as many)


def check_sample(config: PipelineConfig, inputs: list[str], sample: int) -> SampleReport:
    """What a sample of about `sample` rows says of the config (without datasets: the first rows of each
    input, by its share of the input: read.sample_shares)."""
    report = SampleReport()
    left_out = LeftOut()
    files, datasets = run_inputs(config, inputs, left_out)
    report.warnings.extend(left_out.warnings())
    # Each file's rows are built as the run builds them (prepare.format_rows), with its dataset's own config,
    # in the order the run takes them (a mix's, with the datasets' data handlers run), so the sample is the
    # sample run's.
    sources = dataset_sources(config, datasets) if datasets else {}
    takes = any(registered(c.input.type).takes_tokenizer for c in config.all_configs() if c.input.type != "auto")
    tokenizer = _builder_tokenizer(config) if takes else None
    rows = config_rows(config, datasets)
    if rows is None:  # the inputs in order: the first rows of each (a mix: its first rows, in its order)
        report.shares = sample_shares(files, sample)
        rows, sample = first_rows(files, report.shares), sum(report.shares)
    report.sample = sample
    for chunk in read_chunks(files, 256, max_items=sample, rows=rows):
        report.rows += len(chunk)
        formatted = format_rows(chunk, config, sources, tokenizer)
        for drop in formatted.drops:
            # Lines that are no row (not JSON, say) are the sample run's to report; a builder's own choice
            # to skip a row is no row it cannot read.
            reason, detail = drop.why
            if chunk.records[drop.row] is None or drop.row in chunk.errors or reason == Drop.SKIPPED_BY_BUILDER:
                continue
            cfg = sources.get(chunk.file_index[drop.row], (config, None))[0]
            report.failed[reason] += 1
            report.first_failure.setdefault(reason, detail)
            report.failed_type.setdefault(reason, cfg.input.type)
            record = drop.record
            report.suggested[detect_schema(record, cfg) if isinstance(record, dict) else None] += 1
        for shape in formatted.rows.payload:
            if isinstance(shape, Conversation):
                report.roles.update(m["role"] for m in shape.messages)
    _judge(config, report)
    return report


def _builder_tokenizer(config: PipelineConfig) -> BuilderTokenizer:
    """The run's tokenizer, for a plugin's builder that takes one."""
    return BuilderTokenizer(load_tokenizer(config.tokenizer.name or DEFAULT_TOKENIZER, config.tokenizer.revision))


def _judge(config: PipelineConfig, report: SampleReport) -> None:
    built = report.rows - sum(report.failed.values())
    if report.failed:
        (reason, n), = report.failed.most_common(1)
        hint = report.suggested.most_common(1)[0][0] if report.suggested else None
        kind = report.failed_type.get(reason, config.input.type)
        message = (f"input.type {kind}: {sum(report.failed.values())} of {report.rows} sample rows "
                   f"cannot be read ({reason}: {report.first_failure[reason]})")
        if hint and hint != kind:
            message += f"; their keys look like input.type {hint!r}"
        (report.errors if built == 0 else report.warnings).append(message)
    if not report.roles:
        return
    known = set(report.roles) | set(TEMPLATE_ROLES)
    named = [(f"mask.{role}", role) for role in config.mask] + \
        [(f"input.roles_to_train: {role}", role) for role in config.input.roles_to_train]
    for key, role in named:
        if role in report.roles or role in ("prompt", "response"):
            continue
        close = difflib.get_close_matches(role, sorted(known), n=1, cutoff=0.6)
        if close and close[0] not in {r for _, r in named}:
            report.errors.append(f"{key}: no message of the sample has role {role!r}; did you mean "
                                 f"{close[0]!r}? (roles in the data: {', '.join(sorted(report.roles))})")
        else:
            report.warnings.append(f"{key}: no message of the sample has role {role!r} "
                                   f"(roles in the data: {', '.join(sorted(report.roles))})")
    for role in sorted(report.roles):
        # (context roles masked by default are what everyone expects: no word about them)
        expected = role in ("system", "user", "tool") and config.mask_default == "mask"
        if role not in config.mask and role not in config.input.roles_to_train and not expected:
            report.warnings.append(f"role {role!r} ({report.roles[role]} messages) has no mask rule: mask_default "
                                   f"{config.mask_default!r} applies")


def run_sample(config: PipelineConfig, inputs: list[str], report: SampleReport) -> None:
    """The sample run for real (tokenizer, template, masks, drop reasons) of the rows check_sample read
    (report.shares), into a folder kept for showing a sample; the caller removes it (remove_sample)."""
    from gpu_prep.pipeline import Options, run

    out = Path(tempfile.mkdtemp(prefix="gpu-prep-validate-")) / "out"
    limited = config.model_copy(update={"preprocessing": config.preprocessing.model_copy(
        update={"max_items": report.sample})})
    said: list[str] = []  # what run tells before it starts (check_sample has the inputs' own already)
    report.manifest = run(limited, inputs, out, Options(overlap=False, per_file=report.shares, warn=said.append))
    report.out_dir = out
    # What would make `run` fail on these rows fails the check too: no row written, or too many dropped;
    # and an input none of whose sample rows could be read (a file of another shape, whatever its size).
    from gpu_prep.run.manifest import WHOLE_FILE_ROWS, run_problems, summary_warnings, unreadable_inputs

    report.errors.extend(f"the sample run: {problem} (run would exit non-zero)"
                         for problem in run_problems(report.manifest, config, sample=True))
    report.warnings.extend(f"the sample run: {w}" for w in said + summary_warnings(report.manifest)
                           if w not in report.warnings)
    for entry, said in unreadable_inputs(report.manifest):  # fewer rows than run fails on (a bad first line)
        if entry["rows_read"] < WHOLE_FILE_ROWS:
            report.warnings.append(f"input {entry['path']!r}: none of its {entry['rows_read']} sample rows can be read "
                                   f"({said}); raise --sample to read more of it")


def remove_sample(report: SampleReport) -> None:
    if report.out_dir is not None:
        shutil.rmtree(report.out_dir.parent, ignore_errors=True)
