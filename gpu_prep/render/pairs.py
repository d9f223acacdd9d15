"""Preference pairs and KTO rows rendered: the prompt with its generation prompt, each completion after it,
and the checks that the template writes them as one sequence."""

from __future__ import annotations

import json
import os

import jinja2

from gpu_prep.render.limits import row_limits
from gpu_prep.config import TEMPLATE_ROLES
from gpu_prep.errors import Drop
from gpu_prep.format import Conversation, Message, Pair, RowError, Unpaired
from gpu_prep.render.context import RenderContext, RenderedRow, _to_bytes, no_template
from gpu_prep.render.reasoning import _held, _not_shown, _probe
from gpu_prep.render.tool_calls import _arguments_as_objects

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
                text, span, size = _to_bytes(piece, piece_spans, piece_spans, ctx.normalization)
                width = size
            pieces.append(text)
            spans += [(total + a, total + b) for a, b in span]
            total += width
            num_bytes += size
    roles = ["chosen", "rejected"] if isinstance(pair, Pair) else ["desirable" if pair.label else "undesirable"]
    return RenderedRow(pieces, [False] * len(pieces), spans, num_bytes, span_roles=roles, left_out=left_out,
                       notes=notes, label=pair.label if isinstance(pair, Unpaired) else None,
                       generation_prompt_differs=differs)


def _prompt_left_out(messages: list[Message], prompt: str) -> tuple[str, ...]:
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
