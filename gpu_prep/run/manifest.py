"""manifest.json: what a run made, from what, and where every row went; and the tokenizer copied beside the
shards, whose files it hashes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_prep import __version__
from gpu_prep.config import PAIR_TYPES, TEMPLATE_ROLES, PipelineConfig
from gpu_prep.errors import Drop
from gpu_prep.read.mix import Dataset
from gpu_prep.output import pack
from gpu_prep.mask.pairs import PAIR_COUNTS
from gpu_prep.durable import copy_atomic, manifest_checksum, sha256_file, write_atomic, written_files
from gpu_prep.run.accounting import Accounting
from gpu_prep.read.inputs import LeftOut
from gpu_prep.run.context import RunContext
from gpu_prep.tokenization.tokenizer import COPY_DIR, Tokenizer


LEFT_OUT_LISTED = 100  # an input folder's unread files the manifest names (it counts them all)
# A max_seq_len that suits the data cuts its long tail; one that cuts more than this share of the rows
# written is shorter than the typical row, which is rarely meant (a typo, a value from another run).
TRUNCATED_SHARE = 0.5
# Exact copies are a small share of most curated SFT sets; past this share of the rows read (and this many
# rows, so a small file's one or two repeats say nothing), rows dropped as repeats of an earlier row's first
# characters more often share a long opening (an instruction, a passage).
PREFIX_DUPLICATE_SHARE, PREFIX_DUPLICATE_ROWS = 0.05, 10
WHOLE_ROW_TYPES = PAIR_TYPES | {"pretokenized"}  # input types dedup hashes whole, whatever the prefix


@dataclass
class Outcome:
    """What processing a run's chunks gives: its accounting, the domains written (meta.json of each) and
    what the manifest says of a cluster (empty: none)."""

    acct: Accounting
    domains: dict[str, Any]
    cluster: dict[str, Any] = field(default_factory=dict)
    leftovers: list[Path] = field(default_factory=list)  # temporaries to remove once the manifest is written
    engine_check: dict[str, Any] | None = None  # the fast engine's check against HF over every chunk written


def build_manifest(run: RunContext, outcome: Outcome, identity: dict[str, Any], checksums: list[str],
                   seconds: dict[str, float], out_dir: Path, left_out: LeftOut) -> dict[str, Any]:
    """identity: the config's sha256 and the tokenizer's identity (hashed once a run); seconds: timings;
    left_out: what the input folders hold that is not read. The manifest lists every file of the output with
    its size, and carries its own checksum."""
    config, acct, tok = run.config, outcome.acct, run.tok
    packing = config.preprocessing.packing != "none"
    domains = outcome.domains
    files = written_files(out_dir)
    manifest = {
        "gpu_prep_version": __version__,
        "config": config.model_dump(mode="json"),
        "config_sha256": identity["config_sha256"],
        # The engine is chosen during the run, on its first rows.
        "tokenizer": {**identity["tokenizer"], **run.tokenizer_summary(), "engine": tok.active.name,
                      "engine_choice": tok.engine_choice,
                      # The fast engine's check against HF, all the way through (None: HF ran).
                      "engine_check": outcome.engine_check},
        "chat_template": chat_template_summary(run),
        "device": outcome.cluster.get("device", run.backend.name),
        **({"cluster": outcome.cluster} if outcome.cluster else {}),
        "inputs": acct.per_file(checksums),
        **({"inputs_left_out": left_out_summary(left_out)} if left_out else {}),
        "totals": {**acct.totals(), **({"splits": split_totals(config.output.splits, acct, domains)}
                                       if config.output.splits else {}),
                   **({"preference": {k: acct.pairs.get(k, 0) for k in PAIR_COUNTS}}
                      if config.input.type in PAIR_TYPES else {})},
        **({"datasets": dataset_totals(config, run.datasets, acct)} if run.datasets is not None else {}),
        "dropped_examples": acct.examples,
        **({"packing": pack.summary([{"num_samples": m["num_samples"], **m["packing"]} for m in domains.values()],
                                    config.preprocessing.max_seq_len)} if packing else {}),
        **({"fuzzy_dedup": _lsh(config)} if config.preprocessing.fuzzy_dedup is not None else {}),
        "domains": domains,
        "files": files,
        # The tokenizer copied beside the shards, which trainers load: its files' sha256 (shards have theirs
        # in meta.json), so that verify finds an edit that keeps a file's size.
        "tokenizer_files": {name: sha256_file(out_dir / name) for name in files if name.startswith(f"{COPY_DIR}/")},
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
    }
    return {**manifest, "manifest_sha256": manifest_checksum(manifest)}


def copy_tokenizer(tok: Tokenizer, out_dir: Path, template: str | None) -> None:
    """The tokenizer's files into out_dir/tokenizer, so a trainer loads the exact tokenizer that made the
    shards; the chat template the run used goes in as chat_template.jinja, where it is not the tokenizer's."""
    target = out_dir / COPY_DIR
    for path in tok.files():
        destination = target / path.relative_to(tok.directory)
        destination.parent.mkdir(parents=True, exist_ok=True)
        copy_atomic(path, destination)
    if template is not None and template != tok.chat_template:
        write_atomic(target / "chat_template.jinja", template.encode("utf-8"))


def left_out_summary(left_out: LeftOut) -> dict[str, Any]:
    """By folder: its files not read (counted, the first named), or the split read and the others."""
    files = {folder: {"files": len(names), "first": names[:LEFT_OUT_LISTED]}
             for folder, names in left_out.files.items()}
    splits = {folder: {"split_read": read, "splits_not_read": others}
              for folder, (read, others) in left_out.splits.items()}
    return {**files, **splits}


def _lsh(config: PipelineConfig) -> dict[str, Any]:
    """The LSH banding near-duplicate removal used (bands of rows, chosen for the threshold or given), and
    the similarity at which two rows share a band with probability one half."""
    from gpu_prep.filter.fuzzy import MinHasher

    hasher = MinHasher.from_config(config.preprocessing.fuzzy_dedup)
    return {"bands": hasher.bands, "rows_per_band": hasher.rows, "permutations_used": hasher.bands * hasher.rows,
            "similarity_at_half": round((1 - 0.5 ** (1 / hasher.bands)) ** (1 / hasher.rows), 4)}


def split_totals(shares: dict[str, float], acct: Accounting, domains: dict[str, Any]) -> dict[str, Any]:
    """Per split (output.splits): its share, the rows written to it, and its samples and tokens."""
    totals = {}
    for name, share in shares.items():
        metas = [m for m in domains.values() if m.get("split") == name]
        totals[name] = {"share": share, "rows_written": acct.rows_by_split.get(name, 0),
                        **{k: sum(m[k] for m in metas) for k in ("num_samples", "num_tokens", "num_trained_tokens")}}
    return totals


def chat_template_summary(run: RunContext) -> dict[str, Any]:
    """Where the chat template came from, its sha256, and what said which text is trained: the template's
    {% generation %} markers or role spans."""
    render = run.render
    if render.template is None or render.template_source is None:
        return {"source": "none"}
    marked = render.generation and render.template.marked
    return {**render.template_source.describe(), "mask_method": "generation" if marked else "roles"}


def dataset_totals(config: PipelineConfig, datasets: list[Dataset], acct: Accounting) -> list[dict[str, Any]]:
    """Per dataset: rows read, written and dropped by reason, tokens written, and the share of the output's
    rows and tokens it makes beside the sampling ratio asked for."""
    rows_out = sum(c.rows_written for c in acct.counts) or 1
    tokens_out = sum(acct.tokens_by_file) or 1
    out = []
    for k, (spec, dataset) in enumerate(zip(config.datasets or [], datasets)):
        counts = [acct.counts[f.index] for f in dataset.files]
        dropped: Counter = Counter()
        for c in counts:
            dropped.update(c.dropped)
        written = sum(c.rows_written for c in counts)
        tokens = sum(acct.tokens_by_file[f.index] for f in dataset.files)
        read = sum(c.rows_read for c in counts)
        # A weighted mix that stops once a dataset is through (first_exhausted; or max_items) leaves the
        # others' later rows unread: counted, so that every row of the inputs is accounted for.
        counted = read if dataset.rows_counted is None else dataset.rows_counted
        out.append({"name": spec.name, "input_type": config.dataset_config(k).input.type,
                    "files": [f.path for f in dataset.files], "sampling": spec.sampling, "rows_read": read,
                    "rows_not_drawn": max(0, counted - read), "rows_drawn_again": max(0, read - counted),
                    "rows_written": written,
                    "rows_dropped": dict(sorted(dropped.items())), "tokens": tokens,
                    "share_of_rows": written / rows_out, "share_of_tokens": tokens / tokens_out})
    return out


WHOLE_FILE_ROWS = 3  # an input of at least this many rows, none of which could be read, fails the run
# Why a row cannot be read as the config says (its keys, types or JSON), as against a template's or a
# builder's refusal of it.
UNREADABLE = frozenset({Drop.MALFORMED_JSON, Drop.MALFORMED_ROW, Drop.NOT_AN_OBJECT, Drop.MISSING_FIELD,
                        Drop.WRONG_TYPE, Drop.UNKNOWN_SCHEMA})


def unreadable_inputs(manifest: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """The inputs that wrote no row, every row read dropped as one that could not be read (UNREADABLE), each
    with its drops in words."""
    return [(entry, ", ".join(f"{r} {n:,}" for r, n in sorted(entry["rows_dropped"].items())))
            for entry in manifest.get("inputs", [])
            if entry["rows_read"] and not entry["rows_written"] and set(entry["rows_dropped"]) <= UNREADABLE]


def run_problems(manifest: dict[str, Any], config: PipelineConfig, sample: bool = False) -> list[str]:
    """Why a finished run is not useful (empty: it is): no rows written, a dataset of a mix that wrote
    none, or more rows dropped than preprocessing.max_drop_share allows. sample: the run read only the
    first rows (validate), so a dataset it did not reach is no problem."""
    totals = manifest["totals"]
    problems = []
    if totals["rows_written"] == 0:
        empty = [i["path"] for i in manifest.get("inputs", []) if i["rows_read"] == 0]
        said = f"; no row in {', '.join(map(repr, empty[:3]))}{' ...' if len(empty) > 3 else ''}" if empty else ""
        problems.append(f"no rows were written (of {totals['rows_read']:,} read{said})")
    for d in manifest.get("datasets", []):
        unread = d["rows_read"] == 0 and (sample or d.get("sampling") == 0)  # not reached, or weighted 0 on purpose
        if d["rows_written"] == 0 and totals["rows_written"] and not unread:
            dropped = ", ".join(f"{r} {n:,}" for r, n in d["rows_dropped"].items()) or "none"
            problems.append(f"dataset {d['name']!r} wrote no rows (of {d['rows_read']:,} read; dropped: {dropped})")
    for entry, said in unreadable_inputs(manifest) if totals["rows_written"] else []:
        # (a Parquet or CSV file without the columns is refused up front; a JSON file is only seen once read)
        if entry["rows_read"] >= WHOLE_FILE_ROWS:
            problems.append(f"input {entry['path']!r} wrote no rows: none of its {entry['rows_read']:,} rows could be "
                            f"read ({said}); are they of the input type and keys the config names?")
    # Rows written without messages of a role the template does not know (ShareGPT's human or function_call
    # left out of a partial input.roles, OpenAI's developer): training data with turns missing, a mapping to fix.
    for role, n in totals.get("messages_left_out_by_template", {}).items():
        if role not in TEMPLATE_ROLES:
            problems.append(f"the chat template left out {n:,} message(s) with role {role!r}, which is not one of "
                            f"{', '.join(TEMPLATE_ROLES)}: their rows were written without them; map the role with "
                            "input.roles (giving input.roles replaces the default ShareGPT mapping: list every role)")
    dropped = sum(totals["rows_dropped"].values())
    limit = config.preprocessing.max_drop_share
    if totals["rows_written"] and totals["rows_read"] and dropped / totals["rows_read"] > limit:
        problems.append(f"{dropped / totals['rows_read']:.0%} of the rows read were dropped, over "
                        f"preprocessing.max_drop_share {limit:g}")
    return problems


def truncation_warning(manifest: dict[str, Any]) -> str | None:
    """Why a run that cut most of its rows to max_seq_len may not be what was meant (None: it cut few, or
    truncation split cut them into windows, which is what it is for)."""
    totals, rules = manifest["totals"], manifest["config"]["preprocessing"]
    cut, written = totals["rows_truncated"], totals["rows_written"]
    if rules["truncation"] == "split" or not written or cut / written <= TRUNCATED_SHARE:
        return None
    return (f"{cut:,} of the {written:,} rows written ({cut / written:.0%}) were cut to preprocessing.max_seq_len "
            f"({rules['max_seq_len']:,} tokens, truncation {rules['truncation']}): most rows are longer than that; "
            "check max_seq_len (the manifest counts them in totals.rows_truncated)")


def duplicate_warning(manifest: dict[str, Any]) -> str | None:
    """Why many rows dropped as duplicates by their first characters may not all be repeats (None: few were,
    or dedup hashed whole texts or whole rows)."""
    totals, config = manifest["totals"], manifest["config"]
    prefix, read = config["preprocessing"]["dedup_prefix_chars"], totals["rows_read"]
    parts = manifest.get("datasets") or [{"input_type": config["input"]["type"], "rows_dropped": totals["rows_dropped"]}]
    # A mix's own repeats (all_exhausted draws the smaller datasets again) are duplicates whatever dedup compares.
    dropped = sum(max(0, d["rows_dropped"].get("duplicate", 0) - d.get("rows_drawn_again", 0))
                  for d in parts if d["input_type"] not in WHOLE_ROW_TYPES)
    if prefix is None or dropped < PREFIX_DUPLICATE_ROWS or dropped / read <= PREFIX_DUPLICATE_SHARE:
        return None
    return (f"{dropped:,} of the {read:,} rows read ({dropped / read:.0%}) were dropped as duplicates of an earlier "
            f"row's first {prefix:,} characters: if rows share a long opening (an instruction, a passage) and "
            "differ after it, preprocessing.dedup_prefix_chars: null compares whole texts and keeps them")


def summary_warnings(manifest: dict[str, Any]) -> list[str]:
    """What the run summary (and validate's sample run) warns of, from the manifest's counts."""
    return [*_output_warnings(manifest), *_row_warnings(manifest), *_render_warnings(manifest)]


def _output_warnings(manifest: dict[str, Any]) -> list[str]:
    """What the output left out that may not be meant: rows cut or dropped as duplicates, a split that got no
    rows, a mix's rows never drawn."""
    totals = manifest["totals"]
    said = [w for w in (truncation_warning(manifest), duplicate_warning(manifest)) if w]
    for split, counts in totals.get("splits", {}).items():
        if counts["rows_written"] == 0:
            said.append(f"split {split!r} (a {counts['share']:.0%} share) got none of the {totals['rows_written']:,} "
                        "rows written: it has no folder, and a loader asking for it will fail; raise its share or "
                        "give the run more rows")
    if manifest["config"].get("dataprocessor", {}).get("sampling_stopping_strategy") == "first_exhausted" and \
            manifest["config"]["preprocessing"].get("max_items") is None:
        # (.get: a manifest of a run finished before these were counted, returned by --resume)
        said.extend(f"dataset {d['name']!r}: {d['rows_not_drawn']:,} of its {d['rows_read'] + d['rows_not_drawn']:,} "
                    "rows were not drawn: sampling_stopping_strategy first_exhausted ends the mix once one dataset is "
                    "through (all_exhausted draws every row, repeating the smaller datasets)"
                    for d in manifest.get("datasets", []) if d.get("rows_not_drawn") and d["sampling"] != 0)
    return said


def _row_warnings(manifest: dict[str, Any]) -> list[str]:
    """What rows hold that the config does not read as they mean it: preference pairs that teach nothing,
    OpenAI's per-message weights, roles no mapping names."""
    report = manifest["totals"].get("parse_report", {})
    said: list[str] = []
    if n := report.get("identical_completions"):
        said.append(f"{n:,} preference pair(s) have the same chosen and rejected completion (written, as TRL keeps "
                    "them): a preference loss learns nothing from them")
    if n := report.get("message_weight_not_read"):
        said.append(f"{n:,} message(s) carry a 'weight' key (OpenAI's per-message training flag), which this run does "
                    f"not read (input.message_training_key is {manifest['config']['input']['message_training_key']!r}): "
                    "set input.message_training_key: weight to mask the turns weighted 0")
    for role, n in report.get("unknown_roles", {}).items():
        said.append(f"{n:,} message(s) with role {role!r}, which is not one of {', '.join(TEMPLATE_ROLES)} (map it "
                    "with input.roles)")
    return said


def _render_warnings(manifest: dict[str, Any]) -> list[str]:
    """Where the rendered, trained text differs from what the rows hold: text, reasoning and tool calls the
    chat template leaves out or moves, system prompts taken from a field, prompts that part otherwise."""
    totals = manifest["totals"]
    report = totals.get("parse_report", {})
    said: list[str] = []
    for role, n in totals.get("messages_left_out_by_template", {}).items():
        if role in TEMPLATE_ROLES:  # (those of other roles are run_problems' errors)
            said.append(f"the chat template left out the content of {n:,} message(s) with role {role!r} (text beside "
                        "tool calls that it writes alone, as Llama 3.1's and Mistral's do, say): their rows were "
                        "rendered and trained without that text")
    if n := report.get("reasoning_not_rendered"):
        said.append(f"the chat template wrote none of the reasoning of {n:,} row(s) (it shows no reasoning): they "
                    "were rendered without it: use a template that shows it (qwen3), or input.think_mode: drop to "
                    "leave it out knowingly")
    if n := report.get("think_blocks_not_rendered"):
        said.append(f"the chat template wrote nothing of the <think> block in the content of {n:,} message(s) (a "
                    "template that strips reasoning, as Qwen3's does before the last user turn and DeepSeek R1's in "
                    "every turn): they were rendered and trained without it")
    if n := report.get("think_blocks_trained"):
        said.append(f"{n:,} trained message(s) hold a <think> block in their content, trained as content although "
                    "input.think_loss is false (it masks reasoning given as reasoning_content): set "
                    "input.extract_think_tags: true to read a leading block as the turn's reasoning")
    config = manifest["config"]["input"]
    # (a mix's datasets have their own input types: the count is not the chat rows')
    if (n := report.get("system_from_field")) and config["type"] == "chat" and config.get("field_system") \
            and not manifest["config"].get("datasets"):
        said.append(f"{n:,} chat row(s) took their system prompt from the row's {config['field_system']!r} field "
                    "(input.field_system), in place of the template's default one; if that field is not a system "
                    "prompt (a model's name, say), set input.field_system: null")
    if n := report.get("tool_calls_not_trained"):
        said.append(f"the chat template writes the tool calls of {n:,} assistant turn(s) before their content in a "
                    "way gpu-prep could not place (DeepSeek R1's distills do so in a row of several calls): those calls "
                    "were written untrained; use a template that writes calls after the content (DeepSeek V3.1's, "
                    "say)")
    if n := report.get("input_field_not_read"):
        said.append(f"{n:,} preference row(s) with a string prompt hold a non-empty {config.get('field_input') or 'input'!r} "
                    "field, which was not read (LLaMA-Factory's alpaca ranking rows keep the query there): set "
                    "input.alpaca_render: chat_template to join it to the prompt and render the rows with the chat "
                    "template, as LLaMA-Factory does")
    if n := report.get("think_blocks_untouched"):
        said.append(f"{n:,} message(s) hold a <think> block in their content, which input.think_mode drop and "
                    "input.think_max_tokens leave as it is: they act on reasoning given apart (reasoning_content); "
                    "set input.extract_think_tags: true to read a leading block as the turn's reasoning")
    if n := totals.get("preference", {}).get("generation_prompt_differs"):
        said.append(f"the chat template renders the generation prompt of {n:,} row(s) otherwise than prompt + "
                    "completion begins (Gemma 4's empty thought channel, say); as TRL does, those prompts end where "
                    "the two part, so the model is trained on a context that differs from the one it sees at "
                    "inference")
    for role, n in report.get("trained_roles_not_marked_by_template", {}).items():
        said.append(f"the mask rules train role {role!r}, but the chat template's {{% generation %}} markers never "
                    f"mark it ({n:,} message(s) left untrained); set input.mask_method: roles to train it by role "
                    "spans")
    return said


def drop_lines(manifest: dict[str, Any]) -> list[str]:
    """Each drop reason with its count and its first example (file:line and the rule)."""
    lines = []
    for reason, n in manifest["totals"]["rows_dropped"].items():
        example = (manifest["dropped_examples"].get(reason) or [{}])[0]
        where = f"{example['file']}:{example['line']}: {example['detail']}" if example else ""
        lines.append(f"{reason}: {n:,} row(s); first {where}")
    return lines
