"""render/spans: a canonical row -> text pieces to tokenize + the spans that are trained.

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
import functools
import json
import os
import re
import unicodedata
from dataclasses import dataclass, field
from collections.abc import Callable
from itertools import accumulate, pairwise
from typing import TYPE_CHECKING, Any

import jinja2
import numpy as np

from gpu_prep.render.affix import AffixTemplate
from gpu_prep.render.sandbox import row_limits
from gpu_prep.config import TEMPLATE_ROLES
from gpu_prep.errors import ConfigError, Drop
from gpu_prep.format import Conversation, Pair, RowError, Segments, Shape, Tokens, Unpaired
from gpu_prep.render.locate import RowTexts, call_names, locate_contents, render_marked, render_text

if TYPE_CHECKING:
    from gpu_prep.render.sandbox import ChatTemplate
    from gpu_prep.config import PipelineConfig
    from gpu_prep.render.templates import Chosen


Span = tuple[int, int, str | bool, str]  # start, end, label (a role, or True / False outright), message role
AFFIX_CHECK_ROWS = 256  # rows of the first chunk rendered both ways before the Jinja-free path is trusted
NO_TEMPLATE_FIX = 'the tokenizer\'s tokenizer_config.json has none; name one with the config key chat_template (say "chatml")'


@dataclass(frozen=True)
class RenderContext:
    config: PipelineConfig
    template: ChatTemplate | None
    end_of_turn: tuple[str, ...]
    normalization: str | None  # "NFC", "NFKC", ... or None
    offsets: bool  # spans in characters, for the offsets the tokenizer reports (else bytes)
    prefix_text: str  # what the tokenizer adds before a plain text (BOS, [CLS]), as text
    suffix_text: str  # what it adds after one ([SEP]), as text
    eos_text: str | None
    eod_text: str | None = None  # what closes a pretraining document (input.append_eod), when anything does
    vocab_size: int = 0  # ids of pre-tokenized rows must be below it
    generation: bool = False  # {% generation %} blocks, where the template has them, say what is trained
    tool_template: ChatTemplate | None = None  # rows with tools take this one (the tokenizer's tool_use)
    template_source: Chosen | None = None  # where the template came from, for the manifest
    affix: AffixTemplate | None = None  # the template as plain concatenation, when it is one
    first_tokens: Callable[[str, int], str] | None = None  # a text's first n tokens (input.think_max_tokens)
    count_tokens: Callable[[str], int] | None = None  # a text's tokens (structured truncation)
    _trains: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)  # label -> trained

    @functools.cached_property
    def limits(self) -> tuple[float, int]:
        """The template limits each row's renders are held to (template_limits of this context's config)."""
        return template_limits(self.config)

    def template_for(self, conv: Conversation) -> ChatTemplate:
        return self.tool_template if conv.tools and self.tool_template is not None else self.template

    def eot_pattern(self) -> re.Pattern[str]:
        return _eot_pattern(self.end_of_turn)

    def trains(self, label: str | bool | None) -> bool:
        """Whether a message or piece with this label (a role or field, or its own bool flag) is trained."""
        if not isinstance(label, str):
            return label is True
        known = self._trains.get(label)
        if known is None:
            known = self._trains[label] = self.config.action(label) == "train"
        return known


@functools.lru_cache(maxsize=16)
def _eot_pattern(end_of_turn: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(t) for t in sorted(end_of_turn, key=len, reverse=True))
    return re.compile(rf"[ \t]*(?:{alternatives})" if alternatives else r"(?!)")


@dataclass(frozen=True)
class RenderedRow:
    pieces: list[str]  # tokenized independently, concatenated
    piece_trained: list[bool]  # every token of such a piece is trained
    spans: list[tuple[int, int]]  # trained ranges [start, end) of the concatenated text (bytes, or
    # characters with RenderContext.offsets), sorted, disjoint
    num_bytes: int
    closing_pieces: int = 0  # the last pieces (a text row's eod, a tokenizer's [SEP]) survive right truncation
    left_out: tuple[str, ...] = ()  # roles of messages the chat template did not render
    unmarked: tuple[str, ...] = ()  # roles of trained messages no {% generation %} span belongs to
    notes: tuple[str, ...] = ()  # what structured truncation did, for the parse report
    span_roles: list[str] = field(default_factory=list)  # the role each span's trained tokens count under
    given: tuple[np.ndarray, np.ndarray] | None = None  # a pre-tokenized row's ids and loss mask (one empty piece)
    label: bool | None = None  # an unpaired preference row's label (input.type kto)
    # A pair's prompt as the template renders it with its generation prompt does not begin prompt +
    # completion's rendering (Gemma 4's empty thought channel): counted as generation_prompt_differs.
    generation_prompt_differs: bool = False

    @property
    def labelled(self) -> bool:
        """Whether the row's mask is its own labels (a pre-tokenized row), not the mask rules'."""
        return self.given is not None

    @property
    def trains_anything(self) -> bool:
        """Whether any of the row is trained before truncation (a span, a trained piece, a given mask)."""
        return bool(self.spans) or any(self.piece_trained) or (self.given is not None and bool(self.given[1].any()))


def _after_eot(text: str, eot: re.Pattern[str], last: bool) -> int | None:
    """Where the first (or last) end-of-turn token in text ends, newlines after it included."""
    matches = list(eot.finditer(text)) if last else [m] if (m := eot.search(text)) else []
    if not matches:
        return None
    end = matches[-1].end()
    return end + len(text[end:]) - len(text[end:].lstrip("\n"))


def _turn_spans(real: str, regions: list[tuple[int, int, int]], labels: list[str | bool], ctx: RenderContext,
                closing: Callable[[int, int, int], int], opening: dict[int, int]) -> list[tuple[int, int, str | bool]]:
    """Whole turns: each turn runs from the end of the previous turn's end-of-turn token to the same point of
    its own, so headers belong to their own turn and text before the first header (BOS, an injected default
    system prompt) to none. Where no end-of-turn token follows a message, its turn runs on through what the
    template writes after its content when it is the last message (`closing`: Mistral's `[/INST]`, its
    tool result's `[/TOOL_RESULTS]`), as the model's own encoder cuts turns; else it ends with its content.
    opening: by message, where a turn that writes its calls before its content begins (no later than that)."""
    eot = ctx.eot_pattern()
    head = real[: regions[0][1]]
    first = _after_eot(head, eot, last=True)
    if first is None:
        first = len(ctx.prefix_text) if ctx.prefix_text and head.startswith(ctx.prefix_text) else 0
    bounds = [first]
    for (i, _, prev_end), (k, start, _) in pairwise(regions):
        if prev_end <= opening.get(k, start) < start:
            start = opening[k]
        after = _after_eot(real[prev_end:start], eot, last=True)
        bounds.append(prev_end + (after if after is not None else closing(i, prev_end, start)))
    last_end = regions[-1][2]
    bounds.append(last_end + (_after_eot(real[last_end:], eot, last=False) or 0))
    return [(a, b, labels[i]) for (i, _, _), a, b in zip(regions, bounds, bounds[1:])]


def no_template(rows: str, source: Chosen | None, fix: str = NO_TEMPLATE_FIX) -> ConfigError:
    """Rows that need a chat template, where the run has none: a tokenizer with only named templates (as
    transformers keeps a tool_use one) has one to pick."""
    named = source.named if source is not None else ()
    if named:
        fix = f"the tokenizer has only named ones, no default; name one with chat_template_name: {' or '.join(named)}"
    return ConfigError(f"{rows} need a chat template: {fix}")


def conversation_spans(conv: Conversation, ctx: RenderContext
                       ) -> tuple[str, list[Span], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The rendered conversation, its labelled character spans, the roles of messages whose content the
    template left out (a role it does not know, say: counted, since their text is not in the row), the
    roles of trained messages the template's {% generation %} markers never mark (reported), and notes for
    the parse report (tool_calls_not_trained: calls written before a content that could not be placed)."""
    if ctx.template is None:
        raise no_template("chat rows", ctx.template_source)
    generated: list[tuple[int, int, int | None]] = []
    template = ctx.template_for(conv)
    marked = ctx.generation and template.marked
    if ctx.affix is not None and ctx.affix.covers(conv.messages, conv.tools) and not conv.documents:
        real, regions, generated = ctx.affix.render(conv.messages)
    else:
        real, generated = render_marked(template, conv.messages, conv, marked=marked)
        _writes_tool_calls(real, conv, template)
        regions = _locate(real, conv, template, ctx)
    roles = [m["role"] for m in conv.messages]
    # A message is left out where nothing of it was located, or its content was not (a call written alone,
    # the text beside it not: _place_tool_turns; a <think> block alone is think_blocks_not_rendered's).
    located = {i for i, start, end in regions if end > start or not conv.messages[i].get("tool_calls")
               or not _split_think(conv.messages[i]["content"] or "")[1].strip()}
    left_out = tuple(roles[i] for i, m in enumerate(conv.messages)
                     if (m["content"] or m.get("tool_calls")) and i not in located)
    if not regions:
        return real, [], left_out, (), ()
    labels = _labels(conv, ctx)
    if marked:
        spans = _generation_spans(real, generated, regions, labels, conv, ctx)
        return real, spans, left_out, _unmarked(spans, regions, labels, roles, conv, ctx), ()
    texts = RowTexts(real, conv, template, ctx.end_of_turn)
    ends = [0] + [end for _, _, end in regions[:-1]]  # where the message before each region's ends
    limits = [start for _, start, _ in regions[1:]] + [len(real)]
    if ctx.config.input.mask_scope == "turn":  # one span per region, in order
        # A turn's tool calls written before its content (locate.calls_apart) open its turn, header and all.
        apart = {i: found[0] for (i, start, end), after, limit in zip(regions, ends, limits) if roles[i] == "assistant"
                 and conv.messages[i].get("tool_calls") and not _calls_follow(conv.messages[i], real, end, limit)
                 and (found := texts.calls(i, after, start)) is not None}
        turns = _turn_spans(real, regions, labels, ctx, texts.closing, apart)
        turns = [(a, b, label, roles[i]) for (a, b, label), (i, _, _) in zip(turns, regions)]
        return real, turns, left_out, (), texts.notes()
    # A trained content runs on to the end-of-turn token that closes it: what the template writes between
    # them (tool calls, a space) is the same turn's output. train_on_eos says which turns' end-of-turn
    # tokens are trained: those of trained turns (turn), of every turn (all), of the last trained turn
    # (last), or none.
    policy = ctx.config.input.train_on_eos if ctx.config.input.train_end_of_turn else "none"
    # Asked of every message: a set (a list would cost a row of n messages n^2), and the last in rendering order.
    in_order = [i for i, _, _ in regions if ctx.trains(labels[i])]
    trained, last_trained = set(in_order), (in_order[-1] if in_order else None)
    eot = ctx.eot_pattern()
    spans: list[Span] = []
    apart: list[Span] = []  # tool calls written apart from their turn's content (before it)
    previous_end = 0
    for (i, start, end), after, limit in zip(regions, ends, limits):
        content = start  # a training detail's offsets count from here, whatever reasoning is trained before it
        if ctx.config.input.think_loss and i in trained:
            start = _reasoning_start(real, conv.messages[i], previous_end, start)
        previous_end = end
        found = eot.search(real, end, limit)
        match = found if policy in ("turn", "all") or (policy == "last" and i == last_trained) else None
        role = roles[i]  # the role a span's trained tokens are counted under
        # An assistant's output runs on to its end-of-turn token, trained or not: what the template writes
        # between them (tool calls; a space only with the token) is the turn's. Other roles' glue is markup
        # (Qwen3's </tool_response>).
        output_end = end
        if found is not None and role == "assistant" and (match is not None or real[end:found.start()].strip()):
            output_end = found.start()
        detail = _detail(conv.messages[i], i, real[content:end], ctx.config.input.message_training_detail_key)
        reasoning = [(start, content, labels[i], role)] if content > start else []
        closing = [] if match is None else [(match.start(), match.end(), labels[i] if i in trained or policy != "all"
                                             else True, role)]
        if detail:
            spans.extend(reasoning + _split(content, end, labels[i], role, detail))
            spans.extend([(end, output_end, labels[i], role)] if output_end > end else [])
        else:
            spans.append((start, output_end, labels[i], role))
        spans.extend(closing)
        if conv.messages[i].get("tool_calls") and role == "assistant" and not _calls_follow(conv.messages[i], real, end, limit):
            apart.extend(_apart(real, texts.calls(i, after, content), labels[i], i in trained, ctx, policy))
    if policy == "all":  # every turn's: those of turns the template writes on its own too
        apart.extend(_own_turn_ends(real, regions, spans + apart, eot, roles))
    return real, sorted(spans + apart, key=lambda span: span[:2]) if apart else spans, left_out, (), texts.notes()


def _own_turn_ends(real: str, regions: list[tuple[int, int, int]], spans: list[Span], eot: Any,
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
            own.append((at, found.end(), True, roles[regions[before - 1][0]] if before else "system"))
    return own


def _calls_follow(message: dict[str, Any], real: str, end: int, limit: int) -> bool:
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
        return [(start, end, label, "assistant")] if end > start else []
    calls = [(start, end - len(token), label, "assistant")] if end - len(token) > start else []
    if policy not in ("turn", "all"):
        return calls
    return calls + [(end - len(token), end, label if trained or policy != "all" else True, "assistant")]


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


def _generation_spans(real: str, generated: list[tuple[int, int, int | None]], regions: list[tuple[int, int, int]],
                      labels: list[str | bool], conv: Conversation, ctx: RenderContext) -> list[Span]:
    """The template's {% generation %} spans, each labelled with the message it belongs to, so role rules,
    training flags and training detail still narrow them: the message the template was reading when it
    wrote the span, else the first whose content ends at or after the span's start (the span holds that
    message's header, reasoning, content or end-of-turn text)."""
    ends = [end for _, _, end in regions]
    key = ctx.config.input.message_training_detail_key
    where = {i: (start, end) for i, start, end in regions} if key else {}
    messages, last = conv.messages, len(regions) - 1
    spans: list[Span] = []
    for start, end, reading in generated:
        i = reading if reading is not None else regions[min(bisect.bisect_left(ends, start), last)][0]
        message = messages[i]
        if not key or message.get(key) is None or i not in where:
            spans.append((start, end, labels[i], message["role"]))
            continue
        content_start, content_end = where[i]
        shift = content_start - start  # detail ranges count from the content's start
        detail = [(max(a + shift, 0), min(b + shift, end - start), train)
                  for a, b, train in _detail(message, i, real[content_start:content_end], key)]
        spans.extend(_split(start, end, labels[i], message["role"], [d for d in detail if d[1] > d[0]]))
    return spans


def _unmarked(spans: list[Span], regions: list[tuple[int, int, int]], labels: list[str | bool], roles: list[str],
              conv: Conversation, ctx: RenderContext) -> tuple[str, ...]:
    """The roles of trained messages no {% generation %} span belongs to (reported: a mask rule trains a
    role the template never marks, so nothing of it is trained)."""
    marked = {role for _, _, _, role in spans}
    if labels == roles and not any(ctx.trains(role) for role in set(roles) - marked):
        return ()  # each message labelled by its role, and no role without a span is trained
    return tuple(role for i, _, _ in regions
                 if (role := conv.messages[i]["role"]) not in marked and ctx.trains(labels[i]))


def _split(start: int, end: int, label: str | bool, role: str, detail: list[tuple[int, int, bool]]) -> list[Span]:
    """[start, end) labelled: by the last detail range over each part, else by the message's label."""
    if not detail:
        return [(start, end, label, role)]
    cuts = sorted({0, end - start, *(a for a, _, _ in detail), *(b for _, b, _ in detail)})
    parts = []
    for a, b in pairwise(cuts):
        own = [train for lo, hi, train in detail if lo <= a and b <= hi]
        parts.append((start + a, start + b, own[-1] if own else label, role))
    return parts


def _detail(message: dict, index: int, rendered: str, key: str | None) -> list[tuple[int, int, bool]]:
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


def _reasoning_start(real: str, message: dict, previous_end: int, start: int) -> int:
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


def _labels(conv: Conversation, ctx: RenderContext) -> list[str | bool]:
    """Each message's label: its role, or its own training flag (input.message_training_key: true / false,
    or 1 / 0 as OpenAI's `weight` is written; any other value drops the row); with
    input.train_last_turn_only, only the last trained message stays trained."""
    key = ctx.config.input.message_training_key
    if key:
        labels: list[str | bool] = [m["role"] if m.get(key) is None else _flag(m, key, i)
                                    for i, m in enumerate(conv.messages)]
    else:
        labels = [m["role"] for m in conv.messages]
    if ctx.config.input.train_last_turn_only:
        trained = [i for i, label in enumerate(labels) if ctx.trains(label)]
        for i in trained[:-1]:
            labels[i] = False
    return labels


def _locate(real: str, conv: Conversation, template: ChatTemplate, ctx: RenderContext) -> list[tuple[int, int, int]]:
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
            hint = "" if ctx.config.input.extract_think_tags else \
                "; input.extract_think_tags: true reads a leading one as the turn's reasoning"
            raise RowError(err.reason, f"{err.detail}: a content holds a <think> block the template rewrites{hint}") from None
    out, previous_end = [], 0
    for i, start, end in regions:
        tag = real.rfind("<think>", previous_end, start) if i in split else -1
        out.append((i, tag if tag >= 0 else start, end))
        previous_end = end
    return out


def _split_think(content: str) -> tuple[str, str]:
    """(reasoning, content) as the templates that move reasoning out of a content split it."""
    return (content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n"),
            content.split("</think>")[-1].lstrip("\n"))


def _flag(message: dict[str, Any], key: str, index: int) -> bool:
    """A message's training flag (one it has)."""
    flag = message[key]
    if type(flag) is bool or (type(flag) is int and flag in (0, 1)):
        return bool(flag)
    raise RowError(Drop.WRONG_TYPE, f"message {index}'s {key!r} must be true or false (or 1 / 0), got {flag!r}; "
                   "a value the rule cannot read would leave the message to its role's rule unnoticed")


def _to_bytes(text: str, spans: list[Span], form: str | None) -> tuple[str, list[Span], int]:
    """Normalize text between span boundaries and turn character spans into byte spans; also the text's
    length in bytes."""
    if text.isascii():  # one byte per character, and every normal form leaves ASCII alone
        return text, spans, len(text)
    cuts = sorted({0, len(text), *(span[0] for span in spans), *(span[1] for span in spans)})
    byte_at: dict[int, int] = {0: 0}
    out: list[str] = []
    total = 0
    for a, b in pairwise(cuts):
        segment = text[a:b]
        if form is not None:
            segment = unicodedata.normalize(form, segment)
        out.append(segment)
        total += len(segment.encode("utf-8"))
        byte_at[b] = total
    return "".join(out), [(byte_at[s], byte_at[e], label, role) for s, e, label, role in spans], total


def _trained(spans: list[Span], ctx: RenderContext) -> tuple[list[tuple[int, int]], list[str]]:
    """The trained byte ranges, sorted and merged, and the role each is counted under (its first piece's)."""
    keep = sorted((s, e, role) for s, e, label, role in spans if e > s and ctx.trains(label))
    merged: list[tuple[int, int]] = []
    roles: list[str] = []
    for s, e, role in keep:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
        else:
            merged.append((s, e))
            roles.append(role)
    return merged, roles


def _segments(shape: Segments, ctx: RenderContext) -> RenderedRow:
    """Pieces are tokenized one by one, so a piece's tokens are exactly its own: its label decides them all
    (no byte positions needed, which is what lets tokenizers that drop whitespace, like WordPiece, work)."""
    pieces: list[tuple[str, str | bool | None]] = [(t, label) for t, label in shape.pieces if t]
    end = ctx.eos_text if shape.add_eos else ctx.eod_text if shape.add_eod else None
    closed = bool(end and pieces)
    # A tokenizer that closes every text with that very token itself (T5's </s>) gets it once: as the end
    # piece, labelled and cut or kept under truncation as the end is, not again as its own suffix.
    suffix = "" if closed and end == ctx.suffix_text else ctx.suffix_text
    if closed:
        text, label = pieces.pop()
        # A row (or data handler) that ends with the token already: it becomes a piece of its own all the
        # same (the same ids, as it is a special token the tokenizer splits off).
        rest = text[:-len(end)] if text.endswith(end) else text
        pieces += [(rest, label)] * bool(rest) + [(end, label)]
    pieces = [(ctx.prefix_text, None)] * bool(ctx.prefix_text) + pieces + [(suffix, None)] * bool(suffix)
    trained = [shape.train_all or ctx.trains(label) for _, label in pieces]
    texts = [t for t, _ in pieces]
    # What closes the row outlives right truncation: the tokenizer's own suffix ([SEP]) and, for a text row,
    # the end-of-document token before it, so that documents packed or concatenated stay apart. (The eos
    # closing an instruction row's response is the response's: a cut response is not given one.)
    closing = bool(suffix) + (closed and not shape.add_eos)
    return RenderedRow(texts, trained, [], sum(len(t.encode("utf-8")) for t in texts), closing)


def template_limits(config: PipelineConfig) -> tuple[float, int]:
    """input.template_time_limit and input.template_max_chars; a null cap is twice preprocessing.max_chars
    (the longest row the length filter lets through, written once, leaves as much again for reasoning, tool
    calls and the template's own text), and at least 1,000,000 characters."""
    chars = config.input.template_max_chars
    if chars is None:
        chars = max(2 * config.preprocessing.max_chars, 1_000_000)
    return config.input.template_time_limit, chars


def affix_disagreement(shapes: list[Shape], ctx: RenderContext) -> str | None:
    """Render the conversations the affix path would take through Jinja too; say where they differ."""
    if ctx.affix is None:
        return None
    for n, shape in enumerate(shapes[:AFFIX_CHECK_ROWS]):
        if isinstance(shape, Conversation) and ctx.affix.covers(shape.messages, shape.tools):
            try:
                with row_limits(*ctx.limits):
                    if ctx.affix.marks is None:
                        expected = ctx.template.render(shape.messages, shape.tools, shape.documents)
                    else:
                        expected = ctx.template.render_marked(shape.messages, shape.tools, shape.documents)
            except jinja2.exceptions.TemplateError as exc:
                return f"row {n}: Jinja refuses a conversation the affix path accepts ({exc})"
            if ctx.affix.rendered(shape.messages) != expected:
                return f"row {n}: the affix rendering differs from Jinja's"
    return None


def render_row(shape: Shape, ctx: RenderContext) -> RenderedRow:
    if isinstance(shape, Segments):
        return _segments(shape, ctx)
    if isinstance(shape, (Pair, Unpaired)):
        return _pair(shape, ctx)
    if isinstance(shape, Tokens):
        ids = np.asarray(shape.ids, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= ctx.vocab_size:
            bad = int(ids[(ids < 0) | (ids >= ctx.vocab_size)][0])
            raise RowError(Drop.WRONG_TYPE, f"input_ids holds {bad}, outside the vocabulary (0 to {ctx.vocab_size - 1})")
        if ctx.config.split_windows is not None and len(ids) > ctx.config.split_windows and not all(shape.trained):
            raise RowError(Drop.TOO_MANY_TOKENS, f"its {len(ids)} tokens are over max_seq_len "
                                                 f"({ctx.config.split_windows}) and its labels mask "
                                                 f"{shape.trained.count(False)} of them: truncation split cuts only "
                                                 "rows trained whole (a window could train nothing)")
        return RenderedRow([""], [False], [], 0, given=(ids, np.asarray(shape.trained, dtype=np.int8)))
    text, char_spans, left_out, unmarked, notes = _within_limits(shape, ctx)
    if ctx.offsets:
        num_bytes = len(text.encode("utf-8"))
    else:
        text, char_spans, num_bytes = _to_bytes(text, char_spans, ctx.normalization)
    trained, roles = _trained(char_spans, ctx)
    return RenderedRow([text], [False], trained, num_bytes, left_out=left_out, notes=notes, span_roles=roles,
                       unmarked=unmarked)


def _think_cut(conv: Conversation, ctx: RenderContext) -> Conversation:
    """The conversation with each reasoning cut to its first input.think_max_tokens tokens, where set."""
    limit = ctx.config.input.think_max_tokens
    if limit is None or ctx.first_tokens is None or not any(m.get("reasoning_content") for m in conv.messages):
        return conv
    return dataclasses.replace(conv, messages=[
        {**m, "reasoning_content": ctx.first_tokens(m["reasoning_content"], limit)}
        if isinstance(m.get("reasoning_content"), str) else m for m in conv.messages])


def _reasoning_not_shown(conv: Conversation, text: str) -> bool:
    """Whether the template left out the reasoning of the last assistant turn after the last user turn (of
    the conversation as rendered), the one every template that shows reasoning shows: Qwen3 drops earlier
    turns' by design."""
    for m in reversed(conv.messages):
        if m["role"] == "user":
            return False
        if m["role"] == "assistant":
            reasoning = m.get("reasoning_content")
            return isinstance(reasoning, str) and _not_shown(reasoning, text)
    return False


def _probe(reasoning: str) -> str:
    """What stands for a reasoning in a rendering: its first characters (blank: nothing)."""
    return reasoning.strip()[:32]


def _not_shown(reasoning: str, text: str, held: set[str] | None = None) -> bool:
    """Whether the rendered text leaves out a (non-blank) reasoning: its first characters are not in it.
    held: the probes the text holds, as _held found them, where a row asks this of many reasonings."""
    probe = _probe(reasoning)
    return bool(probe) and probe not in (text if held is None else held)


_HASH_BASE = 0x100000001B3  # odd, so invertible modulo 2**64, where numpy's uint64 arithmetic wraps
_HASH_INVERSE = pow(_HASH_BASE, -1, 1 << 64)
_FEW_PROBES = 16  # up to so many, each probe is searched for alone: a few passes over the text


def _held(probes: set[str], text: str) -> set[str]:
    """The non-empty probes the text holds (`probe in text`, each). A search per probe is a pass over the
    text, so a row of n think blocks would cost n times its length: past a few probes, the text's windows
    of each probe length are hashed instead, all at once (polynomial hashes from prefix sums, with numpy),
    and a probe is held where the first window of its hash reads the same."""
    probes = {p for p in probes if p}
    if len(probes) <= _FEW_PROBES or not text:
        return {p for p in probes if p in text}
    weighted = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.uint64)
    n = len(weighted)
    powers = np.full(n, _HASH_BASE, dtype=np.uint64)
    powers[0] = 1
    weighted *= np.cumprod(powers, out=powers)  # character i times B**i
    sums = np.zeros(n + 1, dtype=np.uint64)
    np.cumsum(weighted, out=sums[1:])
    inverses = np.full(n, _HASH_INVERSE, dtype=np.uint64)
    inverses[0] = 1
    np.cumprod(inverses, out=inverses)  # B**-i: the window at i, summed from sums, times this hashes as at 0
    by_length: dict[int, list[str]] = {}
    for probe in probes:
        by_length.setdefault(len(probe), []).append(probe)
    held: set[str] = set()
    for k, group in by_length.items():
        if k > n:
            continue
        hashes = (sums[k:] - sums[:-k]) * inverses[: n - k + 1]
        by_hash: dict[int, list[str]] = {}
        for probe in group:
            by_hash.setdefault(_hash(probe), []).append(probe)
        wanted = np.array(sorted(by_hash), dtype=np.uint64)
        slots = np.minimum(np.searchsorted(wanted, hashes), len(wanted) - 1)
        hits = np.flatnonzero(wanted[slots] == hashes)  # the windows whose hash is a probe's
        found, first = np.unique(slots[hits], return_index=True)
        for slot, at in zip(found.tolist(), hits[first].tolist()):
            for probe in by_hash[int(wanted[slot])]:
                # The first window of its hash is the probe, all but always; where it is not, a search says.
                if text.startswith(probe, at) or probe in text:
                    held.add(probe)
    return held


def _hash(probe: str) -> int:
    """A probe's hash, as _held hashes the windows of a text."""
    value, power = 0, 1
    for char in probe:
        value = (value + ord(char) * power) % (1 << 64)
        power = power * _HASH_BASE % (1 << 64)
    return value


def _think_block_notes(conv: Conversation, text: str, ctx: RenderContext) -> tuple[str, ...]:
    """A note for each message holding a <think> block in its content (read as written, extract_think_tags
    off): think_blocks_not_rendered where the template wrote nothing of it (Qwen3 strips it from the turns
    before the last user turn, as it strips their reasoning), think_blocks_trained where it wrote it in a
    message of a trained role while input.think_loss is false (by role spans), which trains that reasoning
    as content, unlike a reasoning_content; and think_blocks_untouched for each block written while
    input.think_mode drop or think_max_tokens is set, which act on reasoning given apart, not on content. The ids follow the
    template; the notes make each visible."""
    notes: list[str] = []
    blocks = [i for i, m in enumerate(conv.messages) if isinstance(m.get("content"), str) and "</think>" in m["content"]]
    inp = ctx.config.input
    untouched = inp.think_mode == "drop" or inp.think_max_tokens is not None
    by_roles = not (ctx.generation and ctx.template_for(conv).marked) and not ctx.config.input.think_loss
    labels = _labels(conv, ctx) if blocks and by_roles else []  # training flags and train_last_turn_only count
    thoughts = {i: _split_think(conv.messages[i]["content"])[0] for i in blocks}
    held = _held({_probe(thought) for thought in thoughts.values()}, text)
    for i in blocks:
        if _not_shown(thoughts[i], text, held):
            notes.append("think_blocks_not_rendered")
            continue
        notes.extend(["think_blocks_untouched"] * untouched)  # written, as those options would not have it
        if by_roles and ctx.trains(labels[i]):
            notes.append("think_blocks_trained")
    return tuple(notes)


def _pair(pair: Pair | Unpaired, ctx: RenderContext) -> RenderedRow:
    """A preference pair as three pieces, prompt + chosen, prompt + rejected and the prompt alone (an unpaired
    row: prompt + completion and the prompt alone), the wholes trained from where they part from the prompt
    (pairs.py cuts them apart once tokenized, as TRL does, where the prompt's tokens stop matching).
    Conversational: the prompt is the template's rendering of the prompt messages with its generation
    prompt; standard: the texts as they are between the tokenizer's own prefix and suffix, with the eos
    token closing a completion that lacks it (as TRL adds it)."""
    differs, notes = False, ()
    if pair.conversational:
        if ctx.template is None:
            raise no_template("conversational preference rows", ctx.template_source, "name one with chat_template")
        conv = Conversation([*pair.prompt, *pair.completions[0]], tools=pair.tools)
        template = ctx.template_for(conv)
        (asked, parsed), *parts = [_arguments_as_objects(part, template) for part in (pair.prompt, *pair.completions)]
        completions = [part for part, _ in parts]
        notes = ("tool_call_arguments_parsed",) * (parsed + sum(n for _, n in parts))  # as a chat row's
        with row_limits(*ctx.limits) as budget:
            try:
                prompt = template.render(asked, pair.tools, None, add_generation_prompt=True)
                wholes = [template.render([*asked, *c], pair.tools) for c in completions]
                start = min(_common_prefix(prompt, w) for w in wholes)
                differs = start < len(prompt)
                if differs:  # Gemma 4's empty thought channel: held to the generation prompt (_diverges_late)
                    _diverges_late(template.render(asked, pair.tools, None), prompt, wholes, start)
            except jinja2.exceptions.TemplateError as exc:
                if budget.exceeded is not None:
                    raise RowError(Drop.TEMPLATE_LIMIT, budget.exceeded) from None
                raise RowError(Drop.TEMPLATE_ERROR, f"the chat template refused the row: {exc}") from None
        _completions_written(pair, wholes, start, ctx)
        left_out = _prompt_left_out(asked, prompt)
        alone = prompt
    else:
        prompt, left_out = ctx.prefix_text + pair.prompt, ()
        start, alone = len(prompt), prompt + ctx.suffix_text  # TRL tokenizes the prompt with special tokens
        end = "" if ctx.eos_text == ctx.suffix_text else ctx.eos_text or ""  # T5's </s> closes it already
        wholes = [prompt + c + ("" if c.endswith(end) else end) + ctx.suffix_text for c in pair.completions]
    # A standard row's prefix (BOS) is a piece of its own, as the post-processor adds it to the text tokenized
    # alone: joined to the prompt, a SentencePiece tokenizer would not mark the prompt's first word as one.
    prefix = "" if pair.conversational else ctx.prefix_text
    pieces, spans, total, num_bytes = [], [], 0, 0  # total: in the spans' units (characters with offsets, else bytes)
    for whole in [*wholes, alone]:
        trained = [(start - len(prefix), len(whole) - len(prefix))] if whole is not alone else []
        for piece, piece_spans in [*([(prefix, [])] if prefix else []), (whole[len(prefix):], trained)]:
            if ctx.offsets:
                text, span, width, size = piece, piece_spans, len(piece), len(piece.encode("utf-8"))
            else:
                text, byte_spans, size = _to_bytes(piece, [(a, b, True, "") for a, b in piece_spans], ctx.normalization)
                span, width = [(a, b) for a, b, _, _ in byte_spans], size
            pieces.append(text)
            spans += [(total + a, total + b) for a, b in span]
            total += width
            num_bytes += size
    roles = ["chosen", "rejected"] if isinstance(pair, Pair) else ["desirable" if pair.label else "undesirable"]
    return RenderedRow(pieces, [False] * len(pieces), spans, num_bytes, span_roles=roles, left_out=left_out,
                       notes=notes, label=pair.label if isinstance(pair, Unpaired) else None,
                       generation_prompt_differs=differs)


def _prompt_left_out(messages: list[dict], prompt: str) -> tuple[str, ...]:
    """The roles of the prompt's messages of a role that is none of system, user, assistant and tool (ShareGPT's
    human unmapped, say) whose text the template wrote nothing of: neither the start of it nor that start
    written as a JSON string (Llama 3.1 writes its ipython role's content with tojson) is in the prompt. (A
    template role's content a template transforms, a <think> block Qwen3 strips, is no sign of a mapping.)"""
    unknown = [(m["role"], m["content"], json.dumps(m["content"], ensure_ascii=False)[1:-1]) for m in messages
               if m["role"] not in TEMPLATE_ROLES and isinstance(m.get("content"), str)]
    held = _held({_probe(text) for _, *texts in unknown for text in texts}, prompt)
    return tuple(role for role, content, quoted in unknown
                 if _not_shown(content, prompt, held) and _not_shown(quoted, prompt, held))


def _completions_written(pair: Pair | Unpaired, wholes: list[str], start: int, ctx: RenderContext) -> None:
    """Drops a pair a completion of which the template wrote nothing of (its messages' role unknown to it,
    say: ShareGPT's gpt unmapped), naming the roles it does not know, rather than as cut off."""
    for whole, completion, key in zip(wholes, pair.completions, _completion_keys(pair, ctx)):
        if len(whole) <= start:
            unknown = sorted({m["role"] for m in completion} - set(TEMPLATE_ROLES))
            why = (f": its role {' and '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not one "
                   f"of {', '.join(TEMPLATE_ROLES)} (map it with input.roles)") if unknown else ""
            raise RowError(Drop.NO_TRAINED_TOKENS, f"the chat template wrote nothing of the completion in field "
                                                   f"{key!r}, so nothing is trained{why}")


def _completion_keys(pair: Pair | Unpaired, ctx: RenderContext) -> list[str]:
    inp = ctx.config.input
    return [inp.chosen_key, inp.rejected_key] if isinstance(pair, Pair) else [inp.completion_key]


def _common_prefix(a: str, b: str) -> int:
    """How many characters a and b share at their start."""
    return len(os.path.commonprefix((a, b)))


def _diverges_late(head: str, prompt: str, wholes: list[str], start: int) -> None:
    """A prompt rendered with its generation prompt may part from prompt + completion only after the prompt
    messages (TRL cuts the prompt where they part, wherever that is; before the generation prompt, the
    completion would take in prompt text). Else template_error, showing where the renderings differ."""
    if prompt[:start].startswith(head):
        return
    whole = next(w for w in wholes if _common_prefix(prompt, w) == start)
    after = f" (after {prompt[max(start - 40, 0):start]!r})" if start else ""
    raise RowError(Drop.TEMPLATE_ERROR, "the chat template renders the prompt messages differently before a "
                                        f"completion than alone: at character {start}{after}, the prompt with its "
                                        f"generation prompt goes on {prompt[start:start + 40]!r} and prompt + "
                                        f"completion on {whole[start:start + 40]!r}")


def _arguments_as_objects(messages: list[dict[str, Any]], template: ChatTemplate) -> tuple[list[dict[str, Any]], int]:
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


def _within_limits(conv: Conversation, ctx: RenderContext
                   ) -> tuple[str, list[Span], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """conversation_spans (after structured truncation, where asked, and think_max_tokens' cut) and notes
    for the parse report, every render of the row held to the config's template limits together. A row whose renders broke one is dropped as template_limit, naming
    the limit, whatever error the template's interruption surfaced as (locate.py makes every template error
    a RowError); one the template refused stays template_error, with the template's message."""
    with row_limits(*ctx.limits) as budget:
        try:
            notes: tuple[str, ...] = ()
            if ctx.config.preprocessing.truncation == "structured" and ctx.count_tokens is not None:
                conv, notes = _structured(conv, ctx)
            conv = _think_cut(conv, ctx)
            messages, parsed = _arguments_as_objects(conv.messages, ctx.template_for(conv))
            if parsed:
                conv = dataclasses.replace(conv, messages=messages)
                notes += ("tool_call_arguments_parsed",) * parsed
            text, spans, left_out, unmarked, found = conversation_spans(conv, ctx)
            notes += found
            if _reasoning_not_shown(conv, text):
                notes += ("reasoning_not_rendered",)
            notes += _think_block_notes(conv, text, ctx)
            return text, spans, left_out, unmarked, notes
        except RowError:
            if budget.exceeded is not None:
                raise RowError(Drop.TEMPLATE_LIMIT, budget.exceeded) from None
            raise


def _structured(conv: Conversation, ctx: RenderContext) -> tuple[Conversation, tuple[str, ...]]:
    """The conversation cut to fit max_seq_len by turns: leading system messages and the latest turn stay,
    the oldest turns after the system messages go first (as few as will do), then the reasoning of kept
    messages, oldest first (the last one cut keeps its first tokens, as many as fit). What is still too long
    is cut by preprocessing.structured_last_cut: prompt cuts the longest untrained content (_cut_prompt),
    keeping the system messages and every kept turn's header whole; left leaves the mask stage to cut the
    first tokens, as the seed does."""
    if _fits(conv.messages, conv, ctx):
        return conv, ()
    kept, dropped = _drop_turns(conv, ctx)
    kept, trimmed, fits = _trim_reasoning(kept, conv, ctx)
    notes = ["structured_dropped_turns"] * dropped + ["structured_dropped_reasoning"] * trimmed
    if ctx.config.preprocessing.structured_last_cut == "prompt" and not fits:
        kept = _cut_prompt(kept, conv, ctx)
        notes.append("structured_cut_content")
    return dataclasses.replace(conv, messages=kept), tuple(notes)


def _fits(messages: list[dict], conv: Conversation, ctx: RenderContext) -> bool:
    """Whether the messages render within max_seq_len tokens (a text of no more bytes does, uncounted: a
    token is >= 1 byte)."""
    text, limit = render_text(ctx.template_for(conv), messages, conv), ctx.config.preprocessing.max_seq_len
    return len(text.encode("utf-8")) <= limit or ctx.count_tokens(text) <= limit


def _drop_turns(conv: Conversation, ctx: RenderContext) -> tuple[list[dict], int]:
    """The messages without the fewest oldest turns after the leading system messages that makes them fit
    (the latest turn is kept, fitting or not), and how many turns went."""
    messages = conv.messages
    head = next((k for k, m in enumerate(messages) if m["role"] != "system"), len(messages))
    starts = [k for k in range(head, len(messages)) if k == head or messages[k]["role"] == "user"]
    turns = [messages[a:b] for a, b in zip(starts, [*starts[1:], len(messages)])]

    def without(dropped: int) -> list[dict]:
        return messages[:head] + [m for turn in turns[dropped:] for m in turn]

    low, high = 0, max(len(turns) - 1, 0)
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if _fits(without(middle), conv, ctx) else (middle + 1, high)
    return without(low), low


def _trim_reasoning(kept: list[dict], conv: Conversation, ctx: RenderContext) -> tuple[list[dict], int, bool]:
    """The kept messages with their reasoning dropped, oldest first, until they fit (the last one dropped
    keeps its first tokens, as many as fit), how many reasonings were cut, and whether they fit. The
    messages are rendered and counted again only when a cut changed them."""
    kept, template, cut = list(kept), ctx.template_for(conv), 0
    fits = _fits(kept, conv, ctx)
    for k, message in enumerate(kept):
        if fits:
            break
        reasoning = message.get("reasoning_content")
        if not reasoning and "</think>" in (message.get("content") or ""):
            # A <think> block in the content that the template writes as the turn's reasoning (it splits it
            # off itself: the rendering is the same) is reasoning here too.
            thought, rest = _split_think(message["content"])
            split = {**message, "content": rest, "reasoning_content": thought}
            if render_text(template, [*kept[:k], split, *kept[k + 1:]], conv) == render_text(template, kept, conv):
                message, reasoning = split, thought
        if reasoning:
            kept[k] = {**message, "reasoning_content": ""}
            cut += 1
            fits = _fits(kept, conv, ctx)
            if ctx.first_tokens is not None and fits:  # trimmed: its first tokens, as many as fit
                n = _most_that_fit(kept, k, "reasoning_content", reasoning, conv, ctx, ctx.count_tokens(reasoning))
                kept[k] = {**message, "reasoning_content": ctx.first_tokens(reasoning, n)}
    return kept, cut, fits


def _most_that_fit(kept: list[dict], k: int, key: str, text: str, conv: Conversation, ctx: RenderContext,
                   upto: int) -> int:
    """How many of the text's first tokens (at most upto) message k's `key` can hold with the messages fitting."""
    def cut(n: int) -> list[dict]:
        return [*kept[:k], {**kept[k], key: ctx.first_tokens(text, n)}, *kept[k + 1:]]

    low, high = 0, upto
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if _fits(cut(middle), conv, ctx) else (low, middle - 1)
    return low


def _cut_prompt(kept: list[dict], conv: Conversation, ctx: RenderContext) -> list[dict]:
    """The kept messages with the longest untrained content (not a system message's, nor one with a training
    detail) cut to its first tokens, as many as fit: what is cut is the end of the prompt's longest text, as
    LLaMA-Factory cuts a prompt, while the system messages, the headers and what is trained stay whole.
    Where even its first token does not fit, the row is dropped (too_many_tokens)."""
    labels = _labels(dataclasses.replace(conv, messages=kept), ctx)
    detail = ctx.config.input.message_training_detail_key
    cuttable = [k for k, m in enumerate(kept) if m["role"] != "system" and not ctx.trains(labels[k])
                and isinstance(m.get("content"), str) and m["content"] and (not detail or m.get(detail) is None)]
    limit = ctx.config.preprocessing.max_seq_len
    if cuttable and ctx.first_tokens is not None:
        k = max(cuttable, key=lambda k: len(kept[k]["content"]))
        content = kept[k]["content"]
        n = _most_that_fit(kept, k, "content", content, conv, ctx, ctx.count_tokens(content) - 1)
        if n:
            return [*kept[:k], {**kept[k], "content": ctx.first_tokens(content, n)}, *kept[k + 1:]]
        what = f"the longest untrained content (a {kept[k]['role']} message's) cut to its first token"
    else:
        what = "no untrained content to cut"
    raise RowError(Drop.TOO_MANY_TOKENS, f"over max_seq_len {limit} tokens with {what}: structured truncation "
                   "keeps the system messages, the latest turn's headers and its trained text whole")
