"""Looking at samples: a sample's text with its trained tokens marked, built from the bytes each token
stands for (never per-token decodes, which mangle a character split across tokens or a mask boundary)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpu_prep.engines import _byte_decoder

OPEN, CLOSE = "⟦", "⟧"


def _added(tok: Any) -> dict[int, str]:
    return {i: t.content for i, t in tok.engine.get_added_tokens_decoder().items()}


def token_bytes(tok: Any, token_id: int, added: dict[int, str] | None = None) -> bytes:
    """The exact bytes one token stands for: an added token's literal text; a byte-level BPE token's
    bytes; otherwise (WordPiece) the token as the tokenizer decodes it. added: _added(tok), when known."""
    added = _added(tok) if added is None else added
    if token_id in added:
        return added[token_id].encode("utf-8")
    if tok.token_bytes is None:
        return tok.engine.decode([token_id], skip_special_tokens=False).encode("utf-8")
    return tok.engine.id_to_token(token_id).translate(_byte_decoder()).encode("latin-1")


def runs(tok: Any, ids: np.ndarray, loss_mask: np.ndarray) -> list[tuple[bool, str]]:
    """The sample as (trained, text) runs; a run boundary inside a multi-byte character shows its bytes
    as \\xNN rather than hiding them."""
    out: list[tuple[bool, bytearray]] = []
    added = _added(tok)
    for token_id, flag in zip(ids, loss_mask):
        if not out or out[-1][0] != bool(flag):
            out.append((bool(flag), bytearray()))
        out[-1][1].extend(token_bytes(tok, int(token_id), added))
    return [(flag, bytes(data).decode("utf-8", errors="backslashreplace")) for flag, data in out]


def marked_text(tok: Any, ids: np.ndarray, loss_mask: np.ndarray, open_: str = OPEN, close: str = CLOSE) -> str:
    """The sample's text with every run of trained tokens wrapped in open_ ... close."""
    parts = runs(tok, ids, loss_mask)
    plain = "".join(text for _, text in parts)
    if open_ in plain or close in plain:  # markers must be unambiguous
        raise ValueError(f"the sample's own text contains a marker ({open_!r} or {close!r})")
    return "".join(f"{open_}{text}{close}" if flag else text for flag, text in parts)
