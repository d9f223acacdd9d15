"""Damaged and hostile input files: what can be read is read, what cannot stops the run naming the file.

Rules under test:
- a JSON array cut short keeps its whole elements; what follows them is one malformed_json row; an
  element whose end cannot be found (not valid JSON, or not ending within input.max_row_bytes) stops the
  run naming its array index, as the elements after it could be neither read nor counted; one nested deeper
  than Python's decoder recurses is found by its brackets, and read or dropped as its JSON Lines line is;
- text is UTF-8, or UTF-16 / UTF-32 when a byte order mark says so (converted as it is read, so the
  shards are those of the same rows in UTF-8); a UTF-8 BOM is skipped;
- a file whose first bytes are binary (a NUL byte) or not UTF-8 is refused before anything is written
  (exit 2), naming the file and the byte; so is a CSV, TSV, text or JSON array file with bytes that are not
  UTF-8 anywhere, naming the byte, its line and (JSON) its array index, when it is uncompressed; a
  compressed one stops the run where its reader meets them (exit 1), naming the same; in JSON Lines such a
  line is one malformed_json row like any broken line;
- a truncated Parquet or Arrow file is refused (exit 2), a damaged compressed stream or Arrow stream stops
  the run where it breaks (exit 1): always one line naming the file, never a traceback;
- a Parquet file without the column the input type needs writes nothing (exit 3), naming file and column.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import io
import json
import lzma
import random
from pathlib import Path
from typing import Any

import pytest

from gpu_prep.config import parse_config
from gpu_prep.errors import ConfigError, InputError
from gpu_prep.pipeline import Options, run
from gpu_prep.read.inputs import check_columns, expand_inputs
from helpers import gpu_prep_cli, samples

TEXT = {"input": {"type": "text"}, "preprocessing": {"min_chars": 1, "deduplicate": False}}
CHAT = {"input": {"type": "chat"}, "mask": {"assistant": "train"}}
# Characters that are one, two, three and four bytes in UTF-8 (the last a surrogate pair in UTF-16).
ROWS = [{"text": f"row {i}: plain, café, 日本語 and 🙂 #{i}"} for i in range(60)]


def _jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _csv(rows: list[dict[str, Any]]) -> str:
    return "text\n" + "".join(f'"{r["text"]}"\n' for r in rows)


def _run(tmp_path: Path, path: Path, config: dict[str, Any] = TEXT, name: str = "out", **options: Any) -> dict[str, Any]:
    return run(parse_config(config), [str(path)], tmp_path / name, Options(**options))


def _cli(tmp_path: Path, path: Path, config: dict[str, Any] = TEXT) -> Any:
    """The CLI on one input: its result, after checking the error is one line naming the file."""
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(config))
    done = gpu_prep_cli("run", "-q", "-c", config_path, path, "-o", tmp_path / "cli-out")
    assert "Traceback" not in done.stderr, done.stderr
    if done.returncode:
        assert path.name in done.stderr, done.stderr
    return done


# ---------------------------------------------------------------- a JSON array cut short


def test_a_cut_json_array_keeps_its_whole_elements(tmp_path: Path, fast_tokenizer: None) -> None:
    path = tmp_path / "cut.json"
    path.write_text('[{"text": "a"}, {"text": "b"}, {"tex')
    manifest = _run(tmp_path, path)
    totals = manifest["totals"]
    assert (totals["rows_read"], totals["rows_written"], totals["rows_dropped"]) == (3, 2, {"malformed_json": 1})
    example = manifest["dropped_examples"]["malformed_json"][0]
    assert Path(example["file"]).name == "cut.json" and example["line"] == 3


def test_a_long_json_array_cut_inside_a_character_keeps_its_whole_elements(tmp_path: Path, fast_tokenizer: None) -> None:
    rows = ROWS * 400  # about 2 MB: several of the reader's 1 MB blocks
    data = json.dumps(rows, ensure_ascii=False).encode()
    cut = data.rindex("日".encode()) + 1  # inside the last row's three-byte character
    path = tmp_path / "cut.json"
    path.write_bytes(data[:cut])
    totals = _run(tmp_path, path)["totals"]
    assert totals["rows_read"] == len(rows) and totals["rows_written"] == len(rows) - 1
    assert totals["rows_dropped"] == {"malformed_json": 1}


def test_bytes_that_are_not_utf8_inside_a_json_array_stop_the_run(tmp_path: Path, fast_tokenizer: None) -> None:
    """They were replaced by U+FFFD before: the row was written with other text than the file's."""
    data = json.dumps(ROWS * 20, ensure_ascii=False).encode()
    at = data.index("café".encode(), 8000) + 3
    path = tmp_path / "latin.json"
    path.write_bytes(data[:at] + b"\xe9" + data[at + 2:])  # é as Latin-1, past the first bytes checked
    index = data[:at].count(b"}, {")  # the elements before it
    with pytest.raises(ConfigError, match=rf"latin\.json.*not UTF-8 \(byte 0xe9 at byte {at}, line 1, array index {index}\)"):
        _run(tmp_path, path)


@pytest.mark.parametrize("tail", [
    '[{"text": "second array"}]',  # two arrays end to end (cat a.json b.json)
    '\n[{"text": "second array"}]\n',
    '\n{"text": "a row after the array"}',
])
def test_anything_after_a_json_array_stops_the_run_instead_of_being_lost(tmp_path: Path, fast_tokenizer: None,
                                                                         tail: str) -> None:
    path = tmp_path / "joined.json"
    path.write_text(json.dumps([{"text": f"row {i}"} for i in range(5)]) + tail)
    with pytest.raises(InputError, match=r"joined\.json: not one JSON array: after the array's closing .*"
                                         r"array index 4 the last.*rows after it would be lost"):
        _run(tmp_path, path)


def test_two_elements_without_a_comma_stop_the_run(tmp_path: Path, fast_tokenizer: None) -> None:
    path = tmp_path / "comma.json"
    path.write_text('[{"text": "one"}, {"text": "two"} {"text": "three"}]')
    with pytest.raises(InputError, match=r"comma\.json: not one JSON array: after array index 1, with no ','"):
        _run(tmp_path, path)
    path.write_text('[{"text": "one"}, {"text": "two"}]  \n\n')  # blank lines after the array are fine
    assert _run(tmp_path, path, name="ok")["totals"]["rows_written"] == 2
    path.write_text('[{"text": "one"}, {"text": "two"}\n')  # cut short before its ']': nothing after is lost
    totals = _run(tmp_path, path, name="cut")["totals"]
    assert totals["rows_written"] == 2 and totals["rows_dropped"] == {"malformed_json": 1}


def test_max_row_bytes_counts_a_line_without_its_line_end(tmp_path: Path, fast_tokenizer: None) -> None:
    # A CRLF line counted its \r against the cap (an LF line's \n was not), so the same row passed as LF and
    # was dropped as CRLF, and the size said included the line end.
    config = {**TEXT, "input": {"type": "text", "max_row_bytes": 100}}
    body = lambda n: json.dumps({"text": "x" * (n - len(json.dumps({"text": ""})))})  # noqa: E731  a line of n bytes
    for name, end in (("lf.jsonl", "\n"), ("crlf.jsonl", "\r\n")):
        path = tmp_path / name
        path.write_bytes("".join(body(n) + end for n in (99, 100, 101, 300)).encode())
        rejects = tmp_path / f"{name}.rejects"
        manifest = run(parse_config(config), [str(path)], tmp_path / f"out-{name}", Options(rejects=rejects))
        assert manifest["totals"]["rows_written"] == 2 and manifest["totals"]["rows_dropped"] == {"too_large": 2}, name
        details = [json.loads(line)["detail"] for line in rejects.read_text().splitlines()]
        assert details == [f"the line is {n} bytes, over input.max_row_bytes 100; not parsed" for n in (101, 300)], name


def test_an_unending_json_array_element_is_read_no_further_than_max_row_bytes(tmp_path: Path, fast_tokenizer: None) -> None:
    """Its end unknown, the elements after it could not be counted: the run stops (it once dropped the one
    element as too_large and read no further, exit 0)."""
    config = {**TEXT, "input": {"type": "text", "max_row_bytes": 1000}}
    big = json.dumps({"text": "x" * 3000})
    path = tmp_path / "big.json"
    path.write_text(f'[{{"text": "first"}}, {big}, {{"text": "after a big one"}}]')
    manifest = _run(tmp_path, path, config)
    assert manifest["totals"]["rows_written"] == 2 and manifest["totals"]["rows_dropped"] == {"too_large": 1}
    path.write_text('[{"text": "first"}, {"text": "' + "y" * (3 << 20) + '"}, {"text": "after"}]')  # over a read block
    with pytest.raises(InputError, match=r"big\.json: array index 1 .* does not end within input\.max_row_bytes "
                                         r"\(1,000 characters\).*rows after it would be lost"):
        _run(tmp_path, path, config, name="unending")


@pytest.mark.parametrize("bad", ['{"text": "x",}', '{"text": "x\x01"}', '{"text": "a"b"}', '{"text": tru}'])
@pytest.mark.parametrize("block", [7, 1 << 20])
def test_a_bad_json_array_element_before_the_end_stops_the_run(tmp_path: Path, bad: str, block: int) -> None:
    """Its end is not known, so neither are the elements after it: they were lost, the run going on with exit 0."""
    from gpu_prep.read.jsonl import _parse_line
    from gpu_prep.read.json_array import json_array_rows

    path = tmp_path / "bad.json"
    path.write_text("[" + ",\n".join([json.dumps({"text": f"row {i}"}) for i in range(3)] + [bad] + ['{"text": "z"}'] * 900) + "]")
    read = []
    with pytest.raises(InputError, match=r"bad\.json: array index 3 is not valid JSON .*rows after it would be lost"):
        read.extend(json_array_rows(str(path), None, _parse_line, block=block))
    assert len(read) == 3  # the elements before it, as read


@pytest.mark.parametrize("cut", ['{"text": "ab', '{"text": tr', '{"text": 3.', '{"text": 3e-', '{"text": "\\u12', '{"te'])
def test_an_array_cut_inside_its_last_element_keeps_the_others(tmp_path: Path, cut: str) -> None:
    from gpu_prep.read.jsonl import _parse_line
    from gpu_prep.read.json_array import json_array_rows

    path = tmp_path / "cut.json"
    path.write_text('[{"text": "a"}, {"text": "b"}, ' + cut)
    for block in (5, 1 << 20):
        rows = [(r.line, r.dropped) for r in json_array_rows(str(path), None, _parse_line, block=block)]
        assert rows == [(1, None), (2, None), (3, ("malformed_json", "array index 2 is cut short: the file ends inside it"))]


@pytest.mark.parametrize("deep", [
    "[" * 100_000 + "]" * 100_000,
    '{"a": ' * 100_000 + "1" + "}" * 100_000,
    '{"text": "deep [ and } in a string", "x": ' + "[{}, " * 50_000 + "0" + "]" * 50_000 + "}",
])
def test_a_json_array_element_nested_past_the_parsers_depth_is_one_dropped_row(tmp_path: Path, fast_tokenizer: None,
                                                                              deep: str) -> None:
    """The standard decoder, which finds each element's end, recursed into it (a RecursionError naming no file);
    the element is dropped as malformed_json, as the same line in JSON Lines is, and the rows after it are read."""
    path = tmp_path / "deep.json"
    path.write_text(f'[{{"text": "before"}}, {deep}, {{"text": "after"}}]')
    rejects = tmp_path / "rejects.jsonl"
    manifest = _run(tmp_path, path, rejects=rejects)
    assert manifest["totals"]["rows_written"] == 2 and manifest["totals"]["rows_dropped"] == {"malformed_json": 1}
    [entry] = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert (entry["line"], entry["reason"]) == (2, "malformed_json") and "depth limit" in entry["detail"]
    from gpu_prep.commands.validate import check_sample  # validate reads it as run does

    assert check_sample(parse_config(TEXT), [str(path)], 10).rows == 3
    lines = tmp_path / "deep.jsonl"
    lines.write_text(_jsonl([{"text": "before"}]) + deep + "\n" + _jsonl([{"text": "after"}]))
    assert _run(tmp_path, lines, name="lines")["totals"]["rows_dropped"] == {"malformed_json": 1}


def test_a_json_array_element_the_decoder_cannot_recurse_into_is_read_as_json_lines_reads_it(tmp_path: Path) -> None:
    """Deeper than Python's recursion limit (1000) but within the strict parser's (1024): a row like any other."""
    from gpu_prep.read.jsonl import _parse_line
    from gpu_prep.read.json_array import json_array_rows

    row = '{"text": "deep", "meta": ' + "[" * 1010 + "]" * 1010 + "}"
    path = tmp_path / "deep.json"
    path.write_text(f'[{row}, {{"text": "after"}}]')
    for block in (7, 1 << 20):  # the element also cut by the read blocks
        rows = [(r.line, r.record and r.record["text"], r.dropped) for r in
                json_array_rows(str(path), None, _parse_line, block=block)]
        assert rows == [(1, "deep", None), (2, "after", None)]
    path.write_text('[{"text": "one"}, ' + "[" * 2000 + "}" * 2000 + ', {"text": "two"}]')  # brackets that do not pair
    with pytest.raises(InputError, match=r"deep\.json: array index 1 is not valid JSON \(a '}' closes a '\['.*"
                                         r"rows after it would be lost"):
        list(json_array_rows(str(path), None, _parse_line))
    path.write_text('[{"text": "one"}, ' + "[" * 2000 + '"a string never closed')  # the file ends inside it
    rows = [(r.line, r.dropped) for r in json_array_rows(str(path), None, _parse_line, block=64)]
    assert rows == [(1, None), (2, ("malformed_json", "array index 1 is cut short: the file ends inside it"))]


def test_a_comma_before_a_json_arrays_closing_bracket_is_refused(tmp_path: Path, fast_tokenizer: None) -> None:
    """json.load refuses it, as a JSON Lines row with such a comma is malformed_json; it was taken silently."""
    path = tmp_path / "trailing.json"
    path.write_text('[{"text": "one"}, {"text": "two"},\n]\n')
    with pytest.raises(InputError, match=r"trailing\.json: not valid JSON: a ',' after the last element \(array index 1\)"):
        _run(tmp_path, path)


# ---------------------------------------------------------------- encodings


def _shards_of(tmp_path: Path, name: str, data: bytes, config: dict[str, Any] = TEXT) -> list[Any]:
    path = tmp_path / name
    path.write_bytes(data)
    _run(tmp_path, path, config, name=f"out-{name}")
    return samples(tmp_path / f"out-{name}")


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all((x[0] == y[0]).all() and (x[1] == y[1]).all() for x, y in zip(a, b))


@pytest.mark.parametrize("encoding, bom", [("utf-16-le", codecs.BOM_UTF16_LE), ("utf-16-be", codecs.BOM_UTF16_BE),
                                           ("utf-32-le", codecs.BOM_UTF32_LE), ("utf-32-be", codecs.BOM_UTF32_BE),
                                           ("utf-8", codecs.BOM_UTF8)])
@pytest.mark.parametrize("layout", ["jsonl", "json", "csv", "txt"])
def test_text_with_a_bom_is_read_in_its_encoding(tmp_path: Path, fast_tokenizer: None, layout: str, encoding: str,
                                                 bom: bytes) -> None:
    text = {"jsonl": _jsonl(ROWS), "json": json.dumps(ROWS, ensure_ascii=False), "csv": _csv(ROWS),
            "txt": "".join(r["text"] + "\n" for r in ROWS)}[layout]
    config = {**TEXT, "input": {"type": "text", "text_rows": "line"}} if layout == "txt" else TEXT
    want = _shards_of(tmp_path, f"plain.{layout}", text.encode(), config)
    got = _shards_of(tmp_path, f"bom.{layout}", bom + text.encode(encoding), config)
    assert len(want) == len(ROWS) and _same(got, want)


def test_compressed_utf16_is_read(tmp_path: Path, fast_tokenizer: None) -> None:
    want = _shards_of(tmp_path, "plain.jsonl", _jsonl(ROWS).encode())
    assert _same(_shards_of(tmp_path, "u16.jsonl.gz", gzip.compress(_jsonl(ROWS).encode("utf-16"))), want)


def test_utf16_cut_inside_a_character_keeps_its_whole_lines(tmp_path: Path, fast_tokenizer: None) -> None:
    data = _jsonl(ROWS).encode("utf-16")
    path = tmp_path / "cut16.jsonl"
    path.write_bytes(data[:-5])  # inside the last line, half a code unit
    totals = _run(tmp_path, path)["totals"]
    assert (totals["rows_written"], totals["rows_dropped"]) == (len(ROWS) - 1, {"malformed_json": 1})


def test_a_bad_surrogate_in_utf16_stops_the_run_naming_the_byte(tmp_path: Path, fast_tokenizer: None) -> None:
    data = _jsonl(ROWS * 10).encode("utf-16-le")
    at = 10_000
    path = tmp_path / "bad16.jsonl"
    path.write_bytes(codecs.BOM_UTF16_LE + data[:at] + b"\x00\xdc" + data[at:])  # a lone low surrogate
    with pytest.raises(InputError, match=rf"bad16\.jsonl: cannot read beyond line \d+ .*not valid UTF-16-LE at byte {at + 2}"):
        _run(tmp_path, path)


def test_a_csv_file_that_is_not_utf8_is_refused_naming_byte_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(_csv(ROWS[:3]).encode() + "café\n".encode("latin-1"))
    offset = len(_csv(ROWS[:3]).encode()) + len("caf")
    with pytest.raises(ConfigError, match=rf"latin1\.csv.*not UTF-8 \(byte 0xe9 at byte {offset}, line 5\)"):
        expand_inputs([str(path)])
    done = _cli(tmp_path, path)
    assert done.returncode == 2 and "not UTF-8" in done.stderr
    assert not (tmp_path / "cli-out").exists()


def test_a_jsonl_line_that_is_not_utf8_is_its_own_dropped_row_naming_the_byte(tmp_path: Path, fast_tokenizer: None) -> None:
    """In JSON Lines a line is a row: one line in another encoding drops that row alone (with the byte
    named in the rejects), however early in the file it is."""
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(_jsonl(ROWS[:1]).encode() + '{"text": "caf\xe9"}\n'.encode("latin-1") + _jsonl(ROWS[1:]).encode())
    rejects = tmp_path / "rejects.jsonl"
    totals = _run(tmp_path, path, rejects=rejects)["totals"]
    assert (totals["rows_written"], totals["rows_dropped"]) == (len(ROWS), {"malformed_json": 1})
    (reject,) = [json.loads(line) for line in rejects.read_text(encoding="utf-8").splitlines()]
    assert reject["line"] == 2 and reject["detail"].startswith("not UTF-8: byte 0xe9 at column 14"), reject


def test_utf16_without_a_bom_is_refused_as_binary(tmp_path: Path) -> None:
    path = tmp_path / "nobom.csv"
    path.write_bytes(_csv(ROWS).encode("utf-16-le"))
    with pytest.raises(ConfigError, match=r"nobom\.csv.*binary data \(a NUL byte at byte 1, line 1; UTF-16 or UTF-32 text needs a byte order mark\)"):
        expand_inputs([str(path)])


TEXT_LINES = {**TEXT, "input": {"type": "text", "text_rows": "line"}}


def _late(layout: str, rows: int) -> tuple[bytes, int, int]:
    """A CSV, TSV, text (a row a line) or JSON array (an element a line) file of `rows` rows and then one
    whose é is Latin-1: its bytes, the offset of that byte, and its line (its array index is `rows`)."""
    texts = [row["text"] for row in ROWS * (rows // len(ROWS))] + ["late café"]
    if layout == "json":
        data = ("[\n" + ",\n".join(json.dumps({"text": t}, ensure_ascii=False) for t in texts) + "\n]\n").encode()
    else:
        data = (("text\n" if layout != "txt" else "") + "".join(f"{t}\n" for t in texts)).encode()
    at = data.rindex("é".encode())
    return data[:at] + b"\xe9" + data[at + 2:], at, data.count(b"\n", 0, at) + 1


@pytest.mark.parametrize("layout", ["csv", "tsv", "txt", "json"])
def test_bytes_that_are_not_utf8_late_in_a_file_refuse_it_naming_byte_and_line(tmp_path: Path, layout: str) -> None:
    """Past the first bytes checked, past the whole-file check's first block and past each reader's (the
    JSON array reader's 1 MiB, the CSV reader's whole file): the file is refused before the run, naming the
    byte, its line and a JSON array's element (it used to stop the run part-way, exit 1, at a line or index
    where the reader had got to, "line 0" in a CSV, calling the file damaged or cut short)."""
    data, at, line = _late(layout, 30_000)  # about 1.4 MB
    assert at > (1 << 20) + 4096
    path = tmp_path / f"late.{layout}"
    path.write_bytes(data)
    index = ", array index 30000" if layout == "json" else ""
    with pytest.raises(ConfigError, match=rf"late\.{layout}.*not UTF-8 \(byte 0xe9 at byte {at}, line {line}{index}\);"
                                          r".*convert it, e\.g\. iconv"):
        expand_inputs([str(path)])


def test_a_csv_file_not_utf8_near_its_end_exits_2_before_the_output_is_made(tmp_path: Path) -> None:
    data, at, line = _late("csv", 3_000)
    path = tmp_path / "late.csv"
    path.write_bytes(data)
    done = _cli(tmp_path, path)
    assert done.returncode == 2, done.stderr
    assert f"not UTF-8 (byte 0xe9 at byte {at}, line {line})" in done.stderr and "damaged" not in done.stderr
    assert not (tmp_path / "cli-out").exists()


@pytest.mark.parametrize("layout", ["csv", "txt", "json"])
def test_bytes_that_are_not_utf8_in_a_compressed_file_stop_the_run_naming_byte_and_line(
        tmp_path: Path, fast_tokenizer: None, layout: str) -> None:
    """A compressed file's text is not read twice up front: its reader stops at the byte, and the line is
    the byte's, not where the reader had got to (a block or more ahead of the rows)."""
    data, at, line = _late(layout, 3_000)  # about 140 KB: past the text reader's 8 KiB read-ahead
    path = tmp_path / f"late.{layout}.gz"
    path.write_bytes(gzip.compress(data))
    index = ", array index 3000" if layout == "json" else ""
    with pytest.raises(InputError, match=rf"late\.{layout}\.gz: text that is not UTF-8 \(byte 0xe9 at byte {at}, line "
                                         rf"{line}{index}\); the rows after it cannot be read"):
        _run(tmp_path, path, TEXT_LINES)


def test_the_json_array_reader_names_the_element_a_byte_not_utf8_is_in(tmp_path: Path) -> None:
    """Whatever block the reader decodes at a time: the element is the byte's, not the one the reader
    had got to when it decoded the block."""
    from gpu_prep.read.jsonl import _parse_line
    from gpu_prep.read.json_array import json_array_rows
    from gpu_prep.read.text_checks import NotUtf8

    data, at, line = _late("json", 120)
    path = tmp_path / "late.json"
    path.write_bytes(data)
    for block in (7, 4096, 1 << 20):
        read = []
        with pytest.raises(NotUtf8, match=rf"byte {at}, line {line}, array index 120\)") as caught:
            read.extend(json_array_rows(str(path), None, _parse_line, block=block))
        assert caught.value.index == 120 and len(read) == 120, block


def test_the_utf8_check_finds_the_byte_across_block_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_prep.read import text_checks as sources

    good = "café 日本語 🙂 ".encode() * 3
    path = tmp_path / "t.txt"
    for at in range(len(good) + 1):
        if at < len(good) and good[at] & 0xC0 == 0x80:
            continue  # inside a character
        path.write_bytes(good[:at] + b"\xe9!" + good[at:])
        for block in (1, 2, 3, 5):
            monkeypatch.setattr(sources, "SCAN_BYTES", block)
            assert sources.first_not_utf8(str(path), None, to_the_end=True) == (0xE9, at), (at, block)
    path.write_bytes(good)
    assert sources.first_not_utf8(str(path), None, to_the_end=True) is None
    path.write_bytes(good + "日".encode()[:2])  # cut inside its last character
    assert sources.first_not_utf8(str(path), None, to_the_end=True) == (0xE6, len(good))
    assert sources.first_not_utf8(str(path), None, to_the_end=False) is None


def test_a_jsonl_line_that_is_not_utf8_past_the_start_is_one_dropped_row(tmp_path: Path, fast_tokenizer: None) -> None:
    path = tmp_path / "late.jsonl"
    path.write_bytes(_jsonl(ROWS * 10).encode() + '{"text": "caf\xe9"}\n'.encode("latin-1"))
    totals = _run(tmp_path, path)["totals"]
    assert (totals["rows_written"], totals["rows_dropped"]) == (len(ROWS) * 10, {"malformed_json": 1})


# ---------------------------------------------------------------- binary and damaged files (through the CLI)


def _parquet(path: Path, rows: list[dict[str, Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path.read_bytes()


def _arrow(rows: list[dict[str, Any]], stream: bool, batches: int = 1) -> bytes:
    import pyarrow as pa

    table = pa.Table.from_pylist(rows)
    sink = pa.BufferOutputStream()
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, table.schema) as writer:
        for _ in range(batches):
            writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _random(n: int, no_nul: bool = False) -> bytes:
    data = random.Random(n).randbytes(n)
    return data.replace(b"\x00", b"\x01") if no_nul else data


PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + _random(2000)
# name, content, exit code, what stderr says
HOSTILE = [
    ("random.jsonl", _random(5000), 2, "binary data"),
    ("image.jsonl", PNG, 2, "binary data (a NUL byte at byte 8"),
    ("noise.txt", _random(300, no_nul=True), 2, "not UTF-8"),
    ("cut.parquet", "parquet-half", 2, "a Parquet file that cannot be read"),
    ("cut.feather", "feather-half", 2, "an Arrow IPC file that cannot be read"),
    ("cut.arrow", "arrow-stream-half", 1, "cannot read beyond row"),
    ("cut.csv.gz", "csv-gzip-half", 1, "cannot decompress beyond line"),
    ("cut.txt.xz", "txt-xz-half", 1, "cannot decompress beyond line"),
    ("cut.json.gz", "json-gzip-half", 1, "cannot decompress beyond element"),
    ("cut.jsonl.zst", "zstd-half", 2, "cannot decompress it as zstd"),
    ("old.feather", b"FEA1" + _random(500), 2, "Feather version 1, which gpu-prep does not read"),
    # One object over many lines (the datasets json builder's field= layout): its lines were rows, all malformed.
    ("wrapped.json", json.dumps({"version": 1, "data": [{"text": f"row {i}"} for i in range(30)]}, indent=2).encode(),
     2, "holds one JSON object written over many lines"),
]


def _hostile(kind: Any, folder: Path) -> bytes:
    if isinstance(kind, bytes):
        return kind
    rng = random.Random(0)  # rows that do not compress to nothing: a compressed file's half is past its first bytes
    many = [{"text": f"row {i}: {rng.getrandbits(256):x} café"} for i in range(20_000)]
    whole = {"parquet-half": lambda: _parquet(folder / "whole.parquet", many),
             "feather-half": lambda: _arrow(many, stream=False),
             "arrow-stream-half": lambda: _arrow(ROWS, stream=True, batches=50),
             "csv-gzip-half": lambda: gzip.compress(_csv(many).encode()),
             "txt-xz-half": lambda: lzma.compress(_csv(many).encode()),
             "json-gzip-half": lambda: gzip.compress(json.dumps(many).encode()),
             "zstd-half": lambda: _zstd(_jsonl(many).encode())}[kind]()
    return whole[: len(whole) // 2]


def _zstd(data: bytes) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.output_stream(sink, compression="zstd") as out:
        out.write(data)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("name, kind, code, says", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_damaged_or_binary_file_ends_the_run_naming_it(tmp_path: Path, name: str, kind: Any, code: int,
                                                         says: str) -> None:
    path = tmp_path / name
    path.write_bytes(_hostile(kind, tmp_path))
    config = {**TEXT, "input": {"type": "text", "text_rows": "line"}} if ".txt" in name else TEXT
    done = _cli(tmp_path, path, config)
    assert done.returncode == code, done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    if name.endswith((".csv.gz", ".txt.xz")):  # the line named is where the text breaks, though read ahead
        opener = gzip.open if name.endswith(".gz") else lzma.open
        whole = 0
        with opener(path, "rb") as handle:
            with contextlib.suppress(EOFError, lzma.LZMAError):
                while data := handle.read1(1 << 12):
                    whole += data.count(b"\n")
        assert whole > 1000 and f"beyond line {whole} " in done.stderr, (whole, done.stderr)
    if name == "cut.json.gz":  # the array's whole elements before the cut are read: the last one is named
        with gzip.open(path, "rb") as handle, contextlib.suppress(EOFError):
            text = b""
            while data := handle.read1(1 << 12):
                text += data
        whole = text.decode("utf-8", "ignore").count('"text"') - 1  # the last element begun is cut
        assert whole > 1000 and f"beyond element {whole} " in done.stderr, (whole, done.stderr)


def test_a_compressed_stream_is_read_in_whole_blocks_up_to_its_break() -> None:
    # The codecs' read1 gives about 11 KB at a time: joined into whole blocks, so that a JSON array's
    # element is parsed once a block, not once every 11 KB (a 16 MB element took 40 times as long); the text
    # before a break comes first, the break on the next read.
    from gpu_prep.read.text_checks import _up_to_a_break

    text = b"".join(f"line {i} {random.Random(i).getrandbits(64):x}\n".encode() for i in range(200_000))
    whole = gzip.compress(text)
    take = _up_to_a_break(gzip.GzipFile(fileobj=io.BytesIO(whole)))
    assert [len(take(1 << 20)) for _ in range(3)] == [1 << 20] * 3
    cut = _up_to_a_break(gzip.GzipFile(fileobj=io.BytesIO(whole[: len(whole) // 2])))
    got = b""
    with pytest.raises(EOFError):
        while data := cut(1 << 20):
            got += data
    assert len(got) > len(text) // 3 and text.startswith(got)


def test_json_lines_named_json_with_a_bad_first_line_are_read_as_json_lines(tmp_path: Path) -> None:
    # Only an object opened alone on the first line (as pretty-printers write one) is refused as one object
    # over many lines: a first row cut short, or nested past the parser's depth, is one malformed_json row.
    rows = "".join(json.dumps({"text": f"row number {i} is a row"}) + "\n" for i in range(20))
    for name, first in (("cut.json", '{"text": "a row cut sh'), ("deep.json", "{" + '"a":[' * 2000 + "1" + "]" * 2000 + "}")):
        path = tmp_path / name
        path.write_text(first + "\n" + rows)
        manifest = _run(tmp_path, path, name=f"out-{name}")
        assert manifest["totals"]["rows_written"] == 20 and list(manifest["totals"]["rows_dropped"]) == ["malformed_json"]


def test_a_parquet_file_without_the_column_the_input_type_needs_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "texts.parquet"
    _parquet(path, ROWS)
    done = _cli(tmp_path, path, CHAT)
    assert done.returncode == 3 and "field 'messages' is missing" in done.stderr, done.stderr


def test_a_missing_field_names_the_keys_the_row_has(tmp_path: Path, fast_tokenizer: None) -> None:
    """So a key set to the wrong name shows the right one (the detail said only "field 'text' is missing")."""
    path = tmp_path / "rows.jsonl"
    path.write_text(_jsonl([{"content": "a", "source": "web"}, {f"k{i}": i for i in range(20)}, {}]))
    rejects = tmp_path / "rejects.jsonl"
    _run(tmp_path, path, rejects=rejects)
    assert [json.loads(line)["detail"] for line in rejects.read_text().splitlines()] == [
        "field 'text' is missing; the keys of the row are 'content', 'source'",
        "field 'text' is missing; the keys of the row are 'k0', 'k1', 'k2', 'k3', 'k4', 'k5', 'k6', 'k7', ...",
        "field 'text' is missing; the row has no keys"]
    path.write_text(_jsonl([{"messages": [{"role": "user", "content": "hi"}, {"from": "gpt", "value": "hello"}]}]))
    rejects = tmp_path / "chat-rejects.jsonl"
    _run(tmp_path, path, CHAT, name="chat", rejects=rejects)
    assert json.loads(rejects.read_text())["detail"] == ("field messages[1].'role' is missing; the keys of messages[1] "
                                                         "are 'from', 'value'")


@pytest.mark.parametrize("setting", ["input.messages_key", "input.text_key", "input.role_key", "output.domain_key"])
def test_an_empty_key_setting_is_a_config_error(setting: str) -> None:
    """Every row was dropped as missing the field '' instead."""
    section, key = setting.split(".")
    with pytest.raises(ConfigError, match=rf"{setting}: is empty; it names a field of the rows"):
        parse_config({section: {key: ""}})


def test_check_columns_names_the_file_the_missing_columns_and_those_it_has(tmp_path: Path) -> None:
    _parquet(tmp_path / "texts.parquet", ROWS)
    (tmp_path / "texts.arrow").write_bytes(_arrow(ROWS, stream=True))
    (tmp_path / "texts.csv").write_text(_csv(ROWS))  # a CSV's header is known before its rows too
    (tmp_path / "texts.tsv.gz").write_bytes(gzip.compress(_csv(ROWS).encode()))
    files = expand_inputs([str(tmp_path / f"texts.{ext}") for ext in ("parquet", "arrow", "csv", "tsv.gz")])
    check_columns(files, ("text",))
    for file in files:
        with pytest.raises(ConfigError, match=rf"{Path(file.path).name}'?: no column 'messages', which every row "
                                              r"needs; its columns are 'text'"):
            check_columns([file], ("messages",))


def test_a_parquet_file_without_the_text_column_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Among good inputs, a Parquet file that lacks the text column would only add dropped rows to a run
    that exits 0: it is refused up front instead (exit 2), naming the file and its columns."""
    good, bad = tmp_path / "good.jsonl", tmp_path / "other.parquet"
    good.write_text(_jsonl(ROWS), encoding="utf-8")
    _parquet(bad, [{"body": r["text"]} for r in ROWS])
    (tmp_path / "config.json").write_text(json.dumps(TEXT))
    done = gpu_prep_cli("run", "-q", "-c", tmp_path / "config.json", good, bad, "-o", tmp_path / "cli-out")
    assert done.returncode == 2 and "other.parquet" in done.stderr and "its columns are 'body'" in done.stderr, done.stderr
    assert not (tmp_path / "cli-out").exists()


def test_a_prompt_response_parquet_without_its_columns_is_refused_up_front(tmp_path: Path) -> None:
    path = tmp_path / "pairs.parquet"
    _parquet(path, [{"prompt": "Hi?", "answer": "Hello."}])
    config = {**TEXT, "input": {"type": "prompt_response"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = gpu_prep_cli("run", "-q", "-c", tmp_path / "config.json", path, "-o", tmp_path / "cli-out")
    assert done.returncode == 2 and "no column 'response' or 'completion'" in done.stderr and "'answer'" in done.stderr, done.stderr


def test_a_json_array_saved_as_json_lines_is_named_for_what_it_is(tmp_path: Path, fast_tokenizer: None) -> None:
    # json.dump(rows, f) into a .jsonl file: on one line it is one row of rows, dropped saying what it is;
    # written over many lines (indent=2), the file is refused before anything is read.
    rows = [{"text": f"document {i}"} for i in range(5)]
    chats = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]} for i in range(5)]
    one_line = tmp_path / "one.jsonl"
    one_line.write_text(json.dumps(chats) + "\n" + json.dumps({"text": "a real row"}) + "\n")
    manifest = _run(tmp_path, one_line, {**TEXT, "input": {"type": "auto"}})
    [example] = manifest["dropped_examples"]["not_an_object"]
    assert "the line is a JSON array of 5 rows" in example["detail"] and "named .json" in example["detail"]
    # validate reads the line as run does (it took the rows for messages, and named a missing role)
    from gpu_prep.commands.validate import check_sample

    report = check_sample(parse_config({**TEXT, "input": {"type": "chat"}}), [str(one_line)], 10)
    assert report.failed["not_an_object"] == 1 and "the line is a JSON array of 5 rows" in report.first_failure["not_an_object"]
    pretty = tmp_path / "pretty.jsonl"
    pretty.write_text(json.dumps(rows, indent=2))
    with pytest.raises(ConfigError, match=r"pretty\.jsonl'?: named as JSON Lines, but it holds a JSON array written over"):
        _run(tmp_path, pretty, name="pretty")


@pytest.mark.parametrize("kind", ["text", "auto", "chat"])
def test_a_one_line_array_of_rows_is_named_as_such_and_custom_message_keys_are_not(tmp_path: Path, kind: str,
                                                                                  fast_tokenizer: None) -> None:
    # json.dump(rows) on one line is rows, whatever their type; messages under input.role_key / content_key
    # of the user's (speaker / text, a key text rows have too) are a conversation.
    rows = [{"text": "first document"}, {"text": "second document"}]
    messages = [{"speaker": "user", "text": "hi"}, {"speaker": "assistant", "text": "hello"}]
    path = tmp_path / "lines.jsonl"
    path.write_text(json.dumps(rows) + "\n" + json.dumps(messages) + "\n")
    config = {"input": {"type": kind, "role_key": "speaker", "content_key": "text"}, "chat_template": "chatml",
              "mask": {"assistant": "train"}, "preprocessing": {"min_chars": 1, "deduplicate": False,
                                                                "max_drop_share": 1.0}}
    rejects = tmp_path / f"{kind}.rejects.jsonl"
    _run(tmp_path, path, config, name=kind, rejects=rejects)
    entries = {json.loads(line)["line"]: json.loads(line) for line in rejects.read_text().splitlines()}
    assert "the line is a JSON array of 2 rows" in entries[1]["detail"]
    assert 2 not in entries or "JSON array" not in entries[2]["detail"]


def test_nan_and_infinity_are_named_as_what_json_lacks() -> None:
    # Python's json.dumps writes float('nan') as NaN: the drop says why the row is not JSON, and how to write it.
    from gpu_prep.read.jsonl import _parse_line

    for line in (b'{"a": 1, "score": NaN}', b'{"score": -Infinity}', b'{"score": Infinity, "b": 2}',
                 '{"text": "日本語の文章です", "score": NaN}'.encode()):  # orjson's position counts characters
        row = _parse_line(line)
        reason, detail = row.dropped
        assert row.record is None and reason == "malformed_json" and "NaN and Infinity are not JSON" in detail, detail
    assert "NaN" not in _parse_line(b'{"score": tru}').dropped.detail


def test_a_parquet_string_that_is_not_utf8_is_not_looked_for_in_the_files_bytes(tmp_path: Path) -> None:
    # The text check reads a text file's bytes again to find a bad byte; a Parquet file's bytes are not its
    # text (the byte it found was in the page metadata): the column's own error, naming the byte, stands,
    # and drops the row that holds it.
    import itertools

    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = [f"row {i} ".encode() * 20 for i in range(5)]
    raw[3] = b"caf\xe9 latin-1 " * 10
    offsets = pa.array([0, *itertools.accumulate(len(b) for b in raw)], pa.int32())
    column = pa.StringArray.from_buffers(len(raw), offsets.buffers()[1], pa.py_buffer(b"".join(raw)))
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": column}), path)
    rejects = tmp_path / "rejects.jsonl"
    manifest = _run(tmp_path, path, {**TEXT, "preprocessing": {"min_chars": 0}}, rejects=rejects)
    assert manifest["totals"]["rows_written"] == 4 and manifest["totals"]["rows_dropped"] == {"malformed_row": 1}
    detail = json.loads(rejects.read_text())["detail"]
    assert "0xe9" in detail and "iconv" not in detail, detail


def test_a_rejected_line_that_is_not_utf8_keeps_its_bytes(tmp_path: Path) -> None:
    # The rejects file is how dropped rows are got back: a latin-1 line is shown readable, and given back
    # byte for byte (decoded with U+FFFD alone, it could not be re-encoded).
    import base64

    latin = '{"text": "café crème"}'.encode("latin-1")
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"text": "a good row"}\n' + latin + b"\r\n" + b'{"text": "another good row"}\n')
    rejects = tmp_path / "rejects.jsonl"
    manifest = _run(tmp_path, path, rejects=rejects)
    assert manifest["totals"]["rows_written"] == 2
    [entry] = [json.loads(line) for line in rejects.read_text(encoding="utf-8").splitlines()]
    assert entry["line"] == 2 and entry["reason"] == "malformed_json" and "not UTF-8: byte 0xe9" in entry["detail"]
    assert base64.b64decode(entry["row_base64"]) == latin and entry["row"] == '{"text": "caf\ufffd cr\ufffdme"}'
