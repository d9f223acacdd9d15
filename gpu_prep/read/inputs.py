"""read/inputs: input files -> bounded chunks of raw rows, each keeping its (file, line).

Which layout a file is, checked against its content, is detect.py's; each layout's reader is one module
listed in rows.py's READERS. A JSON Lines line that is not valid JSON, or not an object, becomes a row that carries
its drop reason, so it is counted and never takes its neighbours with it. Blank lines are not rows. Rows
of the columnar formats are numbered from 1 in the file, CSV rows by their line (the header is line 1).

A file that cannot be read on (a damaged compressed stream, a Parquet page or Arrow batch that cannot be
decoded, text that is not in its encoding) stops the run with an InputError naming the file and the last
row read: the rows before it were read, the rest would be lost without a word.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gpu_prep.errors import ConfigError, Drop, Dropped, InputError
from gpu_prep.read.delimited import csv_header
from gpu_prep.read.hub import check_hub_version, hub_dataset
from gpu_prep.read.detect import column_names, inspect_file
from gpu_prep.read.files import (KNOWN, READ_ERRORS, datasets_own, file_size, is_url, local_path, remote_files,
                                 split_name, text_size)
from gpu_prep.read.folders import dataset_folder_files, default_split, split_names
from gpu_prep.read.row import DroppedRow, ReadRow

# A JSON Lines chunk closes at chunk_rows rows or at about this much JSON text, whichever comes first, so
# memory stays bounded whatever the rows' sizes (Parquet and JSON-array rows count rows only).
CHUNK_BYTES = 4 << 20
# The first chunk is smaller, and each next one twice the size up to CHUNK_BYTES, so that tokenizing (the
# stage everything else hides behind) starts early instead of after a whole chunk was read and rendered.
FIRST_CHUNK_BYTES = 256 << 10
MAX_ROW_BYTES = 64 << 20  # input.max_row_bytes's default


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
    """Rows in input order. records[i] is None when the row is already dropped (errors[i] says why). A
    record is an object, or a non-empty list of objects (a conversation's messages)."""

    file_index: list[int] = field(default_factory=list)
    line: list[int] = field(default_factory=list)
    records: list[dict[str, Any] | None] = field(default_factory=list)
    errors: dict[int, DroppedRow] = field(default_factory=dict)  # the rows dropped as they were read, by place
    size: int = 0  # bytes of text its rows were read from (a columnar file's: their share of its bytes)
    skipped: int = 0  # bytes of the rows read past before it (those a resumed run had done): for progress

    def __len__(self) -> int:
        return len(self.records)

    def add(self, file_index: int, row: ReadRow) -> None:
        record, dropped, as_read = row.record, row.dropped, row.as_read
        if dropped is None and not (isinstance(record, dict) or is_message_list(record)):
            dropped = Dropped(Drop.NOT_AN_OBJECT, f"a row must be a JSON object, got {type(record).__name__}")
            as_read = record
        if dropped is not None:
            self.errors[len(self.records)] = DroppedRow(len(self.records), dropped, as_read)
            record = None
        self.file_index.append(file_index)
        self.line.append(row.line)
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
        found = _pattern_files(pattern, how, left_out)
        if not found:
            raise ConfigError(f"input {pattern!r}: no such file, or the pattern matches nothing{_hub_hint(pattern)}")
        paths.extend((pattern, path) for path in found)
    _check_given_once(paths)
    files: list[InputFile] = []
    for _, path in paths:
        files.append(_input_file(first_index + len(files), path, how))
    return files


def _pattern_files(pattern: str, how: ReadAs, left_out: LeftOut) -> list[str]:
    """The files one input gives (a URL, a folder, a glob or a file), noting in left_out what its folders
    hold that is not read."""
    if is_url(pattern):
        if how.split is not None:
            raise ConfigError(_no_split(pattern, how.split, "a URL has"))
        found, unread = remote_files(pattern)
        if unread:
            left_out.files[pattern] = unread
        return found
    if os.path.isdir(pattern):
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
        return found
    if how.split is not None:
        raise ConfigError(_no_split(pattern, how.split, "a file has"))
    if glob.has_magic(pattern):
        return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    return [pattern]


def _input_file(index: int, path: str, how: ReadAs) -> InputFile:
    """The input file at path, checked to be there, readable and of a format its name (or how.builder) says
    and its content agrees with."""
    if not is_url(path) and not os.path.isfile(path):
        raise ConfigError(f"input {path!r}: no such file{_hub_hint(path)}")
    if not is_url(path) and not os.access(path, os.R_OK):
        raise ConfigError(f"input {path!r}: not readable")
    layout, compression = split_name(path)
    if how.builder is not None and layout is None:
        layout = how.builder
    if layout is None:
        raise ConfigError(f"input {path!r}: not a format gpu-prep reads by its name (it reads {KNOWN}); "
                          "rename it, or name its format with a dataset's builder")
    # Taken before the file's content is first looked at, so that what inspect_file sees is checked too.
    stat = None if is_url(path) else os.stat(path)
    size = file_size(path) if stat is None else stat.st_size
    layout, encoding = inspect_file(path, layout, compression)
    return InputFile(index, path, size, layout, compression, how.text_key, how.text_per_line, encoding=encoding,
                     text_bytes=text_size(path, compression, size), mtime_ns=None if stat is None else stat.st_mtime_ns)


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
    their names saying no layout it reads (with a builder, such files are read as its layout). Neither
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


@dataclass(frozen=True)
class Part:
    """A piece of one input file that a worker reads alone: whole lines, bytes [start, end), of an
    uncompressed JSON Lines file; row groups or record batches [start, end) of a Parquet or Arrow file
    (batches); or (end None) the whole file."""

    file: InputFile
    start: int = 0
    end: int | None = None
    batches: bool = False


def read_part(part: Part) -> bytes:
    """A byte-range part's bytes."""
    with open(part.file.path, "rb") as handle:
        handle.seek(part.start)
        return handle.read(part.end - part.start)
