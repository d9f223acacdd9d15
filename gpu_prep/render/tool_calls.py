"""Tool calls whose arguments a row gives as a JSON string, made objects where the template writes them as
objects (as transformers' templates expect)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any



if TYPE_CHECKING:
    from gpu_prep.format import Message
    from gpu_prep.render.sandbox import ChatTemplate




def _arguments_as_objects(messages: list[Message], template: ChatTemplate) -> tuple[list[Message], int]:
    """The messages with each tool call's arguments given as a string holding a JSON object (OpenAI's wire
    format) made that object, where the template writes a string quoted (tojson: Qwen2.5, Llama 3.1), which
    would train a JSON string no tool-call parser reads as arguments; and how many were. A template that
    writes a string as given (Qwen3) gets the messages as they are, as transformers passes them."""
    if template is None or not any(m.get("tool_calls") for m in messages) or not template.quotes_string_arguments:
        return messages, 0
    out, parsed = [], 0
    for message in messages:
        calls = [_call_as_object(call) for call in message.get("tool_calls") or ()]
        changed = sum(made is not call for made, call in zip(calls, message.get("tool_calls") or ()))
        out.append({**message, "tool_calls": calls} if changed else message)
        parsed += changed
    return (out, parsed) if parsed else (messages, 0)


def _call_as_object(call: Any) -> Any:
    """A tool call ({"function": {...}} or the function itself) with arguments that are a string holding a
    JSON object made that object; the call itself where they are not."""
    inner = call.get("function", call) if isinstance(call, dict) else None
    arguments = inner.get("arguments") if isinstance(inner, dict) else None
    if not (isinstance(arguments, str) and arguments.lstrip().startswith("{")):
        return call
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return call
    if not isinstance(value, dict):
        return call
    inner = {**inner, "arguments": value}
    return {**call, "function": inner} if "function" in call else inner
