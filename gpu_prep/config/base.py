"""What every config section shares: frozen models whose numbers are held to ranges that can work, the
constants the sections and the stages read (row types, template roles, Alpaca's texts), and key helpers."""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Le, Lt
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError


Action = Literal["mask", "train"]



E_NOTATION = re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$")  # 5e-1, 1.5E3
# Every integer setting is at most a 64-bit one, whatever bounds of its own it has: counts, lengths and
# sizes are computed in numpy's int64 (and Python's index-sized ints), so a larger one would pass here
# and end the run in an OverflowError far from the config.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# Token lengths are stored as int32 (Megatron's index, Parquet's seq_lengths) and cuDF's string positions
# are 32-bit.
INT32_MAX = (1 << 31) - 1


def _number_kinds(field: FieldInfo) -> tuple[set[type], list[Any]]:
    """The number types a field takes (int, float), through `| None` and Annotated[...], and the bounds
    (annotated_types' Ge, Gt, Le, Lt) put on them."""
    kinds, bounds = set(), list(field.metadata)
    for kind in typing.get_args(field.annotation) or (field.annotation,):
        if typing.get_origin(kind) is Annotated:
            kind, *extra = typing.get_args(kind)
            bounds += [b for e in extra for b in (e.metadata if isinstance(e, FieldInfo) else [e])]
        if kind in (int, float):
            kinds.add(kind)
    return kinds, [b for b in bounds if isinstance(b, (Ge, Gt, Le, Lt))]


def _int_range(bounds: list[Any]) -> tuple[int, int]:
    """The least and greatest integer the bounds allow, within int64."""
    low = max([INT64_MIN] + [b.ge for b in bounds if isinstance(b, Ge)] + [b.gt + 1 for b in bounds if isinstance(b, Gt)])
    high = min([INT64_MAX] + [b.le for b in bounds if isinstance(b, Le)] + [b.lt - 1 for b in bounds if isinstance(b, Lt)])
    return low, high


def _allowed(field: FieldInfo) -> str | None:
    """The values a number field allows, in words (None: not a number field)."""
    kinds, bounds = _number_kinds(field)
    if kinds == {int}:
        return "integers from {} to {}".format(*_int_range(bounds))
    if not kinds:
        return None
    ends = {type(b): getattr(b, type(b).__name__.lower()) for b in bounds}  # Ge(ge=0) -> {Ge: 0}
    ends = {kind: str(int(end)) if end == int(end) else str(end) for kind, end in ends.items()}
    if ends.keys() == {Ge, Le}:
        return f"finite numbers from {ends[Ge]} to {ends[Le]}"
    words = {Ge: "at least", Gt: "above", Le: "at most", Lt: "below"}
    return ("finite numbers " + " and ".join(f"{words[kind]} {end}" for kind, end in ends.items())).rstrip()


class _Frozen(BaseModel):
    # No inf or nan in a float setting: no limit, size or share is infinite (null says "none" where
    # a setting has no limit), and nan compares false with any bound.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _whole_number(cls, value: Any, info: ValidationInfo) -> Any:
        """For a number field, what its author wrote as a number: 5e-1 or 1e3 in YAML (PyYAML reads them as
        strings, YAML 1.2 as numbers), and for an int field a float that is a whole number (1e8, 2048.0).
        Strictly typed, the field would refuse either. An integer is then held to the field's bounds within
        int64 (INT64_MAX), the field's own or not."""
        if info.field_name is None:
            return value
        kinds, bounds = _number_kinds(cls.model_fields[info.field_name])
        if isinstance(value, str) and kinds and E_NOTATION.match(value):
            value = float(value)
        if isinstance(value, float) and value.is_integer() and kinds == {int}:
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and int in kinds:
            low, high = _int_range(bounds)
            if value < low:
                raise PydanticCustomError("greater_than_equal", "Input should be greater than or equal to {ge}",
                                          {"ge": low})
            if value > high:
                raise PydanticCustomError("less_than_equal", "Input should be less than or equal to {le}",
                                          {"le": high})
        return value


ALPACA_FORMAT = ("Below is an instruction that describes a task, paired with an input that provides further "
                 "context. Write a response that appropriately completes the request.\n\n"
                 "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_NO_INPUT_FORMAT = ("Below is an instruction that describes a task. Write a response that appropriately "
                          "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")
# The input types whose rows are TRL's preference pairs or unpaired rows, and those of pretraining text.
PAIR_TYPES = frozenset({"preference", "kto"})
TEXT_TYPES = frozenset({"text", "pretokenized"})
# The roles chat templates know.
TEMPLATE_ROLES = ("system", "user", "assistant", "tool")
# Not a template role: a row role listed under it is the assistant's tool call, its content JSON of
# {"name", "arguments"} (or a list of them) made into the assistant message's tool_calls
# (format._tool_calls), so the chat template writes the call in its own syntax.
TOOL_CALL_ROLE = "tool_call"
# The roles of ShareGPT-style data ("from") and the template roles they stand for. LLaMA-Factory's tags
# included: a function_call turn is the assistant's tool call (as LLaMA-Factory reads it), an observation
# the tool's result. (Listing function_call under assistant instead keeps its JSON as the reply's text.)
SHAREGPT_ROLES = {"user": ["human", "user"], "assistant": ["gpt", "model", "assistant"],
                  TOOL_CALL_ROLE: ["function_call"], "system": ["system"], "tool": ["tool", "function", "observation"]}
_NO_ROLE_NAMES: dict[str, str] = {}


def _one_setting(data: Any, alias: str, key: str, section: str) -> Any:
    """The config section with `alias` (another tool's name of `key`) moved to `key`; the two given and
    disagreeing is an error: two spellings of one setting must never disagree silently."""
    if not isinstance(data, dict) or alias not in data:
        return data
    data = dict(data)
    value = data.pop(alias)
    if data.setdefault(key, value) != value:
        raise ValueError(f"{section}{alias} and {section}{key} disagree (they name one setting)")
    return data


def _field_name(value: str) -> str:
    """A setting that names a row's field: an empty name would only have every row dropped as missing it."""
    if value == "":
        raise ValueError("is empty; it names a field of the rows (no row has a field named '')")
    return value


# A setting that names a row's field (input.*_key, output.domain_key, ...).
FieldName = Annotated[str, AfterValidator(_field_name)]


# Axolotl's dataset types and the input.type each is here.
AXOLOTL_TYPES = {"completion": "text", "input_output": "segments", "chat_template": "chat", "": "pretokenized"}


