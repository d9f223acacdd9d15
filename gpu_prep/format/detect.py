"""Which input type a row is (input.type auto), and which columns a type reads as columns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_prep.config import PAIR_TYPES
from gpu_prep.errors import Drop
from gpu_prep.format.chat import sharegpt_keys
from gpu_prep.format.registry import from_plugin
from gpu_prep.format.shapes import RowError

if TYPE_CHECKING:
    from gpu_prep.config import PipelineConfig


def detect_schema(record: dict[str, Any], config: PipelineConfig) -> str | None:
    """The input type a row's keys say it is (input.type "auto"), or None. Keys with a value count first: a
    CSV's empty cells (every column is a key of every row) name no shape; where those name none, every key does."""
    filled = {k: v for k, v in record.items() if v is not None and v != ""}
    return _schema_of(filled, config) or (_schema_of(record, config) if len(filled) < len(record) else None)


def _schema_of(record: dict[str, Any], config: PipelineConfig) -> str | None:
    inp = config.input
    if "input_ids" in record:
        return "pretokenized"
    if _message_list(record.get(inp.messages_key)):
        return "chat"
    if _message_list(record.get(sharegpt_keys(config)[0])):
        return "sharegpt"
    if "segments" in record:
        return "segments"
    if inp.chosen_key in record and inp.rejected_key in record:
        return "preference"
    if inp.completion_key in record and inp.label_key in record:
        return "kto"
    if inp.prompt_key in record and inp.response_key in record:
        return inp.auto_prompt_type
    if isinstance(record.get(inp.prompt_key), list) and isinstance(record.get(inp.completion_key), list):
        return "prompt_response"  # TRL's conversational prompt-completion row
    if inp.field_instruction in record and inp.field_output in record:
        return "alpaca"
    if inp.text_key in record:
        return "text"
    return None


def _message_list(value: Any) -> bool:
    """A list of messages, or JSON text of one (a CSV or Parquet column), as _conversation reads them."""
    return isinstance(value, list) or (isinstance(value, str) and value.lstrip().startswith("["))


def auto_schema(record: dict[str, Any], config: PipelineConfig) -> str:
    """The input type of a row of input.type auto (rows of several shapes in one input): the one its keys
    name, else unknown_schema."""
    schema = detect_schema(record, config)
    if schema in PAIR_TYPES:  # prompt and completions: the run's output must be of them throughout
        raise RowError(Drop.UNKNOWN_SCHEMA, f"a {schema} row: input.type auto writes one sample a row; set "
                                            f"input.type {schema}")
    if schema is None:
        inp = config.input
        known = ["input_ids", inp.messages_key, sharegpt_keys(config)[0], "segments", f"{inp.prompt_key}+{inp.response_key}",
                 f"{inp.field_instruction}+{inp.field_output}", inp.text_key]
        raise RowError(Drop.UNKNOWN_SCHEMA, f"no known shape: the row has none of the keys {', '.join(known)}")
    return schema


def columnar_schema(config: PipelineConfig) -> tuple[tuple[str, ...], tuple[str, str, str] | None] | None:
    """What rows of this config can be read as columns from: (top-level string fields, messages) where
    messages is (field, role key, content key) for chat rows and None for text and instruction rows; None
    for other input types. Text and instruction rows are built from those fields alone; a chat row is read
    as columns only where it has no key beyond them (read.Columnar.complete)."""
    inp = config.input
    domain = (config.output.domain_key,) if config.output.domain_key else ()
    if from_plugin(inp.type):
        return None  # a plugin's builder for this type may read any field of the row
    if inp.type == "text":
        return (inp.text_key, *domain), None
    if inp.type == "instruction":
        return (inp.prompt_key, inp.response_key, *domain), None
    if inp.type not in ("chat", "sharegpt"):
        return None
    messages = (inp.messages_key, inp.role_key, inp.content_key) if inp.type == "chat" else sharegpt_keys(config)
    return (None if len(set(messages + domain)) < len(messages) + len(domain) else (domain, messages))
