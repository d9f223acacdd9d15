"""Builders of conversations: chat (OpenAI messages) and sharegpt rows, with their tools, tool calls, system
fields and inline reasoning."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import TYPE_CHECKING, Any

from gpu_prep.config import TOOL_CALL_ROLE
from gpu_prep.errors import Drop
from gpu_prep.format.registry import register
from gpu_prep.format.shapes import Conversation, Message, RowError, missing, type_name

if TYPE_CHECKING:
    from gpu_prep.config import PipelineConfig


def _string_field(record: dict[str, Any], key: str, where: str = "") -> str:
    if key not in record:
        raise missing(record, key, where)
    value = record[key]
    if not isinstance(value, str):
        raise RowError(Drop.WRONG_TYPE, f"field {where}{key!r} must be a string, got {type_name(value)}")
    return value


def _content(message: dict[str, Any], key: str, where: str) -> str:
    """A message's text. Besides a string, what chat APIs send is read as chat templates' users expect: a
    list of text parts ({"type": "text", "text": ...}, as in OpenAI's format) is its texts joined by
    newlines; null or absent content beside tool_calls (an assistant turn that only calls tools) is empty."""
    value = message.get(key)
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                if isinstance(part, dict) and part.get("type") == "text":
                    raise RowError(Drop.WRONG_TYPE, f"{where}{key}[{j}] is a text part whose 'text' is "
                                                    f"{type_name(part.get('text'))}, not a string")
                kind = repr(part.get("type")) if isinstance(part, dict) else type_name(part)
                raise RowError(Drop.WRONG_TYPE, f"{where}{key}[{j}] is a {kind} part; only text parts "
                                                '({"type": "text", "text": ...}) are read')
            texts.append(part["text"])
        return "\n".join(texts)
    if value is None and message.get("tool_calls"):
        return ""
    return _string_field(message, key, where)


@register("chat")
def build_chat(record: dict[str, Any], config: PipelineConfig) -> Conversation:
    inp = config.input
    return _conversation(record, inp.messages_key, inp.role_key, inp.content_key, config)


@register("sharegpt")
def build_sharegpt(record: dict[str, Any], config: PipelineConfig) -> Conversation:
    """{"conversations": [{"from": "human", "value": ...}, ...]}: chat under other keys and role names
    (input.roles defaults to SHAREGPT_ROLES); keys set in the config win. Bare tool schemas ({"name", ...})
    are wrapped as {"type": "function", "function": ...}, the shape OpenAI clients send and LLaMA-Factory
    writes them in."""
    conv = _conversation(record, *sharegpt_keys(config), config)
    tools = _wrapped(conv.tools)
    return conv if tools is None else dataclasses.replace(conv, tools=tools, notes=(*conv.notes, "tool_schemas_wrapped"))


def _wrapped(tools: list[Any] | None) -> list[Any] | None:
    """ShareGPT rows' tools with each bare schema ({"name", ...}) wrapped as {"type": "function", "function":
    ...}; None where none is bare."""
    def bare(tool: Any) -> bool:
        return isinstance(tool, dict) and "name" in tool and "type" not in tool and "function" not in tool

    return [{"type": "function", "function": t} if bare(t) else t for t in tools] if tools and any(map(bare, tools)) \
        else None


def messages_row(record: list[Any], config: PipelineConfig) -> dict[str, Any]:
    """A row written as a conversation's messages alone, as the row holding them; a list that is rows (a
    JSON array saved as one line) or a type that reads no messages drops it as not_an_object."""
    if _rows_not_messages(record, config):
        raise RowError(Drop.NOT_AN_OBJECT, f"the line is a JSON array of {len(record)} rows, not a row (nor a "
                                           "conversation's messages); a file holding one JSON array is read element "
                                           "by element when named .json")
    kind = config.input.type
    if kind not in ("chat", "sharegpt", "auto"):
        raise RowError(Drop.NOT_AN_OBJECT, f"a row that is a list of messages is read by input.type chat, sharegpt or "
                                           f"auto, not {kind}")
    sharegpt = kind == "sharegpt" or (kind == "auto" and all("role" not in m and "from" in m for m in record))
    return {sharegpt_keys(config)[0] if sharegpt else config.input.messages_key: record}


def _rows_not_messages(record: list[dict[str, Any]], config: PipelineConfig) -> bool:
    """Whether a list of objects is rows (json.dump of a list, saved as one line) rather than messages: none
    holds a role under the config's key (or role / from), and each holds a key rows have."""
    inp = config.input
    roles = {inp.role_key, "role", "from"}
    rows = {inp.messages_key, "conversations", inp.text_key, inp.prompt_key, inp.field_instruction, "input_ids",
            inp.chosen_key, "segments"}
    return all(roles.isdisjoint(m) and not rows.isdisjoint(m) for m in record)


def sharegpt_keys(config: PipelineConfig) -> tuple[str, str, str]:
    """Where a sharegpt row keeps its messages, roles and contents: conversations / from / value, or the
    keys the config sets when its input.type is sharegpt (with auto, those keys are chat's)."""
    inp = config.input
    given = inp.model_fields_set if inp.type == "sharegpt" else set()
    return (inp.messages_key if "messages_key" in given else "conversations",
            inp.role_key if "role_key" in given else "from",
            inp.content_key if "content_key" in given else "value")


def _conversation(record: dict[str, Any], key: str, role_key: str, content_key: str,
                  config: PipelineConfig, system_field: bool = True) -> Conversation:
    """The row's messages under `key` (roles, contents and the config's renames read from role_key,
    content_key and input.message_property_mappings; reasoning moved to reasoning_content; tool-call turns
    made tool_calls), opened by its system field (system_field), with its tools and documents."""
    raw, notes = _raw_messages(record, key)
    inp = config.input
    renames = inp.message_property_mappings  # {template key: row key}
    role_names = inp.role_names
    plain = role_key == "role" and content_key == "content" and not renames and not inp.extract_think_tags \
        and not {"role", "content"} & set(inp.reasoning_keys)
    sources = None  # row keys not copied as they are (the plain messages need none)
    messages: list[Message] = []
    for i, message in enumerate(raw):
        # The common case, a {"role": str, "content": str} message whose role input.roles leaves as it is,
        # is taken as it is (never modified).
        if plain and type(message) is dict and tuple(message) == ("role", "content") \
                and type(role := message["role"]) is str and type(message["content"]) is str \
                and role_names.get(role, role) == role:
            messages.append(message)
            continue
        where = f"{key}[{i}]."
        if not isinstance(message, dict):
            raise RowError(Drop.WRONG_TYPE, f"{key}[{i}] must be an object, got {type_name(message)}")
        if sources is None:
            sources = {role_key, content_key, *renames.values(), *inp.reasoning_keys}
        named = _string_field(message, role_key, where)
        role = role_names.get(named, named)
        content = _content(message, content_key, where)
        if role == TOOL_CALL_ROLE and named != role:  # a row role input.roles lists under tool_call
            message = {**message, "tool_calls": _tool_calls(content, f"{where}{content_key}", named)}
            role, content = "assistant", ""
            notes.append("tool_calls_parsed")
        # Row keys are renamed to the template's, not copied: templates read role and content.
        extra = {k: v for k, v in message.items() if k not in sources}
        extra.update((target, message[source]) for target, source in renames.items() if source in message)
        if "weight" in extra and inp.message_training_key != "weight":
            notes.append("message_weight_not_read")
        source = next((k for k in inp.reasoning_keys if isinstance(message.get(k), str)), None)
        reasoning = None if source is None else message[source]
        if source is not None and source != "reasoning_content":
            notes.append("moved_reasoning_keys")
        if inp.extract_think_tags and role == "assistant" and reasoning is None:
            found = THINK_BLOCK.match(content)
            if found:
                reasoning, content = found.group(1).strip("\n"), content[found.end():]
                notes.append("extracted_think_from_content")
        if reasoning is not None and inp.think_mode == "drop":
            extra.pop("reasoning_content", None)
            notes.append("dropped_think_messages")
        elif reasoning is not None:
            extra["reasoning_content"] = reasoning
        messages.append({**extra, "role": role, "content": content})
    if system_field:
        messages = _with_system_field(record, messages, config, notes)
    return _with_tools(record, messages, notes)


def _raw_messages(record: dict[str, Any], key: str) -> tuple[list[Any], list[str]]:
    """The row's list of messages as written (JSON text of one parsed: a CSV or Parquet column of it), and
    the note of that parse."""
    if key not in record:
        raise missing(record, key)
    raw = record[key]
    notes: list[str] = []
    if isinstance(raw, str) and raw.lstrip().startswith("["):  # JSON text (a CSV or Parquet column of it)
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise RowError(Drop.WRONG_TYPE, f"field {key!r} is a string but not JSON: {exc}") from None
        notes.append("messages_parsed_from_string")
    if not isinstance(raw, list):
        got = "a string that is not JSON text of a list" if isinstance(raw, str) else type_name(raw)
        raise RowError(Drop.WRONG_TYPE, f"field {key!r} must be a list of messages (or JSON text of one), got {got}")
    if not raw:
        raise RowError(Drop.EMPTY, f"field {key!r} has no messages")
    return raw, notes


def _with_tools(record: dict[str, Any], messages: list[Message], notes: list[str]) -> Conversation:
    """The conversation of these messages with the row's tools and documents."""
    tools, parsed = _tools(record)
    documents = record.get("documents")
    if documents is not None and not (isinstance(documents, list) and all(isinstance(d, dict) for d in documents)):
        raise RowError(Drop.WRONG_TYPE, f"field 'documents' must be a list of objects, got {type_name(documents)}")
    return Conversation(messages, tools=tools, documents=documents or None,
                        notes=(*notes, *["tools_parsed_from_string"] * parsed))


def _with_system_field(record: dict[str, Any], messages: list[Message], config: PipelineConfig,
                       notes: list[str]) -> list[Message]:
    """The messages, opened by the row's system prompt field (input.field_system, LLaMA-Factory's `system`
    column) where the row has a non-empty one and the conversation has no system message of its own (which
    wins, as in LLaMA-Factory)."""
    key = config.input.field_system
    system = record.get(key) if key is not None else None
    if system is None or system == "":
        return messages
    if not isinstance(system, str):
        raise RowError(Drop.WRONG_TYPE, f"field {key!r} (the system prompt) must be a string, got {type_name(system)}")
    if any(m["role"] == "system" for m in messages):
        notes.append("system_field_not_used")
        return messages
    notes.append("system_from_field")
    return [{"role": "system", "content": system}, *messages]


THINK_BLOCK = re.compile(r"\s*<think>(.*?)</think>\s*", re.DOTALL)  # an inline reasoning block


def _tool_calls(content: str, where: str, role: str) -> list[dict[str, Any]]:
    """A tool-call turn's content (JSON of {"name", "arguments"}, or a list of them for parallel calls, as
    LLaMA-Factory's function_call turns hold it) as OpenAI's tool_calls, which chat templates write in their
    own syntax (Qwen's <tool_call> block). Anything else drops the row: trained as text, the model would
    learn to call tools in a syntax no tool parser reads."""
    rule = (f"field {where!r} is a tool call (role {role!r}, listed under tool_call in input.roles) and must "
            'be JSON of {"name": ..., "arguments": ...} or a list of them')
    try:
        calls = json.loads(content)
    except ValueError as exc:
        raise RowError(Drop.WRONG_TYPE, f"{rule}; it is not JSON ({exc}): list {role!r} under assistant in "
                                        "input.roles to train it as text") from None
    calls = calls if isinstance(calls, list) else [calls]
    if not calls:
        raise RowError(Drop.WRONG_TYPE, f"{rule}; it is an empty list")
    for call in calls:
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and "arguments" in call):
            got = f"an object with the keys {sorted(map(str, call))}" if isinstance(call, dict) else type_name(call)
            raise RowError(Drop.WRONG_TYPE, f"{rule}; it holds {got}")
    return [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]


TOOL_KEYS = ("tools", "tool_schemas", "functions", "function_schemas")


def _tools(record: dict[str, Any]) -> tuple[list[Any] | None, bool]:
    """The row's tool definitions, for the template's `tools`: the first of TOOL_KEYS present, as a list
    (a list as it is, one object as a list of it, a JSON string parsed into either); and whether they
    were parsed from a string."""
    key = next((k for k in TOOL_KEYS if record.get(k) not in (None, [], "")), None)
    if key is None:
        return None, False
    value = record[key]
    parsed = isinstance(value, str)
    if parsed:
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowError(Drop.WRONG_TYPE, f"field {key!r} is a string but not JSON: {exc}") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        got = type_name(value) if not isinstance(value, list) else \
            f"a list holding {type_name(next(t for t in value if not isinstance(t, dict)))}"
        raise RowError(Drop.WRONG_TYPE, f"field {key!r} must be a list of tool objects, got {got}")
    return value, parsed
