"""Reasoning (<think> blocks and reasoning fields): whether a rendering shows it, and the notes a row's think
blocks get."""

from __future__ import annotations


import numpy as np

from gpu_prep.format import Conversation
from gpu_prep.render.context import RenderContext
from gpu_prep.render.spans import _split_think

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
    policy = ctx.policy
    untouched = policy.think_mode == "drop" or policy.think_max_tokens is not None
    by_roles = not (ctx.generation and ctx.template_for(conv).marked) and not policy.think_loss
    labels = ctx.policy.labels(conv.messages) if blocks and by_roles else []  # training flags and train_last_turn_only count
    thoughts = {i: _split_think(conv.messages[i]["content"])[0] for i in blocks}
    held = _held({_probe(thought) for thought in thoughts.values()}, text)
    for i in blocks:
        if _not_shown(thoughts[i], text, held):
            notes.append("think_blocks_not_rendered")
            continue
        notes.extend(["think_blocks_untouched"] * untouched)  # written, as those options would not have it
        if by_roles and ctx.policy.trains(labels[i]):
            notes.append("think_blocks_trained")
    return tuple(notes)
