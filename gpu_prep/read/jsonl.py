"""JSON Lines: each line parsed by the strict parser (a line that is not valid JSON, or not an object, is a
row that carries its drop reason), lines over input.max_row_bytes dropped unread; and, on the GPU backend,
byte ranges parsed as columns by cudf.read_json where a scan of their bytes says the strict parser would agree."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from gpu_prep.read import jsonscan
from gpu_prep.backend import ReadGroups, ReadRange
from gpu_prep.errors import Drop, Dropped
from gpu_prep.read.jsonscan import LBRACKET, QUOTE
from gpu_prep.read.files import is_url, open_bytes
from gpu_prep.read.row import ReadRow


from gpu_prep.read.inputs import InputFile, Part, read_part

REJECT_TEXT_CHARS = 1 << 20  # how much of a malformed line a rejects file keeps


def _parse_line(raw: bytes, line: int = 1, nbytes: int | None = None) -> ReadRow:
    """Line `line`, parsed by the strict parser (nbytes: the bytes it counts for, by default its own)."""
    nbytes = len(raw) if nbytes is None else nbytes
    try:
        return ReadRow(line, orjson.loads(raw), nbytes)
    except orjson.JSONDecodeError as exc:
        text = raw[:REJECT_TEXT_CHARS].decode("utf-8", errors="replace").rstrip("\r\n")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:  # say so plainly: the file may be in another encoding
            # (the row is kept as its bytes: a rejects file gives them back, which text with U+FFFD could not)
            why = Dropped(Drop.MALFORMED_JSON, f"not UTF-8: byte 0x{raw[bad.start]:02x} at column {bad.start + 1} "
                          "(gpu-prep reads UTF-8, or UTF-16/32 with a BOM; convert the file, e.g. with iconv)")
            return ReadRow(line, None, nbytes, why, raw[:REJECT_TEXT_CHARS].rstrip(b"\r\n"))
        why = Dropped(Drop.MALFORMED_JSON, f"not valid JSON: {exc}{_non_json_number(text, exc.pos)}")
        return ReadRow(line, None, nbytes, why, text)


def _non_json_number(text: str, pos: int) -> str:
    """What to say where a parse failed at NaN or Infinity (pos: orjson's, in characters), which Python's
    json.dumps writes by default."""
    at = text[max(pos - 1, 0):pos + 9]
    if not any(word in at for word in ("NaN", "Infinity")):
        return ""
    return ("; NaN and Infinity are not JSON (Python's json.dumps writes them unless allow_nan=False): write them "
            "as null or as strings")


def _too_large(line_no: int, size: int, cap: int) -> ReadRow:
    detail = f"the line is {size:,} bytes, over input.max_row_bytes {cap:,}; not parsed"
    return ReadRow(line_no, None, size, Dropped(Drop.TOO_LARGE, detail))


def _exact_rows(lines: Iterator[tuple[int, bytes | int]], cap: int) -> Iterator[ReadRow]:
    """Numbered lines -> rows, each line parsed by the strict parser; blank lines are not rows. A line
    given as an int was longer than cap and read past: that is its size."""
    for line_no, raw in lines:
        if isinstance(raw, int):
            yield _too_large(line_no, raw, cap)
            continue
        if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            continue
        if len(raw) > cap and (size := len(raw) - _line_end(raw)) > cap:  # (a line end does not count)
            yield _too_large(line_no, size, cap)
            continue
        yield _parse_line(raw, line_no)


def _line_end(raw: bytes) -> int:
    """How many of a line's last bytes are its line end (CRLF or LF): they do not count as its size."""
    return 2 if raw.endswith(b"\r\n") else 1 if raw.endswith(b"\n") else 0


class _Skipped(int):
    """A line read past (longer than the cap): its size without its line end, and the bytes it took (read),
    which is what a byte range counts."""

    read: int


def _bounded_lines(handle: Any, cap: int, first_line: int = 1) -> Iterator[tuple[int, bytes | int]]:
    """Numbered lines (from first_line) of a binary file, none held longer than cap bytes and its line end:
    a longer line is read past in blocks and given as its size (_Skipped)."""
    line_no = first_line - 1
    while raw := handle.readline(cap + 2):
        line_no += 1
        if len(raw) <= cap or raw.endswith(b"\n"):
            yield line_no, raw
            continue
        size, last = len(raw), raw
        while (rest := handle.readline(1 << 20)) and not rest.endswith(b"\n"):
            size, last = size + len(rest), rest
        skipped = _Skipped(size + len(rest) - _line_end((last + rest)[-2:]))
        skipped.read = size + len(rest)
        yield line_no, skipped


def open_input(file: InputFile) -> Any:
    """A binary file object over the input's bytes, decompressed (and converted to UTF-8) as they are read."""
    return open_bytes(file.path, file.compression, file.encoding)


def _jsonl_rows(file: InputFile, cap: int) -> Iterator[ReadRow]:
    with open_input(file) as handle:
        yield from _exact_rows(_bounded_lines(handle, cap), cap)


RANGE_BYTES = 16 << 20


class ColumnarRecord(dict):
    """A row read as columns: only the fields asked for, plus the line itself for the rejects file."""

    __slots__ = ("raw",)


def as_read(record: Any) -> Any:
    """The row as the strict parser reads it (a rejects file shows whole rows)."""
    return orjson.loads(record.raw) if isinstance(record, ColumnarRecord) else record


@dataclass(frozen=True)
class Columnar:
    """Read as columns on the device. JSON Lines (read_range; None: line by line): these top-level string
    fields, and for chat rows a list of messages, (field, role key, content key), each message an object of
    those two strings. Chat rows are taken only when the bytes hold no key beyond those: such a row is then
    wholly what the strict parser reads, whatever the row builders look for. The byte scan
    (gpu_prep.read.jsonscan) runs on the array module xp: CuPy on the GPU backend, beside the parser. Parquet
    (read_groups; None: pyarrow): the columns that hold text, whole rows (sources.parquet_rows)."""

    fields: tuple[str, ...] = ()
    read_range: ReadRange | None = None
    messages: tuple[str, str, str] | None = None
    xp: Any = np
    read_groups: ReadGroups | None = None

    def jsonl(self, file: InputFile) -> bool:
        """Whether this file's lines are read in byte ranges (uncompressed, UTF-8, local)."""
        return self.read_range is not None and file.compression is None and file.encoding is None \
            and not is_url(file.path)

    def parquet(self, file: InputFile) -> bool:
        return self.read_groups is not None and file.layout == "parquet" and not is_url(file.path)

    def columns(self) -> dict[str, Any]:
        """What read_range is asked for."""
        columns: dict[str, Any] = dict.fromkeys(self.fields, "str")
        if self.messages is not None:
            key, role, content = self.messages
            columns[key] = {role: "str", content: "str"}
        return columns

    def scan(self, data: bytes, rows: int) -> int | None:
        """The number of object keys in `data` (whole lines, `rows` of them not blank) where a columnar
        parser must read it exactly as the strict parser does, else None: each line one JSON object the
        strict parser reads, each top-level field read a string (the messages field a list) named at most
        `rows` times, each message's role and content strings, no key read spelled with escapes."""
        values = {name: (QUOTE, True) for name in self.fields}
        if self.messages is not None:
            key, role, content = self.messages
            values.update({key: (LBRACKET, True), role: (QUOTE, False), content: (QUOTE, False)})
        return jsonscan.scan(self.xp, data, rows, values)

    def safe(self, data: bytes, rows: int) -> bool:
        return self.scan(data, rows) is not None

    def complete(self, keys: int, rows: int, table: Any) -> bool:
        """Whether the parsed table (Arrow) holds one whole row for each of the `rows` lines of the scanned
        bytes (holding `keys` object keys, as scan() counted them): no field missing (an all-null row is a
        line the parser could not read), and for chat rows no message missing its role or content and no key
        beyond the fields and the messages' two. Counted on the columns, not on Python rows."""
        import pyarrow.compute as pc

        if table.num_rows != rows or set(table.column_names) != set(self.columns()) \
                or any(column.null_count for column in table.columns):
            return False
        if self.messages is None:
            return True
        key, role, content = self.messages
        listed = pc.list_flatten(table.column(key))
        if listed.null_count or any(pc.struct_field(listed, name).null_count for name in (role, content)):
            return False
        return keys == rows * (len(self.fields) + 1) + 2 * len(listed)


def _columnar_rows(file: InputFile, columnar: Columnar, cap: int, part: Part | None = None,
                   first_line: int = 1) -> Iterator[ReadRow]:
    """The rows of an uncompressed local JSON Lines file (or of a part of one), read as columns in ranges of
    about RANGE_BYTES of whole lines wherever columnar takes them, else by the strict parser. The lines come
    from the reader the strict path uses, so numbering, sizes, lines over the cap (read past, never held) and
    a file that changes while it is read are as there."""
    if part is None or part.end is None:
        handle, offset = open_input(file), 0
    else:
        handle, offset = io.BytesIO(read_part(part)), part.start
    columns = columnar.columns()
    with handle:
        batch: list[tuple[int, bytes | int]] = []
        size = 0
        for line in _bounded_lines(handle, cap, first_line):
            batch.append(line)
            size += line[1].read if isinstance(line[1], _Skipped) else len(line[1])
            if size >= RANGE_BYTES:
                yield from _range_rows(file.path, offset, size, batch, columnar, columns, cap)
                offset, batch, size = offset + size, [], 0
        yield from _range_rows(file.path, offset, size, batch, columnar, columns, cap)


def _range_rows(path: str, offset: int, size: int, lines: list[tuple[int, bytes | int]], columnar: Columnar,
                columns: dict[str, Any], cap: int) -> Iterator[ReadRow]:
    """The rows of these numbered lines, bytes [offset, offset + size) of the file: as columns where the
    scan and the parser's result allow, else line by line."""
    # A line over the cap (given as its size by _bounded_lines, or held with its line end) is dropped by the
    # exact reader: its range is read line by line.
    whole = not any(isinstance(raw, int) or (len(raw) > cap and len(raw) - _line_end(raw) > cap) for _, raw in lines)
    numbered = [k for k, (_, raw) in enumerate(lines) if not raw.isspace()] if whole else []
    keys = columnar.scan(b"".join(raw for _, raw in lines), len(numbered)) if numbered else None
    table = None if keys is None else columnar.read_range(path, offset, size, columns)
    if table is None or not columnar.complete(keys, len(numbered), table):
        yield from _exact_rows(iter(lines), cap)
        return
    for k, record in zip(numbered, table.to_pylist()):
        line_no, raw = lines[k]
        row = ColumnarRecord(record)
        row.raw = raw
        yield ReadRow(line_no, row, len(raw))


