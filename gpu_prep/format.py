"""format: raw rows -> one canonical shape per row, through a registry of builders keyed by input.type.

A builder takes one record and the config and returns a Conversation (rendered later with the chat
template) or Segments (text pieces tokenized independently, each with a label). It raises RowError to drop
the row with a reason. New input types register a builder:

    @register("my_format")
    def build(record, config): return Segments([(record["body"], "text")])

A plugin's builder may also be a class (one instance is made, its build method called), take the run's
tokenizer as a third argument, and return {"ids", "loss_mask", "domain"} or None: gpu_prep/builders.py
holds that contract and calls every builder (builders.build_row).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from gpu_prep.config import PAIR_TYPES, TOOL_CALL_ROLE
from gpu_prep.errors import Drop

if TYPE_CHECKING:
    from gpu_prep.config import PipelineConfig

DEFAULT_DOMAIN = "__default__"


class RowError(Exception):
    """One row breaks a rule: reason is a Drop code, detail names the field and the rule."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def missing(record: dict[str, Any], key: str, where: str = "") -> RowError:
    """missing_field for `key` (in the row, or in its part `where`, e.g. "messages[2]."), naming the keys
    there, so that a key set to the wrong name shows which it should be (the first few, each cut short)."""
    keys = [repr(str(k)[:40]) for k in list(record)[:MISSING_KEYS_SHOWN + 1]]
    more = ", ..." if len(keys) > MISSING_KEYS_SHOWN else ""
    there = where.rstrip(".") or "the row"
    has = f"the keys of {there} are {', '.join(keys[:MISSING_KEYS_SHOWN])}{more}" if keys else f"{there} has no keys"
    return RowError(Drop.MISSING_FIELD, f"field {where}{key!r} is missing; {has}")


MISSING_KEYS_SHOWN = 8


@dataclass(frozen=True)
class Conversation:
    messages: list[dict[str, Any]]
    tools: list[Any] | None = None
    documents: list[Any] | None = None  # the row's "documents" (retrieved passages), for templates that read them
    # What building it did, for the parse report: "moved_reasoning_keys", "extracted_think_from_content",
    # "tools_parsed_from_string", "tool_calls_parsed", "tool_schemas_wrapped" (once per occurrence).
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Segments:
    """Pieces tokenized independently and concatenated. A label of None is never trained.

    train_all: every token is trained whatever the mask rules say (pretraining text).
    add_eos: the tokenizer's eos token closes the last piece (and is trained with it).
    add_eod: the end-of-document token (input.eod_token, else eos) closes it, as add_eos does.
    """

    pieces: list[tuple[str, str | bool | None]]  # label: a mask rule's name, or True / False (None) outright
    train_all: bool = False
    add_eos: bool = False
    add_eod: bool = False
    source: str | None = None  # the row's own text, when the pieces add text of a format to it


@dataclass(frozen=True)
class Tokens:
    """A pre-tokenized row: its token ids, and which of them are trained."""

    ids: list[int]
    trained: list[bool]
    domain: str | None = None  # the domain a plugin's builder named for the row (None: output.domain_key's)


class _Preference:
    """What preference rows share: a prompt and completions, each a list of messages (conversational) or a
    string (standard)."""

    prompt: list[dict[str, Any]] | str
    completions: list[list[dict[str, Any]] | str]

    @property
    def conversational(self) -> bool:
        return isinstance(self.completions[0], list)

    def texts(self) -> list[str]:
        """The prompt's own text, then each completion's."""
        return [_part_text(self.prompt), *map(_part_text, self.completions)]


@dataclass(frozen=True)
class Pair(_Preference):
    """A preference row (input.type preference, TRL's formats): a prompt and a chosen and a rejected
    completion."""

    prompt: list[dict[str, Any]] | str
    chosen: list[dict[str, Any]] | str
    rejected: list[dict[str, Any]] | str
    tools: list[Any] | None = None
    notes: tuple[str, ...] = ()  # what building the row did, for the parse report (as Conversation.notes)

    @property
    def completions(self) -> list[list[dict[str, Any]] | str]:
        return [self.chosen, self.rejected]


@dataclass(frozen=True)
class Unpaired(_Preference):
    """An unpaired preference row (input.type kto, TRL's format): a prompt, one completion and its label."""

    prompt: list[dict[str, Any]] | str
    completion: list[dict[str, Any]] | str
    label: bool
    tools: list[Any] | None = None
    notes: tuple[str, ...] = ()

    @property
    def completions(self) -> list[list[dict[str, Any]] | str]:
        return [self.completion]


def _part_text(part: list[dict[str, Any]] | str) -> str:
    return part if isinstance(part, str) else "\n".join(m["content"] for m in part)


Shape = Union[Conversation, Segments, Tokens, Pair, Unpaired]
Builder = Callable[..., Any]  # (record, config) or (record, config, tokenizer) -> a Shape (plugins: see builders.py)


@dataclass(frozen=True)
class Registered:
    """A registered builder: what to call (a function, or the build method of the one instance of a class),
    whether it takes the tokenizer (a third positional parameter), and whether it is one of gpu-prep's own
    (defined in this module: called as it is, so a bug in it is not counted as a plugin's builder_error)."""

    call: Builder
    takes_tokenizer: bool
    builtin: bool


_BUILDERS: dict[str, Registered] = {}


def register(name: str) -> Callable[[Any], Any]:
    """Register a builder for input.type `name`: a function build(record, config) or build(record, config,
    tokenizer), or a class whose build(self, item, config[, tokenizer]) is called on one instance made here
    (its __init__ takes no arguments). Returns what it was given, so it works as a decorator."""

    def add(builder: Any) -> Any:
        if isinstance(builder, type):
            if not callable(getattr(builder, "build", None)):
                raise TypeError(f"register({name!r}): class {builder.__name__} has no build(item, config[, tokenizer]) method")
            call = builder().build
        elif callable(builder):
            call = builder
        else:
            raise TypeError(f"register({name!r}): a builder is a function or a class, not {_type_name(builder)}")
        _BUILDERS[name] = Registered(call, _takes_tokenizer(call), getattr(builder, "__module__", None) == __name__)
        return builder

    return add


def _takes_tokenizer(call: Builder) -> bool:
    try:
        params = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):  # a callable Python cannot introspect: the two-argument contract
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in params)


def registered_types() -> list[str]:
    return sorted([*_BUILDERS, "auto"])


def registered(name: str) -> Registered:
    return _BUILDERS[name]


def get_builder(name: str) -> Builder:
    """What was registered for input.type `name`, to call as it is (builders.build_row applies the contract)."""
    return _BUILDERS[name].call


def _string_field(record: dict[str, Any], key: str, where: str = "") -> str:
    if key not in record:
        raise missing(record, key, where)
    value = record[key]
    if not isinstance(value, str):
        raise RowError(Drop.WRONG_TYPE, f"field {where}{key!r} must be a string, got {_type_name(value)}")
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
                                                    f"{_type_name(part.get('text'))}, not a string")
                kind = repr(part.get("type")) if isinstance(part, dict) else _type_name(part)
                raise RowError(Drop.WRONG_TYPE, f"{where}{key}[{j}] is a {kind} part; only text parts "
                                                '({"type": "text", "text": ...}) are read')
            texts.append(part["text"])
        return "\n".join(texts)
    if value is None and message.get("tool_calls"):
        return ""
    return _string_field(message, key, where)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


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
        got = "a string that is not JSON text of a list" if isinstance(raw, str) else _type_name(raw)
        raise RowError(Drop.WRONG_TYPE, f"field {key!r} must be a list of messages (or JSON text of one), got {got}")
    if not raw:
        raise RowError(Drop.EMPTY, f"field {key!r} has no messages")
    inp = config.input
    renames = inp.message_property_mappings  # {template key: row key}
    role_names = inp.role_names
    plain = role_key == "role" and content_key == "content" and not renames and not inp.extract_think_tags \
        and not {"role", "content"} & set(inp.reasoning_keys)
    sources = None  # row keys not copied as they are (the plain messages need none)
    messages = []
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
            raise RowError(Drop.WRONG_TYPE, f"{key}[{i}] must be an object, got {_type_name(message)}")
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
    tools, parsed = _tools(record)
    documents = record.get("documents")
    if documents is not None and not (isinstance(documents, list) and all(isinstance(d, dict) for d in documents)):
        raise RowError(Drop.WRONG_TYPE, f"field 'documents' must be a list of objects, got {_type_name(documents)}")
    return Conversation(messages, tools=tools, documents=documents or None,
                        notes=(*notes, *["tools_parsed_from_string"] * parsed))


def _with_system_field(record: dict[str, Any], messages: list[dict[str, Any]], config: PipelineConfig,
                       notes: list[str]) -> list[dict[str, Any]]:
    """The messages, opened by the row's system prompt field (input.field_system, LLaMA-Factory's `system`
    column) where the row has a non-empty one and the conversation has no system message of its own (which
    wins, as in LLaMA-Factory)."""
    key = config.input.field_system
    system = record.get(key) if key is not None else None
    if system is None or system == "":
        return messages
    if not isinstance(system, str):
        raise RowError(Drop.WRONG_TYPE, f"field {key!r} (the system prompt) must be a string, got {_type_name(system)}")
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
            got = f"an object with the keys {sorted(map(str, call))}" if isinstance(call, dict) else _type_name(call)
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
        got = _type_name(value) if not isinstance(value, list) else \
            f"a list holding {_type_name(next(t for t in value if not isinstance(t, dict)))}"
        raise RowError(Drop.WRONG_TYPE, f"field {key!r} must be a list of tool objects, got {got}")
    return value, parsed


@register("instruction")
def build_instruction(record: dict[str, Any], config: PipelineConfig) -> Segments:
    prompt = _string_field(record, config.input.prompt_key)
    response = _string_field(record, config.input.response_key)
    if not response.strip():
        raise RowError(Drop.EMPTY, f"field {config.input.response_key!r} is empty")
    return Segments([(prompt, "prompt"), (response, "response")], add_eos=True)


@register("prompt_response")
def build_prompt_response(record: dict[str, Any], config: PipelineConfig) -> Conversation:
    """{"prompt": ..., "response": ...} (input.prompt_key / response_key) as a user turn and an assistant
    turn, rendered with the chat template like any conversation, as the QLoRA seed's prompt_response schema
    does: the model is trained on the layout it will be prompted with. (instruction rows of the same keys
    are tokenized as they are, without a template.) TRL's conversational prompt-completion rows, the prompt
    and the completion each a list of messages, are those messages in turn."""
    inp = config.input
    # TRL's prompt-completion rows name the response `completion`: read where the row has no response_key.
    key = inp.completion_key if inp.response_key not in record and inp.completion_key in record else inp.response_key
    if isinstance(record.get(inp.prompt_key), list) and isinstance(record.get(key), list):
        # Conversational (TRL): the prompt's messages, then the completion's, as one conversation; as TRL
        # trains only the completion, the prompt's messages are flagged untrained (an assistant turn in
        # a multi-turn prompt included), the completion's follow the mask rules.
        flag = inp.message_training_key
        if not flag:
            raise RowError(Drop.WRONG_TYPE, "a prompt-completion row of messages marks its prompt untrained with "
                                            "input.message_training_key, which is null; set it (default 'training')")
        prompt = [{**m, flag: False} if isinstance(m, dict) else m for m in record[inp.prompt_key]]
        return _conversation({**record, "messages": [*prompt, *record[key]]}, "messages",
                             inp.role_key, inp.content_key, config)
    prompt = _string_field(record, inp.prompt_key)
    response = _string_field(record, key)
    if not response.strip():
        raise RowError(Drop.EMPTY, f"field {key!r} is empty")
    turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    # Through what every conversation goes through: think tags and reasoning keys, the row's tools.
    return _conversation({**record, "messages": turns}, "messages", "role", "content", config)


@register("alpaca")
def build_alpaca(record: dict[str, Any], config: PipelineConfig) -> Segments | Conversation:
    """Alpaca-style rows ({"instruction", "input", "output", "system", "history"}, names set by
    input.field_*): the prompt is input.format with {instruction}, {input} and {system} filled in
    (input.no_input_format when the row has no input, or an empty one), then the output, closed by eos;
    labelled prompt and response. With input.alpaca_render chat_template, a conversation instead."""
    inp = config.input
    instruction = _string_field(record, inp.field_instruction)
    extra = _optional_string(record, inp.field_input)
    system = _optional_string(record, inp.field_system) or inp.system_prompt
    output = _string_field(record, inp.field_output)
    if not output.strip():
        raise RowError(Drop.EMPTY, f"field {inp.field_output!r} is empty")
    history = _history(record, inp.field_history)
    if inp.alpaca_render == "chat_template":
        return _alpaca_conversation(record, system, history, "\n".join(t for t in (instruction, extra) if t),
                                    output, config)
    if history:  # the format has no place for earlier turns: written without them, the reply loses its context
        raise RowError(Drop.WRONG_TYPE, f"field {inp.field_history!r} holds {len(history)} earlier turn(s), which "
                                        "input.format (template-free) has no place for; input.alpaca_render: "
                                        "chat_template writes them as turns (as LLaMA-Factory does), "
                                        "input.field_history: null ignores the field")
    template = inp.format if extra else inp.no_input_format
    values = {"instruction": instruction, "input": extra, "system": system}
    prompt = _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)  # one pass: no text of a row is a template
    if system and "{system}" not in template:
        prompt = f"{system}\n\n{prompt}"
    # Filters and dedup look at the row's own text: the format's preamble is the same in every row.
    own = "\n".join(t for t in (instruction, extra, output) if t)
    return Segments([(prompt, "prompt"), (output, "response")], add_eos=True, source=own)


_PLACEHOLDER = re.compile(r"\{(instruction|input|system)\}")


def _history(record: dict[str, Any], key: str | None) -> list[list[str]]:
    """An alpaca row's earlier turns, [[question, answer], ...] (absent or null: none)."""
    value = record.get(key) if key is not None else None
    if value is None:
        return []
    if not isinstance(value, list):
        raise RowError(Drop.WRONG_TYPE, f"field {key!r} must be a list of [question, answer] pairs, got "
                                        f"{_type_name(value)}")
    for i, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            raise RowError(Drop.WRONG_TYPE, f"{key}[{i}] must be a [question, answer] pair of strings, got "
                                            f"{json.dumps(pair)[:80]}")
    return value


def _alpaca_conversation(record: dict[str, Any], system: str, history: list[list[str]], prompt: str,
                         output: str, config: PipelineConfig) -> Conversation:
    """An alpaca row as LLaMA-Factory's AlpacaDatasetConverter makes it, rendered with the chat template: the
    system prompt, the history's pairs as user and assistant turns, then the prompt and the output."""
    turns = [{"role": role, "content": text} for pair in history for role, text in zip(("user", "assistant"), pair)]
    messages = [*([{"role": "system", "content": system}] if system else []), *turns,
                {"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    return _conversation({**record, "messages": messages}, "messages", "role", "content", config, system_field=False)


def _optional_string(record: dict[str, Any], key: str | None) -> str:
    """A field that may be absent or null (then ""); when present it must be a string."""
    if key is None or record.get(key) is None:
        return ""
    return _string_field(record, key)


@register("segments")
def build_segments(record: dict[str, Any], config: PipelineConfig) -> Segments:
    """Template-free rows: {"segments": [{"text": ..., "label": true | false}, ...]}, tokenized piece by
    piece and concatenated as they are; a segment labelled true is trained, false is masked."""
    if "segments" not in record:
        raise missing(record, "segments")
    raw = record["segments"]
    if not isinstance(raw, list):
        raise RowError(Drop.WRONG_TYPE, f"field 'segments' must be a list, got {_type_name(raw)}")
    pieces: list[tuple[str, str | bool | None]] = []
    for i, segment in enumerate(raw):
        where = f"segments[{i}]."
        if not isinstance(segment, dict):
            raise RowError(Drop.WRONG_TYPE, f"segments[{i}] must be an object, got {_type_name(segment)}")
        text = _string_field(segment, "text", where)
        if not isinstance(segment.get("label"), bool):
            raise RowError(Drop.WRONG_TYPE if "label" in segment else Drop.MISSING_FIELD,
                           f"field {where}'label' must be true or false, got {_type_name(segment.get('label'))}")
        pieces.append((text, segment["label"]))
    if not any(text for text, _ in pieces):
        raise RowError(Drop.EMPTY, "field 'segments' has no text")
    return Segments(pieces)


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


@register("preference")
def build_preference(record: dict[str, Any], config: PipelineConfig) -> Pair:
    """TRL's preference rows: prompt / chosen / rejected, each a list of messages or a string; without a
    prompt key, the prompt is what chosen and rejected share at their start (TRL's extract_prompt: the
    longest common run of messages, or of characters, backed up to before a space where one ends it)."""
    inp = config.input
    if inp.chosen_key not in record and inp.completion_key in record and inp.label_key in record:
        raise RowError(Drop.MISSING_FIELD, f"field {inp.chosen_key!r} is missing: an unpaired row ({inp.completion_key}, "
                                           f"{inp.label_key}) is read by input.type kto")
    chosen = _preference_part(record, inp.chosen_key, config)
    if isinstance(chosen, str) and inp.rejected_key in record and not isinstance(record[inp.rejected_key], str):
        raise RowError(Drop.WRONG_TYPE, f"field {inp.rejected_key!r} must be a string as {inp.chosen_key!r} is, got "
                                        f"{_type_name(record[inp.rejected_key])}")
    rejected = _preference_part(record, inp.rejected_key, config)
    if isinstance(chosen, list) != isinstance(rejected, list):
        raise RowError(Drop.WRONG_TYPE, f"fields {inp.chosen_key!r} and {inp.rejected_key!r} must both be messages or "
                                        "both be strings")
    given = inp.prompt_key is not None and record.get(inp.prompt_key) is not None
    if given:
        prompt = _preference_part(record, inp.prompt_key, config, allow_empty=True)
        if isinstance(prompt, list) != isinstance(chosen, list):
            hint = (f" (rows whose {inp.chosen_key!r} and {inp.rejected_key!r} hold the prompt themselves are read with "
                    "input.prompt_key: null)") if isinstance(chosen, list) else ""
            raise RowError(Drop.WRONG_TYPE, f"field {inp.prompt_key!r} must be {'messages' if isinstance(chosen, list) else 'a string'} "
                                            f"as {inp.chosen_key!r} is{hint}")
    else:
        prompt, chosen, rejected = _shared_prompt(chosen, rejected)
        if isinstance(chosen, list) and not prompt:
            raise RowError(Drop.EMPTY, f"fields {inp.chosen_key!r} and {inp.rejected_key!r} share no leading messages, "
                                       f"so there is no prompt (give it in {inp.prompt_key or 'prompt'!r})")
    if not chosen or not rejected:
        empty = inp.chosen_key if not chosen else inp.rejected_key
        raise RowError(Drop.EMPTY, f"field {empty!r} has nothing past the prompt")
    for key, completion in ((inp.chosen_key, chosen), (inp.rejected_key, rejected)):
        _opens_with_reply(key, completion, given)
    prompt, (chosen, rejected), tools, notes = _preference_context(record, prompt, [chosen, rejected], config)
    # Written as TRL keeps it, and counted: a pair whose completions are one gives DPO nothing to learn.
    return Pair(prompt, chosen, rejected, tools, (*notes, "identical_completions") if chosen == rejected else notes)


@register("kto")
def build_kto(record: dict[str, Any], config: PipelineConfig) -> Unpaired:
    """TRL's unpaired preference rows: prompt / completion (both messages, or both strings) and a boolean
    label (true: the completion is desirable)."""
    inp = config.input
    if inp.completion_key not in record and inp.chosen_key in record and inp.rejected_key in record:
        raise RowError(Drop.MISSING_FIELD, f"field {inp.completion_key!r} is missing: this is a paired row "
                                           f"({inp.chosen_key}, {inp.rejected_key}), read by input.type preference")
    completion = _preference_part(record, inp.completion_key, config)
    prompt = _preference_part(record, inp.prompt_key, config, allow_empty=True)
    if isinstance(prompt, list) != isinstance(completion, list):
        raise RowError(Drop.WRONG_TYPE, f"fields {inp.prompt_key!r} and {inp.completion_key!r} must both be messages "
                                        "or both be strings")
    if inp.label_key not in record:
        raise missing(record, inp.label_key)
    label = record[inp.label_key]
    if not isinstance(label, bool) and label not in (0, 1):
        raise RowError(Drop.WRONG_TYPE, f"field {inp.label_key!r} must be true or false, got {label!r}")
    _opens_with_reply(inp.completion_key, completion, True)
    prompt, (completion,), tools, notes = _preference_context(record, prompt, [completion], config)
    return Unpaired(prompt, completion, bool(label), tools, notes)


Part = list[dict[str, Any]] | str  # a preference row's prompt or completion: messages, or a string


def _preference_context(record: dict[str, Any], prompt: Part, completions: list[Part], config: PipelineConfig
                        ) -> tuple[Part, list[Part], list[Any] | None, tuple[str, ...]]:
    """A preference row's prompt and completions, its tools, and the notes of them: a prompt of messages
    opened by the row's system prompt field (input.field_system) as a chat row's are; strings, with
    input.alpaca_render chat_template, read as LLaMA-Factory's alpaca ranking rows (_alpaca_pair), else a
    non-empty input field beside them (input.field_input) noted as not read."""
    notes: list[str] = []
    if isinstance(prompt, list):
        prompt = _with_system_field(record, prompt, config, notes)
    elif config.input.alpaca_render == "chat_template":
        prompt, completions = _alpaca_pair(record, prompt, completions, config)
    elif _optional_string(record, config.input.field_input).strip():
        notes.append("input_field_not_read")
    tools, parsed = _tools(record)
    # LLaMA-Factory's sharegpt ranking rows (messages under from / value) take their tools as its sharegpt
    # chat rows do (build_sharegpt); TRL's, as transformers passes them.
    if config.input.role_key == "from" and (wrapped := _wrapped(tools)) is not None:
        tools = wrapped
        notes.append("tool_schemas_wrapped")
    return prompt, completions, tools, (*notes, *["tools_parsed_from_string"] * parsed)


def _alpaca_pair(record: dict[str, Any], prompt: str, completions: list[str], config: PipelineConfig
                 ) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """A string preference row as LLaMA-Factory reads its alpaca ranking rows (input.alpaca_render
    chat_template): the prompt joined with the row's input field, after its system prompt and history as
    turns (as an alpaca row's conversation), each completion the assistant's reply to it."""
    inp = config.input
    text = "\n".join(t for t in (prompt, _optional_string(record, inp.field_input)) if t)
    system = _optional_string(record, inp.field_system) or inp.system_prompt
    history = _history(record, inp.field_history)
    turns = [_alpaca_conversation(record, system, history, text, c, config).messages for c in completions]
    return turns[0][:-1], [t[-1:] for t in turns]


def _opens_with_reply(key: str, completion: list[dict[str, Any]] | str, given: bool) -> None:
    """A completion given as messages begins with the reply: one that begins with a user or system message
    would train that message as the model's own."""
    if isinstance(completion, list) and completion and completion[0]["role"] in ("user", "system"):
        where = "" if given else " (the first message where chosen and rejected differ)"
        raise RowError(Drop.WRONG_TYPE, f"the completion in field {key!r} begins with a {completion[0]['role']} "
                                        f"message{where}: a completion is the reply to the prompt, its first message "
                                        "the assistant's")


def _preference_part(record: dict[str, Any], key: str, config: PipelineConfig,
                     allow_empty: bool = False) -> list[dict[str, Any]] | str:
    if key not in record:
        raise missing(record, key)
    value = record[key]
    if isinstance(value, str) and not value.lstrip().startswith("["):
        if not value and not allow_empty:
            raise RowError(Drop.EMPTY, f"field {key!r} is empty")
        return value
    if isinstance(value, list) and not value and allow_empty:
        return []
    if isinstance(value, dict):  # one message (LLaMA-Factory's sharegpt ranking rows): a one-message completion
        record = {key: [value]}
    inp = config.input
    return _conversation(record, key, inp.role_key, inp.content_key, config, system_field=False).messages


def _shared_prompt(chosen: list[dict[str, Any]] | str, rejected: list[dict[str, Any]] | str) -> tuple[Any, Any, Any]:
    """(prompt, chosen's rest, rejected's rest): TRL's extract_prompt."""
    n = 0
    for a, b in zip(chosen, rejected):
        if a != b:
            break
        n += 1
    if isinstance(chosen, str) and 0 < n < min(len(chosen), len(rejected)) and chosen[n - 1] == " ":
        n -= 1  # the space goes with the completions, as TRL has it
    return chosen[:n], chosen[n:], rejected[n:]


@register("pretokenized")
def build_pretokenized(record: dict[str, Any], config: PipelineConfig) -> Tokens:
    """{"input_ids": [...], "attention_mask": [...], "labels": [...]}, as tokenizers and trainers write
    them: positions whose attention_mask is 0 (padding) are left out, and a token is trained unless its
    label is -100 (no labels: all are). Labels must be unshifted (each -100 or the token's own id)."""
    ids = _int_list(record, "input_ids")
    if not ids:
        raise RowError(Drop.EMPTY, "field 'input_ids' is empty")
    attention = _int_list(record, "attention_mask", len(ids)) if "attention_mask" in record else None
    labels = _int_list(record, "labels", len(ids)) if "labels" in record else None
    if attention is not None and any(a not in (0, 1) for a in attention):
        raise RowError(Drop.WRONG_TYPE, "field 'attention_mask' must hold only 0 and 1")
    if labels is not None:
        for i, (label, token) in enumerate(zip(labels, ids)):
            if label not in (-100, token):
                raise RowError(Drop.WRONG_TYPE, f"labels[{i}] is {label}: a label must be -100 or its token's "
                                                f"own id {token} (labels are read unshifted)")
    keep = range(len(ids)) if attention is None else [i for i, a in enumerate(attention) if a == 1]
    if not keep:
        raise RowError(Drop.EMPTY, "field 'attention_mask' masks every token")
    if keep[-1] - keep[0] + 1 != len(keep):  # padding sits at one end; a hole would join tokens never adjacent
        hole = next(i for i in range(keep[0], keep[-1]) if attention[i] == 0)
        raise RowError(Drop.WRONG_TYPE, f"attention_mask[{hole}] is 0 between tokens it keeps: padding is read only "
                                        "at the start or end of a row")
    return Tokens([ids[i] for i in keep], [labels is None or labels[i] != -100 for i in keep])


def _int_list(record: dict[str, Any], key: str, length: int | None = None) -> list[int]:
    value = record.get(key)
    if not isinstance(value, list):
        raise RowError(Drop.WRONG_TYPE if key in record else Drop.MISSING_FIELD,
                       f"field {key!r} must be a list of integers, got {_type_name(value)}")
    bad = next((i for i, v in enumerate(value) if type(v) is not int), None)
    if bad is not None:
        raise RowError(Drop.WRONG_TYPE, f"{key}[{bad}] is {_type_name(value[bad])} {value[bad]!r}, not an integer")
    if length is not None and len(value) != length:
        raise RowError(Drop.WRONG_TYPE, f"field {key!r} has {len(value)} entries, input_ids {length}")
    return value


@register("text")
def build_text(record: dict[str, Any], config: PipelineConfig) -> Segments:
    text = _string_field(record, config.input.text_key)
    if not text:  # nothing to write: it would be the tokenizer's prefix alone (BOS), with no end-of-document
        # token. Shorter than any min_chars: a filtered row, not bad data (--strict goes on).
        raise RowError(Drop.TOO_SHORT, f"field {config.input.text_key!r} is empty")
    return Segments([(text, "text")], train_all=True, add_eod=config.input.append_eod)


def columnar_schema(config: PipelineConfig) -> tuple[tuple[str, ...], tuple[str, str, str] | None] | None:
    """What rows of this config can be read as columns from: (top-level string fields, messages) where
    messages is (field, role key, content key) for chat rows and None for text and instruction rows; None
    for other input types. Text and instruction rows are built from those fields alone; a chat row is read
    as columns only where it has no key beyond them (read.Columnar.complete)."""
    inp = config.input
    domain = (config.output.domain_key,) if config.output.domain_key else ()
    if inp.type in _BUILDERS and not _BUILDERS[inp.type].builtin:
        return None  # a plugin's builder for this type may read any field of the row
    if inp.type == "text":
        return (inp.text_key, *domain), None
    if inp.type == "instruction":
        return (inp.prompt_key, inp.response_key, *domain), None
    if inp.type not in ("chat", "sharegpt"):
        return None
    messages = (inp.messages_key, inp.role_key, inp.content_key) if inp.type == "chat" else sharegpt_keys(config)
    return (None if len(set(messages + domain)) < len(messages) + len(domain) else (domain, messages))


def source_text(shape: Shape) -> str:
    """The row's own text, before any template: what the length filters look at."""
    if isinstance(shape, Segments):
        return shape.source if shape.source is not None else "".join(text for text, _ in shape.pieces)
    if isinstance(shape, Tokens):  # its ids, written out: what length rules and dedup see of it
        return " ".join(map(str, shape.ids))
    if isinstance(shape, _Preference):
        return "\n".join(shape.texts())
    return "\n".join(m["content"] for m in shape.messages)


def source_chars(shape: Shape) -> int:
    """len(source_text(shape)), without joining a conversation's messages into one string."""
    if type(shape) is Conversation and shape.messages:
        return sum([len(m["content"]) for m in shape.messages]) + len(shape.messages) - 1
    return len(source_text(shape))


def split_text(shape: Shape) -> str:
    """What output.splits hashes: the row's own text, and for a preference pair its prompt alone (so the
    pairs of one prompt share a split: a prompt never leaks from train into validation)."""
    return shape.texts()[0] if isinstance(shape, _Preference) else source_text(shape)


def dedup_text(shape: Shape, source: str | None = None) -> str:
    """What deduplication hashes a prefix of: the source text (source_text(shape), when the caller has it),
    less a conversation's system messages (a long system prompt shared by a whole dataset would otherwise
    make every row a duplicate)."""
    if isinstance(shape, Conversation):
        turns = [m["content"] for m in shape.messages if m["role"] != "system"]
        if turns:
            return "\n".join(turns)
    if isinstance(shape, _Preference):  # a duplicate only of an equal row: the prefix hashed is a digest of it
        texts = [*shape.texts(), *([str(shape.label)] if isinstance(shape, Unpaired) else [])]
        return hashlib.md5("\0".join(texts).encode("utf-8", "surrogatepass")).hexdigest()
    if isinstance(shape, Tokens):  # ids written out share long prefixes (a template's header): the whole row
        return hashlib.md5(f"{shape.ids}{shape.trained}".encode()).hexdigest()
    return source_text(shape) if source is None else source


def hashed_whole(shape: Shape) -> bool:
    """Whether dedup_text is a digest of the whole row (preference, kto and pre-tokenized rows)."""
    return isinstance(shape, (_Preference, Tokens))


def fuzzy_text(shape: Shape) -> str:
    """What near-duplicate removal shingles: the text exact dedup hashes, and for a preference or kto row
    its texts themselves (prompt and completions), for a pre-tokenized row its ids written out."""
    return source_text(shape) if isinstance(shape, (_Preference, Tokens)) else dedup_text(shape)


def domain_of(record: dict[str, Any], domain_key: str | None, default: str | None = None) -> str:
    """The row's output domain: its domain_key field; where that names none, `default` (a dataset's own
    domain: for a field missing, null or empty) or __default__ (for a field missing or null; "" is then a
    domain of its own, as any other value)."""
    value = record.get(domain_key) if domain_key is not None else None
    if value is None or (value == "" and default is not None):
        return default or DEFAULT_DOMAIN
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)
    raise RowError(Drop.WRONG_TYPE, f"field {domain_key!r} (the domain) must be a string or an integer (5 is the "
                                    f"domain '5'), got {_type_name(value)}")
