"""Chat templates that are plain concatenation, rendered without Jinja.

Most chat templates (ChatML, Qwen2.5, Gemma, ...) write a fixed text before the first message, the message
contents unchanged, a fixed text between two messages that depends only on their two roles, and a fixed
text after the last one. Such a template is learnt by rendering probe conversations whose contents are
sentinels (some padded with spaces and newlines, so a template that trims or rewrites contents is caught)
and checking that every probe agrees with the learnt pieces. Rendering a row is then a join, and the
content positions come for free. Rows the probes did not cover (other roles, extra message fields, tools,
empty contents) go through Jinja, and so does everything when the probes disagree.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

import jinja2

# A content's stand-in while a template is probed: private-use characters no template writes or changes.
SENTINEL = "\ue000{}\ue001"
SENTINEL_RE = re.compile("\ue000(\\d+)\ue001")
PROBE_ROLES = ("system", "user", "assistant")
_PADDING = ("", " \n", "\n\n", "\t ")


def _probe_contents(count: int, seed: int) -> list[str]:
    pad = _PADDING[seed % len(_PADDING)]
    return [pad + SENTINEL.format(i) + pad for i in range(count)]


@dataclass(frozen=True)
class AffixTemplate:
    prefix: dict[str, str]  # role of the first message -> text before its content
    glue: dict[tuple[str, str], str]  # (role, next role) -> text between their contents
    suffix: dict[str, str]  # role of the last message -> text after its content

    def covers(self, messages: list[dict[str, Any]], tools: Any) -> bool:
        if tools or not messages:
            return False
        roles = [m.get("role") for m in messages]
        return (all(len(m) == 2 and m["content"] for m in messages)
                and roles[0] in self.prefix and roles[-1] in self.suffix
                and all(pair in self.glue for pair in zip(roles, roles[1:])))

    def render(self, messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int, int]]]:
        """The rendering and [(message index, content start, content end)] in characters."""
        roles = [m["role"] for m in messages]
        parts = [self.prefix[roles[0]]]
        regions, pos = [], len(parts[0])
        for i, message in enumerate(messages):
            content = message["content"]
            parts.append(content)
            regions.append((i, pos, pos + len(content)))
            after = self.glue[(roles[i], roles[i + 1])] if i + 1 < len(messages) else self.suffix[roles[i]]
            parts.append(after)
            pos += len(content) + len(after)
        return "".join(parts), regions


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


def _learn(render: Any, sequences: list[tuple[str, ...]]) -> AffixTemplate | None:
    prefix: dict[str, str] = {}
    glue: dict[tuple[str, str], str] = {}
    suffix: dict[str, str] = {}
    for n, roles in enumerate(sequences):
        contents = _probe_contents(len(roles), n)
        try:
            rendered = render([{"role": r, "content": c} for r, c in zip(roles, contents)])
        except jinja2.exceptions.TemplateError:
            continue  # the template refuses this sequence of roles: rows like it will go through Jinja
        try:
            literals = _split(rendered, contents)
        except _Rewritten:
            return None
        if literals is None:
            continue
        learnt = [(prefix, roles[0], literals[0]), (suffix, roles[-1], literals[-1])]
        learnt += [(glue, pair, lit) for pair, lit in zip(zip(roles, roles[1:]), literals[1:-1])]
        for table, key, literal in learnt:
            if table.setdefault(key, literal) != literal:
                return None  # the text depends on more than the neighbouring roles
    return AffixTemplate(prefix, glue, suffix) if prefix and suffix else None


def detect_affix(render: Any, roles: tuple[str, ...] = PROBE_ROLES) -> AffixTemplate | None:
    """An AffixTemplate equivalent to render(messages) on every probe, or None."""
    sequences = [seq for n in range(1, 5) for seq in itertools.product(roles, repeat=n)]
    affix = _learn(render, sequences)
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
        if affix.covers(messages, None) and affix.render(messages)[0] != expected:
            return None
    return affix
