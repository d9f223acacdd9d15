"""A starter config for the data given (`gpu-prep init DATA... -o config.yaml`): the input type the first
rows' keys say, what that type trains, and the roles the default mapping lacks, each commented."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpu_prep.config import PAIR_TYPES, SHAREGPT_ROLES, TEMPLATE_ROLES
from gpu_prep.format import detect_schema
from gpu_prep.read.rows import read_chunks
from gpu_prep.run.context import run_inputs

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
