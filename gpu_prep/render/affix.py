"""Chat templates that are plain concatenation, rendered without Jinja.

Most chat templates (ChatML, Qwen2.5, Gemma, ...) write a fixed text before the first message, the message
contents unchanged, a fixed text between two messages that depends only on their two roles, and a fixed
text after the last one. Such a template is learnt by rendering probe conversations whose contents are
sentinels (some padded with spaces and newlines, so a template that trims or rewrites contents is caught)
and checking that every probe agrees with the learnt pieces. Rendering a row is then a join, and the
content positions come for free. Rows the probes did not cover (other roles, extra message fields, tools,
empty contents) go through Jinja, and so does everything when the probes disagree.

A template with {% generation %} blocks is learnt the same way when its blocks begin and end inside the
fixed texts (at a place in them that, like the texts, depends only on the neighbouring roles): each fixed
text then carries where blocks begin and end in it, and the rendering gives the same spans Jinja's would.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jinja2

from gpu_prep.render.ranges import Region

if TYPE_CHECKING:
    from gpu_prep.format import Message

# A content's stand-in while a template is probed: private-use characters no template writes or changes.
SENTINEL = "\ue000{}\ue001"
SENTINEL_RE = re.compile("\ue000(\\d+)\ue001")
PROBE_ROLES = ("system", "user", "assistant")
_PADDING = ("", " \n", "\n\n", "\t ")


def _probe_contents(count: int, seed: int) -> list[str]:
    pad = _PADDING[seed % len(_PADDING)]
    return [pad + SENTINEL.format(i) + pad for i in range(count)]


# Where a {% generation %} block begins or ends in a fixed text: (offset in the text, True for a beginning,
# for an end the message the template last read counted from the message after the text, else None).
Mark = tuple[int, bool, int | None]
Key = tuple[str, Any]  # ("prefix", role) | ("glue", (role, next role)) | ("suffix", role)


@dataclass(frozen=True)
class AffixTemplate:
    prefix: dict[str, str]  # role of the first message -> text before its content
    glue: dict[tuple[str, str], str]  # (role, next role) -> text between their contents
    suffix: dict[str, str]  # role of the last message -> text after its content
    marks: dict[Key, tuple[Mark, ...]] | None = None  # where generation blocks lie in each text; None: unmarked

    def covers(self, messages: list[Message], tools: Any) -> bool:
        if tools or not messages:
            return False
        glue, role = self.glue, None
        for m in messages:  # one pass, no generator: this runs for every chat row
            if len(m) != 2 or not m["content"]:
                return False
            if role is not None and (role, m.get("role")) not in glue:
                return False
            role = m.get("role")
        return messages[0].get("role") in self.prefix and role in self.suffix

    def render(self, messages: list[Message]
               ) -> tuple[str, list[Region], list[tuple[int, int, int | None]]]:
        """The rendering, [(message index, content start, content end)] in characters, and (for a marked
        template) the spans its generation blocks cover, as ChatTemplate.render_marked gives them."""
        roles = [m["role"] for m in messages]
        glue, last = self.glue, len(messages) - 1
        parts = [self.prefix[roles[0]]]
        regions: list[Region] = []
        ends = []  # where each content ends: the fixed text after it begins there
        pos = len(parts[0])
        for i, message in enumerate(messages):
            content = message["content"]
            end = pos + len(content)
            after = glue[roles[i], roles[i + 1]] if i < last else self.suffix[roles[i]]
            parts.append(content)
            parts.append(after)
            regions.append(Region(i, pos, end))
            ends.append(end)
            pos = end + len(after)
        text = "".join(parts)
        if not self.marks:
            return text, regions, []
        return text, regions, self._spans(roles, [0, *ends])

    def rendered(self, messages: list[Message]) -> str | tuple[str, list[tuple[int, int, int | None]]]:
        """What the template's render gives (with its generation spans, for a marked one)."""
        text, _, spans = self.render(messages)
        return text if self.marks is None else (text, spans)

    @functools.cached_property
    def _mark_tables(self) -> tuple[dict[str, tuple[Mark, ...]], dict[tuple[str, str], tuple[Mark, ...]],
                                    dict[str, tuple[Mark, ...]]]:
        """marks as three tables, like prefix, glue and suffix (no key tuple to build per message)."""
        tables: dict[str, dict[Any, tuple[Mark, ...]]] = {"prefix": {}, "glue": {}, "suffix": {}}
        for (table, key), mark in (self.marks or {}).items():
            tables[table][key] = mark
        return tables["prefix"], tables["glue"], tables["suffix"]

    def _spans(self, roles: list[str], starts: list[int]) -> list[tuple[int, int, int | None]]:
        """The generation spans of a rendering: starts[m] is where the m-th fixed text begins (the prefix,
        then the text after each message)."""
        prefix, glue, suffix = self._mark_tables
        spans, begun, last = [], 0, len(roles) - 1
        for m, start in enumerate(starts):
            marks = prefix.get(roles[0], ()) if m == 0 else \
                glue.get((roles[m - 1], roles[m]), ()) if m <= last else suffix.get(roles[last], ())
            for offset, beginning, reading in marks:
                if beginning:
                    begun = start + offset
                else:
                    spans.append((begun, start + offset, None if reading is None else m + reading))
        return spans


class _Rewritten(Exception):
    """The template changes contents (trims them, moves them): not plain concatenation."""


def _split(rendered: str, contents: list[str]) -> list[str] | None:
    """The texts between consecutive contents; None when the template leaves a content out (such role
    sequences are not learnt, and rows like them go through Jinja)."""
    found = [int(m.group(1)) for m in SENTINEL_RE.finditer(rendered)]
    if found != sorted(set(found)):
        raise _Rewritten
    if found != list(range(len(contents))):
        return None
    literals, pos = [], 0
    for content in contents:
        at = rendered.find(content, pos)
        if at < 0:
            raise _Rewritten
        literals.append(rendered[pos:at])
        pos = at + len(content)
    literals.append(rendered[pos:])
    return literals


def _marks(literals: list[str], contents: list[str], spans: list[tuple[int, int, int | None]]
           ) -> list[list[Mark]] | None:
    """Where the generation spans of a probe begin and end, per fixed text; None when one begins or ends
    inside a content, or they overlap."""
    bounds, pos = [], 0  # each fixed text's [start, end] in the rendering
    for literal, content in zip(literals, [*contents, ""]):
        bounds.append((pos, pos + len(literal)))
        pos += len(literal) + len(content)

    def place(at: int) -> int | None:
        return next((m for m, (a, b) in enumerate(bounds) if a <= at <= b), None)

    marks: list[list[Mark]] = [[] for _ in literals]
    previous_end = 0
    for start, end, reading in spans:
        first, last = place(start), place(end)
        if first is None or last is None or start < previous_end:
            return None
        marks[first].append((start - bounds[first][0], True, None))
        marks[last].append((end - bounds[last][0], False, None if reading is None else reading - last))
        previous_end = end
    return marks


def _learn(render: Any, sequences: list[tuple[str, ...]], marked: bool) -> AffixTemplate | None:
    tables: dict[str, dict[Any, tuple[str, tuple[Mark, ...]]]] = {"prefix": {}, "glue": {}, "suffix": {}}
    for n, roles in enumerate(sequences):
        contents = _probe_contents(len(roles), n)
        try:
            rendered = render([{"role": r, "content": c} for r, c in zip(roles, contents)])
        except jinja2.exceptions.TemplateError:
            continue  # the template refuses this sequence of roles: rows like it will go through Jinja
        rendered, spans = rendered if marked else (rendered, [])
        try:
            literals = _split(rendered, contents)
        except _Rewritten:
            return None
        if literals is None:
            continue
        marks = _marks(literals, contents, spans)
        if marks is None:
            return None  # a generation block begins or ends inside a content
        keys = [("prefix", roles[0]), *(("glue", pair) for pair in zip(roles, roles[1:])), ("suffix", roles[-1])]
        for (table, key), literal, mark in zip(keys, literals, marks):
            if tables[table].setdefault(key, (literal, tuple(mark))) != (literal, tuple(mark)):
                return None  # the text depends on more than the neighbouring roles
    if not tables["prefix"] or not tables["suffix"]:
        return None
    texts = {name: {key: text for key, (text, _) in table.items()} for name, table in tables.items()}
    marks = {(name, key): mark for name, table in tables.items() for key, (_, mark) in table.items() if mark}
    return AffixTemplate(texts["prefix"], texts["glue"], texts["suffix"], marks if marked else None)


def detect_affix(render: Any, roles: tuple[str, ...] = PROBE_ROLES, marked: bool = False) -> AffixTemplate | None:
    """An AffixTemplate equivalent to render(messages) on every probe, or None. marked: render gives the
    rendering and its generation spans (ChatTemplate.render_marked), and so will the AffixTemplate."""
    sequences = [seq for n in range(1, 5) for seq in itertools.product(roles, repeat=n)]
    affix = _learn(render, sequences, marked)
    if affix is None:
        return None
    # Longer conversations the pieces were not learnt from must come out the same.
    for n, roles_seq in enumerate([("system", "user", "assistant", "user", "assistant", "user", "assistant"),
                                   ("user", "assistant") * 4]):
        messages = [{"role": r, "content": c} for r, c in zip(roles_seq, _probe_contents(len(roles_seq), n + 1))]
        try:
            expected = render(messages)
        except jinja2.exceptions.TemplateError:
            continue
        if affix.covers(messages, None) and affix.rendered(messages) != expected:
            return None
    return affix
