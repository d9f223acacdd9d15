"""Writes bad_rows.jsonl and bad_rows.expected.json: chat rows that break every rule a reader meets in
the wild, each beside the fate it must meet (written, or dropped with a reason). Run it again after
changing a case: python tests/data/make_bad_rows.py

The fates are written down here, from what each row is; the test never takes them from the pipeline.
Config used with it: bad_rows.config.json (max_chars 3000, max_row_bytes 8000, domain_key "source").
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
WRITTEN = "written"


def chat(*turns: tuple[str, object], source: object = "main", **extra: object) -> bytes:
    row = {"source": source, "messages": [{"role": r, "content": c} for r, c in turns], **extra}
    return json.dumps(row, ensure_ascii=False).encode()


def qa(n: int, source: object = "main") -> bytes:
    return chat(("user", f"Question number {n}: what is {n} + {n}?"), ("assistant", f"It is {2 * n}."), source=source)


CASES: list[tuple[bytes, str]] = [
    (b"\xef\xbb\xbf" + qa(1), WRITTEN),  # a UTF-8 byte order mark before the first row
    (qa(2), WRITTEN),
    (b'{"source": "main", "messages": [{"role": "user", "content": "cut', "malformed_json"),
    (b"{not json}", "malformed_json"),
    (b'{"source": "main", "messages": [{"role": "user", "content": "bad \xff\xfe bytes"}]}', "malformed_json"),
    (b"[1, 2, 3]", "not_an_object"),
    (b'"a string"', "not_an_object"),
    (b"42", "not_an_object"),
    (b"null", "not_an_object"),
    (b"", "blank"),  # a blank line is not a row
    (b"   \t ", "blank"),
    (json.dumps({"source": "main", "conversation": []}).encode(), "missing_field"),
    (json.dumps({"messages": [{"role": "user"}]}).encode(), "missing_field"),
    (json.dumps({"messages": [{"content": "who am I?"}]}).encode(), "missing_field"),
    (chat(("user", 5), ("assistant", "five")), "wrong_type"),
    (chat(("user", None), ("assistant", "nothing")), "wrong_type"),
    (chat(("user", "hi"), ("assistant", ["not", "parts"])), "wrong_type"),
    (chat(("user", [{"type": "image_url", "image_url": {"url": "x.png"}}]), ("assistant", "an image")), "wrong_type"),
    (json.dumps({"messages": "not a list"}).encode(), "wrong_type"),
    (json.dumps({"messages": ["not an object"]}).encode(), "wrong_type"),
    (json.dumps({"messages": [{"role": 1, "content": "numeric role"}]}).encode(), "wrong_type"),
    (chat(("user", "a list for a domain"), ("assistant", "no"), source=["a", "b"]), "wrong_type"),
    (json.dumps({"messages": []}).encode(), "empty"),
    # Valid but odd: handled as chat templates' users expect.
    (chat(("user", [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}]),
          ("assistant", "Both parts read.")), WRITTEN),
    (chat(("assistant", "I speak first."), ("user", "Fine."), ("assistant", "Good.")), WRITTEN),
    (chat(("user", "One."), ("user", "Two, in a row."), ("assistant", "Both answered.")), WRITTEN),
    (chat(("user", ""), ("assistant", "An empty question.")), WRITTEN),
    (chat(("user", "A blank answer follows."), ("assistant", "   ")), WRITTEN),  # trains its end of turn
    (chat(("user", "Control \u0007 bell and \u0000 NUL."), ("assistant", "Escaped \u0001 and kept.")), WRITTEN),
    (chat(("system", "Only a system prompt."), ("user", "And a user.")), "no_trained_tokens"),
    # A role the template does not render: the row is written without that message, which the manifest
    # counts under totals.messages_left_out_by_template (and the summary warns about).
    (chat(("knowledge", "Background the template drops."), ("user", "Q?"), ("assistant", "A.")), WRITTEN),
    (chat(("user", "x" * 3001), ("assistant", "too long")), "too_long"),
    (chat(("user", "y" * 9000), ("assistant", "a line too large to parse")), "too_large"),
    (qa(2), "duplicate"),  # exactly the second row again
    # Domain values that must never leave the output directory, and names that collide once made safe.
    (qa(10, source="../x"), WRITTEN),
    (qa(11, source="/etc"), WRITTEN),
    (qa(12, source=""), WRITTEN),
    (qa(13, source="a/b"), WRITTEN),
    (qa(14, source="a_b"), WRITTEN),
    (qa(15, source="a?b"), WRITTEN),
    (qa(16, source="d" * 300), WRITTEN),
    (qa(17, source=".."), WRITTEN),
    (qa(18, source="manifest.json"), WRITTEN),
    (qa(19), WRITTEN),
    (b'{"source": "main", "messages": [{"role": "user", "content": "the last line is cut', "malformed_json"),
]


def main() -> None:
    lines = [line for line, _ in CASES]
    (HERE / "bad_rows.jsonl").write_bytes(b"\n".join(lines))  # the last line has no newline: it was cut
    fates = {str(n): fate for n, (_, fate) in enumerate(CASES, start=1) if fate != "blank"}
    (HERE / "bad_rows.expected.json").write_text(json.dumps(fates, indent=1) + "\n", encoding="utf-8")
    config = {"input": {"type": "chat", "max_row_bytes": 8000}, "mask": {"assistant": "train"},
              "preprocessing": {"max_chars": 3000}, "output": {"domain_key": "source"}}
    (HERE / "bad_rows.config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
