"""The byte scan (gpu_prep.read.jsonscan) takes a line only if the strict parser reads it as one object, and takes
the JSON a writer produces.

These tests hold whatever the columnar parser does: a line the scan takes is valid JSON by the strict
parser's rules (so how lenient cuDF is about invalid JSON cannot matter), and its count of keys is the
parsed objects' count. They run the numpy twin of what CuPy runs on the GPU.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_prep.read.jsonscan import LBRACKET, QUOTE, scan, valid_utf8

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)  # astral ones: escaped pairs under ASCII
SCALARS = st.none() | st.booleans() | st.integers(-10**15, 10**15) | TEXT \
    | st.floats(allow_nan=False, allow_infinity=False, min_value=-1e90, max_value=1e90).filter(
        lambda x: x == 0 or abs(x) > 1e-90)  # a three-digit exponent is refused (see _atoms_valid)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                      max_leaves=12)
OBJECTS = st.dictionaries(TEXT, VALUES, max_size=4)
SEPARATORS = st.sampled_from([(", ", ": "), (",", ":"), (" , ", " : ")])


def _keys(value: Any) -> int:
    if isinstance(value, dict):
        return len(value) + sum(_keys(v) for v in value.values())
    if isinstance(value, list):
        return sum(_keys(v) for v in value)
    return 0


def _escaped_key(value: Any, ascii: bool) -> bool:
    """Whether a key of some object in value is written with an escape (the scan refuses those)."""
    if isinstance(value, dict):
        return any("\\" in json.dumps(k, ensure_ascii=ascii) or _escaped_key(v, ascii) for k, v in value.items())
    return isinstance(value, list) and any(_escaped_key(v, ascii) for v in value)


def _scan(data: bytes, values: dict[str, tuple[int, bool]] | None = None) -> int | None:
    rows = sum(1 for line in data.split(b"\n") if line.strip())
    return scan(np, data, rows, values or {})


@FUZZ
@given(st.lists(st.tuples(OBJECTS, st.booleans(), SEPARATORS), min_size=1, max_size=6))
def test_json_as_writers_write_it_is_taken_with_its_keys_counted(rows: list[tuple[Any, bool, Any]]) -> None:
    lines = [json.dumps(row, ensure_ascii=ascii, separators=seps) for row, ascii, seps in rows]
    data = "\n".join(lines).encode("utf-8") + b"\n"
    escaped = any(_escaped_key(row, ascii) for row, ascii, _ in rows)
    assert _scan(data) == (None if escaped else sum(_keys(row) for row, _, _ in rows))


# Bytes that make JSON invalid in the ways a lenient parser forgives, spliced into valid lines.
NOISE = [b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b" ", b"0", b"1", b"-", b"+", b".", b"e", b"t", b"n",
         b"N", b"I", b"x", b"\t", b"\x00", b"\xff", b"\xc3", b"\\u", b"\\ud800", b"tru", b"nul", b"1e999", b"\n"]


@FUZZ
@given(OBJECTS, st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 3), st.sampled_from(NOISE)), min_size=1,
                         max_size=3))
def test_a_line_the_scan_takes_is_one_the_strict_parser_reads(row: Any, edits: list[tuple[int, int, bytes]]) -> None:
    data = bytearray(json.dumps(row, ensure_ascii=False).encode("utf-8"))
    for at, cut, noise in edits:
        at %= len(data) + 1
        data[at:at + cut] = noise
    data = bytes(data)
    keys = _scan(data)
    if keys is None:
        return
    parsed = [orjson.loads(line) for line in data.split(b"\n") if line.strip()]  # raises if it was not JSON
    assert all(isinstance(p, dict) for p in parsed)
    assert keys >= sum(map(_keys, parsed))  # more where a key repeats (the strict parser keeps the last)


SYNTAX_TRAPS = [
    b'{"a": tru}', b'{"a": True}', b'{"a": nul}', b'{"a": nan}', b'{"a": NaN}', b'{"a": -Infinity}',
    b'{"a": 01}', b'{"a": -01}', b'{"a": +1}', b'{"a": .5}', b'{"a": 1.}', b'{"a": -}', b'{"a": 1e}',
    b'{"a": 1e+}', b'{"a": 1.5.2}', b'{"a": 1e5e2}', b'{"a": 1e5.2}', b'{"a": 0x10}', b'{"a": 1-2}',
    b'{"a": 1e999}', b'{"a": 1' + b"0" * 250 + b'}', b'{"a": truefalse}', b'{"a": true false}',
    b'{"a": 1,}', b'{"a": [1,]}', b'{"a": [,1]}', b'{,"a": 1}', b'{"a" 1}', b'{"a": 1 "b": 2}',
    b'{"a": [1 2]}', b'{"a": ["x" "y"]}', b'{"a"}', b'{"a":}', b'{:1}', b'{"a": 1]', b'{"a": [1}}',
    b'{"a": {"b": 1]}', b'{"a": [1: 2]}', b'{1: 2}', b'{"a": "b": "c"}', b'{"a": 1}}', b'{"a": 1},{}',
    b'{"a": 1} x', b'{"a": "\\x"}', b'{"a": "\\u12"}', b'{"a": "\\u12g4"}', b'{"a": "\\ude00\\ud83d"}',
    b'{"a": "\\ud83d\\ud83d\\ude00"}', b'{"a": "\\ud83d x \\ude00"}', b'{"a": "\\ud83d\\\\ude00"}', b'{"a": "\\udc00"}',
    b'{"a": "\\ud800"}', b'{"a": "raw\ttab"}', b'{"a": "\xff"}', b'{"a": "\xc3"}', b'{"a": "\xed\xa0\x80"}',
    b'{"a": "\xc0\xaf"}', b'\xef\xbb\xbf{"a": 1}', b'[{"a": 1}]', b'"a"', b'{"a": "open',
    b'{"a": [' + b"[" * 1100 + b"]" * 1100 + b"]}",
]


@pytest.mark.parametrize("trap", SYNTAX_TRAPS)
def test_the_scan_refuses_each_line_the_strict_parser_refuses_or_reads_otherwise(trap: bytes) -> None:
    clean = b'{"a": "clean", "b": [1, -2.5e10, true, null, {"c": "d"}]}\n'
    assert _scan(clean) == 3
    assert _scan(clean + trap + b"\n" + clean) is None, trap


def test_the_fields_read_must_hold_their_kind_and_appear_once_a_row() -> None:
    chat = {"messages": (LBRACKET, True), "role": (QUOTE, False), "content": (QUOTE, False)}
    good = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
    assert _scan(good, chat) == 5
    for wrong in (b'{"messages": "text"}', b'{"messages": [{"role": 1, "content": "x"}]}',
                  b'{"messages": [{"role": "user", "content": ["a"]}]}', b'{"m\\u0065ssages": []}',
                  b'{"messages": [{"r\\u006fle": "user", "content": "x"}]}', b'{"messages": [], "messages": []}'):
        assert _scan(good + wrong + b"\n", chat) is None, wrong
    # The same names inside strings, or as keys of other objects holding strings, are no reason to refuse.
    assert _scan(b'{"messages": [{"role": "user", "content": "\\"messages\\": 5"}], "meta": {"role": "x"}}\n',
                 chat) == 5


@FUZZ
@given(st.binary(max_size=40) | st.text(max_size=12).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_utf8_is_valid_exactly_where_a_strict_decoder_reads_it(data: bytes) -> None:
    try:
        data.decode("utf-8")
        strict = True
    except UnicodeDecodeError:
        strict = False
    assert valid_utf8(np, np.frombuffer(data, np.uint8)) == strict
