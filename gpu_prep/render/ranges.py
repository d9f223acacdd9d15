"""The ranges of a rendering that the render modules hand each other: where a message's content lies
(Region) and a labelled range whose label the mask rules read (Span)."""

from __future__ import annotations

from typing import NamedTuple


class Region(NamedTuple):
    """Where message `index`'s content lies in a rendering: characters [start, end) (empty for a content
    the template writes nothing of but whose turn is placed)."""

    index: int
    start: int
    end: int


class Span(NamedTuple):
    """A range [start, end) of a rendering (characters; bytes once normalized, context._to_bytes), the label
    its mask rule is read from (a role or field, or True / False outright) and the role its trained tokens
    are counted under."""

    start: int
    end: int
    label: str | bool
    role: str
