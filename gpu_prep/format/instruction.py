"""Builders of instruction-like rows: instruction, prompt_response, alpaca (with history) and segments; and
of text and pre-tokenized rows."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from gpu_prep.errors import Drop
from gpu_prep.format.chat import _conversation, _string_field
from gpu_prep.format.registry import register
from gpu_prep.format.shapes import Conversation, RowError, Segments, Tokens, missing, type_name

if TYPE_CHECKING:
    from gpu_prep.config import PipelineConfig


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
                                        f"{type_name(value)}")
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
        raise RowError(Drop.WRONG_TYPE, f"field 'segments' must be a list, got {type_name(raw)}")
    pieces: list[tuple[str, str | bool | None]] = []
    for i, segment in enumerate(raw):
        where = f"segments[{i}]."
        if not isinstance(segment, dict):
            raise RowError(Drop.WRONG_TYPE, f"segments[{i}] must be an object, got {type_name(segment)}")
        text = _string_field(segment, "text", where)
        if not isinstance(segment.get("label"), bool):
            raise RowError(Drop.WRONG_TYPE if "label" in segment else Drop.MISSING_FIELD,
                           f"field {where}'label' must be true or false, got {type_name(segment.get('label'))}")
        pieces.append((text, segment["label"]))
    if not any(text for text, _ in pieces):
        raise RowError(Drop.EMPTY, "field 'segments' has no text")
    return Segments(pieces)


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
                       f"field {key!r} must be a list of integers, got {type_name(value)}")
    bad = next((i for i, v in enumerate(value) if type(v) is not int), None)
    if bad is not None:
        raise RowError(Drop.WRONG_TYPE, f"{key}[{bad}] is {type_name(value[bad])} {value[bad]!r}, not an integer")
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
