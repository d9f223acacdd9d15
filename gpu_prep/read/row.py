"""What every reader yields for a row (ReadRow), the same with its file's index (FileRow), and a row of a chunk
that is dropped (DroppedRow)."""

from __future__ import annotations

from typing import Any, NamedTuple

from gpu_prep.errors import Dropped


class ReadRow(NamedTuple):
    """One row as a reader gives it. A row dropped as it is read (not JSON, over input.max_row_bytes, cells
    that do not match the header) has no record: it has why (dropped) and what was read (as_read, for the
    rejects file)."""

    line: int  # its line, array element or row number in the file
    record: Any  # the parsed row; None where it is dropped
    nbytes: int  # the text it was read from, in bytes (a columnar file's: its share of the file's)
    dropped: Dropped | None = None
    as_read: Any = None  # a dropped row as it was read: its text, its bytes or its cells


class FileRow(NamedTuple):
    """A row of one of the run's input files (several datasets' rows come mixed)."""

    file_index: int
    row: ReadRow


class DroppedRow(NamedTuple):
    """A row of a chunk that a stage dropped: its place in the chunk, why, and the row as read (what the
    rejects file and the examples show)."""

    row: int
    why: Dropped
    record: Any
