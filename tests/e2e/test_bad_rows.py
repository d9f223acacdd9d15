"""The bad-row corpus (tests/data/bad_rows.jsonl, made by make_bad_rows.py): every row is written or
dropped for the reason written beside it, the rejects file says where and why, --strict stops at the
first bad row, and no domain value leads a file outside the output directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu_prep.config import parse_config
from gpu_prep.errors import InputError
from gpu_prep.pipeline import Options, run
from helpers import REPO, load_json

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

DATA = REPO / "tests" / "data"
CORPUS = DATA / "bad_rows.jsonl"


def _run(tmp_path: Path, **options: Any) -> dict[str, Any]:
    config = parse_config(load_json(DATA / "bad_rows.config.json"))
    return run(config, [str(CORPUS)], tmp_path / "out", Options(**options))


def test_every_row_meets_the_fate_written_beside_it(tmp_path: Path) -> None:
    expected = {int(n): fate for n, fate in load_json(DATA / "bad_rows.expected.json").items()}
    manifest = _run(tmp_path, rejects=tmp_path / "rejects.jsonl")
    rejects = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text(encoding="utf-8").splitlines()]
    assert {r["line"]: r["reason"] for r in rejects} == {n: f for n, f in expected.items() if f != "written"}
    assert all(r["file"] == str(CORPUS) and r["detail"] for r in rejects)
    assert len(rejects) == len({r["line"] for r in rejects})  # one fate per row
    totals = manifest["totals"]
    assert totals["rows_read"] == len(expected)
    assert totals["rows_written"] == sum(f == "written" for f in expected.values())
    assert totals["rows_read"] == totals["rows_written"] + sum(totals["rows_dropped"].values())
    assert totals["messages_left_out_by_template"] == {"knowledge": 1}
    assert totals["parse_report"]["unknown_roles"] == {"knowledge": 1}


def test_domain_values_stay_inside_the_output_and_apart(tmp_path: Path) -> None:
    manifest = _run(tmp_path)
    out = (tmp_path / "out").resolve()
    written = [p for p in out.rglob("*") if p.is_file()]
    assert all(p.resolve().is_relative_to(out) for p in written)
    assert not (tmp_path / "x").exists() and not (tmp_path / "etc").exists()
    directories = list(manifest["domains"])
    assert len(set(directories)) == len(directories)
    assert all(0 < len(d) <= 80 and "/" not in d and not d.startswith(".") and d != "manifest.json"
               for d in directories)
    values = {meta["domain"] for meta in manifest["domains"].values()}
    assert {"../x", "/etc", "", "a/b", "a_b", "a?b", "d" * 300, "..", "manifest.json", "main"} <= values
    for directory, meta in manifest["domains"].items():  # each directory holds its own domain's samples
        assert load_json(out / directory / "meta.json")["domain"] == meta["domain"]


def test_strict_stops_at_the_first_bad_row_naming_file_and_line(tmp_path: Path) -> None:
    first_bad = min(int(n) for n, f in load_json(DATA / "bad_rows.expected.json").items() if f != "written")
    with pytest.raises(InputError) as caught:
        _run(tmp_path, strict=True)
    assert f"{CORPUS}:{first_bad}: malformed json" in str(caught.value)


def test_a_domain_is_a_string_or_an_integer_and_the_drop_says_so() -> None:
    from gpu_prep.format import RowError, domain_of

    assert domain_of({"source": 5}, "source") == domain_of({"source": "5"}, "source") == "5"
    for value in (5.0, True, ["a"], {"name": "a"}):
        with pytest.raises(RowError, match=r"must be a string or an integer \(5 is the domain '5'\)"):
            domain_of({"source": value}, "source")
