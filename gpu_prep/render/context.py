"""The render stage's context (built once a run: the template, how it is rendered, the mask rules as a
MaskPolicy) and what it gives for a row (RenderedRow)."""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass, field
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from gpu_prep.render.affix import AffixTemplate
from gpu_prep.errors import ConfigError
from gpu_prep.format import Conversation
from gpu_prep.render.policy import MaskPolicy
from gpu_prep.render.ranges import Span

if TYPE_CHECKING:
    from gpu_prep.render.sandbox import ChatTemplate
    from gpu_prep.config import PipelineConfig
    from gpu_prep.render.templates import Chosen



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
    # The config's mask rules, read from it here, so a context made for another config (a dataset's own,
    # dataclasses.replace) cannot keep the old ones.
    policy: MaskPolicy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", MaskPolicy.of(self.config))

    @functools.cached_property
    def limits(self) -> tuple[float, int]:
        """The template limits each row's renders are held to (template_limits of this context's config)."""
        return template_limits(self.config)

    def template_for(self, conv: Conversation) -> ChatTemplate:
        return self.tool_template if conv.tools and self.tool_template is not None else self.template

    def eot_pattern(self) -> re.Pattern[str]:
        return _eot_pattern(self.end_of_turn)


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


def no_template(rows: str, source: Chosen | None, fix: str = NO_TEMPLATE_FIX) -> ConfigError:
    """Rows that need a chat template, where the run has none: a tokenizer with only named templates (as
    transformers keeps a tool_use one) has one to pick."""
    named = source.named if source is not None else ()
    if named:
        fix = f"the tokenizer has only named ones, no default; name one with chat_template_name: {' or '.join(named)}"
    return ConfigError(f"{rows} need a chat template: {fix}")


def template_limits(config: PipelineConfig) -> tuple[float, int]:
    """input.template_time_limit and input.template_max_chars; a null cap is twice preprocessing.max_chars
    (the longest row the length filter lets through, written once, leaves as much again for reasoning, tool
    calls and the template's own text), and at least 1,000,000 characters."""
    chars = config.input.template_max_chars
    if chars is None:
        chars = max(2 * config.preprocessing.max_chars, 1_000_000)
    return config.input.template_time_limit, chars


def _to_bytes(text: str, spans: Sequence[Span | tuple[int, int]], ranges: list[tuple[int, int]], form: str | None
              ) -> tuple[str, list[tuple[int, int]], int]:
    """Normalize text between the spans' bounds and turn character ranges whose ends are such bounds (the
    trained ones) into byte ranges; also the text's length in bytes. (A normal form never empties a text,
    so byte positions keep the order of character positions: ranges merged in either are the same.)"""
    if text.isascii():  # one byte per character, and every normal form leaves ASCII alone
        return text, ranges, len(text)
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
    return "".join(out), [(byte_at[s], byte_at[e]) for s, e in ranges], total


def _trained(spans: list[Span], ctx: RenderContext) -> tuple[list[tuple[int, int]], list[str]]:
    """The trained ranges, sorted and merged, and the role each is counted under (its first piece's)."""
    trains = ctx.policy.trains
    keep = sorted([(s, e, role) for s, e, label, role in spans if e > s and trains(label)])
    merged: list[tuple[int, int]] = []
    roles: list[str] = []
    for s, e, role in keep:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
        else:
            merged.append((s, e))
            roles.append(role)
    return merged, roles
