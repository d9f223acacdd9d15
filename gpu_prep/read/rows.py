"""Every layout's rows through one table (READERS), each file held to the identity the run found it with and
guarded so that a file that cannot be read on stops the run naming it; files cut into parts a worker reads
alone; the first rows of every input (validate's sample); and the rows in bounded chunks (read_chunks)."""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Iterator

import orjson

from gpu_prep.errors import InputError
from gpu_prep.read.delimited import csv_rows
from gpu_prep.read.hub import hub_rows
from gpu_prep.read.columnar import batch_rows, batch_sizes, parquet_rows
from gpu_prep.read.files import READ_ERRORS, is_url
from gpu_prep.read.json_array import json_array_rows
from gpu_prep.read.row import FileRow, ReadRow
from gpu_prep.read.text import text_rows
from gpu_prep.read.text_checks import NotUtf8, first_not_utf8, lines_before_damage


from gpu_prep.read.inputs import (CHUNK_BYTES, DELIMITERS, FIRST_CHUNK_BYTES, MAX_ROW_BYTES, InputFile, Part,
                                  RawChunk, check_unchanged, read_part)
from gpu_prep.read.jsonl import Columnar, _bounded_lines, _columnar_rows, _exact_rows, _jsonl_rows, _parse_line

TEXT_LAYOUTS = ("jsonl", "json", "csv", "tsv", "txt")


def _guarded(file: InputFile, rows: Iterator[ReadRow]) -> Iterator[ReadRow]:
    """The rows, until the file cannot be read on: then an InputError naming the file, what stopped it
    and the last row read (its line, array element or row), and never a traceback."""
    last = 0
    try:
        for row in rows:
            last = row.line
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


def file_rows(file: InputFile, columnar: Columnar | None = None, max_row_bytes: int = MAX_ROW_BYTES
              ) -> Iterator[ReadRow]:
    """Every row of one file; an InputError naming the file when it cannot be read to its end."""
    if file.layout == "hub":  # checks the version of the dataset it loads
        return _guarded(file, hub_rows(file.path, orjson.loads(file.hub), file.version))
    check_unchanged(file)
    return _guarded(file, _rows_of(file, columnar, max_row_bytes))


# How each layout's rows are read: a reader takes the file, the columnar reader (the GPU backend's, or None)
# and input.max_row_bytes. A new file kind is a module of its own and a line here (and its extension in
# files.EXTENSIONS).
Reader = Callable[[InputFile, "Columnar | None", int], Iterator[ReadRow]]


def _parquet_or_arrow(file: InputFile, columnar: Columnar | None, cap: int) -> Iterator[ReadRow]:
    if columnar is not None and columnar.parquet(file):  # the row groups that hold text, by cuDF
        return parquet_rows(file.path, columnar.read_groups)
    return batch_rows(file.path, file.layout)


def _jsonl(file: InputFile, columnar: Columnar | None, cap: int) -> Iterator[ReadRow]:
    if columnar is not None and columnar.jsonl(file):
        return _columnar_rows(file, columnar, cap)  # byte ranges of a local file
    return _jsonl_rows(file, cap)


READERS: dict[str, Reader] = {
    "jsonl": _jsonl,
    "json": lambda f, _, cap: json_array_rows(f.path, f.compression, _parse_line, encoding=f.encoding, cap=cap),
    "csv": lambda f, _, cap: csv_rows(f.path, f.compression, DELIMITERS["csv"], f.encoding),
    "tsv": lambda f, _, cap: csv_rows(f.path, f.compression, DELIMITERS["tsv"], f.encoding),
    "txt": lambda f, _, cap: text_rows(f.path, f.compression, f.text_key, f.text_per_line, f.encoding),
    "parquet": _parquet_or_arrow,
    "arrow-file": _parquet_or_arrow,
    "arrow-stream": _parquet_or_arrow,
}


def _rows_of(file: InputFile, columnar: Columnar | None, max_row_bytes: int) -> Iterator[ReadRow]:
    return READERS[file.layout](file, columnar, max_row_bytes)


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


def count_lines(data: bytes) -> int:
    """How many lines these bytes hold (what the next part's line numbers start after)."""
    return data.count(b"\n") + (bool(data) and not data.endswith(b"\n"))


def part_rows(part: Part, columnar: Columnar | None = None, max_row_bytes: int = MAX_ROW_BYTES,
              first_line: int = 1, data: bytes | None = None) -> Iterator[ReadRow]:
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
        rows = itertools.islice(file_rows(file, columnar, max_row_bytes), share)
        yield from (FileRow(file.index, row) for row in rows)


def read_chunks(files: list[InputFile], chunk_rows: int, max_items: int | None = None,
                chunk_bytes: int = CHUNK_BYTES, columnar: Columnar | None = None, skip: int = 0,
                max_row_bytes: int = MAX_ROW_BYTES,
                rows: Iterator[FileRow] | None = None) -> Iterator[RawChunk]:
    """Every row of every file, in order, in chunks of at most chunk_rows rows (or about chunk_bytes of
    JSON); stops after max_items rows. With `columnar`, JSON Lines files are read as columns. The first
    `skip` rows are read past (a resumed run has done them). `rows`: the rows to chunk instead of the files'
    rows in order (several datasets mixed)."""
    if rows is None:
        rows = (FileRow(file.index, row) for file in files for row in file_rows(file, columnar, max_row_bytes))
    chunk = RawChunk()
    seen = size = 0
    limit = min(chunk_bytes, FIRST_CHUNK_BYTES)
    for file_index, row in rows:
        if max_items is not None and seen >= max_items:
            break
        seen += 1
        if seen <= skip:
            chunk.skipped += row.nbytes
            continue
        chunk.add(file_index, row)
        size += row.nbytes
        chunk.size = size
        if len(chunk) >= chunk_rows or size >= limit:
            yield chunk
            chunk, size, limit = RawChunk(), 0, min(chunk_bytes, 2 * limit)
    if len(chunk):
        yield chunk
