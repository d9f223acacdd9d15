"""Helpers shared by the end-to-end tests: run the real pipeline, read samples back, show them as text.

`marked_text` is the reusable piece: a sample's tokens as readable text with the trained spans wrapped in
markers. It works on bytes, not on per-token decodes, so a multi-byte character split across tokens (or
across a mask boundary) is never mangled silently. A future `gpu-prep inspect` wants the same function.
"""

from __future__ import annotations

import json
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

import gpu_prep
from gpu_prep.chat_template import ChatTemplate
from gpu_prep.config import parse_config
from gpu_prep.pipeline import run

REPO = Path(__file__).resolve().parent.parent
OPEN, CLOSE = "⟦", "⟧"
Sample = tuple[np.ndarray, np.ndarray]


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: byte-level BPE writes every byte as one printable char."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def token_bytes(tok: Any, token_id: int) -> bytes:
    """The exact bytes one token stands for (added tokens are their literal text)."""
    added = tok.engine.get_added_tokens_decoder()
    if token_id in added:
        return added[token_id].content.encode("utf-8")
    decoder = _byte_decoder()
    return bytes(decoder[ch] for ch in tok.engine.id_to_token(token_id))


def marked_text(tok: Any, ids: np.ndarray, loss_mask: np.ndarray, open_: str = OPEN, close: str = CLOSE) -> str:
    """The sample's text with every run of trained tokens wrapped in open_ ... close."""
    plain = b"".join(token_bytes(tok, int(i)) for i in ids).decode("utf-8", errors="backslashreplace")
    if open_ in plain or close in plain:  # markers must be unambiguous
        raise ValueError(f"the sample's own text contains a marker ({open_!r} or {close!r})")
    out = bytearray()
    trained = False
    for token_id, flag in zip(ids, loss_mask):
        if bool(flag) != trained:
            out += (open_ if flag else close).encode("utf-8")
            trained = bool(flag)
        out += token_bytes(tok, int(token_id))
    if trained:
        out += close.encode("utf-8")
    # A marker inside a multi-byte character leaves invalid UTF-8: shown as \xNN, never hidden.
    return out.decode("utf-8", errors="backslashreplace")


def golden_document(title: str, tok: Any, ids: np.ndarray, loss_mask: np.ndarray) -> str:
    """A golden file: a header, the marked text (plus one newline), then the ids and loss_mask lines."""
    return (
        f"# {title}\n"
        f"# tokenizer {tok.name}; trained tokens are wrapped in {OPEN} {CLOSE}; one newline follows the text\n"
        f"{marked_text(tok, ids, loss_mask)}\n"
        f"ids: {' '.join(str(int(i)) for i in ids)}\n"
        f"loss_mask: {' '.join(str(int(m)) for m in loss_mask)}\n"
    )


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """Rows as JSON Lines; a str row is written verbatim (malformed lines, blank lines)."""
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False)) + "\n")
    return path


def load_json(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def run_rows(tmp_path: Path, config: dict[str, Any], rows: list[Any], name: str = "run", **kwargs: Any) -> Path:
    """Write rows to a JSONL file, run the real pipeline on it, return the output directory."""
    inputs = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    out = tmp_path / f"{name}-out"
    run(parse_config(config), [str(inputs)], out, **kwargs)
    return out


def samples(out_dir: Path, domain: str | None = None) -> list[Sample]:
    """All samples of one domain (the only one when domain is None), in stored order."""
    ds = gpu_prep.open_dataset(out_dir)
    if domain is None:
        assert len(ds) == 1, f"expected one domain, got {list(ds)}"
        domain = next(iter(ds))
    return [(ids.copy(), mask.copy()) for ids, mask in ds[domain]]


def render_chat(tok: Any, messages: list[dict[str, Any]]) -> str:
    """The conversation as the tokenizer sees it: the real chat template, then its Unicode normalization."""
    text = ChatTemplate(tok.chat_template, tok.special_tokens).render(messages)
    return unicodedata.normalize(tok.normalization, text) if tok.normalization else text
