"""Where each message's content lies in a conversation's rendering.

The template is rendered a second time with each content replaced by a sentinel, which gives the
template's own text between the contents (headers, end-of-turn tokens, glue). When substituting the
contents back reproduces the real rendering, the content positions are exact; when the template changed a
content (trim, reasoning moved), the glue is matched in order in the real rendering and whatever the
template wrote in a content's place is that content's region. Contents may come out of order (a template
that moves the system prompt into the last user turn); one written twice has no single place, and the
row is dropped.
"""

from __future__ import annotations

import bisect
import os
from typing import TYPE_CHECKING

import jinja2

from gpu_prep.render.affix import SENTINEL, SENTINEL_RE
from gpu_prep.errors import Drop
from gpu_prep.format import Conversation, Message, RowError
from gpu_prep.render.ranges import Region

if TYPE_CHECKING:
    from gpu_prep.render.sandbox import ChatTemplate


def _content_regions(real: str, skeleton: str, contents: dict[int, str], exact_only: bool = False
                     ) -> list[Region] | None:
    """[(message index, start, end)] of every content in the real rendering (None: not exact, when asked)."""
    parts = SENTINEL_RE.split(skeleton)
    literals, order = parts[0::2], [int(i) for i in parts[1::2]]
    # Contents may come out of order (a template that moves the system prompt into the last user turn);
    # written twice, no single place would be the message's.
    if len(set(order)) < len(order):
        raise RowError(Drop.TEMPLATE_ERROR, "the chat template writes a message's content more than once")
    rebuilt = literals[0] + "".join(contents[i] + lit for i, lit in zip(order, literals[1:]))
    regions: list[Region] = []
    pos = len(literals[0])
    if rebuilt == real:
        for i, lit in zip(order, literals[1:]):
            regions.append(Region(i, pos, pos + len(contents[i])))
            pos += len(contents[i]) + len(lit)
        return regions
    if exact_only:
        return None
    # The template transformed some content: match the glue between contents in order.
    if not real.startswith(literals[0]):
        raise RowError(Drop.TEMPLATE_ERROR, "cannot align the chat template's output with the messages")
    for k, (i, lit) in enumerate(zip(order, literals[1:])):
        last = k == len(order) - 1
        end = len(real) - len(lit) if last else (real.find(lit, pos) if lit else -1)
        if end < pos or (last and not real.endswith(lit)):
            raise RowError(Drop.TEMPLATE_ERROR, f"cannot align the chat template's output with message {i}")
        regions.append(Region(i, pos, end))
        pos = end + len(lit)
    return regions


def render_text(template: ChatTemplate, messages: list[Message], conv: Conversation) -> str:
    return render_marked(template, messages, conv, marked=False)[0]


def render_marked(template: ChatTemplate, messages: list[Message], conv: Conversation, marked: bool = True
            ) -> tuple[str, list[tuple[int, int, int | None]]]:
    """The rendering of these messages with the row's tools and documents (and, when marked, the spans its
    {% generation %} blocks wrote); a template that raises drops the row with its own message."""
    try:
        if marked:
            return template.render_marked(messages, conv.tools, conv.documents)
        return template.render(messages, conv.tools, conv.documents), []
    except jinja2.exceptions.TemplateError as exc:
        raise RowError(Drop.TEMPLATE_ERROR, f"the chat template refused the row: {exc}") from None


def locate_contents(real: str, conv: Conversation, template: ChatTemplate) -> list[Region]:
    """Content regions of every message; an empty content gets an empty region (its end-of-turn token can
    still be trained) unless the template renders empty contents differently, then it gets none."""
    def skeleton(indices: dict[int, str]) -> str:
        masked = [{**m, "content": SENTINEL.format(i)} if i in indices else m for i, m in enumerate(conv.messages)]
        return render_text(template, masked, conv)

    every = {i: m["content"] for i, m in enumerate(conv.messages)}
    non_empty = {i: c for i, c in every.items() if c}
    if len(non_empty) == len(every):
        regions = _content_regions(real, skeleton(every), every)
    else:
        with_every = skeleton(every)
        regions = _content_regions(real, with_every, every, exact_only=True)
        if regions is None:
            regions = _place_empty(real, with_every, _content_regions(real, skeleton(non_empty), non_empty))
    return _place_tool_turns(real, conv, template, regions)


def _place_tool_turns(real: str, conv: Conversation, template: ChatTemplate,
                      regions: list[Region]) -> list[Region]:
    """Empty regions for assistant turns that call tools where the template writes their calls in a
    branch that never writes the content (Llama 3.1, Mistral: a call alone, or the call without the text
    beside it): such a turn starts where the rendering of the messages before it, with the generation
    prompt (the assistant's header), ends, when the real rendering starts with that text (else that of the
    messages before it the real rendering wrote something of). From there the
    turn's text runs on to its end-of-turn token, as any trained content does. A turn that cannot be placed
    so stays without a region; either way a content not written is reported as left out."""
    located = {i for i, _, _ in regions}
    placed = list(regions)
    # The text from the end of a message of a role to the header's end of a call turn after it, as the first
    # such turn's rendering showed it: a later turn after the same role is placed where that text, found
    # again, ends, without rendering its prefix (an agent's trajectory of n calls would cost n renders).
    glue: dict[str, str] = {}
    # Where the placed regions end, by message, and the first start of those of each message on: a pass
    # over the regions for each call turn would cost a trajectory of n calls n^2.
    ends = {j: end for j, _, end in regions}
    firsts = [len(real)] * (len(conv.messages) + 1)
    for j, start, _ in regions:
        firsts[j] = min(firsts[j], start)
    for j in range(len(conv.messages) - 1, -1, -1):
        firsts[j] = min(firsts[j], firsts[j + 1])
    before = 0  # the furthest end of the regions of the messages before message i
    for i, message in enumerate(conv.messages):
        before = max(before, ends.get(i - 1, 0))
        if i in located or not message.get("tool_calls") or message["role"] != "assistant":
            continue
        after = firsts[i + 1]
        previous = conv.messages[i - 1]["role"] if i - 1 in ends else None
        known = glue.get(previous) if previous is not None else None
        if known and real.startswith(known, before) and before + len(known) <= after:
            placed.append(Region(i, before + len(known), before + len(known)))
            ends[i] = before + len(known)
            continue
        header = _render_with_prompt(template, conv.messages[:i], conv)
        if header is None or not real.startswith(header):
            # Without the messages the whole rendering wrote nothing of: Mistral v0.3 writes a system message
            # into the last user turn only when the conversation ends there, as a prefix before a call does.
            written = {j for j, _, _ in placed}
            kept = [m for j, m in enumerate(conv.messages[:i]) if j in written]
            header = _render_with_prompt(template, kept, conv) if len(kept) < i else None
        if header is not None and real.startswith(header) and before <= len(header) <= after:
            placed.append(Region(i, len(header), len(header)))
            ends[i] = len(header)
            if previous is not None and len(header) > before:
                glue[previous] = header[before:]
    return sorted(placed, key=lambda region: (region.start, region.index))


def _render_with_prompt(template: ChatTemplate, messages: list[Message], conv: Conversation) -> str | None:
    """The rendering of these messages followed by the generation prompt; None where the template refuses
    them (a prefix of a conversation may break a template's rules)."""
    try:
        return template.render(messages, conv.tools, conv.documents, add_generation_prompt=True)
    except jinja2.exceptions.TemplateError:
        return None


class RowTexts:
    """What a row's rendering writes around its messages where no end-of-turn token marks it, found by
    rendering for the first message after (or of) a role and, for later ones, where the text that showed,
    found again, says (an agent's n turns would otherwise cost n renders of a growing conversation):
    closing, what closes a message's turn (closing_text); calls, where a turn's tool calls written before
    its content lie (calls_apart)."""

    def __init__(self, real: str, conv: Conversation, template: ChatTemplate, eots: tuple[str, ...]) -> None:
        self.real, self.conv, self.template, self.eots = real, conv, template, eots
        self.tails: dict[str, tuple[str, str]] = {}  # role -> closing text, the tool_call_id it holds
        self.leads: dict[str | None, tuple[str, str]] = {}  # role before -> text up to the calls, header
        self.unplaced = 0  # call turns whose calls, written before the content, could not be placed

    def notes(self) -> tuple[str, ...]:
        return ("tool_calls_not_trained",) * self.unplaced

    def closing(self, i: int, at: int, limit: int) -> int:
        """How many characters from `at` (message i's content end) close its turn (0: none found)."""
        message, real = self.conv.messages[i], self.real
        own = message.get("tool_call_id") if isinstance(message.get("tool_call_id"), str) else ""
        tail = None
        if message["role"] in self.tails:
            text, theirs = self.tails[message["role"]]
            tail = text.replace(theirs, own) if theirs and own else text
        if not (tail and real.startswith(tail, at)):
            tail = closing_text(self.template, self.conv, i)
            if tail:
                self.tails[message["role"]] = (tail, own)
        return len(tail) if tail and real.startswith(tail, at) and at + len(tail) <= limit else 0

    def calls(self, i: int, after: int, before: int) -> tuple[int, int, int] | None:
        """Message i's calls written between the message before it (ending at `after`) and its content (at
        `before`): where their block starts, where the calls start after the header, where it ends."""
        previous = self.conv.messages[i - 1]["role"] if i else None
        if previous in self.leads:
            lead, header = self.leads[previous]
            start = after + len(lead)
            calls = start + len(header) if self.real.startswith(header, start) else start
            ends = [e + len(t) for t in self.eots if (e := self.real.find(t, calls, before)) >= 0]
            names = call_names(self.conv.messages[i])
            if self.real.startswith(lead, after) and ends and any(self.real.find(n, calls, min(ends)) >= 0 for n in names):
                return start, calls, min(ends)
        # Once a turn's calls are no plain insertion (R1's template writes the turn after them otherwise
        # without them), the row's later ones are not tried either: each try renders the row three times.
        found = None if self.unplaced else calls_apart(self.real, self.conv, self.template, i, self.eots)
        if found is not None and after <= found[0]:
            self.leads[previous] = (self.real[after:found[0]], self.real[found[0]:found[1]])
            return found
        self.unplaced += 1
        return None


def call_names(message: Message) -> list[str]:
    """The names of the functions a message calls."""
    return [c["function"]["name"] for c in message.get("tool_calls") or () if isinstance(c, dict)
            and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)]


def closing_text(template: ChatTemplate, conv: Conversation, i: int) -> str | None:
    """What the template writes after message i's content when the conversation ends with that message (no
    generation prompt): the rest of its turn, where no end-of-turn token closes it (Mistral's `[/INST]`
    after a user, `, "call_id": ...}[/TOOL_RESULTS]` after a tool result). None where the content is not
    written (a call written alone) or the template refuses the shortened conversation."""
    messages = conv.messages[:i] + [{**conv.messages[i], "content": SENTINEL.format(0)}]
    try:
        text = template.render(messages, conv.tools, conv.documents)
    except jinja2.exceptions.TemplateError:
        return None
    found = list(SENTINEL_RE.finditer(text))
    return text[found[-1].end():] if len(found) == 1 else None


def calls_apart(real: str, conv: Conversation, template: ChatTemplate, i: int, eots: tuple[str, ...]
                ) -> tuple[int, int, int] | None:
    """Where the template writes message i's tool calls when it writes them apart from the turn's content
    (DeepSeek R1's distills: `<｜Assistant｜>` calls `<｜end▁of▁sentence｜>` before the content's own turn): the
    text the rendering gains by the calls, placed to end with an end-of-turn token where it can be (an
    insertion can be read at several places when the text around it repeats): where it starts, where the
    calls start after the assistant header (the generation prompt's opening) it may start with, and where
    it ends. None where the calls are not a plain insertion."""
    bare = [{k: v for k, v in m.items() if k != "tool_calls"} if j == i else m for j, m in enumerate(conv.messages)]
    try:
        other = template.render(bare, conv.tools, conv.documents)
        before = template.render(conv.messages[:i], conv.tools, conv.documents)
        prompted = template.render(conv.messages[:i], conv.tools, conv.documents, add_generation_prompt=True)
    except jinja2.exceptions.TemplateError:
        return None
    start = len(os.path.commonprefix((real, other)))
    room = len(other) - start  # the common tail may not reach back past the common head
    tail = len(os.path.commonprefix((real[::-1][:room], other[::-1][:room])))
    end = len(real) - tail
    if len(other) != start + tail or end <= start:
        return None
    places = [(start, end)]
    while places[-1][0] > 0 and real[places[-1][0] - 1] == real[places[-1][1] - 1]:
        places.append((places[-1][0] - 1, places[-1][1] - 1))
    start, end = next(((a, b) for a, b in places if any(real.startswith(t, b - len(t)) for t in eots)), places[0])
    header = prompted[len(before):] if prompted.startswith(before) else ""
    return start, start + len(os.path.commonprefix((header, real[start:end]))), end


def _place_empty(real: str, with_every: str, regions: list[Region]) -> list[Region]:
    """Empty regions for the empty contents of a template that writes them differently (Qwen3 starts a
    tool call on a new line only after some content): an empty content sits where the text the template
    writes before a content (its header) ends, counted from the end of the content before it."""
    parts = SENTINEL_RE.split(with_every)
    located = {i: (start, end) for i, start, end in regions}
    starts = sorted(start for start, _ in located.values())
    placed, previous_end = list(regions), 0
    for before, index in zip(parts[0::2], (int(i) for i in parts[1::2])):
        if index in located:
            previous_end = located[index][1]
            continue
        at = previous_end + len(before)
        k = bisect.bisect_left(starts, previous_end)  # (a pass over them each time: n^2 for n empty contents)
        following = starts[k] if k < len(starts) else len(real)
        if not real.startswith(before, previous_end) or at > following:
            continue  # not where a content would be: left out, as the template wrote nothing for it
        placed.append(Region(index, at, at))
        previous_end = at
    return sorted(placed, key=lambda region: (region.start, region.index))
