"""Chat templates rendered in Jinja's sandbox, with the environment transformers gives them.

Same options (trim_blocks, lstrip_blocks, loop controls, a {% generation %} tag), the same globals
(raise_exception, strftime_now, dict, namespace) and the same tojson filter, so a template renders here
exactly as `apply_chat_template(..., tokenize=False)` renders it. Nothing in a config is evaluated as code:
templates can only reach what the sandbox allows.
"""

from __future__ import annotations

import json
import re
import threading
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
_tracking = threading.local()  # the rendering in progress on this thread that records generation spans


class _Tracker:
    def __init__(self) -> None:
        self.length = 0  # characters the template has written so far
        self.spans: list[tuple[int, int, int | None]] = []  # start, end, the message it was writing
        self.message: int | None = None  # the message the template last read from


class _Message(dict):
    """A message that tells the tracker when the template reads it (so a generation span is known to be
    that message's, even where the template writes no content for it, as for a tool call)."""

    # Underscored, so the sandbox hides it: a template reads only the message's own keys.
    __slots__ = ("_gpu_prep_index",)


class _Environment(ImmutableSandboxedEnvironment):
    def getitem(self, obj: Any, argument: Any) -> Any:
        if type(obj) is _Message:
            _read(obj)
        return super().getitem(obj, argument)

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is _Message:
            _read(obj)
        return super().getattr(obj, attribute)


def _read(message: _Message) -> None:
    tracker = getattr(_tracking, "tracker", None)
    if tracker is not None:
        tracker.message = message._gpu_prep_index


class _GenerationTag(Extension):
    """{% generation %}...{% endgeneration %} renders its body unchanged; while ChatTemplate.render_marked
    runs, it also records where the body lies in the output, as transformers does for
    return_assistant_tokens_mask: from the characters the template has yielded so far."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        body = caller()
        tracker = getattr(_tracking, "tracker", None)
        if tracker is not None:
            tracker.spans.append((tracker.length, tracker.length + len(body), tracker.message))
        return body


class _Namespace(jinja2.utils.Namespace):
    """A namespace that refuses underscore names, so templates cannot reach interpreter internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's own signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"templates may not set underscore attributes ({name!r})")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    env = _Environment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=dict,
                       namespace=_Namespace)
    return env.from_string(source)


REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' names for a message's reasoning


def _as_transformers_passes(message: dict[str, Any]) -> dict[str, Any]:
    """A message as transformers hands it to a template: keys whose value is None left out, and its
    reasoning under `thinking` and `reasoning_content` both (templates read one or the other)."""
    if any(v is None for v in message.values()):
        message = {k: v for k, v in message.items() if v is not None}
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is not None:
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


def _message(message: dict[str, Any], index: int) -> _Message:
    tracked = _Message(message)
    tracked._gpu_prep_index = index
    return tracked


def has_generation_markers(source: str) -> bool:
    return GENERATION_TAG.search(source) is not None


class ChatTemplate:
    """A compiled template plus the variables it reads besides the conversation: the tokenizer's special
    tokens (bos_token, eos_token, ...) and the config's chat_template_kwargs, which win, as in transformers."""

    def __init__(self, source: str, special_tokens: dict[str, str], kwargs: dict[str, Any] | None = None) -> None:
        self.source = source
        self.template = compile_template(source)
        self.variables = {**special_tokens, **(kwargs or {})}
        self.marked = has_generation_markers(source)

    def _arguments(self, messages: list[dict[str, Any]], tools: list[Any] | None, documents: list[Any] | None,
                   add_generation_prompt: bool) -> dict[str, Any]:
        return {"messages": [_as_transformers_passes(m) for m in messages], "tools": tools, "documents": documents,
                "add_generation_prompt": add_generation_prompt, **self.variables}

    def render(self, messages: list[dict[str, Any]], tools: list[Any] | None = None,
               documents: list[Any] | None = None, add_generation_prompt: bool = False) -> str:
        return self.template.render(**self._arguments(messages, tools, documents, add_generation_prompt))

    def render_marked(self, messages: list[dict[str, Any]], tools: list[Any] | None = None,
                      documents: list[Any] | None = None) -> tuple[str, list[tuple[int, int, int | None]]]:
        """The rendering and the character spans its {% generation %} blocks wrote, in order, each with the
        index of the message the template last read from when the block ended (None: none)."""
        arguments = self._arguments(messages, tools, documents, False)
        arguments["messages"] = [_message(m, i) for i, m in enumerate(arguments["messages"])]
        tracker = _tracking.tracker = _Tracker()
        blocks = []
        try:
            for block in self.template.generate(**arguments):
                blocks.append(block)
                tracker.length += len(block)
        finally:
            _tracking.tracker = None
        return "".join(blocks), tracker.spans
