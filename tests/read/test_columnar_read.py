"""Reading JSON Lines as columns (the GPU backend's cudf.read_json) gives exactly the strict parser's rows.

cuDF is not here, so its place is taken by `lenient_read_range`, which keeps the contract read/jsonl.py relies
on (the rows that start in a byte range, the asked-for fields, an all-null row for a line it cannot read)
and is at least as lenient as cuDF's recovery mode: it accepts raw control characters, NaN, trailing
content and invalid UTF-8, and reads numbers, lists and objects in a string field as their JSON text. If
the byte scan in read/jsonl.py let any such line through, the rows below would differ from the strict parser's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from gpu_prep.read import jsonl as read
from gpu_prep.backend import Backend
from gpu_prep.config import parse_config
from gpu_prep.pipeline import Options, run
from gpu_prep.read.inputs import expand_inputs
from gpu_prep.read.jsonl import Columnar, ColumnarRecord, as_read
from gpu_prep.read.rows import file_rows, read_chunks
from helpers import write_jsonl

FIELDS = ("text", "source")


def _as_text(value: Any) -> str | None:
    if isinstance(value, str):  # a lone surrogate becomes "?" (a string column holds UTF-8)
        return value.encode("utf-8", "replace").decode("utf-8")
    return None if value is None else json.dumps(value)


def _as_column(value: Any, kind: Any) -> Any:
    if kind == "str":
        return _as_text(value)
    if not isinstance(value, list):  # a list of objects: each object's fields as strings, other keys pruned
        return None
    return [{k: _as_text(m.get(k)) for k in kind} if isinstance(m, dict) else None for m in value]


def lenient_read_range(path: str, offset: int, size: int, columns: dict[str, Any]) -> pa.Table:
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(size)
    rows = []
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            value, _ = json.JSONDecoder(strict=False).raw_decode(raw.decode("utf-8", errors="replace").strip())
        except (ValueError, RecursionError):
            value = None
        rows.append({f: _as_column(value.get(f), kind) if isinstance(value, dict) else None
                     for f, kind in columns.items()})
    return pa.Table.from_pylist(rows, schema=_schema(columns))


def _schema(columns: dict[str, Any]) -> pa.Schema:
    """The Arrow schema cuDF gives the columns asked for."""
    return pa.schema([(name, pa.string() if kind == "str" else pa.list_(pa.struct([(k, pa.string()) for k in kind])))
                      for name, kind in columns.items()])


def _clean(n: int) -> list[bytes]:
    return [json.dumps({"text": f"row {i}: plain text, é and 日本 included, the words NaN and Infinity",
                        "source": f"s{i % 3}", "extra": [i]}, ensure_ascii=False).encode() for i in range(n)]


# Lines a strict parser rejects or reads differently from a lenient one, each among clean rows.
TRAPS = [
    b'{"text": "a misspelled literal", "source": "a", "ok": tru}',
    b'{"text": "a leading zero", "source": "a", "n": 012}',
    b'{"text": "a trailing comma", "source": "a",}',
    b'{"text": "an unknown escape \\x41", "source": "a"}',
    b'{"text": "a missing comma" "source": "a"}',
    b'{"text": "raw\ttab inside a string", "source": "a"}',
    b'{"text": "raw \x01 control character", "source": "a"}',
    b'{"text": "a number follows", "source": "a", "n": NaN}',
    b'{"text": "minus infinity in a list", "source": "a", "n": [1,-Infinity]}',
    b'{"text": "trailing content", "source": "a"} x',
    b'{"text": "two objects", "source": "a"} {"other": "on one line"}',
    b'{"text": "a brace too many", "source": "a"}}',
    b'{"text": "an empty object after", "source": "a"},{}',
    b'{"text": "a field spelled with escapes", "source": "a", "te\\u0078t": 5}',
    b'{"text": "a number past a double in a field not read", "source": "a", "n": 1e400}',
    b'{"text": "nested past the parser\'s depth", "source": "a", "n": ' + b"[" * 1100 + b"]" * 1100 + b"}",
    b'{"text": "invalid \xff utf-8", "source": "a"}',
    b'{"text": "lone surrogate \\ud800", "source": "a"}',
    b'{"text": 12345, "source": "a"}',
    b'{"text": ["a", "list"], "source": "a"}',
    b'{"text": {"an": "object"}, "source": "a"}',
    b'{"text": null, "source": "a"}',
    b'{"text": "domain is a number", "source": 7}',
    b'{"text": "domain is true", "source": true}',
    b'{"text": "missing domain"}',
    b'{"source": "missing text"}',
    b'{"text": "first", "text": 5, "source": "duplicate key, the last wins"}',
    b'{"text": "unterminated',
    b'[1, 2, 3]',
    b'"a string row"',
    b'   ',
    b'',
]


# Lines with JSON's other whitespace between tokens (CRLF line ends, tabs): read as columns (cuDF's
# tokenizer takes tabs and carriage returns as whitespace), as the strict parser reads them.
WHITESPACE = [
    b'{"text":\t"tab as whitespace",\t"source": "a"}',
    b'{"text": "a CRLF line", "source": "a"}\r',
    b'\t{ "text" :\r\t"tabs and returns around every token" , "source" : "a" }\r',
]


def test_tabs_and_carriage_returns_between_tokens_are_read_as_columns() -> None:
    columnar = Columnar(FIELDS, lenient_read_range)
    clean = b"\n".join(_clean(3)) + b"\n"
    for line in WHITESPACE:
        assert columnar.safe(clean + line + b"\n" + clean, 7), line
    assert not columnar.safe(clean + b'{"text": "a tab\tinside", "source": "a"}\r\n', 4)
    assert not columnar.safe(clean + b'{"text": "x", "source": "a"}\x0c\n', 4)  # form feed: not JSON's


def _corpus(tmp_path: Path) -> Path:
    pair = b'{"text": "an emoji as an escaped pair: \\ud83d\\ude00", "source": "a"}'  # read as columns
    lines = [b"\xef\xbb\xbf" + _clean(1)[0]] + _clean(40) + [pair] + WHITESPACE
    for k, trap in enumerate(TRAPS):
        lines += [trap] + _clean(3 + k % 4)
    lines += _clean(40)
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines))  # no newline after the last line
    return path


def _rows(path: Path, columnar: Columnar | None) -> list[tuple]:
    files = expand_inputs([str(path)])
    out = []
    for chunk in read_chunks(files, 7, columnar=columnar):
        for i, record in enumerate(chunk.records):
            projected = None if record is None else {f: record.get(f) for f in FIELDS}
            out.append((chunk.line[i], chunk.errors.get(i), projected, as_read(record),
                        isinstance(record, ColumnarRecord)))
    return out


@pytest.mark.parametrize("range_bytes", [1, 300, 2000, 1 << 20])
def test_columnar_rows_are_the_strict_parsers_rows(tmp_path: Path, monkeypatch: Any, range_bytes: int) -> None:
    path = _corpus(tmp_path)
    monkeypatch.setattr(read, "RANGE_BYTES", range_bytes)
    exact = _rows(path, None)
    columnar = _rows(path, Columnar(FIELDS, lenient_read_range))
    assert [r[:4] for r in columnar] == [r[:4] for r in exact]
    taken = sum(r[4] for r in columnar)
    if range_bytes < 1 << 20:  # small ranges: the clean ones are read as columns, the others line by line
        assert 0 < taken < len(exact)
    else:  # one range holding every trap: all of it line by line
        assert taken == 0


def test_a_clean_file_is_read_wholly_as_columns(tmp_path: Path) -> None:
    path = tmp_path / "clean.jsonl"
    path.write_bytes(b"\n".join(_clean(500)) + b"\n")
    rows = _rows(path, Columnar(FIELDS, lenient_read_range))
    assert all(r[4] for r in rows) and [r[0] for r in rows] == list(range(1, 501))
    assert rows == [(*r[:4], True) for r in _rows(path, None)]


@pytest.mark.parametrize("trap", [t for t in TRAPS if t.strip()])
def test_the_byte_scan_refuses_each_trap(trap: bytes) -> None:
    clean = b"\n".join(_clean(3)) + b"\n"
    columnar = Columnar(FIELDS, lenient_read_range)
    assert columnar.safe(clean, 3)
    data = clean + trap + b"\n"
    rows = 3 + bool(trap.strip())
    # Refused by the scan, or (a missing field, an all-null row) by the check of what the parser returned.
    refused = not columnar.safe(data, rows)
    missing = any(v is None for r in lenient_read_range_bytes(data).to_pylist() for v in r.values())
    assert refused or missing, trap


def lenient_read_range_bytes(data: bytes) -> pa.Table:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".jsonl") as handle:
        handle.write(data)
        handle.flush()
        return lenient_read_range(handle.name, 0, len(data), dict.fromkeys(FIELDS, "str"))


def test_a_run_reading_columns_writes_what_the_exact_reader_writes(tmp_path: Path, monkeypatch: Any,
                                                                   fast_tokenizer: Any) -> None:
    path = _corpus(tmp_path)
    extra = write_jsonl(tmp_path / "b.jsonl", [{"text": f"document {i} " * 5, "source": "b"} for i in range(50)])
    monkeypatch.setattr(read, "RANGE_BYTES", 300)
    results = {}
    for reader in ("exact", "cudf"):
        if reader == "cudf":
            monkeypatch.setattr(Backend, "json_range_reader", lambda self: lenient_read_range)
        config = parse_config({"input": {"type": "text"}, "gpu": {"reader": reader},
                               "preprocessing": {"min_chars": 10}, "output": {"domain_key": "source"}})
        manifest = run(config, [str(path), str(extra)], tmp_path / reader, Options(rejects=tmp_path / f"{reader}.rejects.jsonl"))
        shards = {d: [s["sha256"] for s in m["shards"]] for d, m in manifest["domains"].items()}
        results[reader] = (shards, manifest["totals"], (tmp_path / f"{reader}.rejects.jsonl").read_bytes())
    assert results["cudf"] == results["exact"]
    assert results["exact"][1]["rows_dropped"]["malformed_json"] >= 5


# Chat rows read as columns: the messages as a list of {role, content} objects. Such a row is taken only
# where the bytes hold no key beyond the ones read, so that the record is the whole row; each line below is
# one the count of keys or the byte scan must send to the strict parser (or read exactly as it does).
CHAT = {"messages": {"role": "str", "content": "str"}}
CHAT_TRAPS = [
    b'{"id": 7, "messages": [{"role": "user", "content": "an extra top-level key"}]}',
    b'{"messages": [{"role": "user", "content": "an extra message key", "name": "ann"}]}',
    b'{"messages": [{"role": "user", "content": "tools beside"}], "tools": [{"name": "f"}]}',
    b'{"messages": [{"content": "keys in the other order", "role": "user"}]}',
    b'{"messages": [{"role": "user", "content": ["a", "list"]}]}',
    b'{"messages": [{"role": "user", "content": {"type": "text"}}]}',
    b'{"messages": [{"role": "user", "content": 5}]}',
    b'{"messages": [{"role": null, "content": "role is null"}]}',
    b'{"messages": [{"role": "user"}]}',
    b'{"messages": ["a string message"]}',
    b'{"messages": [null]}',
    b'{"messages": "[{\\"role\\": \\"user\\", \\"content\\": \\"JSON text\\"}]"}',
    b'{"messages": null}',
    b'{"messages": []}',
    b'{"messages": {"role": "user", "content": "an object, not a list"}}',
    b'{"messages": [{"role": "user", "content": "json inside: {\\"key\\": \\"value\\", \\"n\\": 1}"}]}',
    b'{"messages": [{"role": "user", "content": "ends in a backslash \\\\"}]}',
    b'{"messages": [{"role": "user", "content": "x"}], "odd\\\\": 1}',
    b'{"messages": [{"role": "user", "content": "a \\\\\\": b"}]}',
    b'{"messages": [{"role": "user", "role": "assistant", "content": "duplicate role"}]}',
    b'{"messages": [{"role": "user", "content": "a"}], "messages": [{"role": "user", "content": "b"}]}',
    b'{"messages" : [{"role" : "user" , "content" : "spaces around colons"}]}',
    b'{"m\\u0065ssages": [{"role": "user", "content": "an escaped key"}]}',
    b'{"messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "second"}]} x',
    b'{"messages": [{"role": "user", "content": "a brace too many"}]}}',
    b'{"messages": [{"role": "user", "content": "an object after"}]},{"y": 1}',
    b'{"messages": [{"role": "user", "content": "a bracket after"}]} ]}',
    b'{"messages": [{"role": "user", "content": "braces }{ and NaN, Infinity inside text are text"}]}',
    b'{"messages": [{"role": "user", "content": "raw \x01 control"}]}',
    b'{"messages": [{"role": "user", "content": "lone \\ud800 surrogate"}]}',
    b'{"messages": [{"role": "user", "content": "unterminated"}',
]


def _clean_chats(n: int, start: int = 0) -> list[bytes]:
    return [json.dumps({"messages": [{"role": "user", "content": f"question {i}: é, 日本 and a \"quote\""},
                                     {"role": "assistant", "content": f"answer {i}\nwith a newline"}]},
                       ensure_ascii=False).encode() for i in range(start, start + n)]


def _chat_corpus(tmp_path: Path) -> Path:
    lines = _clean_chats(30)
    for k, trap in enumerate(CHAT_TRAPS):
        lines += [trap] + _clean_chats(2 + k % 3, 100 * (k + 1))
    path = tmp_path / "chat.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _chat_rows(path: Path, columnar: Columnar | None) -> list[tuple]:
    files = expand_inputs([str(path)])
    return [(chunk.line[i], chunk.errors.get(i), as_read(record), None if record is None else record.get("messages"),
             isinstance(record, ColumnarRecord))
            for chunk in read_chunks(files, 5, columnar=columnar) for i, record in enumerate(chunk.records)]


@pytest.mark.parametrize("range_bytes", [1, 150, 700, 1 << 20])
def test_chat_rows_read_as_columns_are_the_strict_parsers_rows(tmp_path: Path, monkeypatch: Any,
                                                               range_bytes: int) -> None:
    path = _chat_corpus(tmp_path)
    monkeypatch.setattr(read, "RANGE_BYTES", range_bytes)
    exact = _chat_rows(path, None)
    columnar = _chat_rows(path, Columnar((), lenient_read_range, ("messages", "role", "content")))
    assert [r[:4] for r in columnar] == [r[:4] for r in exact]
    taken = [r[2] for r in columnar if r[4]]
    if range_bytes < 1 << 20:
        assert 0 < len(taken) < len(exact)
    if range_bytes == 1:  # a range a line: the rows whose bytes prove them whole, JSON inside a string or not
        assert {"messages": [{"role": "user", "content": 'json inside: {"key": "value", "n": 1}'}]} in taken
    if range_bytes == 1 << 20:  # one range holding every trap: all of it line by line
        assert not taken


def test_a_clean_chat_file_is_read_wholly_as_columns_with_its_domain(tmp_path: Path) -> None:
    lines = [json.dumps({"messages": json.loads(raw)["messages"], "source": f"s{i % 2}"}).encode()
             for i, raw in enumerate(_clean_chats(200))]
    path = tmp_path / "clean.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    columnar = Columnar(("source",), lenient_read_range, ("messages", "role", "content"))
    rows = _chat_rows(path, columnar)
    assert all(r[4] for r in rows) and rows == [(*r[:4], True) for r in _chat_rows(path, None)]
    # The same rows with one more key each: never read as columns, since the record would lack that key.
    path.write_bytes(b"\n".join(raw[:-1] + b', "id": 1}' for raw in lines) + b"\n")
    assert not any(r[4] for r in _chat_rows(path, columnar))


@pytest.mark.parametrize("trap", CHAT_TRAPS)
def test_the_chat_checks_refuse_what_the_columns_would_not_hold(trap: bytes) -> None:
    # Each trap that the strict parser reads differently from the columns (or cannot read) is refused by
    # the byte scan or by the check of what the columnar parser returned.
    columnar = Columnar((), lenient_read_range, ("messages", "role", "content"))
    data = b"\n".join(_clean_chats(2)) + b"\n"
    assert columnar.safe(data, 2) and columnar.complete(columnar.scan(data, 2), 2, _lenient(data))
    data += trap + b"\n"
    skeleton = columnar.scan(data, 3)
    taken = skeleton is not None and columnar.complete(skeleton, 3, _lenient(data))
    try:
        strict = orjson_row(trap)
    except ValueError:
        strict = None
    assert not taken or strict == {"messages": _lenient(data).to_pylist()[-1]["messages"]}, trap


def orjson_row(raw: bytes) -> Any:
    import orjson

    return orjson.loads(raw)


def _lenient(data: bytes) -> pa.Table:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".jsonl") as handle:
        handle.write(data)
        handle.flush()
        return lenient_read_range(handle.name, 0, len(data), CHAT)


@pytest.mark.parametrize("kind", ["chat", "sharegpt"])
def test_a_chat_run_reading_columns_writes_what_the_exact_reader_writes(tmp_path: Path, monkeypatch: Any,
                                                                        fast_tokenizer: Any, kind: str) -> None:
    path = _chat_corpus(tmp_path)
    if kind == "sharegpt":  # the same rows under ShareGPT's keys and role names
        data = path.read_bytes().replace(b'"messages"', b'"conversations"').replace(b'"role"', b'"from"')
        data = data.replace(b'"content"', b'"value"').replace(b'"user"', b'"human"').replace(b'"assistant"', b'"gpt"')
        path.write_bytes(data)
    monkeypatch.setattr(read, "RANGE_BYTES", 400)
    results, taken = {}, {}
    original = Backend.json_range_reader
    for reader in ("exact", "cudf"):
        calls: list[int] = []

        def counting(path: str, offset: int, size: int, columns: dict[str, Any]) -> pa.Table:
            calls.append(size)
            return lenient_read_range(path, offset, size, columns)

        monkeypatch.setattr(Backend, "json_range_reader", lambda self: counting)
        config = parse_config({"input": {"type": kind}, "gpu": {"reader": reader}, "mask": {"assistant": "train"},
                               "preprocessing": {"min_chars": 1}})
        rejects = tmp_path / f"{reader}.rejects.jsonl"
        manifest = run(config, [str(path)], tmp_path / reader, Options(rejects=rejects))
        shards = {d: [s["sha256"] for s in m["shards"]] for d, m in manifest["domains"].items()}
        results[reader] = (shards, manifest["totals"], rejects.read_bytes())
        taken[reader] = len(calls)
    monkeypatch.setattr(Backend, "json_range_reader", original)
    assert results["cudf"] == results["exact"]
    assert taken["exact"] == 0 and taken["cudf"] > 0
    assert results["exact"][1]["rows_dropped"]["malformed_json"] >= 3


def test_which_runs_read_columns(monkeypatch: Any) -> None:
    # Columns where gpu.reader is cudf (the default) on a backend that reads them (the GPU backend with
    # cuDF), the CPU backend never; only where every dataset's rows are built from the same fields, and no data handler
    # reads rows whole.
    from gpu_prep.run.context import columnar_reader

    cpu = Backend("cpu", np)
    asked = parse_config({"gpu": {"reader": "cudf"}})
    assert parse_config({}).gpu.reader == "cudf" and columnar_reader(asked, cpu) is None
    monkeypatch.setattr(Backend, "json_range_reader", lambda self: lenient_read_range)

    def reader(config: dict[str, Any]) -> tuple | None:
        found = columnar_reader(parse_config({"gpu": {"reader": "cudf"}, **config}), cpu)
        return None if found is None else (found.fields, found.messages)

    assert reader({"input": {"type": "text"}, "output": {"domain_key": "source"}}) == (("text", "source"), None)
    assert reader({"input": {"type": "instruction"}}) == (("prompt", "response"), None)
    assert reader({"input": {"type": "chat"}}) == ((), ("messages", "role", "content"))
    assert reader({"input": {"type": "sharegpt"}}) == ((), ("conversations", "from", "value"))
    assert reader({"input": {"type": "chat", "messages_key": "turns"}}) == ((), ("turns", "role", "content"))
    assert reader({"input": {"type": "chat"}, "gpu": {"reader": "exact"}}) is None
    assert columnar_reader(parse_config({"input": {"type": "chat"}}), cpu) is not None  # the default
    for other in ("auto", "preference", "tokens"):
        assert reader({"input": {"type": other}}) is None
    chat = {"name": "a", "data_paths": ["a.jsonl"]}
    assert reader({"input": {"type": "chat"}, "datasets": [chat, {**chat, "name": "b"}]}) is not None
    text = {**chat, "name": "b", "input": {"type": "text"}}
    assert reader({"input": {"type": "chat"}, "datasets": [chat, text]}) is None
    handled = {**chat, "name": "b", "data_handlers": [{"name": "rename_columns", "arguments": {
        "fn_kwargs": {"column_mapping": {"turns": "messages"}}}}]}
    assert reader({"input": {"type": "chat"}, "datasets": [chat, handled]}) is None


def _range_reader_of_cudf(path: str, offset: int, size: int, columns: dict[str, Any]) -> pa.Table:
    """The stand-in, with cuDF's answer for a range that holds no row: a table without columns."""
    table = lenient_read_range(path, offset, size, columns)
    return table if table.num_rows else pa.table({})


@pytest.mark.parametrize("content", [b"\n", b"   \n\n", None])
def test_ranges_without_rows_are_no_rows(tmp_path: Path, monkeypatch: Any, content: bytes | None) -> None:
    # A file of blank lines, and chats whose last range holds only blank lines, read as the strict parser does.
    path = tmp_path / "chat.jsonl"
    path.write_bytes(content if content is not None else b"\n".join(_clean_chats(3)) + b"\n" + b" " * 600 + b"\n\n")
    monkeypatch.setattr(read, "RANGE_BYTES", 500)
    columnar = Columnar((), _range_reader_of_cudf, ("messages", "role", "content"))
    assert _chat_rows(path, columnar) == [(*r[:4], r[2] is not None) for r in _chat_rows(path, None)]


def test_lines_over_the_cap_are_dropped_as_the_strict_reader_drops_them_and_never_held(tmp_path: Path) -> None:
    import tracemalloc

    path = tmp_path / "long.jsonl"
    clean = b"\n".join(_clean(5)) + b"\n"
    path.write_bytes(clean + b'{"text": "' + b"x" * (24 << 20) + b'", "source": "a"}\n' + b" " * 3000 + b"\n" + clean)
    columnar = Columnar(FIELDS, lenient_read_range)
    files = expand_inputs([str(path)])
    exact = [(c.line, c.errors) for c in read_chunks(files, 4, max_row_bytes=2000)]
    tracemalloc.start()
    columns = [(c.line, c.errors) for c in read_chunks(files, 4, columnar=columnar, max_row_bytes=2000)]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert columns == exact
    assert sum(str(e).count("too_large") for _, errors in exact for e in errors.values()) == 2
    assert peak < 8 << 20, peak  # the 24 MiB line is read past in blocks


@pytest.mark.parametrize("end", [b"\n", b"\r\n"])
def test_ranges_after_a_line_over_the_cap_still_start_at_a_line(tmp_path: Path, monkeypatch: Any, end: bytes) -> None:
    # A line over the cap is said by its size without its line end; the ranges after it count the bytes it
    # took, or each began a byte early (two with CRLF), was incomplete, and the rest of the file was read
    # line by line: the rows the same, the device unused.
    monkeypatch.setattr(read, "RANGE_BYTES", 4096)
    path = tmp_path / "rows.jsonl"
    data = b"".join(json.dumps({"text": "x" * 300 if i in (1, 2, 3) else f"row {i}", "source": "s"}).encode() + end
                    for i in range(400))
    path.write_bytes(data)
    starts = []

    def reading(path: str, offset: int, size: int, columns: dict[str, Any]) -> pa.Table:
        starts.append(offset == 0 or data[offset - 1:offset] == b"\n")
        return lenient_read_range(path, offset, size, columns)

    (file,) = expand_inputs([str(path)])
    rows = list(file_rows(file, Columnar(FIELDS, reading), 200))
    exact = file_rows(file, None, 200)
    assert [(r.line, r.dropped, r.as_read) for r in rows] == [(r.line, r.dropped, r.as_read) for r in exact]
    assert starts and all(starts)
    assert sum(isinstance(r.record, ColumnarRecord) for r in rows) > 300


def test_a_plugin_builder_for_a_built_in_type_gets_rows_whole(monkeypatch: Any) -> None:
    # A plugin that registers its own "text" builder may read any field: such rows are never read as columns.
    import gpu_prep.format
    from gpu_prep.run.context import columnar_reader

    monkeypatch.setattr(Backend, "json_range_reader", lambda self: lenient_read_range)
    config = parse_config({"input": {"type": "text"}})
    assert columnar_reader(config, Backend("cpu", np)) is not None
    monkeypatch.setattr(gpu_prep.format.registry, "_BUILDERS", dict(gpu_prep.format.registry._BUILDERS))
    gpu_prep.format.register("text")(lambda record, config: gpu_prep.format.get_builder("instruction")(record, config))
    assert columnar_reader(config, Backend("cpu", np)) is None


# Parquet on the GPU backend: the columns that hold text are decoded by cuDF (read_groups), the others by
# pyarrow, and the rows are pyarrow's. The stand-in answers as cuDF's to_arrow does, with large strings.
def _large_strings(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_string(kind):
        return pa.large_string()
    if pa.types.is_list(kind):
        return pa.list_(_large_strings(kind.value_type))
    if pa.types.is_struct(kind):
        return pa.struct([(kind.field(i).name, _large_strings(kind.field(i).type)) for i in range(kind.num_fields)])
    return kind


def _groups_like_cudf(asked: list[tuple[int, ...]]) -> Any:
    import pyarrow.parquet as pq

    def read_groups(path: str, groups: list[int], columns: list[str]) -> pa.Table:
        asked.append((*groups, *columns))
        table = pq.ParquetFile(path).read_row_groups(groups, columns=columns, use_pandas_metadata=False)
        return table.cast(pa.schema([(f.name, _large_strings(f.type)) for f in table.schema]))
    return read_groups


def _mixed_parquet(path: Path, rows: int = 300, group_rows: int = 70) -> Path:
    import pyarrow.parquet as pq

    records = [{"id": i, "text": None if i % 17 == 0 else f"row {i}: é, 日本",
                "messages": None if i % 23 == 0 else [{"role": "user", "content": f"q{i}", "turn": 1},
                                                      None if i % 29 == 0 else {"role": "assistant", "turn": 2,
                                                                                "content": None if i % 7 == 0 else f"a{i}"}],
                "tags": [f"t{i % 3}"] * (i % 4), "blob": bytes([i % 256]) * 3, "score": i / 7,
                "kind": f"k{i % 2}"} for i in range(rows)]
    table = pa.Table.from_pylist(records)
    table = table.set_column(table.schema.get_field_index("kind"), "kind", table.column("kind").dictionary_encode())
    pq.write_table(table, path, row_group_size=group_rows)
    return path


def _in_order(rows: Any) -> list[str]:
    """Rows compared with their keys' order (a rejects file writes them so)."""
    return [repr(row) for row in rows]


def test_parquet_text_columns_read_on_the_device_give_pyarrows_rows(tmp_path: Path) -> None:
    from gpu_prep.read.columnar import batch_rows, parquet_rows

    path = _mixed_parquet(tmp_path / "mixed.parquet")
    asked: list[tuple[int, ...]] = []
    got = list(parquet_rows(str(path), _groups_like_cudf(asked)))
    assert _in_order(got) == _in_order(batch_rows(str(path), "parquet"))
    assert [list(r[1]) for r in got[:1]] == [["id", "text", "messages", "tags", "blob", "score", "kind"]]
    # Each of the 5 row groups once, for the columns with strings in them (not the dictionary, bytes, numbers).
    assert asked == [(g, "text", "messages", "tags") for g in range(5)]
    # Row groups [2, 4) as a cluster's part reads them, numbered on from its first row.
    assert _in_order(parquet_rows(str(path), _groups_like_cudf([]), 2, 4, 141)) == \
        _in_order(batch_rows(str(path), "parquet", 2, 4, 141))


@pytest.mark.parametrize("answer", ["none", "short", "renamed", "reordered", "retyped", "child renamed",
                                    "child dropped"])
def test_a_row_group_the_device_reads_otherwise_is_read_by_pyarrow(tmp_path: Path, answer: str) -> None:
    from gpu_prep.read.columnar import batch_rows, parquet_rows

    path = _mixed_parquet(tmp_path / "mixed.parquet")
    cudf_like = _groups_like_cudf([])

    def odd(path: str, groups: list[int], columns: list[str]) -> pa.Table | None:
        table = cudf_like(path, groups, columns)
        if groups != [1]:
            return table
        messages = table.column("messages")
        return {"none": None, "short": table.slice(1),
                "renamed": table.rename_columns(["text", "messages", "labels"]),
                "reordered": table.set_column(1, "messages", messages.cast(pa.list_(pa.struct(
                    [("content", pa.string()), ("role", pa.string()), ("turn", pa.int64())])))),
                "retyped": table.set_column(1, "messages", pa.array([None] * len(table), pa.list_(pa.string()))),
                # A cast alone would fill a struct's missing or renamed field with nulls.
                "child renamed": table.set_column(1, "messages", messages.cast(pa.list_(pa.struct(
                    [("role", pa.string()), ("Content", pa.string()), ("turn", pa.int64())])))),
                "child dropped": table.set_column(1, "messages", messages.cast(pa.list_(pa.struct(
                    [("role", pa.string()), ("turn", pa.int64())]))))}[answer]

    assert _in_order(parquet_rows(str(path), odd)) == _in_order(batch_rows(str(path), "parquet"))


def test_a_gpu_run_reads_parquet_text_on_the_device_and_writes_what_pyarrow_gives(tmp_path: Path, monkeypatch: Any,
                                                                                 fast_tokenizer: Any) -> None:
    # The whole run, chat rows from Parquet with a column of another type beside: the same shards, totals
    # and rejects with the device's reader as with pyarrow's, and the device asked for every row group.
    path = _mixed_parquet(tmp_path / "chat.parquet")
    asked: list[tuple[int, ...]] = []
    config = parse_config({"input": {"type": "chat"}, "mask": {"assistant": "train"},
                           "preprocessing": {"min_chars": 1}})
    results = {}
    for reader in ("pyarrow", "device"):
        if reader == "device":
            monkeypatch.setattr(Backend, "parquet_reader", lambda self: _groups_like_cudf(asked))
        manifest = run(config, [str(path)], tmp_path / reader, Options(rejects=tmp_path / f"{reader}.rejects.jsonl"))
        shards = {d: [s["sha256"] for s in m["shards"]] for d, m in manifest["domains"].items()}
        results[reader] = (shards, manifest["totals"], (tmp_path / f"{reader}.rejects.jsonl").read_bytes())
    assert results["device"] == results["pyarrow"] and len(asked) == 5
    assert results["pyarrow"][1]["rows_written"] > 100 and results["pyarrow"][2]
