"""Parquet and Arrow IPC files (file and stream, Feather): rows a record batch at a time, row groups read by
cuDF where they hold text (the GPU backend), and where a row number lies (locator)."""


from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpu_prep.backend import ReadGroups
from gpu_prep.errors import Drop, Dropped, InputError
from gpu_prep.read.files import BATCH_ROWS, file_size, is_url, open_raw
from gpu_prep.read.row import ReadRow


def locator(path: str, layout: str, number: int, batches: dict[str, list[int]]) -> str:
    """Where row `number` (as the reader numbers it, from 1) is, in the terms of its format: a line; an
    array's index, a hub dataset's row, a row group and row (Parquet), a record batch and row (Arrow), all
    counted from 0 as Python and pyarrow index them. batches caches each file's batch sizes."""
    if layout in ("parquet", "arrow-file", "arrow-stream"):
        sizes = batches.setdefault(path, [rows for rows, _ in batch_sizes(path, layout)])
        row = number - 1
        for k, size in enumerate(sizes):
            if row < size:
                return f"{'row group' if layout == 'parquet' else 'record batch'} {k}, row {row}"
            row -= size
    if layout == "json":
        return f"array index {number - 1}"
    if layout == "hub":
        return f"row {number - 1}"
    return f"line {number}"


def _source(path: str) -> Any:
    """A pyarrow source over the file: memory-mapped when local, streamed through fsspec for a URL."""
    import pyarrow as pa

    return pa.PythonFile(open_raw(path), mode="r") if is_url(path) else pa.memory_map(path)


def _batches(path: str, layout: str, start: int = 0, stop: int | None = None) -> Iterator[Any]:
    """The record batches of a Parquet file's row groups [start, stop), or of an Arrow IPC file's batches
    [start, stop) (an Arrow stream: all of them)."""
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    if layout == "parquet":
        parquet = pq.ParquetFile(open_raw(path) if is_url(path) else path)
        for group in range(start, parquet.metadata.num_row_groups if stop is None else stop):
            with _reading_group(path, group):
                yield from parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=[group])
        return
    with _source(path) as source:
        if layout == "arrow-stream":
            yield from ipc.open_stream(source)
            return
        reader = ipc.open_file(source)
        for k in range(start, reader.num_record_batches if stop is None else stop):
            yield reader.get_batch(k)


@contextmanager
def _reading_group(path: str, group: int) -> Iterator[None]:
    """Reading one Parquet row group: what pyarrow raises stops the run naming the file and the group.
    Row groups are read one at a time, as pq.read_table reads them: given several at once, pyarrow cannot
    read a nested column whose dictionary changes between groups (a list of structs with a dictionary
    field, as Polars and pandas write categoricals: "Nested data conversions not implemented for chunked
    array outputs")."""
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError) as exc:  # OSError: pyarrow's for a damaged page
        raise InputError(f"{path}: cannot read row group {group} ({type(exc).__name__}: {str(exc).strip()}); the "
                         "file is damaged or holds what pyarrow cannot read: its rows from that group on would be "
                         "lost, so the run stops") from None


def batch_rows(path: str, layout: str, start: int = 0, stop: int | None = None, first: int = 1) -> Iterator[ReadRow]:
    """The rows of Parquet row groups or Arrow record batches [start, stop) (all by default), numbered
    from first."""
    rows = 0 if layout == "arrow-stream" else sum(n for n, _ in batch_sizes(path, layout))  # unknown before read
    row, share = first - 1, _byte_share(file_size(path), rows)
    for batch in _batches(path, layout, start, stop):
        for record, dropped in batch_records(batch):
            row += 1
            yield _numbered(row, record, dropped, share(row))


def _numbered(n: int, record: dict[str, Any], dropped: Dropped | None, nbytes: int) -> ReadRow:
    """Row n: its record, or where it is dropped, why (the record kept as read)."""
    return ReadRow(n, record, nbytes) if dropped is None else ReadRow(n, None, nbytes, dropped, record)


def batch_records(batch: Any) -> Iterator[tuple[dict[str, Any], Dropped | None]]:
    """A record batch's rows as dicts, each with None or why it is dropped: a row with a string that is not
    UTF-8 (pyarrow writes such strings without checking them) is, naming the column and the byte, whatever
    column it is: one bad cell stopped the whole run. Such a row keeps the cell with U+FFFD for the bad bytes
    (what the rejects file shows)."""
    import pyarrow as pa

    try:
        yield from ((record, None) for record in batch.to_pylist())
        return
    except UnicodeDecodeError:
        pass
    for k in range(batch.num_rows):
        record, bad = {}, None
        for name, column in zip(batch.schema.names, batch.columns):
            try:
                record[name] = column[k].as_py()
            except UnicodeDecodeError as exc:
                plain = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                record[name] = column[k].cast(pa.binary()).as_py().decode("utf-8", errors="replace") if plain else None
                bad = bad or (name, exc)
        if bad is None:
            yield record, None
        else:
            name, exc = bad
            yield record, Dropped(Drop.MALFORMED_ROW, f"column {name!r} holds text that is not UTF-8: byte "
                                                      f"0x{exc.object[exc.start]:02x} at offset {exc.start} of a value")


def _byte_share(size: int, rows: int) -> Any:
    """Row n's share (from 1) of a columnar file's `size` bytes over its `rows` rows, the shares summing to
    its size: what a chunk's size and the run's progress count for it (0 where its rows are not known)."""
    return lambda n: n * size // rows - (n - 1) * size // rows if rows else 0


def _holds_text(kind: Any) -> bool:
    """Whether a Parquet column of this Arrow type is one the device decodes: strings, or lists and structs
    with strings in them (of strings, booleans, integers and doubles only)."""
    import pyarrow as pa

    def leaves(kind: Any) -> list[Any]:  # [None] where a leaf is of another type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return leaves(kind.value_type)
        if pa.types.is_struct(kind):
            return [leaf for i in range(kind.num_fields) for leaf in leaves(kind.field(i).type)] or [None]
        plain = (pa.types.is_string, pa.types.is_large_string, pa.types.is_boolean, pa.types.is_integer,
                 pa.types.is_float64)
        return [kind if any(is_kind(kind) for is_kind in plain) else None]

    found = leaves(kind)
    return None not in found and any(pa.types.is_string(k) or pa.types.is_large_string(k) for k in found)


def _same_shape(got: Any, want: Any) -> bool:
    """Whether a column decoded as `got` is one of the file's type `want` up to what cuDF changes in it:
    large strings for strings, list element names, and the null type for what holds nulls alone. (A cast
    alone would not do: it fills a struct's missing or renamed fields with nulls.)"""
    import pyarrow as pa

    types = pa.types
    if types.is_null(got):
        return True
    if types.is_list(want) or types.is_large_list(want):
        return (types.is_list(got) or types.is_large_list(got)) and _same_shape(got.value_type, want.value_type)
    if types.is_struct(want):
        return types.is_struct(got) and [f.name for f in got] == [f.name for f in want] and \
            all(_same_shape(g.type, w.type) for g, w in zip(got, want))
    if types.is_string(want) or types.is_large_string(want):
        return types.is_string(got) or types.is_large_string(got)
    return got == want


def parquet_rows(path: str, read_groups: ReadGroups, start: int = 0, stop: int | None = None,
                 first: int = 1) -> Iterator[ReadRow]:
    """The rows of a local Parquet file's row groups [start, stop), as batch_rows gives them, with the
    columns that hold text decoded by read_groups (cuDF on the GPU backend) and the others by pyarrow. A row
    group read_groups cannot read, or reads into other rows or types than the file's, is read by pyarrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    schema, meta = parquet.schema_arrow, parquet.metadata
    device = [f.name for f in schema if _holds_text(f.type)]
    if not device or len(set(schema.names)) != len(schema.names):
        yield from batch_rows(path, "parquet", start, stop, first)
        return
    host = [name for name in schema.names if name not in device]
    target = pa.schema([schema.field(name) for name in device])
    row, share = first - 1, _byte_share(file_size(path), meta.num_rows)
    for group in range(start, meta.num_row_groups if stop is None else stop):
        with _reading_group(path, group):
            table = _as_decoded(read_groups(path, [group], device), target, meta.row_group(group).num_rows)
            if table is None:
                batches = parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=[group])
            else:
                rest = parquet.read_row_group(group, columns=host)
                columns = [table.column(name) if name in target.names else rest.column(name) for name in schema.names]
                batches = pa.Table.from_arrays(columns, schema=schema).to_batches(max_chunksize=BATCH_ROWS)
            for batch in batches:
                for record, dropped in batch_records(batch):
                    row += 1
                    yield _numbered(row, record, dropped, share(row))


def _as_decoded(table: Any, target: Any, rows: int) -> Any:
    """The device's table of a row group in the file's own types (target), or None where it is not one
    (other rows, columns or types) or cannot be cast back."""
    import pyarrow as pa

    if table is None or table.num_rows != rows or table.column_names != target.names or \
            not all(_same_shape(got.type, want.type) for got, want in zip(table.schema, target)):
        return None
    try:  # cuDF gives large strings, and the null type for children that hold nulls alone
        return table.cast(target)
    except (pa.ArrowException, ValueError, TypeError):
        return None


def batch_sizes(path: str, layout: str) -> list[tuple[int, int]]:
    """(rows, bytes) of each Parquet row group (bytes uncompressed) or Arrow record batch, in order."""
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    if layout == "parquet":
        meta = pq.ParquetFile(open_raw(path) if is_url(path) else path).metadata
        return [(meta.row_group(i).num_rows, meta.row_group(i).total_byte_size) for i in range(meta.num_row_groups)]
    with _source(path) as source:
        if layout == "arrow-stream":
            return [(b.num_rows, b.nbytes) for b in ipc.open_stream(source)]
        reader = ipc.open_file(source)
        return [(batch.num_rows, batch.nbytes) for batch in map(reader.get_batch, range(reader.num_record_batches))]
