"""The built-in data handlers: what a dataset of a mix may name in its data_handlers (the seed's, by the
same names and arguments), each a function from a row to a row, or to None to skip it, that may raise
RowError to drop it. They register in read/mix.py's registry as this module loads (with the run package);
a plugin adds its own with gpu_prep.mix.register_handler. Those that take a `tokenizer` are handed the run's
(read.mix.with_tokenizer); apply_tokenizer_chat_template renders with the run's chat template."""

from __future__ import annotations

import re
from typing import Any

from gpu_prep.errors import Drop, RowError
from gpu_prep.read.mix import HANDLERS, columns, register_handler

# The registry itself (built-ins included once this module is loaded), and the built-in handlers.
__all__ = ["HANDLERS", "apply_custom_data_formatting_template", "apply_dataset_formatting",
           "apply_tokenizer_chat_template", "duplicate_column", "register_handler", "remove_columns", "rename_columns",
           "select_columns", "skip_large_text", "tokenize_and_apply_input_masking"]


def rename_columns(record: dict, column_mapping: dict[str, str]) -> dict:
    return {column_mapping.get(k, k): v for k, v in record.items()}


def select_columns(record: dict, column_names: Any) -> dict:
    return {k: record[k] for k in columns(column_names) if k in record}


def remove_columns(record: dict, column_names: Any) -> dict:
    drop = set(columns(column_names))
    return {k: v for k, v in record.items() if k not in drop}


def duplicate_column(record: dict, old_column: str, new_column: str) -> dict:
    if old_column not in record:
        raise RowError(Drop.MISSING_FIELD, f"field {old_column!r} is missing")
    return {**record, new_column: record[old_column]}


def skip_large_text(record: dict, column_name: str, max_length: int) -> dict | None:
    """None (skip the row) when the column's text is longer than max_length characters."""
    value = record.get(column_name)
    return None if isinstance(value, str) and len(value) > max_length else record


_FIELD = re.compile(r"\{\{\s*(\w+)\s*\}\}|\{(\w+)\}")


def apply_custom_data_formatting_template(record: dict, template: str, formatted_text_column_name: str = "text") -> dict:
    """A field written from a template with {{field}} (or {field}) placeholders for the row's fields."""
    def fill(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in record:
            raise RowError(Drop.MISSING_FIELD, f"the template needs field {name!r}, which is missing")
        return str(record[name])

    return {**record, formatted_text_column_name: _FIELD.sub(fill, template)}


def apply_dataset_formatting(record: dict, dataset_text_field: str, tokenizer: Any) -> dict:
    """The field with the tokenizer's eos token added at its end (handlers that take `tokenizer` get the
    run's)."""
    value = record.get(dataset_text_field)
    if not isinstance(value, str):
        raise RowError(Drop.MISSING_FIELD if value is None else Drop.WRONG_TYPE,
                       f"field {dataset_text_field!r} must be a string")
    return {**record, dataset_text_field: value + (tokenizer.eos_token or "")}


def apply_tokenizer_chat_template(record: dict, tokenizer: Any, conversation_column: str = "messages",
                                  formatted_text_column_name: str = "text") -> dict:
    """A field holding the conversation rendered by the run's chat template (config.chat_template, else the
    tokenizer's), as plain text."""
    from gpu_prep.render.sandbox import ChatTemplate

    messages = record.get(conversation_column)
    if not isinstance(messages, list):
        raise RowError(Drop.MISSING_FIELD if messages is None else Drop.WRONG_TYPE,
                       f"field {conversation_column!r} must be a list of messages")
    if tokenizer.chat_template is None:
        raise RowError(Drop.TEMPLATE_ERROR, "the tokenizer has no chat template (name one with chat_template)")
    special = tokenizer.special_tokens_map
    key = (tokenizer.chat_template, tuple(sorted(special.items())))
    if key not in _TEMPLATES:
        _TEMPLATES[key] = ChatTemplate(tokenizer.chat_template, special)
    text = _TEMPLATES[key].render(messages, record.get("tools"))
    return {**record, formatted_text_column_name: text}


_TEMPLATES: dict[Any, Any] = {}  # compiled chat templates, by their text and special tokens


def tokenize_and_apply_input_masking(record: dict, tokenizer: Any, input_column_name: str | None = None,
                                     output_column_name: str | None = None, add_eos_token: bool = True,
                                     input_field_name: str | None = None, output_field_name: str | None = None,
                                     tokenizer_kwargs: dict | None = None) -> dict:
    """The row as pre-tokenized ids (input_ids, labels, attention_mask), as the seed's handler makes them:
    input and output joined (a space between them where neither side has whitespace at the join, the
    tokenizer's eos after), tokenized as one text; the labels are -100 over as many tokens as the input
    alone tokenizes to. Its dataset reads them as input.type pretokenized. The older names
    input_field_name / output_field_name are taken too; tokenizer_kwargs change nothing (no padding or
    truncation here: max_seq_len and truncation rule the row)."""
    names = (input_column_name or input_field_name, output_column_name or output_field_name)
    if None in names:
        raise RowError(Drop.HANDLER_ERROR, "needs input_column_name and output_column_name")
    texts = [record.get(name) for name in names]
    for name, text in zip(names, texts):
        if not isinstance(text, str):
            raise RowError(Drop.MISSING_FIELD if text is None else Drop.WRONG_TYPE, f"field {name!r} must be a string")
    prompt, answer = texts
    glue = "" if prompt.endswith((" ", "\n", "\t")) or answer.startswith((" ", "\n", "\t")) else " "
    ids = tokenizer.encode(prompt + glue + answer + ((tokenizer.eos_token or "") if add_eos_token else ""))
    masked = min(len(tokenizer.encode(prompt)), len(ids))
    return {"input_ids": ids, "labels": [-100] * masked + ids[masked:], "attention_mask": [1] * len(ids)}


for _fn in (rename_columns, select_columns, remove_columns, duplicate_column, skip_large_text,
            apply_custom_data_formatting_template, apply_dataset_formatting, apply_tokenizer_chat_template,
            tokenize_and_apply_input_masking):
    register_handler(_fn.__name__, _fn)
