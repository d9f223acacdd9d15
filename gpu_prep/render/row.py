"""The render stage: a row's shape -> RenderedRow, through the template (or its Jinja-free form, once the
first rows agree), within the row limits, with structured truncation and reasoning cut as the config says."""

from __future__ import annotations

import dataclasses

import jinja2
import numpy as np

from gpu_prep.render.limits import row_limits
from gpu_prep.errors import Drop
from gpu_prep.format import Conversation, Pair, RowError, Segments, Shape, Tokens, Unpaired
from gpu_prep.render.context import AFFIX_CHECK_ROWS, RenderContext, RenderedRow, _to_bytes, _trained
from gpu_prep.render.pairs import _pair
from gpu_prep.render.reasoning import _reasoning_not_shown, _think_block_notes
from gpu_prep.render.spans import ConversationSpans, conversation_spans
from gpu_prep.render.tool_calls import _arguments_as_objects
from gpu_prep.render.truncation import _structured



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
    found = _within_limits(shape, ctx)
    trained, roles = _trained(found.spans, ctx)  # in characters
    text = found.text
    if ctx.offsets:
        num_bytes = len(text.encode("utf-8"))
    else:
        text, trained, num_bytes = _to_bytes(text, found.spans, trained, ctx.normalization)
    return RenderedRow([text], [False], trained, num_bytes, left_out=found.left_out, notes=found.notes,
                       span_roles=roles, unmarked=found.unmarked)


def _think_cut(conv: Conversation, ctx: RenderContext) -> Conversation:
    """The conversation with each reasoning cut to its first input.think_max_tokens tokens, where set."""
    limit = ctx.policy.think_max_tokens
    if limit is None or ctx.first_tokens is None or not any(m.get("reasoning_content") for m in conv.messages):
        return conv
    return dataclasses.replace(conv, messages=[
        {**m, "reasoning_content": ctx.first_tokens(m["reasoning_content"], limit)}
        if isinstance(m.get("reasoning_content"), str) else m for m in conv.messages])


def _within_limits(conv: Conversation, ctx: RenderContext) -> ConversationSpans:
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
            found = conversation_spans(conv, ctx)
            notes += found.notes
            if _reasoning_not_shown(conv, found.text):
                notes += ("reasoning_not_rendered",)
            notes += _think_block_notes(conv, found.text, ctx)
            return ConversationSpans(found.text, found.spans, found.left_out, found.unmarked, notes)
        except RowError:
            if budget.exceeded is not None:
                raise RowError(Drop.TEMPLATE_LIMIT, budget.exceeded) from None
            raise


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
    trained = [shape.train_all or ctx.policy.trains(label) for _, label in pieces]
    texts = [t for t, _ in pieces]
    # What closes the row outlives right truncation: the tokenizer's own suffix ([SEP]) and, for a text row,
    # the end-of-document token before it, so that documents packed or concatenated stay apart. (The eos
    # closing an instruction row's response is the response's: a cut response is not given one.)
    closing = bool(suffix) + (closed and not shape.add_eos)
    return RenderedRow(texts, trained, [], sum(len(t.encode("utf-8")) for t in texts), closing)
