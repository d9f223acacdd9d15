"""Tool-call arguments a row gives as a JSON string (OpenAI's wire format), made objects where the template
writes them with tojson, so the trained text is the object a tool-call parser reads (render/tool_calls.py).
The toy tokenizer's ids are the rendered bytes, so the sample reads back as text."""

from __future__ import annotations

from typing import Any

from gpu_prep.backend import CPU
from gpu_prep.config import parse_config
from gpu_prep.format import Conversation
from gpu_prep.render.row import render_row
from gpu_prep.render.sandbox import ChatTemplate
from gpu_prep.render.tool_calls import _arguments_as_objects
from gpu_prep.run.context import build_context
from toy import IM_END
from toy import ids as ids_of

QUOTING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
           "{% for c in m.tool_calls or [] %}<call>{{ c.function.arguments | tojson }}</call>{% endfor %}"
           "<|im_end|>\n{% endfor %}")
AS_GIVEN = QUOTING.replace("{{ c.function.arguments | tojson }}",
                           "{% if c.function.arguments is string %}{{ c.function.arguments }}"
                           "{% else %}{{ c.function.arguments | tojson }}{% endif %}")


def _call(arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "add", "arguments": arguments}}


def _messages(*calls: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "1+2?"}, {"role": "assistant", "content": "", "tool_calls": list(calls)}]


def test_string_arguments_become_objects_only_where_the_template_quotes_strings() -> None:
    quoting, as_given = ChatTemplate(QUOTING, {}), ChatTemplate(AS_GIVEN, {})
    assert quoting.quotes_string_arguments and not as_given.quotes_string_arguments
    messages = _messages(_call('{"a": 1, "b": 2}'), _call("not json"), _call('["a list"]'), _call({"a": 3}))
    made, count = _arguments_as_objects(messages, quoting)
    assert count == 1 and made[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1, "b": 2}
    assert made[1]["tool_calls"][1:] == messages[1]["tool_calls"][1:]  # not a JSON object: as given
    assert _arguments_as_objects(messages, as_given) == (messages, 0)


def test_the_trained_call_is_the_object_in_the_toy_ids(toy: Any) -> None:
    config = parse_config({"mask": {"assistant": "train"}, "chat_template": QUOTING})
    ctx = build_context(config, toy, CPU, [], None, None).render
    row = render_row(Conversation(_messages(_call('{"a": 1}'))), ctx)
    text = row.pieces[0]
    assert '<call>{"a": 1}</call>' in text and '\\"a\\"' not in text  # an object, not a quoted string
    (start, end), = row.spans
    assert text.encode("utf-8")[start:end] == b'<call>{"a": 1}</call><|im_end|>'
    ids, _ = toy.encode([text.encode("utf-8")[start:end].decode("utf-8")])
    assert ids.tolist() == [*ids_of('<call>{"a": 1}</call>'), IM_END]  # one id per byte, then <|im_end|>
