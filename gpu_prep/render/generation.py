"""The {% generation %} tag, as transformers reads it for return_assistant_tokens_mask: rendered unchanged,
and, while ChatTemplate.render_marked runs, where each block lies in the output and which message the
template last read when it wrote it (messages handed to the template as _Message, which tell when read)."""

from __future__ import annotations

import re
import threading
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension

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


def _message(message: dict[str, Any], index: int) -> _Message:
    tracked = _Message(message)
    tracked._gpu_prep_index = index
    return tracked


def has_generation_markers(source: str) -> bool:
    return GENERATION_TAG.search(source) is not None
