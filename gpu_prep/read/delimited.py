"""CSV and TSV files (the other layouts' readers are beside this module in read/): a header row names the columns and every cell
is text, read by pyarrow's CSV reader block by block; the standard csv module reads a file again only to
name what pyarrow skips or cannot say (a ragged record's number, the line an unclosed quote opens on)."""

from __future__ import annotations

import codecs
import io
import itertools
import re
from collections import deque
from collections.abc import Iterator
from typing import Any

from gpu_prep.errors import ConfigError, Drop, Dropped, InputError
from gpu_prep.read.files import HEAD_BYTES, REJECT_TEXT, open_bytes
from gpu_prep.read.row import ReadRow


def csv_rows(path: str, compression: str | None, delimiter: str, encoding: str | None = None) -> Iterator[ReadRow]:
    """CSV or TSV: the header row names the columns, every cell is text; rows are numbered by record, the
    header being 1 (the line, unless a quoted cell spans lines or blank lines come between). A row with
    more or fewer cells than the header is a malformed_row drop showing its text, in its place (the parser
    skips it without saying where it lay, so a first such row has the file read once more to number them);
    where a quoted cell joins lines into such a record, each line is a drop of its own: its quote may be a stray
    one that took the records after it into its cell, and the rows read are to be the records the file holds.
    a header naming a column twice refuses the file. A quote that opens a cell and never closes would take
    the rest of the file into that cell: the parser is given one more record after the text (_END_CELL's,
    with one cell too many, so it comes back as the last skipped row) and, when that record does not come
    back whole, the text ended inside a quote and an InputError stops the run naming the record."""
    if _blank(path, compression, encoding):  # no header, so no rows: as a header-only file, not a damaged one
        return
    header = csv_header(path, compression, delimiter, encoding)
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise ConfigError(f"input {path!r}: its header names the column {', '.join(map(repr, twice))} more than once; "
                          "one of them would be lost")
    skipped = _Skipped(delimiter.join([_END_CELL] * (len(header) + 1)))
    # row: the records read (the header being 1), as the csv module numbers them in `ragged` (the rows with
    # too few or too many cells, once one is met); extra: how many more rows than records joined lines gave.
    row, extra, ragged = 1, 0, None
    bad = skipped.rows
    with open_bytes(path, compression, encoding) as handle:
        # The parser reads ahead: `bad` may hold rows of later blocks, so a row is taken from it only at its
        # own number; what is left at the end (where the two readers disagree on a row) comes last.
        read = 0
        for batch in _open_csv(handle, delimiter, header, skipped):
            if bad and ragged is None:
                ragged = deque(_ragged_records(path, compression, delimiter, encoding, len(header)))
            records = batch.to_pylist()
            # The text read for the batch, shared among its rows: what a chunk's size and progress count.
            now = _position(handle, read + batch.nbytes)
            share, first = divmod(now - read, max(1, len(records)))
            read = now
            for k, record in enumerate(records):
                row += 1
                while bad and ragged and ragged[0] == row:  # the skipped rows before this one, in their places
                    ragged.popleft()
                    drops = _malformed(row + extra, bad.popleft())
                    yield from drops
                    row, extra = row + 1, extra + len(drops) - 1
                yield ReadRow(row + extra, record, share + (first if k == 0 else 0))
        if not skipped.ended:
            last = row + len(bad)
            raise InputError(f"{path}: the file ends inside a quoted cell: a '\"' opened in record {last} (the last, "
                             f"starting on line {_record_line(path, compression, delimiter, encoding, last)}) never "
                             "closes, so the rows after it were read into that cell and would be lost; the run stops "
                             "(close the quote, and write a '\"' inside a quoted cell as '\"\"')")
        for invalid in bad:
            row += 1
            drops = _malformed(row + extra, invalid)
            yield from drops
            extra += len(drops) - 1


class _Skipped:
    """The parser's invalid_row_handler: keeps the rows it skips (taken from the left), and notes whether the
    last one is the record put after the text (_END_CELL's), whole."""

    def __init__(self, end: str) -> None:
        self.end, self.ended = end, False
        self.rows: deque[Any] = deque()

    def __call__(self, invalid: Any) -> str:
        self.ended = invalid.text == self.end
        if not self.ended:
            self.rows.append(invalid)
        return "skip"


def _open_csv(handle: Any, delimiter: str, header: list[str], skipped: _Skipped) -> Any:
    """pyarrow's CSV reader over the text and then the end record, every cell read as text."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    types = {name: pa.string() for name in header}
    options = pacsv.ConvertOptions(column_types=types, strings_can_be_null=False, quoted_strings_can_be_null=False)
    return pacsv.open_csv(_Then(handle, f"\n{skipped.end}\n".encode()),
                          read_options=pacsv.ReadOptions(block_size=4 << 20),
                          parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True,
                                                           invalid_row_handler=skipped),
                          convert_options=options)


def _malformed(number: int, invalid: Any) -> list[ReadRow]:
    """A row the parser skipped, as dropped rows numbered from `number` (in its batch's bytes): one, or one a
    line where a quoted cell joins lines into it."""
    cells = f"{invalid.actual_columns} cells where the header has {invalid.expected_columns}"
    lines = [line for line in _LINE_END.split(invalid.text) if line]  # blank lines are no record
    if len(lines) < 2:
        return [ReadRow(number, None, 0, Dropped(Drop.MALFORMED_ROW, cells), invalid.text[:REJECT_TEXT])]
    joined = (f"{cells}, in a record a quoted cell joins from {len(lines)} lines (a '\"' opened on one line "
              "and closed on another?)")
    return [ReadRow(number + k, None, 0, Dropped(Drop.MALFORMED_ROW, f"{joined}: line {k + 1} of them; each is "
                                                 "counted as a dropped row"), line[:REJECT_TEXT])
            for k, line in enumerate(lines)]


def _blank(path: str, compression: str | None, encoding: str | None) -> bool:
    """Whether a CSV or TSV file's text holds no record: no bytes, a byte order mark or blank lines alone
    (pyarrow refuses such a file as "Empty CSV file"; a writer that shards its output leaves empty parts)."""
    with open_bytes(path, compression, encoding) as handle:
        text = handle.read(HEAD_BYTES).removeprefix(codecs.BOM_UTF8)
        while text:
            if text.strip(b"\r\n"):
                return False
            text = handle.read(HEAD_BYTES)
    return True


_LINE_END = re.compile(r"\r\n|\r|\n")  # as the parser ends a line

# The cells of the record csv_rows puts after a CSV's text: NUL bytes, so that no row of a text file is it.
_END_CELL = "\x00gpu-prep: end of the text\x00"


class _Then(io.RawIOBase):
    """A file's bytes, then `tail`."""

    def __init__(self, handle: Any, tail: bytes) -> None:
        self.handle, self.tail = handle, tail

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.handle.read(len(buffer))
        if not data:
            data, self.tail = self.tail[:len(buffer)], self.tail[len(buffer):]
        buffer[: len(data)] = data
        return len(data)


def _csv_records(path: str, compression: str | None, delimiter: str, encoding: str | None) -> Iterator[tuple[int, int]]:
    """(the line it starts on, its cell count) of each record of a CSV or TSV file, read with the standard csv
    module; blank lines are no record, as pyarrow skips them."""
    import csv
    import sys

    limit = csv.field_size_limit(sys.maxsize)  # a cell may hold a whole document
    try:
        with open_bytes(path, compression, encoding) as handle:
            reader = csv.reader(io.TextIOWrapper(handle, encoding="utf-8-sig", errors="replace", newline=""),
                                delimiter=delimiter)
            line = 0
            for record in reader:
                if record:
                    yield line + 1, len(record)
                line = reader.line_num
    finally:
        csv.field_size_limit(limit)


def _record_line(path: str, compression: str | None, delimiter: str, encoding: str | None, number: int) -> int:
    """The line record `number` starts on (the header being 1)."""
    line = 1
    for line, _ in itertools.islice(_csv_records(path, compression, delimiter, encoding), number):
        pass
    return line


def csv_header(path: str, compression: str | None, delimiter: str, encoding: str | None = None) -> list[str]:
    """The column names a CSV or TSV file's header row gives (its first block alone is read)."""
    import pyarrow.csv as pacsv

    with open_bytes(path, compression, encoding) as handle:
        return pacsv.open_csv(handle, parse_options=pacsv.ParseOptions(
            delimiter=delimiter, newlines_in_values=True, invalid_row_handler=lambda invalid: "skip")).schema.names


def _position(handle: Any, otherwise: int) -> int:
    """How far into its (decompressed) text a file object is; `otherwise` where it cannot say (a zstd stream,
    a transcoded UTF-16 file)."""
    try:
        return handle.tell()
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return otherwise


def _ragged_records(path: str, compression: str | None, delimiter: str, encoding: str | None, cells: int) -> list[int]:
    """The numbers (the header being 1) of the records that do not have `cells` cells."""
    import csv

    try:
        return [n for n, (_, count) in enumerate(_csv_records(path, compression, delimiter, encoding), start=1)
                if count != cells]
    except csv.Error:  # what pyarrow reads, the csv module may not: the rows are then numbered in order read
        return []
