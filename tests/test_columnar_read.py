"""Reading JSON Lines as columns (the GPU backend's cudf.read_json) gives exactly the strict parser's rows.

cuDF is not here, so its place is taken by `lenient_read_range`, which keeps the contract read.py relies
on (the rows that start in a byte range, the asked-for fields, an all-null row for a line it cannot read)
and is at least as lenient as cuDF's recovery mode: it accepts raw control characters, NaN, trailing
content and invalid UTF-8, and reads numbers, lists and objects in a string field as their JSON text. If
the byte scan in read.py let any such line through, the rows below would differ from the strict parser's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu_prep import read
from gpu_prep.backend import Backend
from gpu_prep.config import parse_config
from gpu_prep.pipeline import Options, run
from gpu_prep.read import Columnar, ColumnarRecord, as_read, columnar_safe, expand_inputs, read_chunks
from helpers import write_jsonl

FIELDS = ("text", "source")


def _as_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)


def lenient_read_range(path: str, offset: int, size: int, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(size)
    rows = []
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            value, _ = json.JSONDecoder(strict=False).raw_decode(raw.decode("utf-8", errors="replace").strip())
        except ValueError:
            value = None
        rows.append({f: _as_text(value.get(f)) if isinstance(value, dict) else None for f in fields})
    return rows


def _clean(n: int) -> list[bytes]:
    return [json.dumps({"text": f"row {i}: plain text, é and 日本 included", "source": f"s{i % 3}",
                        "extra": [i]}, ensure_ascii=False).encode() for i in range(n)]


# Lines a strict parser rejects or reads differently from a lenient one, each among clean rows.
TRAPS = [
    b'{"text": "raw\ttab inside a string", "source": "a"}',
    b'{"text": "raw \x01 control character", "source": "a"}',
    b'{"text":\t"tab as whitespace", "source": "a"}',
    b'{"text": "carriage return line", "source": "a"}\r',
    b'{"text": "a number follows", "source": "a", "n": NaN}',
    b'{"text": "trailing content", "source": "a"} x',
    b'{"text": "two objects", "source": "a"} {"other": "on one line"}',
    b'{"text": "invalid \xff utf-8", "source": "a"}',
    b'{"text": "lone surrogate \\ud800", "source": "a"}',
    b'{"text": "an escaped pair \\ud83d\\ude00 is fine but rare", "source": "a"}',
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


def _corpus(tmp_path: Path) -> Path:
    lines = [b"\xef\xbb\xbf" + _clean(1)[0]] + _clean(40)
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


@pytest.mark.parametrize("trap", TRAPS[:22])
def test_the_byte_scan_refuses_each_trap(trap: bytes) -> None:
    clean = b"\n".join(_clean(3)) + b"\n"
    assert columnar_safe(clean, FIELDS, 3)
    data = clean + trap + b"\n"
    rows = 3 + bool(trap.strip())
    # Refused by the scan, or (a missing field, an all-null row) by the check of what the parser returned.
    refused = not columnar_safe(data, FIELDS, rows)
    missing = any(v is None for r in lenient_read_range_bytes(data) for v in r.values())
    assert refused or missing, trap


def lenient_read_range_bytes(data: bytes) -> list[dict[str, Any]]:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".jsonl") as handle:
        handle.write(data)
        handle.flush()
        return lenient_read_range(handle.name, 0, len(data), FIELDS)


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
