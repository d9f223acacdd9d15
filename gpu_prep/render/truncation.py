"""Structured truncation (preprocessing.truncation "structured"): whole turns dropped, then reasonings, then
the prompt cut, until the row fits max_seq_len."""

from __future__ import annotations

import dataclasses


from gpu_prep.errors import Drop
from gpu_prep.format import Conversation, Message, RowError
from gpu_prep.render.locate import render_text
from gpu_prep.render.context import RenderContext
from gpu_prep.render.spans import _split_think

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


def _fits(messages: list[Message], conv: Conversation, ctx: RenderContext) -> bool:
    """Whether the messages render within max_seq_len tokens (a text of no more bytes does, uncounted: a
    token is >= 1 byte)."""
    text, limit = render_text(ctx.template_for(conv), messages, conv), ctx.config.preprocessing.max_seq_len
    return len(text.encode("utf-8")) <= limit or ctx.count_tokens(text) <= limit


def _drop_turns(conv: Conversation, ctx: RenderContext) -> tuple[list[Message], int]:
    """The messages without the fewest oldest turns after the leading system messages that makes them fit
    (the latest turn is kept, fitting or not), and how many turns went."""
    messages = conv.messages
    head = next((k for k, m in enumerate(messages) if m["role"] != "system"), len(messages))
    starts = [k for k in range(head, len(messages)) if k == head or messages[k]["role"] == "user"]
    turns = [messages[a:b] for a, b in zip(starts, [*starts[1:], len(messages)])]

    def without(dropped: int) -> list[Message]:
        return messages[:head] + [m for turn in turns[dropped:] for m in turn]

    low, high = 0, max(len(turns) - 1, 0)
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if _fits(without(middle), conv, ctx) else (middle + 1, high)
    return without(low), low


def _trim_reasoning(kept: list[Message], conv: Conversation, ctx: RenderContext) -> tuple[list[Message], int, bool]:
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


def _most_that_fit(kept: list[Message], k: int, key: str, text: str, conv: Conversation, ctx: RenderContext,
                   upto: int) -> int:
    """How many of the text's first tokens (at most upto) message k's `key` can hold with the messages fitting."""
    def cut(n: int) -> list[Message]:
        return [*kept[:k], {**kept[k], key: ctx.first_tokens(text, n)}, *kept[k + 1:]]

    low, high = 0, upto
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if _fits(cut(middle), conv, ctx) else (low, middle - 1)
    return low


def _cut_prompt(kept: list[Message], conv: Conversation, ctx: RenderContext) -> list[Message]:
    """The kept messages with the longest untrained content (not a system message's, nor one with a training
    detail) cut to its first tokens, as many as fit: what is cut is the end of the prompt's longest text, as
    LLaMA-Factory cuts a prompt, while the system messages, the headers and what is trained stay whole.
    Where even its first token does not fit, the row is dropped (too_many_tokens)."""
    labels = ctx.policy.labels(kept)
    detail = ctx.policy.message_training_detail_key
    cuttable = [k for k, m in enumerate(kept) if m["role"] != "system" and not ctx.policy.trains(labels[k])
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
