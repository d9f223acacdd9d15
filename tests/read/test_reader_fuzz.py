"""The reader and the row builders never raise on what they are fed: random bytes, random JSON values and
random chat-shaped rows each become a row or a named drop. Reading as columns (the GPU backend's path)
gives the strict parser's rows on the same soup. Whether a file is JSON Lines at all is checked before it
is read (sources.inspect_file): on random bytes that check takes the file or refuses it with a ConfigError,
nothing else; the reader is fed the bytes directly."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpu_prep.config import parse_config
from gpu_prep.errors import Drop
from gpu_prep.format import RowError, get_builder
from gpu_prep.errors import ConfigError
from gpu_prep.read.inputs import InputFile
from gpu_prep.read.jsonl import Columnar, as_read
from gpu_prep.read.rows import read_chunks
from gpu_prep.read.detect import inspect_file
from test_columnar_read import lenient_read_range

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# JSON as it is written: no NaN or Infinity (not JSON), integers within 64 bits (the parser's range; a
# larger one makes the row malformed_json, with the parser's own message).
JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


def _read(data: bytes, columnar: Columnar | None = None, chunk_rows: int = 3, whole: bool = False) -> list[tuple]:
    """(line, error, the row as the strict parser reads it); whole: the record itself in its place (a chat
    row read as columns must be the whole row)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.jsonl"
        path.write_bytes(data)
        rows = []
        files = [InputFile(0, str(path), len(data))]  # read as JSON Lines whatever the content check says
        for chunk in read_chunks(files, chunk_rows, columnar=columnar, max_row_bytes=300):
            for i, record in enumerate(chunk.records):
                assert (record is None) == (i in chunk.errors)
                dropped = chunk.errors.get(i)  # as (reason, detail, the row as read)
                rows.append((chunk.line[i], dropped and (*dropped.why, dropped.record),
                             dict(record) if whole and record is not None
                             else as_read(record)))
        return rows


@FUZZ
@given(st.binary(max_size=3000), st.sampled_from(["jsonl", "json", "csv", "txt", "parquet", "arrow"]))
def test_the_content_check_takes_or_refuses_random_bytes(data: bytes, layout: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"fuzz.{layout}"
        path.write_bytes(data)
        try:
            inspect_file(str(path), layout, None)
        except ConfigError as exc:
            assert str(path) in str(exc)


@FUZZ
@given(st.binary(max_size=3000))
def test_random_bytes_become_rows_or_named_drops(data: bytes) -> None:
    rows = _read(data)
    lines = data.split(b"\n")
    numbers = [n for n, _, _ in rows]
    assert numbers == sorted(set(numbers)) and all(1 <= n <= len(lines) for n in numbers)
    # A row is a line with something on it once a leading BOM is gone, or one too large to look at (its line
    # end, LF or CRLF, not counted).
    unbommed = [line[3:] if k == 0 and line.startswith(b"\xef\xbb\xbf") else line for k, line in enumerate(lines)]
    sizes = [len(raw.removesuffix(b"\r")) if k < len(lines) - 1 else len(raw) for k, raw in enumerate(lines)]
    assert len(rows) == sum(1 for line, size in zip(unbommed, sizes) if line.strip() or size > 300)
    known = {Drop.MALFORMED_JSON, Drop.NOT_AN_OBJECT, Drop.TOO_LARGE}
    assert all(error is None or error[0] in known for _, error, _ in rows)


@FUZZ
@given(st.lists(JSON, max_size=12))
def test_random_json_values_are_read_as_written(values: list[Any]) -> None:
    data = b"\n".join(json.dumps(v).encode() for v in values)
    rows = _read(data)
    big = [len(json.dumps(v)) > 300 for v in values]
    assert len(rows) == len(values)
    for (line, error, record), value, too_large in zip(rows, values, big):
        if too_large:
            assert error[0] == Drop.TOO_LARGE
        elif isinstance(value, dict) or (isinstance(value, list) and value and all(isinstance(v, dict) for v in value)):
            assert error is None and record == value
        else:
            assert error[0] == Drop.NOT_AN_OBJECT


MESSAGE = st.dictionaries(st.sampled_from(["role", "content", "tool_calls", "name"]),
                          st.sampled_from(["user", "assistant", "system", "tool", ""]) | JSON, max_size=4)
ROW = st.dictionaries(st.sampled_from(["messages", "text", "prompt", "response", "source"]),
                      st.lists(MESSAGE | JSON, max_size=4) | JSON, max_size=4)


@FUZZ
@given(ROW, st.sampled_from(["chat", "instruction", "text"]))
@example({"text": ""}, "text")
def test_builders_raise_only_named_row_errors(row: dict[str, Any], kind: str) -> None:
    config = parse_config({"input": {"type": kind}})
    try:
        get_builder(kind)(row, config)
    except RowError as err:
        # bad data, or a text row with nothing in it: shorter than any min_chars, a filtered row (--strict goes on)
        assert err.reason in Drop.BAD_DATA or (err.reason == Drop.TOO_SHORT and "is empty" in err.detail), err
        assert err.detail


@FUZZ
@given(st.lists(st.sampled_from([
    b'{"text": "clean row", "source": "s"}', b'{"text": "another \\u00e9 row", "source": "t"}',
    b'{"text": 5, "source": "s"}', b'{"text": "x"} trailing', b'{"text": "nan", "n": NaN, "source": "s"}',
    b'{"text": "bad \xff", "source": "s"}', b'{"text": "ctl \x01", "source": "s"}', b"", b"[1]", b"{",
    b'{"source": "s"}', b'{"text": "dup", "text": "key", "source": "s"}', b'{"text": "\\ud800", "source": "s"}',
    b'{"text": "x", "source": "s"}}', b'{"text": "x", "source": "s"},{}', b'{"text": "}{ NaN", "source": "s"}',
]), max_size=40), st.integers(1, 400))
def test_columns_equal_the_strict_parser_on_any_mix(lines: list[bytes], range_bytes: int) -> None:
    import gpu_prep.read.jsonl as read

    data = b"\n".join(lines)
    saved, read.RANGE_BYTES = read.RANGE_BYTES, range_bytes
    try:
        columnar = _read(data, Columnar(("text", "source"), lenient_read_range))
    finally:
        read.RANGE_BYTES = saved
    assert columnar == _read(data)


# Chat-shaped rows: messages with the keys read and others, values of every JSON type, escapes that end in
# a backslash or a quote before a colon; written with and without ASCII escapes and spaces.
_MESSAGE = st.dictionaries(st.sampled_from(["role", "content", "name", "messages"]),
                           st.text(alphabet='ab\\":{} é', max_size=6) | JSON, max_size=3)
_CHAT_ROW = st.dictionaries(st.sampled_from(["messages", "id", "content"]),
                            st.lists(_MESSAGE | JSON, max_size=3) | JSON, min_size=1, max_size=2)


@FUZZ
@given(st.lists(st.tuples(_CHAT_ROW, st.booleans(), st.sampled_from([(", ", ": "), (",", ":"), (" , ", " : ")])),
                max_size=12), st.integers(1, 400))
def test_chat_columns_equal_the_strict_parser_on_any_mix(rows: list[tuple[Any, bool, tuple[str, str]]],
                                                         range_bytes: int) -> None:
    import gpu_prep.read.jsonl as read

    data = b"\n".join(json.dumps(row, ensure_ascii=ascii, separators=seps).encode() for row, ascii, seps in rows)
    saved, read.RANGE_BYTES = read.RANGE_BYTES, range_bytes
    try:
        columnar = _read(data, Columnar((), lenient_read_range, ("messages", "role", "content")), whole=True)
    finally:
        read.RANGE_BYTES = saved
    assert columnar == _read(data, whole=True)
