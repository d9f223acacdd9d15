"""read/inputs: input files -> bounded chunks of raw rows, each keeping its (file, line).

Which format a file is, checked against its content, and the readers of the formats beyond JSON Lines
live in sources.py. A JSON Lines line that is not valid JSON, or not an object, becomes a row that carries
its drop reason, so it is counted and never takes its neighbours with it. Blank lines are not rows. Rows
of the columnar formats are numbered from 1 in the file, CSV rows by their line (the header is line 1).

A file that cannot be read on (a damaged compressed stream, a Parquet page or Arrow batch that cannot be
decoded, text that is not in its encoding) stops the run with an InputError naming the file and the last
row read: the rows before it were read, the rest would be lost without a word.
"""

from __future__ import annotations

import glob
import io
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from gpu_prep.read import jsonscan
from gpu_prep.backend import ReadGroups, ReadRange
from gpu_prep.errors import ConfigError, Drop, InputError
from gpu_prep.read.jsonscan import LBRACKET, QUOTE
from gpu_prep.read.delimited import csv_header, csv_rows
from gpu_prep.read.hub import check_hub_version, hub_dataset, hub_rows
from gpu_prep.read.columnar import batch_rows, batch_sizes, parquet_rows
from gpu_prep.read.detect import column_names, inspect_file
from gpu_prep.read.files import (KNOWN, READ_ERRORS, datasets_own, file_size, is_url, local_path, open_bytes,
                                 remote_files, split_name, text_size)
from gpu_prep.read.folders import dataset_folder_files, default_split, split_names
from gpu_prep.read.json_array import json_array_rows
from gpu_prep.read.row import Row
from gpu_prep.read.text import text_rows
from gpu_prep.read.text_checks import NotUtf8, first_not_utf8, lines_before_damage

# A JSON Lines chunk closes at chunk_rows rows or at about this much JSON text, whichever comes first, so
# memory stays bounded whatever the rows' sizes (Parquet and JSON-array rows count rows only).
CHUNK_BYTES = 4 << 20
# The first chunk is smaller, and each next one twice the size up to CHUNK_BYTES, so that tokenizing (the
# stage everything else hides behind) starts early instead of after a whole chunk was read and rendered.
FIRST_CHUNK_BYTES = 256 << 10
MAX_ROW_BYTES = 64 << 20  # input.max_row_bytes's default
FileRow = tuple[int, int, Any, "tuple[str, str, Any] | None", int]  # a Row with its file's index first


@dataclass(frozen=True)
class InputFile:
    index: int
    path: str
    size_bytes: int
    # How it is read (sources.inspect_file): jsonl, json, csv, tsv, txt, parquet, arrow-file, arrow-stream.
    layout: str = "jsonl"
    compression: str | None = None  # gzip, bz2, xz, zstd
    text_key: str = "text"  # .txt rows: the field their text goes in
    text_per_line: bool = False  # .txt: a row per line (else the file is one row)
    hub: str | None = None  # layout "hub": the datasets.load_dataset arguments, as JSON
    encoding: str | None = None  # a text file's encoding when its BOM says UTF-16 or UTF-32 (None: UTF-8)
    text_bytes: int | None = None  # about how much text it holds, decompressed (sources.text_size; progress)
    version: str | None = None  # layout "hub": what names the dataset's version (hub.hub_version)
    # A local file's modification time when the run found it: with size_bytes, the identity every read of it
    # is checked against (check_unchanged), so a file cut or appended to after that is never read as data.
    mtime_ns: int | None = None

    @property
    def weight(self) -> int:
        """What the file counts for in progress and in validate's sample: its text, decompressed, where
        that is known (reading counts the text it reads), else its size."""
        return self.text_bytes or self.size_bytes


@dataclass(frozen=True)
class ReadAs:
    """How a run's inputs are read beyond their names: the format of files whose name does not say (a
    dataset's builder), a DatasetDict folder's split, and where plain text goes."""

    builder: str | None = None
    split: str | None = None
    text_key: str = "text"
    text_per_line: bool = False


@dataclass
class RawChunk:
    """Rows in input order. records[i] is None when the row is already dropped (reason in errors). A
    record is an object, or a non-empty list of objects (a conversation's messages)."""

    file_index: list[int] = field(default_factory=list)
    line: list[int] = field(default_factory=list)
    records: list[dict[str, Any] | None] = field(default_factory=list)
    errors: dict[int, tuple[str, str, Any]] = field(default_factory=dict)  # reason, detail, the row as read
    size: int = 0  # bytes of text its rows were read from (a columnar file's: their share of its bytes)
    skipped: int = 0  # bytes of the rows read past before it (those a resumed run had done): for progress

    def __len__(self) -> int:
        return len(self.records)

    def add(self, file_index: int, line: int, record: Any, error: tuple[str, str, Any] | None = None) -> None:
        if error is None and not (isinstance(record, dict) or is_message_list(record)):
            error = (Drop.NOT_AN_OBJECT, f"a row must be a JSON object, got {type(record).__name__}", record)
        if error is not None:
            self.errors[len(self.records)] = error
            record = None
        self.file_index.append(file_index)
        self.line.append(line)
        self.records.append(record)


def is_message_list(record: Any) -> bool:
    """A row that is a list of objects: a conversation written as its messages alone (multi-dialogue)."""
    return isinstance(record, list) and bool(record) and all(isinstance(m, dict) for m in record)


def _hub_hint(path: str) -> str:
    """For a missing path that reads like a hub dataset id (ORG/NAME, no extension): where such ids go."""
    if path.startswith("hf://datasets/"):  # the repo is what follows datasets/, whatever folder comes after
        parts = path[len("hf://datasets/"):].split("/")
        return f"; no such file or folder in the hub dataset {'/'.join(parts[:2])!r} (or it is not in the cache)"
    parts = Path(path).parts
    if len(parts) < 2 or split_name(path)[0] is not None or glob.has_magic(path):
        return ""
    name = "/".join(parts[-2:])
    return (f"; if {name!r} is a hub dataset, a dataset reads it with `hub: {{name: {name}}}` (or the path "
            f"hf://datasets/{name})")


@dataclass
class LeftOut:
    """What the input folders hold that is not read, by folder: files whose names say no format gpu-prep
    reads, and the splits of a DatasetDict or datasets cache folder besides the one read by default (split
    read, the others)."""

    files: dict[str, list[str]] = field(default_factory=dict)
    splits: dict[str, tuple[str, list[str]]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.files or self.splits)

    def warnings(self) -> list[str]:
        files = [f"input folder {folder!r}: {len(names):,} file(s) in it are not read, their names saying no format "
                 f"gpu-prep reads ({names_of(folder, names)}); {RENAME_FIX}" for folder, names in self.files.items()]
        splits = [f"input folder {folder!r}: read split {read!r}; it also holds {', '.join(map(repr, others))} "
                  "(input.split names another)" for folder, (read, others) in self.splits.items()]
        return files + splits


def expand_inputs(patterns: list[str], how: ReadAs | None = None, first_index: int = 0,
                  left_out: LeftOut | None = None) -> list[InputFile]:
    """Files, globs and folders -> input files in a fixed order (as given; globs and folders sorted), each
    checked to be what its name (or how.builder) says. A save_to_disk or DatasetDict folder is its Arrow
    files. Nothing unknown is taken: a ConfigError names the file and what it holds; so does a file the
    list gives twice. What the folders hold that is not read goes into left_out."""
    how, left_out = how or ReadAs(), left_out if left_out is not None else LeftOut()
    paths: list[tuple[str, str]] = []  # (what was given, a file it gives)
    for pattern in patterns:
        pattern = local_path(pattern)  # file://: read by the local rules (folders, splits, given twice)
        if is_url(pattern):
            if how.split is not None:
                raise ConfigError(_no_split(pattern, how.split, "a URL has"))
            found, unread = remote_files(pattern)
            if unread:
                left_out.files[pattern] = unread
        elif os.path.isdir(pattern):
            found = dataset_folder_files(Path(pattern), how.split)
            if found is None:
                found, unread, inner = folder_files(Path(pattern), how.builder, how.split)
                loose = [f for f in found if not any(Path(f).is_relative_to(d) for d in inner)]
                if how.split is not None and (not inner or loose):  # files beside its datasets folders have none
                    raise ConfigError(_no_split(pattern, how.split, f"{names_of(pattern, loose)} in this folder have"
                                                if inner else "this folder has"))
                if not found:
                    raise ConfigError(_nothing_read(pattern, unread))
                if unread:
                    left_out.files[pattern] = unread
                if how.split is None:  # the default split read from each datasets folder in it
                    left_out.splits.update((where, (chosen, others)) for where, (chosen, others) in inner.items() if others)
            elif how.split is None and len(splits := split_names(Path(pattern))) > 1:  # the default split read
                chosen = default_split(splits)
                left_out.splits[pattern] = (chosen, [s for s in splits if s != chosen])
        elif how.split is not None:
            raise ConfigError(_no_split(pattern, how.split, "a file has"))
        elif glob.has_magic(pattern):
            found = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        else:
            found = [pattern]
        if not found:
            raise ConfigError(f"input {pattern!r}: no such file, or the pattern matches nothing{_hub_hint(pattern)}")
        paths.extend((pattern, path) for path in found)
    _check_given_once(paths)
    files = []
    for _, path in paths:
        if not is_url(path) and not os.path.isfile(path):
            raise ConfigError(f"input {path!r}: no such file{_hub_hint(path)}")
        if not is_url(path) and not os.access(path, os.R_OK):
            raise ConfigError(f"input {path!r}: not readable")
        fmt, compression = split_name(path)
        if how.builder is not None and fmt is None:
            fmt = how.builder
        if fmt is None:
            raise ConfigError(f"input {path!r}: not a format gpu-prep reads by its name (it reads {KNOWN}); "
                              "rename it, or name its format with a dataset's builder")
        # Taken before the file's content is first looked at, so that what inspect_file sees is checked too.
        stat = None if is_url(path) else os.stat(path)
        size = file_size(path) if stat is None else stat.st_size
        layout, encoding = inspect_file(path, fmt, compression)
        files.append(InputFile(first_index + len(files), path, size, layout, compression, how.text_key,
                               how.text_per_line, encoding=encoding, text_bytes=text_size(path, compression, size),
                               mtime_ns=None if stat is None else stat.st_mtime_ns))
    return files


def check_unchanged(file: InputFile) -> None:
    """An InputError when the input is not what the run found at its start (a local file's size and
    modification time, a URL's size, a hub dataset's version): rows read from it would be a mix of two
    versions, or a part of one cut short, and the manifest's checksum would describe neither."""
    if file.layout == "hub":
        check_hub_version(file.path, hub_dataset(orjson.loads(file.hub)), file.version)
        return
    try:
        if file.mtime_ns is None:
            now = (file_size(file.path), None)
        else:
            stat = os.stat(file.path)
            now = (stat.st_size, stat.st_mtime_ns)
    except (OSError, ValueError):
        raise InputError(f"{file.path}: removed since the run started; run again when the inputs are stable") from None
    if now != (file.size_bytes, file.mtime_ns):
        raise InputError(f"{file.path}: changed since the run started ({file.size_bytes:,} bytes then, {now[0]:,} "
                         "now, or modified since); run again on inputs nothing writes to")


DELIMITERS = {"csv": ",", "tsv": "\t"}  # of the CSV and TSV layouts


def folder_files(folder: Path, builder: str | None = None, split: str | None = None
                 ) -> tuple[list[str], list[str], dict[str, tuple[str, list[str]]]]:
    """The files of a folder (and the folders in it) that gpu-prep reads, sorted, and those it leaves out,
    their names saying no format it reads (with a builder, such files are read as its format). Neither
    holds hidden files or those under hidden folders (.ipynb_checkpoints, .git), nor, in a folder the
    datasets library wrote (a dataset_info.json beside the files), its metadata or cache-*.arrow files. A
    folder in it that the datasets library wrote (a DatasetDict, a save_to_disk folder, a cache folder of
    several splits) is read as it is when given itself: one split's Arrow files (split, else train or the
    only one); by such folder, the split read and the others it holds."""
    read, left_out, splits = [], [], {}
    taken: list[Path] = []  # datasets folders read whole, as one split: nothing under them is read again
    for path in sorted(folder.rglob("*")):
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            continue
        if taken and path.is_relative_to(taken[-1]):
            continue
        if path.is_dir():
            found = dataset_folder_files(path, split)
            if found is not None:
                taken.append(path)
                read.extend(found)
                names = split_names(path)
                if names:
                    chosen = split or default_split(names)
                    splits[str(path)] = (chosen, [n for n in names if n != chosen])
            continue
        if not path.is_file():
            continue
        if datasets_own(path.name) and (path.parent / "dataset_info.json").is_file():
            continue
        (read if builder or split_name(str(path))[0] else left_out).append(str(path))
    return sorted(read), sorted(left_out), splits


def _no_split(pattern: str, split: str, which: str) -> str:
    return (f"input {pattern!r}: input.split {split!r} names a split, and {which} none (splits are read from "
            "DatasetDict and datasets cache folders)")


# What to do about files an input folder holds whose names say no format gpu-prep reads.
RENAME_FIX = (f"rename them with their format's extension ({KNOWN}), or read them with a dataset whose builder "
              "names their format")


def names_of(folder: str, paths: list[str], most: int = 5) -> str:
    """The first few of a folder's files, by their names within it."""
    names = [os.path.relpath(p, folder) for p in paths[:most]]
    return ", ".join(names) + (f" and {len(paths) - most:,} more" if len(paths) > most else "")


def _nothing_read(folder: str, left_out: list[str]) -> str:
    if not left_out:
        return f"input {folder!r}: the folder holds no files (hidden ones are not read)"
    return (f"input {folder!r}: the folder holds {len(left_out):,} file(s), none named as a format gpu-prep reads "
            f"({names_of(folder, left_out)}); {RENAME_FIX}")


def _check_given_once(paths: list[tuple[str, str]]) -> None:
    """Refuse a file given twice in one list of inputs (named again, by another spelling, through a link, or
    matched by a glob or folder and named too): its rows would be written twice, or dropped as duplicates the
    second time. Two datasets of a mix may name one file; that is a choice, not a slip."""
    seen: dict[Any, tuple[str, str]] = {}
    for pattern, path in paths:
        try:
            key = path if is_url(path) else os.stat(path)[1:3]  # (inode, device)
        except OSError:
            continue  # missing: refused by name later
        if key in seen:
            raise ConfigError(f"input {_given(*seen[key])} and {_given(pattern, path)} are the same file; it would "
                              "be read twice: give it once (to read a file twice on purpose, name it in two datasets "
                              "of a mix)")
        seen[key] = (pattern, path)


def _given(pattern: str, path: str) -> str:
    """How an input file was given: its name, what found it, and where a link leads."""
    how = repr(path) if pattern == path else f"{path!r} (from {pattern!r})"
    if not is_url(path) and os.path.realpath(path) != os.path.abspath(path):
        how += f" (a link to {os.path.realpath(path)!r})"
    return how


def check_columns(files: list[InputFile], needed: tuple[str | tuple[str, ...], ...]) -> None:
    """A ConfigError, before anything is written, for a Parquet, Arrow, CSV or TSV file that lacks a column
    every row needs (needed: the input type's fields, a tuple where any of its names will do): each of its
    rows would only be dropped as missing_field. It names the file, the columns missing and those the file
    has. Its schema (or header row) alone is read."""
    for file in files:
        if file.layout in ("csv", "tsv") and needed:
            try:
                have = csv_header(file.path, file.compression, DELIMITERS[file.layout], file.encoding)
            except READ_ERRORS:  # an empty file (no rows) or an unreadable one: its reader says so, where it reads it
                continue
        elif file.layout == "parquet" or file.layout.startswith("arrow"):
            have = column_names(file.path, file.layout)
            twice = sorted({name for name in have if have.count(name) > 1})
            if twice:  # a row holds one value per key: the last column of a name would win, unseen
                raise ConfigError(f"input {file.path!r}: its schema names the column {', '.join(map(repr, twice))} more "
                                  "than once; one of them would be lost")
        else:
            continue
        missing = [" or ".join(map(repr, names)) for names in (n if isinstance(n, tuple) else (n,) for n in needed)
                   if not any(name in have for name in names)]
        if missing:
            raise ConfigError(f"input {file.path!r}: no column {', '.join(missing)}, which every row needs; "
                              f"its columns are {', '.join(map(repr, have)) or 'none'}: set the input type or its keys "
                              "(input.*_key) to what the file holds")


REJECT_TEXT_CHARS = 1 << 20  # how much of a malformed line a rejects file keeps


def _parse_line(raw: bytes) -> tuple[Any, tuple[str, str, Any] | None]:
    try:
        return orjson.loads(raw), None
    except orjson.JSONDecodeError as exc:
        text = raw[:REJECT_TEXT_CHARS].decode("utf-8", errors="replace").rstrip("\r\n")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:  # say so plainly: the file may be in another encoding
            # (the row is kept as its bytes: a rejects file gives them back, which text with U+FFFD could not)
            return None, (Drop.MALFORMED_JSON, f"not UTF-8: byte 0x{raw[bad.start]:02x} at column {bad.start + 1} "
                          "(gpu-prep reads UTF-8, or UTF-16/32 with a BOM; convert the file, e.g. with iconv)",
                          raw[:REJECT_TEXT_CHARS].rstrip(b"\r\n"))
        return None, (Drop.MALFORMED_JSON, f"not valid JSON: {exc}{_non_json_number(text, exc.pos)}", text)


def _non_json_number(text: str, pos: int) -> str:
    """What to say where a parse failed at NaN or Infinity (pos: orjson's, in characters), which Python's
    json.dumps writes by default."""
    at = text[max(pos - 1, 0):pos + 9]
    if not any(word in at for word in ("NaN", "Infinity")):
        return ""
    return ("; NaN and Infinity are not JSON (Python's json.dumps writes them unless allow_nan=False): write them "
            "as null or as strings")


def _too_large(line_no: int, size: int, cap: int) -> Row:
    detail = f"the line is {size:,} bytes, over input.max_row_bytes {cap:,}; not parsed"
    return line_no, None, (Drop.TOO_LARGE, detail, None), size


def _exact_rows(lines: Iterator[tuple[int, bytes | int]], cap: int) -> Iterator[Row]:
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
        record, error = _parse_line(raw)
        yield line_no, record, error, len(raw)


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


def _jsonl_rows(file: InputFile, cap: int) -> Iterator[Row]:
    with open_input(file) as handle:
        yield from _exact_rows(_bounded_lines(handle, cap), cap)


# The layouts whose bytes are the text itself (a Parquet or Arrow file's bytes are not: the column's reader names
# a bad string there).
TEXT_LAYOUTS = ("jsonl", "json", "csv", "tsv", "txt")


def _guarded(file: InputFile, rows: Iterator[Row]) -> Iterator[Row]:
    """The rows, until the file cannot be read on: then an InputError naming the file, what stopped it
    and the last row read (its line, array element or row), and never a traceback."""
    last = 0
    try:
        for row in rows:
            last = row[0]
            yield row
    except READ_ERRORS as exc:
        if file.encoding is None and file.layout in TEXT_LAYOUTS and \
                (isinstance(exc, UnicodeDecodeError) or "invalid UTF8" in str(exc)):
            # The decoder reads ahead of the rows (pyarrow's CSV reader a block of them, and says nowhere):
            # the text is read again to name the byte and its line.
            found = first_not_utf8(file.path, file.compression, to_the_end=True)
            if found is not None:
                raise NotUtf8(file.path, file.compression, *found) from None
        what = "decompress" if file.compression is not None and not isinstance(exc, UnicodeError) else "read"
        if what == "decompress" and file.layout in ("csv", "tsv"):  # its reader decompresses a block ahead
            last = lines_before_damage(file.path, file.compression)
        unit = {"json": "element", "parquet": "row", "hub": "row"}.get(file.layout,
                                                                      "row" if file.layout.startswith("arrow") else "line")
        why = ("the dataset cannot be read on (a damaged cache file, or rows of another schema)" if file.layout == "hub"
               else "the file is damaged or cut short")
        raise InputError(f"{file.path}: cannot {what} beyond {unit} {last} ({type(exc).__name__}: {exc}); {why}: rows "
                         "after that one would be lost, so the run stops") from None


# Reading JSON Lines as columns: the GPU backend parses byte ranges with cudf.read_json. Its recovery
# mode is more lenient than a strict JSON parser (raw control characters, trailing content, numbers read
# as text), so a range is handed to it only when a scan of its bytes rules every such case out, and its
# result is taken only when it has one complete row per line; any other range is parsed line by line as
# above. Either way every row is the one the strict parser would give, so output and accounting stay exact.
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
                   first_line: int = 1) -> Iterator[Row]:
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
                columns: dict[str, Any], cap: int) -> Iterator[Row]:
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
        yield line_no, row, None, len(raw)


def file_rows(file: InputFile, columnar: Columnar | None = None, max_row_bytes: int = MAX_ROW_BYTES) -> Iterator[Row]:
    """(line or row number, record, error, bytes of JSON) for every row of one file; an InputError naming
    the file when it cannot be read to its end."""
    if file.layout == "hub":  # checks the version of the dataset it loads
        return _guarded(file, hub_rows(file.path, orjson.loads(file.hub), file.version))
    check_unchanged(file)
    return _guarded(file, _rows_of(file, columnar, max_row_bytes))


def _rows_of(file: InputFile, columnar: Columnar | None, max_row_bytes: int) -> Iterator[Row]:
    layout, encoding = file.layout, file.encoding
    if columnar is not None and columnar.parquet(file):
        return parquet_rows(file.path, columnar.read_groups)
    if layout == "parquet" or layout.startswith("arrow"):
        return batch_rows(file.path, layout)
    if layout in ("csv", "tsv"):
        return csv_rows(file.path, file.compression, DELIMITERS[layout], encoding)
    if layout == "txt":
        return text_rows(file.path, file.compression, file.text_key, file.text_per_line, encoding)
    if layout == "json":
        return json_array_rows(file.path, file.compression, _parse_line, encoding=encoding, cap=max_row_bytes)
    if columnar is not None and columnar.jsonl(file):
        return _columnar_rows(file, columnar, max_row_bytes)  # byte ranges of a local file
    return _jsonl_rows(file, max_row_bytes)


@dataclass(frozen=True)
class Part:
    """A piece of one input file that a worker reads alone: whole lines, bytes [start, end), of an
    uncompressed JSON Lines file; row groups or record batches [start, end) of a Parquet or Arrow file
    (batches); or (end None) the whole file."""

    file: InputFile
    start: int = 0
    end: int | None = None
    batches: bool = False


def split_file(file: InputFile, part_bytes: int) -> list[Part]:
    """The file cut into parts of about part_bytes: uncompressed JSON Lines at lines' ends, Parquet at row
    groups, Arrow IPC files at record batches. Other formats, compressed or UTF-16/32 files and URLs are one
    part each (their byte offsets are not their text's)."""
    if file.size_bytes <= part_bytes or file.compression is not None or file.encoding is not None or is_url(file.path):
        return [Part(file)]
    if file.layout in ("parquet", "arrow-file"):
        cuts, size = [0], 0
        sizes = [size for _, size in batch_sizes(file.path, file.layout)]
        for k, n in enumerate(sizes[:-1], start=1):
            size += n
            if size >= part_bytes:
                cuts.append(k)
                size = 0
        cuts.append(len(sizes))
        return [Part(file, a, b, batches=True) for a, b in zip(cuts, cuts[1:])] if len(cuts) > 2 else [Part(file)]
    if file.layout != "jsonl":
        return [Part(file)]
    cuts = [0]
    with open(file.path, "rb") as handle:
        while cuts[-1] + part_bytes < file.size_bytes:
            handle.seek(cuts[-1] + part_bytes - 1)
            while (rest := handle.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass  # a line longer than the block: read past it
            cuts.append(handle.tell())
    cuts = sorted(set(cuts) | {file.size_bytes})
    return [Part(file, a, b) for a, b in zip(cuts, cuts[1:])]


def read_part(part: Part) -> bytes:
    """A byte-range part's bytes."""
    with open(part.file.path, "rb") as handle:
        handle.seek(part.start)
        return handle.read(part.end - part.start)


def count_lines(data: bytes) -> int:
    """How many lines these bytes hold (what the next part's line numbers start after)."""
    return data.count(b"\n") + (bool(data) and not data.endswith(b"\n"))


def part_rows(part: Part, columnar: Columnar | None = None, max_row_bytes: int = MAX_ROW_BYTES,
              first_line: int = 1, data: bytes | None = None) -> Iterator[Row]:
    """The rows of one part, as file_rows gives them; a byte range's lines are numbered from first_line.
    data: the part's bytes when the caller has read them already."""
    if part.end is None:
        yield from file_rows(part.file, columnar, max_row_bytes)
        return
    check_unchanged(part.file)
    if part.batches and columnar is not None and columnar.parquet(part.file):
        yield from _guarded(part.file, parquet_rows(part.file.path, columnar.read_groups,
                                                    part.start, part.end, first_line))
    elif part.batches:
        yield from _guarded(part.file, batch_rows(part.file.path, part.file.layout, part.start, part.end, first_line))
    elif columnar is not None and columnar.jsonl(part.file):
        yield from _columnar_rows(part.file, columnar, max_row_bytes, part, first_line)
    else:
        lines = _bounded_lines(io.BytesIO(read_part(part) if data is None else data), max_row_bytes, first_line)
        yield from _exact_rows(lines, max_row_bytes)


def sample_shares(files: list[InputFile], rows: int) -> list[int]:
    """How many of its first rows each file gives a sample of `rows` rows (or one a file, where there are
    more files): a few each (three where the sample allows, at least one), so that the sample reaches every
    input, and the rest shared by size (largest remainders), so that it weighs each about as the run will."""
    sizes = [max(f.weight, 1) for f in files]
    floor = max(1, min(3, rows // max(len(files), 1)))
    rest, total = max(rows - floor * len(files), 0), sum(sizes)
    exact = [rest * size / total for size in sizes]
    shares = [floor + int(e) for e in exact]
    for k in sorted(range(len(files)), key=lambda k: int(exact[k]) - exact[k])[:rest - sum(map(int, exact))]:
        shares[k] += 1
    return shares


def first_rows(files: list[InputFile], shares: list[int], columnar: Columnar | None = None,
               max_row_bytes: int = MAX_ROW_BYTES) -> Iterator[FileRow]:
    """The first rows of each file, as many as its share (sample_shares), in order."""
    for file, share in zip(files, shares):
        yield from ((file.index, *row) for row in itertools.islice(file_rows(file, columnar, max_row_bytes), share))


def read_chunks(files: list[InputFile], chunk_rows: int, max_items: int | None = None,
                chunk_bytes: int = CHUNK_BYTES, columnar: Columnar | None = None, skip: int = 0,
                max_row_bytes: int = MAX_ROW_BYTES,
                rows: Iterator[FileRow] | None = None) -> Iterator[RawChunk]:
    """Every row of every file, in order, in chunks of at most chunk_rows rows (or about chunk_bytes of
    JSON); stops after max_items rows. With `columnar`, JSON Lines files are read as columns. The first
    `skip` rows are read past (a resumed run has done them). `rows`: (file index, line, record, error,
    bytes) to chunk instead of the files' rows in order (several datasets mixed)."""
    if rows is None:
        rows = ((file.index, *row) for file in files for row in file_rows(file, columnar, max_row_bytes))
    chunk = RawChunk()
    seen = size = 0
    limit = min(chunk_bytes, FIRST_CHUNK_BYTES)
    for file_index, line, record, error, nbytes in rows:
        if max_items is not None and seen >= max_items:
            break
        seen += 1
        if seen <= skip:
            chunk.skipped += nbytes
            continue
        chunk.add(file_index, line, record, error)
        size += nbytes
        chunk.size = size
        if len(chunk) >= chunk_rows or size >= limit:
            yield chunk
            chunk, size, limit = RawChunk(), 0, min(chunk_bytes, 2 * limit)
    if len(chunk):
        yield chunk
