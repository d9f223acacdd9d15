"""Builders of preference pairs (chosen and rejected) and KTO rows (one completion and its label), from
messages or strings, with the prompt they share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_prep.errors import Drop
from gpu_prep.format.chat import _conversation, _tools, _with_system_field, _wrapped
from gpu_prep.format.instruction import _alpaca_conversation, _history, _optional_string
from gpu_prep.format.registry import register
from gpu_prep.format.shapes import Pair, RowError, Unpaired, missing, type_name

if TYPE_CHECKING:
    from gpu_prep.config import PipelineConfig


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
                                        f"{type_name(record[inp.rejected_key])}")
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
