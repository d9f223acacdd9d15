"""Committing chunks in order (run/commit.py), the per-file accounting it keeps (run/accounting.py) and the
output directory's policy (run/outdir.py), each on its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from gpu_prep.errors import ConfigError, Drop, Dropped, InputError
from gpu_prep.output.writer import DatasetWriter
from gpu_prep.read.inputs import InputFile
from gpu_prep.run.accounting import PIECES, Accounting
from gpu_prep.run.commit import append_by_domain, count_trained_by_role
from gpu_prep.durable import JOURNAL, create, journal, write_json_atomic
from gpu_prep.run.outdir import MANIFEST, RUN_MARKER, check_output, prepare_output, remove_partial_files

FILES = [InputFile(0, "a.jsonl", 10), InputFile(1, "b.jsonl", 10)]


def test_each_domain_gets_its_samples_in_input_order(tmp_path: Path) -> None:
    writer = DatasetWriter(tmp_path, "bin", 1000)
    lengths = [2, 3, 1, 4]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.arange(offsets[-1], dtype=np.int64)
    append_by_domain(writer, [(None, "x"), (None, "y"), (None, "x"), (None, "y")], ids, np.ones(len(ids), np.int8),
                     offsets)
    domains = writer.finish()
    assert list(domains) == ["x", "y"]
    assert np.fromfile(tmp_path / "x" / "sequence.bin", "<i8").tolist() == [0, 1, 5]
    assert np.fromfile(tmp_path / "y" / "sequence.bin", "<i8").tolist() == [2, 3, 4, 6, 7, 8, 9]
    assert np.fromfile(tmp_path / "y" / "sample_offsets.bin", "<i8").tolist() == [0, 3, 7]
    # With splits, a split's domains live in its own folder: x of train and x of validation stay apart.
    split = DatasetWriter(tmp_path / "split", "bin", 1000)
    append_by_domain(split, [("train", "x"), ("validation", "x"), ("train", "x"), ("train", "y")], ids,
                     np.ones(len(ids), np.int8), offsets)
    assert sorted(split.finish()) == ["train/x", "train/y", "validation/x"]
    assert np.fromfile(tmp_path / "split" / "train" / "x" / "sequence.bin", "<i8").tolist() == [0, 1, 5]


def test_trained_tokens_are_counted_by_role_and_the_rest_as_whole_pieces() -> None:
    acct = Accounting(FILES)
    count_trained_by_role(acct, ["assistant", "tool", "assistant"], np.array([3, 0, 4]), trained=10)
    assert acct.trained_by_role == {"assistant": 7, PIECES: 3}


def test_accounting_sums_per_file_and_writes_rejects(tmp_path: Path) -> None:
    rejects = tmp_path / "rejects.jsonl"
    acct = Accounting(FILES, rejects=rejects)
    acct.read([0, 0, 1, 1, 1])
    acct.written(0, truncated=True)
    acct.written(1, truncated=False)
    acct.dropped(0, 2, Dropped(Drop.DUPLICATE, "dup"), {"text": "x"})
    acct.dropped(1, 5, Dropped(Drop.MALFORMED_JSON, "bad"), "{x")
    acct.dropped(1, 6, Dropped(Drop.TOO_SHORT, "short"), {"text": ""})
    assert not rejects.exists()  # appears only when the run closes
    acct.close()
    for entry in acct.per_file(["s0", "s1"]):
        assert entry["rows_read"] == entry["rows_written"] + sum(entry["rows_dropped"].values())
    assert acct.totals()["rows_truncated"] == 1
    lines = [orjson.loads(line) for line in rejects.read_bytes().splitlines()]
    assert [(e["file"], e["line"], e["reason"]) for e in lines] == [("a.jsonl", 2, "duplicate"),
                                                                   ("b.jsonl", 5, "malformed_json"),
                                                                   ("b.jsonl", 6, "too_short")]


def test_accounting_state_carries_on_where_it_stopped(tmp_path: Path) -> None:
    acct = Accounting(FILES, rejects=tmp_path / "r.jsonl")
    acct.read([0])
    acct.dropped(0, 1, Dropped(Drop.EMPTY, "empty"), {})
    state = orjson.loads(orjson.dumps(acct.state()))  # as a checkpoint stores it
    acct.abort(keep=True)
    again = Accounting(FILES, rejects=tmp_path / "r.jsonl", state=state)
    again.read([1])
    again.written(1, truncated=False)
    again.close()
    assert again.totals()["rows_read"] == 2 and again.totals()["rows_dropped"] == {"empty": 1}
    assert len((tmp_path / "r.jsonl").read_bytes().splitlines()) == 1


def test_strict_stops_at_bad_data_but_not_at_a_rule_the_row_merely_fails() -> None:
    acct = Accounting(FILES, strict=True)
    acct.dropped(0, 3, Dropped(Drop.DUPLICATE, "dup"))  # not bad data: counted
    with pytest.raises(InputError, match=r"a.jsonl:4: malformed json: oops"):
        acct.dropped(0, 4, Dropped(Drop.MALFORMED_JSON, "oops"))


def test_the_output_directory_policy(tmp_path: Path) -> None:
    out = tmp_path / "out"
    check_output(out, overwrite=False, resume=False)  # absent: fine
    prepare_output(out, overwrite=False)
    assert (out / RUN_MARKER).exists()
    with journal(out):  # what a run writes, it lists first
        (out / "d").mkdir()
        with create(out / "d" / ".sequence.bin.tmp") as handle:
            handle.write(b"partial")
        write_json_atomic(out / "d" / "meta.json", {})
        write_json_atomic(out / MANIFEST, {})
    (out / "d" / "notes.txt").write_text("mine")  # a user's files, beside and among the run's
    (out / "data.jsonl").write_text("mine too")
    with pytest.raises(ConfigError, match="not empty"):
        check_output(out, overwrite=False, resume=False)
    check_output(out, overwrite=True, resume=False)
    remove_partial_files(out)
    assert not (out / "d" / ".sequence.bin.tmp").exists() and (out / "d" / "meta.json").exists()
    prepare_output(out, overwrite=True)
    left = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert left == [JOURNAL, RUN_MARKER, "d/notes.txt", "data.jsonl"]  # only what the journal listed is gone
    (out / JOURNAL).unlink()  # an output whose writer kept no list: nothing can be told apart, nothing is removed
    (out / MANIFEST).write_text("{}")
    with pytest.raises(ConfigError, match="remove it yourself"):
        check_output(out, overwrite=True, resume=False)
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a gpu-prep run"):
        check_output(other, overwrite=True, resume=False)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        check_output(tmp_path / "file", overwrite=True, resume=False)
