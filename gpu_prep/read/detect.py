"""What an input file is, checked against its content, and the readers of the formats beyond JSON Lines.

A file's layout comes from its extension (or, for a file without a known one, a dataset's `builder`) and
is then checked against its first bytes: a Parquet file starts with PAR1, an Arrow IPC file with ARROW1
and an Arrow stream with its continuation marker, a compressed file with its codec's magic, and text
formats must be text. An unknown extension or content that is not what the name says stops the run
before anything is written, naming the file and what was found: nothing is ever read as JSON Lines by
default.

Formats: JSON Lines, JSON arrays (streamed element by element, so memory stays bounded on a multi-GB
array), Parquet, Arrow IPC (file and stream, as the HF datasets cache and save_to_disk write them),
Feather, CSV and TSV (a header row names the columns; every cell is read as text), plain text (a document
per file, or per line with input.text_rows "line"); the text formats also gzip-, bz2-, xz- or
zstd-compressed, decompressed as they are read. A `save_to_disk` folder (state.json + .arrow files) is its
Arrow files in order; a DatasetDict folder (dataset_dict.json) is one split's (input.split).

Text is UTF-8 unless a byte order mark says UTF-16 or UTF-32 (LE or BE); such a file is converted to UTF-8
as it is read, so every reader sees UTF-8. The file's first bytes decide: a NUL byte (with no such BOM)
means binary data, and refuses the file before anything is written, naming the byte. Bytes that are not
UTF-8 refuse a CSV, TSV, plain text or JSON array file the same way (its reader could not go past them),
wherever they are in an uncompressed local file, whose whole text is checked (1 to 3 ms a MB); a compressed
file or a URL, which that would read twice, is stopped where its reader meets them, naming the same byte and
line. In JSON Lines they are their line's problem alone: that row is dropped as malformed_json. A Parquet or Arrow file whose footer cannot be read (a truncated
copy) is refused the same way.
"""

from __future__ import annotations

import json

from gpu_prep.errors import ConfigError, InputError
from gpu_prep.read.columnar import _source
from gpu_prep.read.files import HEAD_BYTES, NOT_UTF8_FIX, READ_ERRORS, _MAGIC, is_url, open_bytes, open_raw
from gpu_prep.read.json_array import json_array_rows
from gpu_prep.read.text_checks import NotUtf8, bom_encoding, first_not_utf8, line_at, not_utf8, text_problem


def _what(head: bytes) -> str:
    """What some first bytes look like, for an error message."""
    if head.startswith(b"PAR1"):
        return "Parquet"
    if head.startswith(b"ARROW1"):
        return "an Arrow IPC file"
    if head.startswith(b"\xff\xff\xff\xff"):
        return "an Arrow IPC stream"
    if head.startswith(b"FEA1"):  # pyarrow.feather.write_feather(..., version=1)
        return ("Feather version 1, which gpu-prep does not read (write it again as version 2: "
                "pyarrow.feather.write_feather(pyarrow.feather.read_table(path), new_path))")
    for codec, magic in _MAGIC.items():
        if head.startswith(magic):
            return f"{codec}-compressed data"
    if b"\x00" in head:
        return "binary data"
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    return f"text starting {text[:40]!r}" if text else "an empty file"


def inspect_file(path: str, layout: str, compression: str | None) -> tuple[str, str | None]:
    """(layout, encoding) of a file whose first bytes agree with its format: "arrow" files are "arrow-file"
    or "arrow-stream", and a text file's encoding is its BOM's (None: UTF-8). A ConfigError naming the file
    and what was found when they do not: another layout, binary data, text not in UTF-8, or (Parquet and
    Arrow) a footer or schema that cannot be read, as in a truncated copy. Reads the first HEAD_BYTES only,
    but for the whole text of an uncompressed local CSV, TSV, plain text or JSON array file (_not_utf8_past_head)."""
    with open_raw(path) as handle:
        raw = handle.read(64)
    if compression is not None and raw and not raw.startswith(_MAGIC[compression]):
        raise ConfigError(f"input {path!r}: named as {compression}-compressed, but it holds {_what(raw)}")
    try:
        with open_bytes(path, compression) as handle:
            raw = handle.read(HEAD_BYTES)
    except READ_ERRORS as exc:
        if compression is None:
            raise
        raise ConfigError(f"input {path!r}: cannot decompress it as {compression}: {exc}") from None
    if layout == "parquet":
        if not raw.startswith(b"PAR1"):
            raise ConfigError(f"input {path!r}: named as Parquet, but it holds {_what(raw)}")
        return _readable(path, layout), None
    if layout in ("arrow", "feather"):
        if raw.startswith(b"ARROW1"):
            return _readable(path, "arrow-file"), None
        if raw.startswith(b"\xff\xff\xff\xff") and layout == "arrow":
            return _readable(path, "arrow-stream"), None
        raise ConfigError(f"input {path!r}: named as {'Arrow' if layout == 'arrow' else 'Feather'}, but it holds {_what(raw)}")
    if raw.startswith((b"PAR1", b"ARROW1", b"\xff\xff\xff\xff", *_MAGIC.values())):
        raise ConfigError(f"input {path!r}: named as {layout.upper()} text, but it holds {_what(raw)}")
    encoding = bom_encoding(raw)
    text = ""
    if layout in ("jsonl", "json"):
        text = raw.decode(encoding or "utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    lines_are_rows = layout == "jsonl" or (layout == "json" and text.startswith("{"))
    problem, head = text_problem(raw, encoding, lines_are_rows)
    if not problem and not lines_are_rows and encoding is None and len(raw) == HEAD_BYTES:
        problem = _not_utf8_past_head(path, compression, array=layout == "json" and text.startswith("["))
    if problem:
        raise ConfigError(f"input {path!r}: named as {layout.upper()} text, but it holds {problem}")
    if layout in ("jsonl", "json"):
        if text and text[0] not in "{[" and not (layout == "jsonl" and _json_line(text)):
            # (a JSON Lines file whose first line is JSON all the same, a number or a string, has that row
            # dropped as not_an_object like any other line)
            raise ConfigError(f"input {path!r}: named as {'JSON Lines' if layout == 'jsonl' else 'JSON'}, but it holds "
                              f"{_what(head)}; name its format with a dataset's builder, or give it the extension of "
                              "what it is")
        if layout == "json" and text.startswith("{"):  # one object per line, named .json; or one object over many
            if text.partition("\n")[0].strip() == "{":  # as json.dumps(indent=...), jq and JSON.stringify write it
                raise ConfigError(f"input {path!r}: holds one JSON object written over many lines, neither JSON Lines "
                                  "(an object a line) nor an array of rows; where its rows are a field's list "
                                  "({\"data\": [...]}), write them out as JSON Lines (jq -c '.data[]' FILE > rows.jsonl)")
            return "jsonl", encoding
        if layout == "jsonl" and text.split("\n", 1)[0].strip() == "[":
            raise ConfigError(f"input {path!r}: named as JSON Lines, but it holds a JSON array written over many "
                              "lines (its first line is '['); name it .json to read its elements as rows")
    return layout, encoding


def _not_utf8_past_head(path: str, compression: str | None, array: bool) -> str:
    """What text_problem says of bytes that are not UTF-8 beyond a CSV, TSV, plain text or JSON array file's
    head, so that they too stop the run before anything is written: the whole text of an uncompressed local
    file is checked (1 to 3 ms a MB of text with letters beyond ASCII, 0.2 ms of ASCII: 1 to 2% of a run;
    benchmarks/RESULTS.md). Not a compressed file or a URL, which that would read twice (decompressing
    costs 4 to 6 ms a MB with gzip, 13 with xz, 40 with bz2): their readers stop where they meet such
    bytes (NotUtf8). In a JSON array, the elements are found up to the byte (not parsed), to name the one
    it is in."""
    if compression is not None or is_url(path):
        return ""
    found = first_not_utf8(path, compression, to_the_end=not array)
    if found is None:
        return ""
    byte, offset = found
    index = None
    if array:
        try:
            for _ in json_array_rows(path, compression, lambda raw, index, size: None):
                pass
        except NotUtf8 as exc:
            index = exc.index
        except InputError:  # an element before the byte breaks the array: the run would stop there anyway
            pass
    return f"{not_utf8(byte, offset, line_at(path, compression, offset), index)}; {NOT_UTF8_FIX}"


def _json_line(text: str) -> bool:
    """Whether the first line of the text (when whole in it) is a JSON value."""
    line, _, rest = text.partition("\n")
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return bool(rest)


def _readable(path: str, layout: str) -> str:
    """The layout, once the file's footer (Parquet, Arrow IPC file) or schema (Arrow stream) is read; a
    ConfigError naming the file when it cannot be, as when the file was cut short."""
    try:
        column_names(path, layout)
    except (OSError, ValueError, EOFError) as exc:
        name = "a Parquet" if layout == "parquet" else "an Arrow IPC"
        raise ConfigError(f"input {path!r}: {name} file that cannot be read, truncated or damaged ({exc})") from None
    return layout


def column_names(path: str, layout: str) -> list[str]:
    """The columns of a Parquet or Arrow file, from its footer or schema alone (no rows are read)."""
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    if layout == "parquet":
        if not is_url(path):
            return pq.read_schema(path).names
        with open_raw(path) as handle:
            return pq.read_schema(handle).names
    with _source(path) as source:
        reader = ipc.open_stream(source) if layout == "arrow-stream" else ipc.open_file(source)
        return reader.schema.names


# ---------------------------------------------------------------- folders written by datasets
