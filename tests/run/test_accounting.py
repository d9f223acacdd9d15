"""Every row read is written or dropped under exactly one named reason, per input file (manifest.json).

The fixtures are built as (line, expected fate) pairs, so the expected counts come from how the data was
made, never from the pipeline's output. Dedup is checked on its contract: the MD5 of the first 200
characters (code points), the first occurrence in input order kept, across chunks and files.
"""

from __future__ import annotations

import json

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_prep.backend import CPU
from gpu_prep.config import parse_config
from gpu_prep.errors import Drop
from gpu_prep.pipeline import Options, run
from helpers import load_json, samples, write_jsonl

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

MIN, MAX = 20, 400
TEXT_CONFIG = {"input": {"type": "text", "append_eod": False}, "preprocessing": {"min_chars": MIN, "max_chars": MAX}}
PREFIX = "".join(f"{i % 10}" for i in range(200))  # 200 characters shared by the prefix-dedup rows
KEPT = None  # the fate of a row that is written

Fixture = list[tuple[Any, str | None]]  # (row or raw line, drop reason or KEPT)


def _text(body: Any) -> dict[str, Any]:
    return {"text": body}


def _file_a() -> Fixture:
    return [
        (_text("alpha: a perfectly ordinary document"), KEPT),
        (_text("alpha: a perfectly ordinary document"), Drop.DUPLICATE),
        (_text("short"), Drop.TOO_SHORT),
        (_text("x" * (MIN - 1)), Drop.TOO_SHORT),
        (_text("y" * MIN), KEPT),  # exactly min_chars is long enough
        (_text("z" * (MAX + 1)), Drop.TOO_LONG),
        (_text("w" * MAX), KEPT),  # exactly max_chars is short enough
        ('{"text": "unterminated', Drop.MALFORMED_JSON),
        ("{not json at all}", Drop.MALFORMED_JSON),
        ("[1, 2, 3]", Drop.NOT_AN_OBJECT),
        ('"just a string"', Drop.NOT_AN_OBJECT),
        ("42", Drop.NOT_AN_OBJECT),
        ("null", Drop.NOT_AN_OBJECT),
        ("", None),  # a blank line is not a row: neither read nor dropped (filtered out below)
        ({"content": "the key is called text"}, Drop.MISSING_FIELD),
        (_text(5), Drop.WRONG_TYPE),
        (_text(None), Drop.WRONG_TYPE),
        (_text(["a list"]), Drop.WRONG_TYPE),
        (_text(PREFIX + " first, in file a"), KEPT),
        (_text(PREFIX + " same 200 characters, different after"), Drop.DUPLICATE),
        (_text(PREFIX[:199] + "#" + " differs at character 199"), KEPT),
        (_text("é" * 150 + "x" * 50 + " code points, not bytes: tail 1"), KEPT),
        (_text("é" * 150 + "x" * 50 + " code points, not bytes: tail 2"), Drop.DUPLICATE),
        # Same first 200 bytes (100 x "é") as the row above but not the same 200 characters.
        (_text("é" * 150 + "y" * 50 + " code points, not bytes"), KEPT),
        (_text("short"), Drop.TOO_SHORT),  # a repeat too, but the length rules come before dedup
        (_text("last row of file a, kept"), KEPT),
    ]


def _file_b() -> Fixture:
    return [
        (_text("alpha: a perfectly ordinary document"), Drop.DUPLICATE),  # first seen in file a
        (_text(PREFIX + " second, in file b"), Drop.DUPLICATE),
        (_text("beta: only in file b, and kept"), KEPT),
        (_text("beta: only in file b, and kept"), Drop.DUPLICATE),
        ("[]", Drop.NOT_AN_OBJECT),
        ("{", Drop.MALFORMED_JSON),
        ({"text": {"nested": "object"}}, Drop.WRONG_TYPE),
        (_text(""), Drop.TOO_SHORT),  # empty: shorter than any min_chars
    ]


def _write(tmp_path: Path, name: str, fixture: Fixture) -> Path:
    return write_jsonl(tmp_path / name, [row for row, _ in fixture])


def _rows(fixture: Fixture) -> Fixture:
    return [(row, fate) for row, fate in fixture if row != ""]


def _expected(fixture: Fixture) -> dict[str, Any]:
    rows = _rows(fixture)
    dropped = Counter(fate for _, fate in rows if fate is not KEPT)
    return {"rows_read": len(rows), "rows_written": sum(f is KEPT for _, f in rows), "rows_dropped": dict(dropped)}


def _run(config: dict[str, Any], inputs: list[Path], out: Path, **kwargs: Any) -> dict[str, Any]:
    return run(parse_config(config), [str(p) for p in inputs], out, Options(**kwargs))


def _kept_texts(fixtures: list[Fixture]) -> list[str]:
    return [row["text"] for fixture in fixtures for row, fate in _rows(fixture) if fate is KEPT]


@pytest.mark.parametrize("chunk_rows", [1, 4, 2048])
def test_every_row_is_written_or_dropped_for_its_reason(tmp_path: Path, qwen: Any, chunk_rows: int) -> None:
    fixtures = [_file_a(), _file_b()]
    paths = [_write(tmp_path, f"{name}.jsonl", f) for name, f in zip("ab", fixtures)]
    manifest = _run(TEXT_CONFIG, paths, tmp_path / "out", chunk_rows=chunk_rows, rejects=tmp_path / "rejects.jsonl")
    # Dropped rows are listed in input order, whichever stage dropped them and however rows were chunked.
    rejected = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text(encoding="utf-8").splitlines()]
    where = [(paths.index(Path(r["file"])), r["line"]) for r in rejected]
    assert where == sorted(where) and len(where) == sum(sum(e["rows_dropped"].values()) for e in manifest["inputs"])
    for entry, fixture in zip(manifest["inputs"], fixtures):
        assert entry["rows_read"] == entry["rows_written"] + sum(entry["rows_dropped"].values())
        got = {k: entry[k] for k in ("rows_read", "rows_written", "rows_dropped")}
        assert got == _expected(fixture), entry["path"]
    totals = manifest["totals"]
    assert totals["rows_read"] == sum(e["rows_read"] for e in manifest["inputs"])
    assert totals["rows_read"] == totals["rows_written"] + sum(totals["rows_dropped"].values())
    # The manifest on disk says the same, and the kept rows are the first occurrences, in input order.
    assert load_json(tmp_path / "out" / "manifest.json")["inputs"] == manifest["inputs"]
    assert [qwen.decode(ids) for ids, _ in samples(tmp_path / "out")] == _kept_texts(fixtures)


def test_dedup_keeps_the_first_occurrence_in_the_order_inputs_are_given(tmp_path: Path, qwen: Any) -> None:
    first = [(_text(PREFIX + " variant one"), KEPT), (_text("filler row number one"), KEPT)]
    second = [(_text("filler row number two"), KEPT), (_text(PREFIX + " variant two"), KEPT)]
    a, b = _write(tmp_path, "a.jsonl", first), _write(tmp_path, "b.jsonl", second)
    _run(TEXT_CONFIG, [a, b], tmp_path / "ab")
    _run(TEXT_CONFIG, [b, a], tmp_path / "ba")  # not alphabetical, not by file: the order given
    texts_ab = [qwen.decode(ids) for ids, _ in samples(tmp_path / "ab")]
    texts_ba = [qwen.decode(ids) for ids, _ in samples(tmp_path / "ba")]
    assert texts_ab == [PREFIX + " variant one", "filler row number one", "filler row number two"]
    assert texts_ba == ["filler row number two", PREFIX + " variant two", "filler row number one"]


def test_dedup_off_keeps_duplicates(tmp_path: Path) -> None:
    rows = [_text("the same document twice over")] * 2
    config = {**TEXT_CONFIG, "preprocessing": {**TEXT_CONFIG["preprocessing"], "deduplicate": False}}
    manifest = _run(config, [write_jsonl(tmp_path / "d.jsonl", rows)], tmp_path / "out")
    assert manifest["totals"]["rows_written"] == 2


def test_dedup_can_hash_the_whole_text(tmp_path: Path) -> None:
    # Two documents that agree on their first 200 characters: duplicates by the seed's prefix rule, distinct
    # with dedup_prefix_chars null; an equal document is a duplicate either way.
    head = "x" * 200
    rows = [_text(head + " one ending"), _text(head + " another ending"), _text(head + " one ending")]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    written = {}
    for chars in (200, None):
        config = {**TEXT_CONFIG, "preprocessing": {**TEXT_CONFIG["preprocessing"], "dedup_prefix_chars": chars}}
        manifest = _run(config, [data], tmp_path / f"out-{chars}")
        written[chars] = manifest["totals"]["rows_written"]
        detail = manifest["dropped_examples"]["duplicate"][0]["detail"]
        assert ("first 200 characters" in detail) == (chars == 200)
    assert written == {200: 1, None: 2}


def test_dedup_digest_is_md5_of_the_first_200_code_points() -> None:
    # The digest the CPU backend computes is the contract a GPU backend must match.
    texts = ["é" * 250, "short", ""]
    assert CPU.digests(texts, 200) == [hashlib.md5(t[:200].encode("utf-8")).digest() for t in texts]


def _chat(*turns: tuple[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": role, "content": content} for role, content in turns]}


LONG = " ".join(f"word{i}" for i in range(200))  # far more than MAX_SEQ_LEN tokens


def _chat_fixture() -> Fixture:
    return [
        (_chat(("system", "S."), ("user", "Hi"), ("assistant", "Hello")), KEPT),
        (_chat(("system", "S."), ("user", LONG), ("assistant", "Only answer, beyond max_seq_len")),
         Drop.NO_TRAINED_TOKENS),
        (_chat(("system", "S."), ("user", "Hi"), ("assistant", "Hello"), ("user", LONG), ("assistant", "Bye")),
         KEPT),  # truncated: the first answer still fits
        (_chat(("system", "S."), ("user", "Nothing answers this")), Drop.NO_TRAINED_TOKENS),
        ({"conversation": []}, Drop.MISSING_FIELD),
        ({"messages": "not a list"}, Drop.WRONG_TYPE),
        ({"messages": []}, Drop.EMPTY),
        ({"messages": ["not an object"]}, Drop.WRONG_TYPE),
        ({"messages": [{"content": "no role"}]}, Drop.MISSING_FIELD),
        ({"messages": [{"role": "user", "content": 7}]}, Drop.WRONG_TYPE),
    ]


MAX_SEQ_LEN = 48


def test_chat_rows_with_nothing_left_to_train_are_counted(tmp_path: Path) -> None:
    config = {"input": {"type": "chat"}, "mask": {"assistant": "train"},
              "preprocessing": {"max_seq_len": MAX_SEQ_LEN}}
    fixture = _chat_fixture()
    manifest = _run(config, [_write(tmp_path, "chat.jsonl", fixture)], tmp_path / "out")
    (entry,) = manifest["inputs"]
    assert {k: entry[k] for k in ("rows_read", "rows_written", "rows_dropped")} == _expected(fixture)
    assert entry["rows_truncated"] == 1
    stored = samples(tmp_path / "out")
    assert max(len(ids) for ids, _ in stored) == MAX_SEQ_LEN and all(mask.any() for _, mask in stored)


@pytest.mark.parametrize("max_items, read_a, read_b", [(3, 3, 0), (5, 4, 1), (100, 4, 2)])
def test_max_items_stops_after_that_many_rows(tmp_path: Path, max_items: int, read_a: int, read_b: int) -> None:
    # Malformed lines are rows too: they count toward max_items; blank lines do not.
    def doc(i: int, name: str) -> dict[str, str]:
        return _text(f"document {i} of file {name}, long enough to keep")

    a = write_jsonl(tmp_path / "a.jsonl", [doc(1, "a"), "{broken", "", doc(2, "a"), doc(3, "a")])
    b = write_jsonl(tmp_path / "b.jsonl", [doc(1, "b"), doc(2, "b")])
    config = {**TEXT_CONFIG, "preprocessing": {**TEXT_CONFIG["preprocessing"], "max_items": max_items}}
    manifest = _run(config, [a, b], tmp_path / "out", chunk_rows=2)
    assert [e["rows_read"] for e in manifest["inputs"]] == [read_a, read_b]
    assert manifest["totals"]["rows_read"] == min(max_items, 6)
    assert manifest["totals"]["rows_written"] == min(max_items, 6) - 1  # the broken line is dropped


def test_chat_dedup_ignores_a_long_shared_system_prompt(tmp_path: Path) -> None:
    # A dataset-wide system prompt longer than the 200-character prefix must not make every row a duplicate.
    system = "You are a careful assistant. " * 10
    rows = [
        (_chat(("system", system), ("user", "What is 2+2?"), ("assistant", "4")), KEPT),
        (_chat(("system", system), ("user", "What is 3+3?"), ("assistant", "6")), KEPT),
        (_chat(("system", "Another prompt."), ("user", "What is 2+2?"), ("assistant", "4")), Drop.DUPLICATE),
    ]
    config = {"input": {"type": "chat"}, "mask": {"assistant": "train"}}
    manifest = _run(config, [_write(tmp_path, "chat.jsonl", rows)], tmp_path / "out")
    (entry,) = manifest["inputs"]
    assert {k: entry[k] for k in ("rows_read", "rows_written", "rows_dropped")} == _expected(rows)


def test_a_chunk_of_empty_texts_is_counted_not_crashed(tmp_path: Path) -> None:
    config = {"input": {"type": "text", "append_eod": False}, "preprocessing": {"min_chars": 0}}
    rows = [({"text": ""}, Drop.TOO_SHORT), ({"text": ""}, Drop.TOO_SHORT)]
    manifest = _run(config, [_write(tmp_path, "empty.jsonl", rows)], tmp_path / "out")
    (entry,) = manifest["inputs"]
    assert {k: entry[k] for k in ("rows_read", "rows_written", "rows_dropped")} == _expected(rows)


def test_the_dedup_seen_set_spills_past_its_budget_and_decides_the_same(tmp_path: Path) -> None:
    from gpu_prep.filter.dedup import DIGEST, DigestSet

    rng = np.random.default_rng(3)
    pool = rng.integers(0, 256, size=(3000, 16), dtype=np.uint8).view(DIGEST).reshape(-1)
    free, capped = DigestSet(), DigestSet(budget_bytes=100 * 16, spill_dir=tmp_path)
    for _ in range(40):
        batch = pool[rng.integers(0, len(pool), 150)]  # repeats within and across batches
        assert np.array_equal(free.first_seen(batch), capped.first_seen(batch))
        assert sum(run.nbytes for run in capped.runs) <= 100 * 16
    assert len(capped.spilled) > 3 and all(p.exists() for p in capped.files())
    assert len(capped) == len(free) == len(np.unique(free.array()))
    (tmp_path / "again").mkdir()  # --resume's rebuild from the dedup log, a slice at a time
    resumed = DigestSet(free.array(), budget_bytes=100 * 16, spill_dir=tmp_path / "again")
    assert resumed.contains(pool).tolist() == free.contains(pool).tolist() and resumed.spilled


def test_a_run_whose_seen_set_spills_writes_what_one_in_memory_does(tmp_path: Path) -> None:
    rows = [_text(f"document {i % 300}: " + "word " * (20 + i % 300 % 7)) for i in range(900)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    outs = {}
    for memory in (None, 0.0002):  # 0.0002 MB: about 13 digests in memory
        config = {**TEXT_CONFIG, "preprocessing": {**TEXT_CONFIG["preprocessing"], "dedup_memory_mb": memory}}
        manifest = _run(config, [data], tmp_path / f"out-{memory}")
        outs[memory] = (manifest["totals"], (tmp_path / f"out-{memory}" / "__default__" / "sequence.bin").read_bytes())
    assert outs[None] == outs[0.0002] and outs[None][0]["rows_dropped"]["duplicate"] == 600
    assert not list((tmp_path / "out-0.0002").glob(".gpu-prep-seen*"))  # the spill files go with the run
