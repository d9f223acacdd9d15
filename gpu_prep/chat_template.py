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
        self.spans: list[tuple[int, int]] = []


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
            tracker.spans.append((tracker.length, tracker.length + len(body)))
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
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=dict,
                       namespace=_Namespace)
    return env.from_string(source)


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
        return {"messages": messages, "tools": tools, "documents": documents,
                "add_generation_prompt": add_generation_prompt, **self.variables}

    def render(self, messages: list[dict[str, Any]], tools: list[Any] | None = None,
               documents: list[Any] | None = None, add_generation_prompt: bool = False) -> str:
        return self.template.render(**self._arguments(messages, tools, documents, add_generation_prompt))

    def render_marked(self, messages: list[dict[str, Any]], tools: list[Any] | None = None,
                      documents: list[Any] | None = None) -> tuple[str, list[tuple[int, int]]]:
        """The rendering and the character spans its {% generation %} blocks wrote, in order."""
        tracker = _tracking.tracker = _Tracker()
        blocks = []
        try:
            for block in self.template.generate(**self._arguments(messages, tools, documents, False)):
                blocks.append(block)
                tracker.length += len(block)
        finally:
            _tracking.tracker = None
        return "".join(blocks), tracker.spans
