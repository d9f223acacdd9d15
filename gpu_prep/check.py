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

from gpu_prep.builders import BuilderTokenizer
from gpu_prep.config import PAIR_TYPES, SHAREGPT_ROLES, TEMPLATE_ROLES, PipelineConfig
from gpu_prep.errors import Drop
from gpu_prep.format import Conversation, detect_schema, registered
from gpu_prep.mix import config_rows
from gpu_prep.read import LeftOut, first_rows, read_chunks, sample_shares
from gpu_prep.run.context import DEFAULT_TOKENIZER, dataset_sources, run_inputs
from gpu_prep.run.stages import format_rows
from gpu_prep.tokenizer import load_tokenizer


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
    # Each file's rows are built as the run builds them (stages.format_rows), with its dataset's own config,
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
            if chunk.records[drop.row] is None or drop.row in chunk.errors or drop.reason == Drop.SKIPPED_BY_BUILDER:
                continue
            cfg = sources.get(chunk.file_index[drop.row], (config, None))[0]
            report.failed[drop.reason] += 1
            report.first_failure.setdefault(drop.reason, drop.detail)
            report.failed_type.setdefault(drop.reason, cfg.input.type)
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


def _starter_roles(records: list[Any], kind: str) -> str:
    """The input.roles a starter config needs for chat or sharegpt rows whose roles the default mapping does
    not know (a ShareGPT bot, say): the default written out whole (a mapping given replaces it), each other
    role under the template role its name is in another case (USER), else a ShareGPT name stands for, else
    by where it stands: turns alternate from the user's after any system message, so a role found mostly
    in second place of a pair is the assistant's."""
    if kind not in ("chat", "sharegpt"):
        return ""
    key, role_key = ("conversations", "from") if kind == "sharegpt" else ("messages", "role")
    mapping = {t: list(s) for t, s in (SHAREGPT_ROLES if kind == "sharegpt" else {}).items()}
    known = {source for sources in mapping.values() for source in sources} | set(TEMPLATE_ROLES)
    named = {source: target for target, sources in SHAREGPT_ROLES.items() for source in sources}
    seen: Counter = Counter()
    second: Counter = Counter()  # in second place of a user-assistant pair
    for record in records:
        turns = record.get(key) if isinstance(record, dict) else record
        roles = [t.get(role_key) for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []
        roles = [r for r in roles if isinstance(r, str)]
        for place, role in enumerate(r for r in roles if r.lower() != "system"):
            if role not in known:
                seen[role] += 1
                second[role] += place % 2
    if not seen:
        return ""
    for role in seen:
        target = named.get(role.lower()) or ("assistant" if second[role] * 2 > seen[role] else "user")
        mapping.setdefault(target, []).append(role)
    lines = "".join(f"\n    {target}: [{', '.join(sources)}]" for target, sources in mapping.items())
    return (f"\n  # The rows hold roles the default mapping does not know ({', '.join(seen)}), placed here by their "
            "name\n  # or where they stand in the conversations: check them. A mapping given replaces the default "
            f"whole,\n  # so it is written out whole.\n  roles:{lines}")


# What each input type trains by default in a starter config, with a comment saying why.
_STARTER_MASK = {
    "chat": ("{assistant: train}", "the assistant's turns (and the end-of-turn token closing each)"),
    "sharegpt": ("{assistant: train}", "the assistant's turns (gpt/model rows are mapped to assistant)"),
    "instruction": ("{prompt: mask, response: train}", "the response; the prompt is context"),
    "alpaca": ("{prompt: mask, response: train}", "the output; the instruction and input are context"),
    "segments": ("{}", "the segments whose own label says train"),
    "text": ("{}", "every token (pretraining text ignores mask)"),
    "pretokenized": ("{}", "what the rows' labels say"),
    "preference": ("{}", "each pair's chosen and rejected completions; the prompt never"),
    "kto": ("{}", "each row's completion; the prompt never"),
}

# The starter's comments on dedup and truncation, and its storage: preference and kto rows in TRL's columns,
# which the README's DPOTrainer and KTOTrainer recipes read.
_PAIR_STARTER = ("rows equal to an earlier row (prompt, completions, label) are dropped",
                 "completions are cut (truncation: right | drop)", "parquet      # TRL's columns; or bin")
_ROW_STARTER = ("rows whose first 200 characters repeat an earlier row's are dropped",
                "longer rows are cut (truncation: right | left | drop | split | structured)",
                "bin          # bin | h5 | megatron | parquet")


def starter_config(inputs: list[str], tokenizer: str | None, rows: int = 50) -> str:
    """A config for these inputs, commented, ready to run: the input type their first rows' keys say
    (or auto, when they differ), and what that type trains."""
    from gpu_prep.config import parse_config

    files, _ = run_inputs(parse_config({}), inputs)
    base = parse_config({"input": {"type": "auto"}})
    kinds: Counter = Counter()
    seen, records = 0, []
    for chunk in read_chunks(files, rows, max_items=rows):
        for record in chunk.records:
            seen += 1
            if record is not None:
                kinds[detect_schema({"messages": record} if isinstance(record, list) else record, base)] += 1
                records.append(record)
    found = {k: n for k, n in kinds.items() if k is not None}
    if not found:
        from gpu_prep.errors import ConfigError

        raise ConfigError(f"none of the first {seen} rows of {', '.join(inputs)} has a shape gpu-prep knows "
                          "(messages, conversations, prompt+response, instruction+output, text, input_ids)")
    kind = max(found, key=found.get) if len(found) == 1 else "auto"
    mask, why = _STARTER_MASK.get(kind, ("{assistant: train, response: train}", "assistant turns and responses"))
    shapes = ", ".join(f"{k} {n}" for k, n in sorted(found.items(), key=lambda item: -item[1]))
    dedup, cut, storage = _PAIR_STARTER if kind in PAIR_TYPES else _ROW_STARTER
    return f"""# gpu-prep config written by `gpu-prep init` from the first {seen} rows of {', '.join(inputs)}
# (shapes found: {shapes}). Run it with: gpu-prep run -c THIS_FILE {' '.join(inputs)} -o out/
# Check it against the data first with: gpu-prep validate -c THIS_FILE {' '.join(inputs)}
version: 1
# A tokenizer folder, a bundled name (qwen2.5, qwen3, bert-uncased) or a hub model id.
tokenizer: {tokenizer or "qwen2.5"}
# The tokenizer's own chat template; or a name (chatml, llama3, mistral, ...), a .jinja file.
chat_template: tokenizer_default
input:
  type: {kind}{_starter_roles(records, kind)}
# What is trained: {why}.
mask: {mask}
preprocessing:
  max_seq_len: 2048            # {cut}
  deduplicate: true            # {dedup}
  # fuzzy_dedup: {{}}            # also drop near-duplicates (MinHash + LSH over word 5-grams, Jaccard 0.8)
  min_chars: 1
output:
  storage_format: {storage}
"""
