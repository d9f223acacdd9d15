"""Several datasets in one run (the config's `datasets`): each dataset's files read in order and its data
handlers applied to every row, then the datasets concatenated in order or, with sampling ratios,
interleaved by weight.

Interleaving follows the seed's data_config (Hugging Face `interleave_datasets` with probabilities):
numpy's default_rng(seed) picks the dataset of each next row, drawn in blocks of 1000 with the ratios as
probabilities; a dataset whose rows run out starts again from its first row; the run stops right after
the draw that takes one dataset (first_exhausted) or the last dataset (all_exhausted) through all of its
rows. The order is computed as the rows are read, so memory does not grow with the output.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_prep.errors import ConfigError, Drop, Dropped, RowError
from gpu_prep.read.inputs import InputFile
from gpu_prep.read.jsonl import Columnar
from gpu_prep.read.row import FileRow, ReadRow
from gpu_prep.read.rows import file_rows

DRAW_BLOCK = 1000  # datasets drawn at a time, as the seed's interleaving does (it fixes the order for a seed)

Handler = Callable[..., Any]  # (record, **fn_kwargs) -> record, or None to skip the row
HANDLERS: dict[str, Handler] = {}


def register_handler(name: str, fn: Handler) -> None:
    """Make fn usable as a data handler by name (plugins loaded with --plugin call this)."""
    HANDLERS[name] = fn


def dataset_order(lengths: list[int], ratios: list[float] | None, seed: int, strategy: str) -> Iterator[int]:
    """Which dataset each row of the mixed stream comes from, in order (lengths: rows per dataset)."""
    if ratios is None:
        for k, n in enumerate(lengths):
            yield from [k] * n
        return
    p = np.asarray(ratios, dtype=np.float64)
    drawable = p > 0
    empty = [k for k, n in enumerate(lengths) if n == 0 and drawable[k]]
    if empty:
        raise ConfigError(f"datasets {empty} have a sampling ratio above 0 but no rows")
    if strategy == "all_exhausted" and not drawable.all():
        raise ConfigError("sampling_stopping_strategy all_exhausted cannot exhaust a dataset with ratio 0")
    counts = np.zeros(len(lengths), dtype=np.int64)
    left = int(drawable.sum())  # drawable datasets not yet taken through all their rows
    rng = np.random.default_rng(seed)
    while True:
        for k in rng.choice(len(lengths), size=DRAW_BLOCK, p=p).tolist():
            yield k
            counts[k] += 1
            if counts[k] == lengths[k]:
                left -= 1
                if strategy == "first_exhausted" or left == 0:
                    return




@dataclass
class Dataset:
    """One dataset of the run: its files (indices into the run's file list) and its handlers."""

    name: str
    files: list[InputFile]
    handlers: list[tuple[Handler, dict[str, Any], str, Any]]  # function, fn_kwargs, name, remove_columns
    # About how many times a weighted mix reads it through (its draws over its rows), once the mix has
    # counted the rows: what the run's progress takes as its share of the input.
    passes: float = 1.0
    rows_counted: int | None = None  # its rows, where a weighted mix counted them (set_passes)

    def count(self, max_row_bytes: int) -> int:
        """Its rows, handlers not run (a handler drops a row as a whole, so the count is the same)."""
        return sum(1 for file in self.files for _ in file_rows(file, None, max_row_bytes))

    def rows(self, columnar: Columnar | None, max_row_bytes: int) -> Iterator[FileRow]:
        for file in self.files:
            for row in file_rows(file, columnar, max_row_bytes):
                yield FileRow(file.index, self.handled(row))

    def handled(self, row: ReadRow) -> ReadRow:
        """The row through the dataset's handlers: their record, or dropped where one drops it (the row as
        read kept)."""
        if row.dropped is not None or row.record is None:
            return row
        record, dropped = self.handle(row.record)
        if dropped is not None:
            return ReadRow(row.line, None, row.nbytes, dropped, row.record)
        return row._replace(record=record)

    def handle(self, record: Any) -> tuple[Any, Dropped | None]:
        if self.handlers and not isinstance(record, dict):  # handlers take rows that are objects
            return None, Dropped(Drop.NOT_AN_OBJECT, f"a row must be a JSON object, got {type(record).__name__}")
        for fn, kwargs, name, remove in self.handlers:
            before = set(record) if remove == "all" and isinstance(record, dict) else set()
            try:
                record = fn(record, **kwargs)
            except RowError as err:
                return None, Dropped(err.reason, f"data handler {name}: {err.detail}")
            except Exception as exc:  # a handler's own failure drops the row, naming the handler
                return None, Dropped(Drop.HANDLER_ERROR, f"data handler {name} failed: {type(exc).__name__}: {exc}")
            if record is None:
                return None, Dropped(Drop.SKIPPED_BY_HANDLER, f"data handler {name} skipped the row")
            if remove and isinstance(record, dict):  # the handler's remove_columns ("all": the row's own)
                gone = before if remove == "all" else set(_columns(remove))
                record = {k: v for k, v in record.items() if k not in gone}
        return record, None


def set_passes(datasets: list[Dataset], lengths: list[int], ratios: list[float], strategy: str) -> None:
    """Each dataset's passes, from its rows and the draws expected: until the last (all_exhausted) or the
    first (first_exhausted) dataset is through."""
    drawn = [n / r for n, r in zip(lengths, ratios) if r > 0 and n]
    total = (max if strategy == "all_exhausted" else min)(drawn) if drawn else 0
    for dataset, n, r in zip(datasets, lengths, ratios):
        dataset.passes, dataset.rows_counted = (total * r / n if n else 1.0), n


def config_rows(config: Any, datasets: list[Dataset] | None, columnar: Columnar | None = None
                ) -> Iterator[FileRow] | None:
    """Every row of a config's datasets, mixed as it says; None without datasets (the inputs in order)."""
    return None if datasets is None else _mixed_rows(config, datasets, columnar)


def _mixed_rows(config: Any, datasets: list[Dataset], columnar: Columnar | None) -> Iterator[FileRow]:
    ratios, process, max_row_bytes = config.sampling_ratios(), config.dataprocessor, config.input.max_row_bytes
    if ratios is None:
        for dataset in datasets:
            yield from dataset.rows(columnar, max_row_bytes)
        return
    lengths = [d.count(max_row_bytes) for d in datasets]
    set_passes(datasets, lengths, ratios, process.sampling_stopping_strategy)
    streams = [d.rows(columnar, max_row_bytes) for d in datasets]
    for k in dataset_order(lengths, ratios, process.seed, process.sampling_stopping_strategy):
        row = next(streams[k], None)
        if row is None:  # this dataset ran out: it starts again from its first row
            streams[k] = datasets[k].rows(columnar, max_row_bytes)
            row = next(streams[k])
        yield row


# ---------------------------------------------------------------- the built-in data handlers


def _columns(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def rename_columns(record: dict, column_mapping: dict[str, str]) -> dict:
    return {column_mapping.get(k, k): v for k, v in record.items()}


def select_columns(record: dict, column_names: Any) -> dict:
    return {k: record[k] for k in _columns(column_names) if k in record}


def remove_columns(record: dict, column_names: Any) -> dict:
    drop = set(_columns(column_names))
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


def with_tokenizer(datasets: list[Dataset], tokenizer: Any) -> None:
    """Hand the run's tokenizer to the handlers that take one (a builders.BuilderTokenizer: the part of a
    transformers tokenizer a handler uses, with the run's chat template)."""
    for dataset in datasets:
        dataset.handlers = [(fn, {**kwargs, "tokenizer": tokenizer} if "tokenizer" in inspect.signature(fn).parameters
                             else kwargs, name, remove) for fn, kwargs, name, remove in dataset.handlers]
