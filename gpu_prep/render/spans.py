"""render/spans: a conversation -> the spans of its rendering that are trained.

A conversation is rendered ONCE with the real chat template, and the position of every message's content
in that rendering is found exactly (locate.py). What is trained is then said by the template's
{% generation %} markers where it has them (as transformers reads them), else by role spans: a trained
message's content and the end-of-turn token that closes it (or its whole turn).

Spans are labelled with the role (or field); the mask rules then pick the trained ones. For byte-level BPE,
positions are UTF-8 byte offsets into the text the tokenizer sees, after the tokenizer's Unicode
normalization, which is applied piece by piece so that positions and text agree. For every other tokenizer
(ctx.offsets) they stay character offsets into the rendered text, the coordinates of the offsets the
tokenizer reports.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from itertools import accumulate, pairwise
from typing import TYPE_CHECKING, Any, NamedTuple


from gpu_prep.errors import Drop
from gpu_prep.format import Conversation, Message, RowError
from gpu_prep.render.locate import RowTexts, call_names, locate_contents, render_marked, render_text
from gpu_prep.render.context import RenderContext, no_template
from gpu_prep.render.ranges import Region, Span

if TYPE_CHECKING:
    from gpu_prep.render.sandbox import ChatTemplate


class ConversationSpans(NamedTuple):
    """A conversation's rendering and what conversation_spans found in it."""

    text: str  # the rendering
    spans: list[Span]  # its labelled character spans
    # The roles of messages whose content the template left out (a role it does not know, say: counted,
    # since their text is not in the row).
    left_out: tuple[str, ...] = ()
    # The roles of trained messages the template's {% generation %} markers never mark (reported).
    unmarked: tuple[str, ...] = ()
    # Notes for the parse report (tool_calls_not_trained: calls written before a content that could not be placed).
    notes: tuple[str, ...] = ()


def _after_eot(text: str, eot: re.Pattern[str], last: bool) -> int | None:
    """Where the first (or last) end-of-turn token in text ends, newlines after it included."""
    matches = list(eot.finditer(text)) if last else [m] if (m := eot.search(text)) else []
    if not matches:
        return None
    end = matches[-1].end()
    return end + len(text[end:]) - len(text[end:].lstrip("\n"))


def conversation_spans(conv: Conversation, ctx: RenderContext) -> ConversationSpans:
    """The rendered conversation and its labelled character spans (and the roles left out or unmarked, the
    notes: ConversationSpans): by the template's {% generation %} markers where they rule, else by role
    spans, of whole turns (mask_scope turn) or of contents (_content_spans)."""
    if ctx.template is None:
        raise no_template("chat rows", ctx.template_source)
    template = ctx.template_for(conv)
    marked = ctx.generation and template.marked
    real, regions, generated = _rendering(conv, template, marked, ctx)
    roles = [m["role"] for m in conv.messages]
    # A message is left out where nothing of it was located, or its content was not (a call written alone,
    # the text beside it not: _place_tool_turns; a <think> block alone is think_blocks_not_rendered's).
    located = {i for i, start, end in regions if end > start or not conv.messages[i].get("tool_calls")
               or not _split_think(conv.messages[i]["content"] or "")[1].strip()}
    left_out = () if len(located) == len(roles) else tuple(
        roles[i] for i, m in enumerate(conv.messages) if (m["content"] or m.get("tool_calls")) and i not in located)
    if not regions:
        return ConversationSpans(real, [], left_out)
    labels = ctx.policy.labels(conv.messages)
    if marked:
        spans = _generation_spans(real, generated, regions, labels, conv, ctx)
        return ConversationSpans(real, spans, left_out, _unmarked(spans, regions, labels, roles, conv, ctx))
    texts = RowTexts(real, conv, template, ctx.end_of_turn)
    if ctx.policy.mask_scope == "turn":
        spans = _turn_spans(real, regions, labels, roles, texts, ctx)
    else:
        spans = _content_spans(real, regions, labels, roles, texts, ctx)
    return ConversationSpans(real, spans, left_out, (), texts.notes())


def _rendering(conv: Conversation, template: ChatTemplate, marked: bool, ctx: RenderContext
               ) -> tuple[str, list[Region], list[tuple[int, int, int | None]]]:
    """The rendering, where each message's content lies in it, and (marked) the spans its {% generation %}
    blocks wrote: without Jinja where the template's affix form covers the row."""
    if ctx.affix is not None and ctx.affix.covers(conv.messages, conv.tools) and not conv.documents:
        return ctx.affix.render(conv.messages)
    real, generated = render_marked(template, conv.messages, conv, marked=marked)
    _writes_tool_calls(real, conv, template)
    return real, _locate(real, conv, template, ctx), generated


def _between(real: str, regions: list[Region]) -> tuple[list[int], list[int]]:
    """For each region, where the region before it ends (0 before the first) and where the one after it
    starts (the rendering's end after the last)."""
    return [0] + [end for _, _, end in regions[:-1]], [start for _, start, _ in regions[1:]] + [len(real)]


def _turn_spans(real: str, regions: list[Region], labels: list[str | bool], roles: list[str], texts: RowTexts,
                ctx: RenderContext) -> list[Span]:
    """Whole turns (mask_scope turn), one span per region, in order: each turn runs from the end of the
    previous turn's end-of-turn token to the same point of its own, so headers belong to their own turn and
    text before the first header (BOS, an injected default system prompt) to none. Where no end-of-turn
    token follows a message, its turn runs on through what the template writes after its content when it
    is the last message (texts.closing: Mistral's `[/INST]`, its tool result's `[/TOOL_RESULTS]`), as the
    model's own encoder cuts turns; else it ends with its content. A turn's tool calls written before its
    content (locate.calls_apart) open its turn, header and all."""
    messages = texts.conv.messages
    opening = {i: found[0] for (i, start, end), after, limit in zip(regions, *_between(real, regions))
               if roles[i] == "assistant" and messages[i].get("tool_calls")
               and not _calls_follow(messages[i], real, end, limit) and (found := texts.calls(i, after, start)) is not None}
    eot = ctx.eot_pattern()
    head = real[: regions[0].start]
    first = _after_eot(head, eot, last=True)
    if first is None:
        first = len(ctx.prefix_text) if ctx.prefix_text and head.startswith(ctx.prefix_text) else 0
    bounds = [first]
    for (i, _, prev_end), (k, start, _) in pairwise(regions):
        if prev_end <= opening.get(k, start) < start:
            start = opening[k]
        after = _after_eot(real[prev_end:start], eot, last=True)
        bounds.append(prev_end + (after if after is not None else texts.closing(i, prev_end, start)))
    last_end = regions[-1].end
    bounds.append(last_end + (_after_eot(real[last_end:], eot, last=False) or 0))
    return [Span(a, b, labels[i], roles[i]) for (i, _, _), a, b in zip(regions, bounds, bounds[1:])]


def _content_spans(real: str, regions: list[Region], labels: list[str | bool], roles: list[str], texts: RowTexts,
                   ctx: RenderContext) -> list[Span]:
    """Contents (mask_scope content): a trained content runs on to the end-of-turn token that closes it, as
    what the template writes between them (tool calls, a space) is the same turn's output; train_on_eos
    says which turns' end-of-turn tokens are trained: those of trained turns (turn), of every turn (all), of
    the last trained turn (last), or none. With think_loss, a trained turn's reasoning is trained with it."""
    policy, messages = ctx.policy, texts.conv.messages
    eos, detail_key, think_loss = policy.train_on_eos, policy.message_training_detail_key, policy.think_loss
    # Asked of every message: a set (a list would cost a row of n messages n^2), and the last in rendering order.
    in_order = [i for i, _, _ in regions if policy.trains(labels[i])]
    trained, last_trained = set(in_order), (in_order[-1] if in_order else None)
    eot = ctx.eot_pattern()
    spans: list[Span] = []
    apart: list[Span] = []  # tool calls written apart from their turn's content (before it)
    previous_end = 0
    for (i, start, end), after, limit in zip(regions, *_between(real, regions)):
        message, label, role = messages[i], labels[i], roles[i]  # role: what its trained tokens count under
        content = start  # a training detail's offsets count from here, whatever reasoning is trained before it
        if think_loss and i in trained:
            start = _reasoning_start(real, message, previous_end, start)
        previous_end = end
        found = eot.search(real, end, limit)
        match = found if eos in ("turn", "all") or (eos == "last" and i == last_trained) else None
        # An assistant's output runs on to its end-of-turn token, trained or not: what the template writes
        # between them (tool calls; a space only with the token) is the turn's. Other roles' glue is markup
        # (Qwen3's </tool_response>).
        output_end = end
        if found is not None and role == "assistant" and (match is not None or real[end:found.start()].strip()):
            output_end = found.start()
        if detail_key and message.get(detail_key) is not None:
            spans.extend(_with_detail(real, message, i, Span(start, output_end, label, role), content, end, detail_key))
        else:
            spans.append(Span(start, output_end, label, role))
        if match is not None:
            spans.append(Span(match.start(), match.end(), label if i in trained or eos != "all" else True, role))
        if message.get("tool_calls") and role == "assistant" and not _calls_follow(message, real, end, limit):
            apart.extend(_apart(real, texts.calls(i, after, content), label, i in trained, ctx, eos))
    if eos == "all":  # every turn's: those of turns the template writes on its own too
        apart.extend(_own_turn_ends(real, regions, spans + apart, eot, roles))
    return sorted(spans + apart, key=lambda span: span[:2]) if apart else spans


def _with_detail(real: str, message: Message, i: int, span: Span, content: int, end: int, key: str) -> list[Span]:
    """A message's span cut by its training detail (key), whose ranges cover its content [content, end): the
    reasoning before the content and the output after it keep the message's label."""
    start, output_end, label, role = span
    detail = _detail(message, i, real[content:end], key)
    if not detail:
        return [span]
    reasoning = [Span(start, content, label, role)] if content > start else []
    output = [Span(end, output_end, label, role)] if output_end > end else []
    return reasoning + _split(content, end, label, role, detail) + output


def _own_turn_ends(real: str, regions: list[Region], spans: list[Span], eot: Any,
                   roles: list[str]) -> list[Span]:
    """The end-of-turn tokens of turns no message stands for (Qwen2.5's default system prompt, written where
    a conversation has none), trained under train_on_eos all, each counted under the role of the message
    before it (system, before the first)."""
    # The ranges by start, with the furthest end reached so far: a token is covered where the ranges that
    # start at or before it reach past it. Two searches per token, not a pass over every span and region,
    # which would cost a row of n messages n^2. (Regions lie in rendering order.)
    covered = sorted([(a, b) for a, b, _, _ in spans] + [(start, end) for _, start, end in regions])
    starts, reach = [a for a, _ in covered], list(accumulate((b for _, b in covered), max))
    region_starts = [start for _, start, _ in regions]
    own: list[Span] = []
    for found in eot.finditer(real):
        at = found.start()
        k = bisect.bisect_right(starts, at)
        if k == 0 or reach[k - 1] <= at:
            before = bisect.bisect_right(region_starts, at)
            own.append(Span(at, found.end(), True, roles[regions[before - 1].index] if before else "system"))
    return own


def _calls_follow(message: Message, real: str, end: int, limit: int) -> bool:
    """Whether a message's tool calls are written after its content, before the next message's (so they are
    the turn's output the content's span runs on through): a called function's name is there."""
    names = call_names(message)
    return not names or any(real.find(name, end, limit) >= 0 for name in names)


def _apart(real: str, found: tuple[int, int, int] | None, label: str | bool, trained: bool, ctx: RenderContext,
           policy: str) -> list[Span]:
    """The spans of tool calls a template writes apart from the content (RowTexts.calls), and of their
    end-of-turn token, labelled as the token closing a turn is."""
    if found is None:
        return []
    _, start, end = found
    token = next((t for t in ctx.end_of_turn if real.startswith(t, end - len(t))), None)
    if token is None:
        return [Span(start, end, label, "assistant")] if end > start else []
    calls = [Span(start, end - len(token), label, "assistant")] if end - len(token) > start else []
    if policy not in ("turn", "all"):
        return calls
    return calls + [Span(end - len(token), end, label if trained or policy != "all" else True, "assistant")]


def _writes_tool_calls(real: str, conv: Conversation, template: ChatTemplate) -> None:
    """Drops a row whose tool calls the template writes nothing of (a template without tool-call support,
    seen as the rendering without them being the same): written, the call would be lost and the turn
    trained as a reply without it."""
    calls = [i for i, m in enumerate(conv.messages) if m.get("tool_calls")]
    if not calls:
        return
    bare = [{k: v for k, v in m.items() if k != "tool_calls"} for m in conv.messages]
    try:
        if render_text(template, bare, conv) != real:
            return
    except RowError:  # refused without them: the template reads them
        return
    raise RowError(Drop.TEMPLATE_ERROR, f"the chat template writes nothing of the tool_calls of message {calls[0]} "
                                        "(it does not render tool calls), so the call would be lost; use a template "
                                        "that does (qwen2.5, qwen3 and llama3.1 do), or, for a sharegpt row's "
                                        "function_call turn, list its role under assistant in input.roles to train "
                                        "the call as text")


def _generation_spans(real: str, generated: list[tuple[int, int, int | None]], regions: list[Region],
                      labels: list[str | bool], conv: Conversation, ctx: RenderContext) -> list[Span]:
    """The template's {% generation %} spans, each labelled with the message it belongs to, so role rules,
    training flags and training detail still narrow them: the message the template was reading when it
    wrote the span, else the first whose content ends at or after the span's start (the span holds that
    message's header, reasoning, content or end-of-turn text)."""
    ends = [end for _, _, end in regions]
    key = ctx.policy.message_training_detail_key
    where = {i: (start, end) for i, start, end in regions} if key else {}
    messages, last = conv.messages, len(regions) - 1
    spans: list[Span] = []
    for start, end, reading in generated:
        i = reading if reading is not None else regions[min(bisect.bisect_left(ends, start), last)].index
        message = messages[i]
        if not key or message.get(key) is None or i not in where:
            spans.append(Span(start, end, labels[i], message["role"]))
            continue
        content_start, content_end = where[i]
        shift = content_start - start  # detail ranges count from the content's start
        detail = [(max(a + shift, 0), min(b + shift, end - start), train)
                  for a, b, train in _detail(message, i, real[content_start:content_end], key)]
        spans.extend(_split(start, end, labels[i], message["role"], [d for d in detail if d[1] > d[0]]))
    return spans


def _unmarked(spans: list[Span], regions: list[Region], labels: list[str | bool], roles: list[str],
              conv: Conversation, ctx: RenderContext) -> tuple[str, ...]:
    """The roles of trained messages no {% generation %} span belongs to (reported: a mask rule trains a
    role the template never marks, so nothing of it is trained)."""
    marked = {role for _, _, _, role in spans}
    if labels == roles and not any(ctx.policy.trains(role) for role in set(roles) - marked):
        return ()  # each message labelled by its role, and no role without a span is trained
    return tuple(role for i, _, _ in regions
                 if (role := conv.messages[i]["role"]) not in marked and ctx.policy.trains(labels[i]))


def _split(start: int, end: int, label: str | bool, role: str, detail: list[tuple[int, int, bool]]) -> list[Span]:
    """[start, end) labelled: by the last detail range over each part, else by the message's label."""
    if not detail:
        return [Span(start, end, label, role)]
    cuts = sorted({0, end - start, *(a for a, _, _ in detail), *(b for _, b, _ in detail)})
    parts = []
    for a, b in pairwise(cuts):
        own = [train for lo, hi, train in detail if lo <= a and b <= hi]
        parts.append(Span(start + a, start + b, own[-1] if own else label, role))
    return parts


def _detail(message: Message, index: int, rendered: str, key: str | None) -> list[tuple[int, int, bool]]:
    """A message's training detail as (start, end, train) character ranges of its rendered content (the
    offsets count in the content as written; a template that trims it shifts them)."""
    ranges = message.get(key) if key else None
    if ranges is None:
        return []
    where = f"message {index}'s {key}"
    content = message["content"]
    shift = content.find(rendered) if rendered else 0
    if shift < 0:
        raise RowError(Drop.TEMPLATE_ERROR, f"{where} needs the content written as it is, and the template changed it")
    if not isinstance(ranges, list):
        raise RowError(Drop.WRONG_TYPE, f"{where} must be a list of {{begin_offset, end_offset, train}}")
    out = []
    for r in ranges:
        if not (isinstance(r, dict) and type(r.get("begin_offset")) is int and type(r.get("end_offset")) is int
                and isinstance(r.get("train"), bool) and 0 <= r["begin_offset"] <= r["end_offset"] < len(content)):
            raise RowError(Drop.WRONG_TYPE, f"{where}: {r!r} is not {{begin_offset, end_offset (included), train}} "
                           f"within the content's {len(content)} characters")
        a, b = r["begin_offset"] - shift, r["end_offset"] + 1 - shift
        a, b = max(a, 0), min(b, len(rendered))
        if b > a:
            out.append((a, b, r["train"]))
    return out


EMPTY_THINK = re.compile(r"<think>\s*</think>\s*$")


def _reasoning_start(real: str, message: Message, previous_end: int, start: int) -> int:
    """Where a trained turn's rendered reasoning begins (its <think> tag, where the template writes one
    before it): the turn is trained from there; a turn without reasoning, from the empty block the template
    writes right before its content (Qwen3's last turn), so that the model learns to open and close it too.
    The content's start where the template shows none."""
    reasoning = message.get("reasoning_content")
    text = reasoning.strip() if isinstance(reasoning, str) else ""
    if not text:
        tag = real.rfind("<think>", previous_end, start)
        return tag if tag >= 0 and EMPTY_THINK.match(real, tag, start) else start
    at = real.rfind(text, previous_end, start)
    if at < 0:
        return start
    tag = real.rfind("<think>", previous_end, at)
    return tag if tag >= 0 else at


def _locate(real: str, conv: Conversation, template: ChatTemplate, ctx: RenderContext) -> list[Region]:
    """locate_contents; where that fails on contents holding a </think> tag, the template may have moved
    their reasoning out of the content, as Qwen3's and DeepSeek-R1's do in the last turn (the reasoning is
    what stands before the first </think> after its <think>, the content what follows the last </think>;
    text before <think> is not written): the contents are then located split so, and each such content's
    region starts at its <think> tag again, so what the template wrote for it is trained as a whole."""
    try:
        return locate_contents(real, conv, template)
    except RowError as err:
        split = {i: _split_think(m["content"]) for i, m in enumerate(conv.messages) if "</think>" in m["content"]}
        if not split:
            raise
        messages = [{**m, "content": split[i][1], "reasoning_content": split[i][0]} if i in split else m
                    for i, m in enumerate(conv.messages)]
        try:
            regions = locate_contents(real, dataclasses.replace(conv, messages=messages), template)
        except RowError:
            hint = "" if ctx.policy.extract_think_tags else \
                "; input.extract_think_tags: true reads a leading one as the turn's reasoning"
            raise RowError(err.reason, f"{err.detail}: a content holds a <think> block the template rewrites{hint}") from None
    out, previous_end = [], 0
    for i, start, end in regions:
        tag = real.rfind("<think>", previous_end, start) if i in split else -1
        out.append(Region(i, tag if tag >= 0 else start, end))
        previous_end = end
    return out


def _split_think(content: str) -> tuple[str, str]:
    """(reasoning, content) as the templates that move reasoning out of a content split it."""
    return (content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n"),
            content.split("</think>")[-1].lstrip("\n"))
