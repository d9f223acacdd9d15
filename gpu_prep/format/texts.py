"""The texts the filter stage reads from a built row: its source text and length, what dedup, fuzzy dedup
and splits hash, and its domain."""

from __future__ import annotations

import hashlib
from typing import Any

from gpu_prep.errors import Drop
from gpu_prep.format.shapes import (DEFAULT_DOMAIN, Conversation, RowError, Segments, Shape, Tokens, Unpaired,
                                    _Preference, type_name)

def source_text(shape: Shape) -> str:
    """The row's own text, before any template: what the length filters look at."""
    if isinstance(shape, Segments):
        return shape.source if shape.source is not None else "".join(text for text, _ in shape.pieces)
    if isinstance(shape, Tokens):  # its ids, written out: what length rules and dedup see of it
        return " ".join(map(str, shape.ids))
    if isinstance(shape, _Preference):
        return "\n".join(shape.texts())
    return "\n".join(m["content"] for m in shape.messages)


def source_chars(shape: Shape) -> int:
    """len(source_text(shape)), without joining a conversation's messages into one string."""
    if type(shape) is Conversation and shape.messages:
        return sum([len(m["content"]) for m in shape.messages]) + len(shape.messages) - 1
    return len(source_text(shape))


def split_text(shape: Shape) -> str:
    """What output.splits hashes: the row's own text, and for a preference pair its prompt alone (so the
    pairs of one prompt share a split: a prompt never leaks from train into validation)."""
    return shape.texts()[0] if isinstance(shape, _Preference) else source_text(shape)


def dedup_text(shape: Shape, source: str | None = None) -> str:
    """What deduplication hashes a prefix of: the source text (source_text(shape), when the caller has it),
    less a conversation's system messages (a long system prompt shared by a whole dataset would otherwise
    make every row a duplicate)."""
    if isinstance(shape, Conversation):
        turns = [m["content"] for m in shape.messages if m["role"] != "system"]
        if turns:
            return "\n".join(turns)
    if isinstance(shape, _Preference):  # a duplicate only of an equal row: the prefix hashed is a digest of it
        texts = [*shape.texts(), *([str(shape.label)] if isinstance(shape, Unpaired) else [])]
        return hashlib.md5("\0".join(texts).encode("utf-8", "surrogatepass")).hexdigest()
    if isinstance(shape, Tokens):  # ids written out share long prefixes (a template's header): the whole row
        return hashlib.md5(f"{shape.ids}{shape.trained}".encode()).hexdigest()
    return source_text(shape) if source is None else source


def hashed_whole(shape: Shape) -> bool:
    """Whether dedup_text is a digest of the whole row (preference, kto and pre-tokenized rows)."""
    return isinstance(shape, (_Preference, Tokens))


def fuzzy_text(shape: Shape) -> str:
    """What near-duplicate removal shingles: the text exact dedup hashes, and for a preference or kto row
    its texts themselves (prompt and completions), for a pre-tokenized row its ids written out."""
    return source_text(shape) if isinstance(shape, (_Preference, Tokens)) else dedup_text(shape)


def domain_of(record: dict[str, Any], domain_key: str | None, default: str | None = None) -> str:
    """The row's output domain: its domain_key field; where that names none, `default` (a dataset's own
    domain: for a field missing, null or empty) or __default__ (for a field missing or null; "" is then a
    domain of its own, as any other value)."""
    value = record.get(domain_key) if domain_key is not None else None
    if value is None or (value == "" and default is not None):
        return default or DEFAULT_DOMAIN
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)
    raise RowError(Drop.WRONG_TYPE, f"field {domain_key!r} (the domain) must be a string or an integer (5 is the "
                                    f"domain '5'), got {type_name(value)}")
