"""The canonical shapes every row is built into (Conversation and its Messages, Segments, Tokens, Pair,
Unpaired), and RowError (errors.py's, named here too), which drops a row with a reason and a detail."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Required, TypedDict, Union

from gpu_prep.errors import Drop, RowError

DEFAULT_DOMAIN = "__default__"


def missing(record: dict[str, Any], key: str, where: str = "") -> RowError:
    """missing_field for `key` (in the row, or in its part `where`, e.g. "messages[2]."), naming the keys
    there, so that a key set to the wrong name shows which it should be (the first few, each cut short)."""
    keys = [repr(str(k)[:40]) for k in list(record)[:MISSING_KEYS_SHOWN + 1]]
    more = ", ..." if len(keys) > MISSING_KEYS_SHOWN else ""
    there = where.rstrip(".") or "the row"
    has = f"the keys of {there} are {', '.join(keys[:MISSING_KEYS_SHOWN])}{more}" if keys else f"{there} has no keys"
    return RowError(Drop.MISSING_FIELD, f"field {where}{key!r} is missing; {has}")


MISSING_KEYS_SHOWN = 8


class Message(TypedDict, total=False):
    """One message of a conversation, as the chat builders make it and chat templates read it: a role and
    its text always; the other keys where the row has them. A row's other message keys come along under
    their own names (templates may read them), among them the two the mask rules read, under the names
    input.message_training_key and input.message_training_detail_key give (the defaults below)."""

    role: Required[str]  # after input.roles: system, user, assistant, tool, or a role the row names itself
    content: Required[str]  # "" for an assistant turn that only calls tools
    reasoning_content: str  # the turn's reasoning, from input.reasoning_keys or a <think> block
    tool_calls: list[dict[str, Any]]  # OpenAI's: {"type": "function", "function": {"name", "arguments"}}
    tool_call_id: str  # a tool result's: which call it answers
    name: str  # a tool result's function name, or a participant's name
    training: bool | int  # the message trained or masked whatever its role's rule (true / false, 1 / 0)
    train_detail: list[dict[str, Any]]  # [{"begin_offset", "end_offset" (included), "train"}] ranges of its content


@dataclass(frozen=True)
class Conversation:
    messages: list[Message]
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

    prompt: list[Message] | str
    completions: list[list[Message] | str]

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

    prompt: list[Message] | str
    chosen: list[Message] | str
    rejected: list[Message] | str
    tools: list[Any] | None = None
    notes: tuple[str, ...] = ()  # what building the row did, for the parse report (as Conversation.notes)

    @property
    def completions(self) -> list[list[Message] | str]:
        return [self.chosen, self.rejected]


@dataclass(frozen=True)
class Unpaired(_Preference):
    """An unpaired preference row (input.type kto, TRL's format): a prompt, one completion and its label."""

    prompt: list[Message] | str
    completion: list[Message] | str
    label: bool
    tools: list[Any] | None = None
    notes: tuple[str, ...] = ()

    @property
    def completions(self) -> list[list[Message] | str]:
        return [self.completion]


def _part_text(part: list[Message] | str) -> str:
    return part if isinstance(part, str) else "\n".join(m["content"] for m in part)


Shape = Union[Conversation, Segments, Tokens, Pair, Unpaired]


def type_name(value: Any) -> str:
    """A value's JSON-ish type name, as details name what a field holds."""
    return "null" if value is None else type(value).__name__
