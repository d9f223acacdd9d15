"""Looking at samples: a sample's text with its trained tokens marked, built from the bytes each token
stands for (never per-token decodes, which mangle a character split across tokens or a mask boundary)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpu_prep.tokenization.engines import byte_decoder

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
    return tok.engine.id_to_token(token_id).translate(byte_decoder()).encode("latin-1")


def _decoded_runs(tok: Any, ids: np.ndarray, loss_mask: np.ndarray) -> list[tuple[bool, str]]:
    """Runs of a tokenizer whose tokens are not byte strings (WordPiece, SentencePiece): each run is what
    decoding up to its end adds to decoding up to its start, so the spaces the decoder puts between words
    (or turns ▁ into) stay where they are."""
    flags = np.asarray(loss_mask, dtype=bool)
    cuts = [0, *(np.flatnonzero(flags[1:] != flags[:-1]) + 1).tolist(), len(ids)]
    texts = [tok.engine.decode([int(i) for i in ids[:c]], skip_special_tokens=False) for c in cuts]
    out = []
    for k, (a, b) in enumerate(zip(texts, texts[1:])):
        same = len(a) if b.startswith(a) else next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        out.append((bool(flags[cuts[k]]) if cuts[k] < len(flags) else False, b[same:]))
    return [run for run in out if run[1]]


def runs(tok: Any, ids: np.ndarray, loss_mask: np.ndarray) -> list[tuple[bool, str]]:
    """The sample as (trained, text) runs; a run boundary inside a multi-byte character shows its bytes
    as \\xNN rather than hiding them."""
    if tok.token_bytes is None or not tok.byte_spans:
        return _decoded_runs(tok, ids, loss_mask)
    out: list[tuple[bool, bytearray]] = []
    added = _added(tok)
    for token_id, flag in zip(ids, loss_mask):
        if not out or out[-1][0] != bool(flag):
            out.append((bool(flag), bytearray()))
        out[-1][1].extend(token_bytes(tok, int(token_id), added))
    return [(flag, bytes(data).decode("utf-8", errors="backslashreplace")) for flag, data in out]


def marked_text(tok: Any, ids: np.ndarray, loss_mask: np.ndarray, open_: str = OPEN, close: str = CLOSE) -> str:
    """The sample's text with every run of trained tokens wrapped in open_ ... close. Markers the text
    holds itself are shown escaped (a backslash before them), so the marking stays unambiguous."""
    def escaped(text: str) -> str:
        return text.replace(open_, "\\" + open_).replace(close, "\\" + close)

    return "".join(f"{open_}{escaped(text)}{close}" if flag else escaped(text) for flag, text in runs(tok, ids, loss_mask))
