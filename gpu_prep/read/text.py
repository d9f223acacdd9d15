"""Plain text: a document per file, or per line with input.text_rows "line"."""


from __future__ import annotations

import io
from collections.abc import Iterator

from gpu_prep.read.files import open_bytes
from gpu_prep.read.row import ReadRow


def text_rows(path: str, compression: str | None, key: str, per_line: bool,
              encoding: str | None = None) -> Iterator[ReadRow]:
    """Plain text: the whole file as one row {key: text}, or (per_line) each non-blank line as one."""
    with open_bytes(path, compression, encoding) as handle:
        stream = io.TextIOWrapper(handle, encoding="utf-8", errors="strict", newline="")
        if not per_line:
            text = stream.read().removeprefix("\ufeff")
            if text.strip():
                yield ReadRow(1, {key: text}, len(text))
            return
        for line_no, line in enumerate(stream, start=1):
            if line_no == 1:
                line = line.removeprefix("\ufeff")
            line = line.rstrip("\r\n")
            if line.strip():
                yield ReadRow(line_no, {key: line}, len(line))
