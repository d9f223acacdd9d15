"""Every input format gpu-prep reads gives the shards the same rows give as JSON Lines, byte for byte; a
file whose name gpu-prep does not know, or whose content is not what its name says, stops the run before
anything is written; paths inside a config file are the config file's.

The formats are written here with the libraries users write them with: pyarrow (Parquet, Arrow IPC file
and stream, Feather, CSV), the standard library (gzip, bz2, xz; TSV; plain text) and datasets
(save_to_disk folders and a DatasetDict).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from corpora import sharegpt_chats
from gpu_prep.config import load_config, parse_config
from gpu_prep.errors import ConfigError, InputError
from gpu_prep.pipeline import Options, run
from gpu_prep.read.inputs import expand_inputs
from gpu_prep.read.rows import file_rows
from gpu_prep.read.detect import inspect_file
from gpu_prep.read.files import split_name
from helpers import REPO, write_jsonl

ROWS = 120


def chat_rows() -> list[dict[str, Any]]:
    return [{"messages": c["messages"]} for c in sharegpt_chats(ROWS)]


def instruction_rows() -> list[dict[str, Any]]:
    return [{"prompt": c["messages"][0]["content"], "response": c["messages"][1]["content"]}
            for c in sharegpt_chats(ROWS) if len(c["messages"]) > 1 and c["messages"][0]["role"] == "user"]


def text_rows() -> list[dict[str, Any]]:
    return [{"text": m["content"]} for c in sharegpt_chats(ROWS) for m in c["messages"][:2]]


KINDS = {
    "chat": ({"input": {"type": "chat"}, "mask": {"assistant": "train"}}, chat_rows),
    "instruction": ({"input": {"type": "instruction"}, "mask": {"prompt": "mask", "response": "train"}}, instruction_rows),
    "text": ({"input": {"type": "text"}, "preprocessing": {"min_chars": 1}}, text_rows),
}


def _flat(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Rows as string columns (messages as JSON text), for the formats that hold text only."""
    return [{k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for k, v in r.items()} for r in rows]


def _table(rows: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    return pa.Table.from_pylist(rows)


def _write_compressed(opener: Callable, suffix: str) -> Callable:
    def write(rows: list[dict[str, Any]], folder: Path) -> list[str]:
        path = folder / f"data.jsonl{suffix}"
        with opener(path, "wt", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        return [str(path)]
    return write


def _zstd(rows: list[dict[str, Any]], folder: Path) -> list[str]:
    import pyarrow as pa

    path = folder / "data.jsonl.zst"
    with pa.output_stream(str(path), compression="zstd") as out:
        out.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())
    return [str(path)]


def _json_array(rows: list[dict[str, Any]], folder: Path) -> list[str]:
    path = folder / "data.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        json.dump(rows, handle, ensure_ascii=False, indent=2)
    return [str(path)]


def _parquet(rows: list[dict[str, Any]], folder: Path) -> list[str]:
    import pyarrow.parquet as pq

    pq.write_table(_table(rows), folder / "data.parquet", row_group_size=37)
    return [str(folder / "data.parquet")]


def _arrow(stream: bool, suffix: str) -> Callable:
    def write(rows: list[dict[str, Any]], folder: Path) -> list[str]:
        import pyarrow as pa
        import pyarrow.ipc as ipc

        table = _table(rows)
        path = folder / f"data{suffix}"
        with pa.OSFile(str(path), "wb") as sink:
            writer = (ipc.new_stream if stream else ipc.new_file)(sink, table.schema)
            writer.write_table(table, max_chunksize=29)
            writer.close()
        return [str(path)]
    return write


def _csv(delimiter: str, suffix: str, opener: Callable = open) -> Callable:
    def write(rows: list[dict[str, Any]], folder: Path) -> list[str]:
        path = folder / f"data{suffix}"
        flat = _flat(rows)
        with opener(path, "wt", encoding="utf-8", newline="") as handle:
            out = csv.DictWriter(handle, fieldnames=list(flat[0]), delimiter=delimiter)
            out.writeheader()
            out.writerows(flat)
        return [str(path)]
    return write


def _save_to_disk(rows: list[dict[str, Any]], folder: Path) -> list[str]:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(folder / "saved"), max_shard_size="20KB")
    return [str(folder / "saved")]


def _dataset_dict(rows: list[dict[str, Any]], folder: Path) -> list[str]:
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "test": datasets.Dataset.from_list(rows[:3])}).save_to_disk(str(folder / "dict"))
    return [str(folder / "dict")]


WRITERS = {
    "jsonl.gz": _write_compressed(gzip.open, ".gz"),
    "jsonl.bz2": _write_compressed(bz2.open, ".bz2"),
    "jsonl.xz": _write_compressed(lzma.open, ".xz"),
    "jsonl.zst": _zstd,
    "json-array.gz": _json_array,
    "parquet": _parquet,
    "arrow-stream": _arrow(True, ".arrow"),
    "arrow-file": _arrow(False, ".arrow"),
    "feather": _arrow(False, ".feather"),
    "csv": _csv(",", ".csv"),
    "tsv.gz": _csv("\t", ".tsv.gz", gzip.open),
    "save_to_disk": _save_to_disk,
    "dataset_dict": _dataset_dict,
}


def _shards(manifest: dict[str, Any]) -> dict[str, list[str]]:
    return {name: [s["sha256"] for s in meta["shards"]] for name, meta in manifest["domains"].items()}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("layout", sorted(WRITERS))
def test_every_format_writes_the_shards_json_lines_does(kind: str, layout: str, tmp_path: Path) -> None:
    settings, make = KINDS[kind]
    rows = make()
    config = parse_config({**settings, "preprocessing": {**settings.get("preprocessing", {}), "deduplicate": False}})
    want = run(config, [str(write_jsonl(tmp_path / "rows.jsonl", rows))], tmp_path / "want", Options(chunk_rows=50))
    folder = tmp_path / layout
    folder.mkdir()
    inputs = WRITERS[layout](rows, folder)
    got = run(config, inputs, tmp_path / "got", Options(chunk_rows=50))
    assert got["totals"]["rows_read"] == want["totals"]["rows_read"] == len(rows)
    assert got["totals"]["rows_dropped"] == want["totals"]["rows_dropped"]
    assert _shards(got) == _shards(want)


def test_plain_text_a_document_per_file_or_per_line(tmp_path: Path) -> None:
    docs = [r["text"] for r in text_rows()[:40]]
    config = parse_config({"input": {"type": "text"}, "preprocessing": {"min_chars": 1, "deduplicate": False}})
    for k, doc in enumerate(docs):
        (tmp_path / f"doc{k:03d}.txt").write_text(doc, encoding="utf-8")
    want = run(config, [str(write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in docs]))], tmp_path / "want")
    got = run(config, [str(tmp_path / "doc*.txt")], tmp_path / "got")
    assert _shards(got) == _shards(want)
    lines = [line for d in docs for line in d.splitlines() if line.strip()]
    with bz2.open(tmp_path / "lines.txt.bz2", "wt", encoding="utf-8") as handle:
        handle.write("\n".join(docs))
    per_line = parse_config({"input": {"type": "text", "text_rows": "line", "text_key": "content"},
                             "preprocessing": {"min_chars": 1, "deduplicate": False}})
    got = run(per_line, [str(tmp_path / "lines.txt.bz2")], tmp_path / "lines")
    want = run(per_line, [str(write_jsonl(tmp_path / "l.jsonl", [{"content": line} for line in lines]))],
               tmp_path / "lines-want")
    assert _shards(got) == _shards(want) and got["totals"]["rows_written"] == len(lines)


def test_a_dataset_dict_reads_the_split_asked_for(tmp_path: Path) -> None:
    rows = text_rows()
    _dataset_dict(rows, tmp_path)
    config = {"input": {"type": "text"}, "preprocessing": {"min_chars": 1, "deduplicate": False}}
    test = run(parse_config({**config, "input": {"type": "text", "split": "test"}}), [str(tmp_path / "dict")], tmp_path / "t")
    assert test["totals"]["rows_read"] == 3
    with pytest.raises(ConfigError, match="the splits train, test; input.split 'dev' is not one of them"):
        run(parse_config({**config, "input": {"type": "text", "split": "dev"}}), [str(tmp_path / "dict")], tmp_path / "d")
    # An input without splits does not quietly read all of itself for a split named.
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"text": "a document"}])
    with pytest.raises(ConfigError, match="input.split 'test' names a split, and a file has none"):
        run(parse_config({**config, "input": {"type": "text", "split": "test"}}), [str(plain)], tmp_path / "p")


def test_a_folder_of_splits_read_as_its_default_says_which_and_what_it_leaves(tmp_path: Path) -> None:
    # train is read by default (documented), but load_from_disk gives every split, so a user may not know
    # that test is left: run and validate say so, and the manifest records it with the other inputs left
    # out; a split named in the config is what was asked for, and is not remarked on.
    from typer.testing import CliRunner

    from gpu_prep.cli import app

    _dataset_dict(text_rows(), tmp_path)
    folder = str(tmp_path / "dict")
    settings = {"input": {"type": "text"}, "preprocessing": {"min_chars": 1, "deduplicate": False}}
    (tmp_path / "text.json").write_text(json.dumps(settings), encoding="utf-8")
    said = f"input folder {folder!r}: read split 'train'; it also holds 'test' (input.split names another)"
    for command in (["run", folder, "-o", tmp_path / "out"], ["validate", folder]):
        result = CliRunner().invoke(app, [*map(str, command), "-c", str(tmp_path / "text.json")])
        assert result.exit_code == 0 and said in " ".join(result.stderr.split()), result.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["inputs_left_out"] == {folder: {"split_read": "train", "splits_not_read": ["test"]}}
    asked = run(parse_config({**settings, "input": {"type": "text", "split": "train"}}), [folder], tmp_path / "asked")
    assert "inputs_left_out" not in asked


def test_a_datasets_cache_folder_reads_one_split_not_all(tmp_path: Path) -> None:
    # The folder load_dataset leaves in its cache holds every split's Arrow files beside dataset_info.json:
    # it used to be read whole, the test split first (and with dedup the train rows dropped as its repeats).
    datasets = pytest.importorskip("datasets")
    rows = {"train": [{"text": f"train document {i}"} for i in range(5)],
            "test": [{"text": f"test document {i}"} for i in range(3)]}
    files = {name: str(write_jsonl(tmp_path / f"{name}.jsonl", r)) for name, r in rows.items()}
    loaded = datasets.load_dataset("json", data_files=files, cache_dir=str(tmp_path / "cache"))
    folder = Path(loaded["train"].cache_files[0]["filename"]).parent
    config = {"input": {"type": "text"}, "preprocessing": {"min_chars": 1, "deduplicate": False}}
    for split, want in (("train", 5), ("test", 3), (None, 5)):
        inp = {"type": "text", **({"split": split} if split else {})}
        got = run(parse_config({**config, "input": inp}), [str(folder)], tmp_path / f"o-{split}")
        assert got["totals"]["rows_read"] == want and [i["path"].endswith(f"-{split or 'train'}.arrow") for i in got["inputs"]] == [True]
        assert got.get("inputs_left_out") == (None if split else {str(folder): {"split_read": "train",
                                                                               "splits_not_read": ["test"]}})
    with pytest.raises(ConfigError, match="a datasets cache folder with the splits train, test; input.split 'dev'"):
        run(parse_config({**config, "input": {"type": "text", "split": "dev"}}), [str(folder)], tmp_path / "o-dev")


def test_datasets_folders_inside_a_folder_read_one_split_each(tmp_path: Path) -> None:
    # A project folder holding a DatasetDict and a load_dataset cache root (and a file of its own): each
    # datasets folder in it is read as when given itself, train by default, the splits left named in the
    # manifest. It used to be read file by file: the test split into the training shards with no word, and
    # dataset_dict.json dropped as a row.
    datasets = pytest.importorskip("datasets")
    project = tmp_path / "project"
    _dataset_dict(text_rows(), project)
    files = {name: str(write_jsonl(tmp_path / f"{name}.jsonl", [{"text": f"{name} document {i}"} for i in range(n)]))
             for name, n in (("train", 5), ("test", 3))}
    cache = Path(datasets.load_dataset("json", data_files=files, cache_dir=str(project / "cache"))["train"]
                 .cache_files[0]["filename"]).parent
    write_jsonl(project / "extra.jsonl", [{"text": "a document of its own"}])
    config = {"input": {"type": "text"}, "preprocessing": {"min_chars": 1, "deduplicate": False}}
    got = run(parse_config(config), [str(project)], tmp_path / "out")
    read = {Path(i["path"]).relative_to(project).as_posix(): i["rows_read"] for i in got["inputs"]}
    assert {k: v for k, v in read.items() if not k.startswith("cache/")} == {
        "dict/train/data-00000-of-00001.arrow": len(text_rows()), "extra.jsonl": 1}
    assert [v for k, v in read.items() if k.startswith("cache/")] == [5] and got["totals"]["rows_written"] == sum(read.values())
    assert {k: v for k, v in got["inputs_left_out"].items() if "files" not in v} == {
        str(project / "dict"): {"split_read": "train", "splits_not_read": ["test"]},
        str(cache): {"split_read": "train", "splits_not_read": ["test"]}}
    # input.split for such a folder: the files beside its datasets folders have no split, and are refused
    test = parse_config({**config, "input": {"type": "text", "split": "test"}})
    with pytest.raises(ConfigError, match="input.split 'test' names a split, and extra.jsonl in this folder have none"):
        run(test, [str(project)], tmp_path / "test")
    (project / "extra.jsonl").unlink()
    assert sorted(i["rows_read"] for i in run(test, [str(project)], tmp_path / "test")["inputs"]) == [3, 3]


# ---------------------------------------------------------------- refusing what cannot be read


def _refused(tmp_path: Path, name: str, content: bytes, match: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    out = tmp_path / f"out-{name}"
    with pytest.raises(ConfigError, match=match) as caught:
        run(parse_config({"input": {"type": "text"}}), [str(path)], out)
    assert str(path) in str(caught.value)
    assert not out.exists(), "a refused input must leave nothing behind"


def test_a_parquet_or_arrow_file_naming_a_column_twice_is_refused(tmp_path: Path) -> None:
    # As a CSV header naming a column twice is: a row holds one value per key, so the last column won unseen.
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    table = pa.Table.from_arrays([pa.array(["first"]), pa.array(["second"])], names=["text", "text"])
    pq.write_table(table, tmp_path / "dup.parquet")
    feather.write_feather(table, tmp_path / "dup.feather")
    for name in ("dup.parquet", "dup.feather"):
        with pytest.raises(ConfigError, match="its schema names the column 'text' more than once; one of them would be lost"):
            run(parse_config({"input": {"type": "text"}}), [str(tmp_path / name)], tmp_path / f"out-{name}")
        assert not (tmp_path / f"out-{name}").exists()


@pytest.mark.parametrize("name", ["cells.parquet", "cells.arrow"])
def test_a_cell_that_is_not_utf8_drops_its_row_naming_the_column(tmp_path: Path, name: str) -> None:
    # pyarrow writes strings without checking them: one bad cell, even in a column the config never reads,
    # stopped the whole run ("the file is damaged or cut short", naming the first row of its row group).
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    values = [f"meta {i}".encode() for i in range(100)]
    values[57] = b"bad \xfe here"
    table = pa.table({"text": [f"document {i}" for i in range(100)],
                      "unused": pa.array(values, pa.binary()).view(pa.string())})
    if name.endswith(".parquet"):
        pq.write_table(table, tmp_path / name, row_group_size=10)
    else:
        feather.write_feather(table, tmp_path / name, chunksize=10)
    rejects = tmp_path / "rejects.jsonl"
    got = run(parse_config({"input": {"type": "text"}, "preprocessing": {"min_chars": 0}}), [str(tmp_path / name)],
              tmp_path / "out", Options(rejects=rejects))
    assert got["totals"]["rows_written"] == 99 and got["totals"]["rows_dropped"] == {"malformed_row": 1}
    entry = json.loads(rejects.read_text(encoding="utf-8"))
    assert entry["line"] == 58 and entry["detail"] == ("column 'unused' holds text that is not UTF-8: byte 0xfe at "
                                                       "offset 4 of a value")
    assert entry["row"] == {"text": "document 57", "unused": "bad \ufffd here"} and "5" in entry["where"]


def test_unknown_and_mislabelled_files_stop_the_run_naming_the_file(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(_table([{"text": "a"}]), tmp_path / "real.parquet")
    parquet = (tmp_path / "real.parquet").read_bytes()
    _refused(tmp_path, "data.xlsx", b"PK\x03\x04", "not a format gpu-prep reads by its name")
    _refused(tmp_path, "data", b'{"text": "no extension"}\n', "not a format gpu-prep reads by its name")
    _refused(tmp_path, "table.jsonl", parquet, "named as JSON.*holds Parquet")
    _refused(tmp_path, "export.csv", parquet, "named as CSV text, but it holds Parquet")
    _refused(tmp_path, "rows.jsonl", b"name,age\nann,3\n", "named as JSON Lines, but it holds text starting 'name,age")
    _refused(tmp_path, "rows.json", b"name,age\nann,3\n", "named as JSON, but it holds text starting 'name,age")
    _refused(tmp_path, "cache.arrow", b'{"text": "json"}\n', "named as Arrow, but it holds text")
    _refused(tmp_path, "data.parquet", b'{"text": "json"}\n', "named as Parquet, but it holds text")
    _refused(tmp_path, "rows.jsonl.gz", b'{"text": "not compressed"}\n', "named as gzip-compressed, but it holds text")
    _refused(tmp_path, "rows.jsonl.zst", gzip.compress(b'{"a": 1}\n'), "named as zstd-compressed, but it holds gzip")
    _refused(tmp_path, "data.parquet.gz", gzip.compress(parquet), "not a format gpu-prep reads by its name")


def test_formats_by_name() -> None:
    assert split_name("a/b.JSONL.GZ") == ("jsonl", "gzip")
    assert split_name("x.tsv.xz") == ("tsv", "xz") and split_name("x.arrow") == ("arrow", None)
    assert split_name("x.parquet.zst") == (None, None) and split_name("x.csv.7z") == (None, None)


def test_a_json_named_file_of_lines_is_read_as_lines(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "lines.json", [{"text": "one"}, {"text": "two"}])
    assert inspect_file(str(path), "json", None)[0] == "jsonl"


# ---------------------------------------------------------------- paths inside a config


def test_paths_in_a_config_are_the_config_files(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    write_jsonl(project / "data" / "a.jsonl", [{"text": "first document, long enough"}])
    (project / "template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    config = {"chat_template": "template.jinja", "input": {"type": "text"}, "preprocessing": {"min_chars": 1},
              "datasets": [{"name": "a", "data_paths": ["data/*.jsonl"]}]}
    (project / "config.json").write_text(json.dumps(config))
    loaded = load_config(project / "config.json")
    assert loaded.datasets[0].data_paths == [str(project / "data" / "*.jsonl")]
    assert loaded.chat_template == str(project / "template.jinja")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run([str(Path(sys.executable).parent / "gpu-prep"), "run", "-c", str(project / "config.json"),
                             "-o", "out"], cwd=elsewhere, capture_output=True, text=True, timeout=300,
                            env={**os.environ})
    assert result.returncode == 0, result.stderr
    assert json.loads((elsewhere / "out" / "manifest.json").read_text())["totals"]["rows_written"] == 1
    # A --set value is the command line's: relative to where the command runs, not to the config's folder.
    (elsewhere / "mine.jinja").write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    moved = os.getcwd()
    try:
        os.chdir(elsewhere)
        assert load_config(project / "config.json", ["chat_template=mine.jinja"]).chat_template == "mine.jinja"
    finally:
        os.chdir(moved)


def test_set_reaches_into_the_datasets_list_by_index_or_name() -> None:
    # --set datasets.1.weight=... or datasets.web.sampling_ratio=...: a list is indexed from 0 or by an entry's
    # name; anything else names the list and what it takes, instead of replacing the list with a mapping.
    path = REPO / "configs" / "mix.yaml"
    loaded = load_config(path, ["datasets.1.sampling=0.25", "datasets.chat.sampling=0.55",
                                "datasets.web.input.text_key=body", "datasets.alpaca.data_handlers.0.arguments.fn_kwargs.max_length=99"])
    assert [d.sampling for d in loaded.datasets] == [0.55, 0.25, 0.2]
    assert loaded.datasets[2].input["text_key"] == "body" and loaded.datasets[2].input["type"] == "text"
    assert loaded.datasets[1].data_handlers[0].arguments["fn_kwargs"] == {"column_name": "output", "max_length": 99}
    assert [d.sampling for d in load_config(path).datasets] == [0.5, 0.3, 0.2]  # the file's, untouched
    with pytest.raises(ConfigError, match=r"the config has no list datasets\.chat\.data_handlers to index; give it "
                                          r"whole, e\.g\. --set 'datasets\.chat\.data_handlers=\[\.\.\.\]'"):
        load_config(path, ["datasets.chat.data_handlers.0.name=skip_large_text"])
    with pytest.raises(ConfigError, match=r"datasets\.alpaca\.data_handlers is an empty list; give it whole"):
        load_config(path, ["datasets.alpaca.data_handlers=[]", "datasets.alpaca.data_handlers.0.name=x"])
    for wrong in ("datasets.7.sampling=1", "datasets.nope.sampling=1"):
        with pytest.raises(ConfigError, match=r"datasets is a list of 3; give an index from 0 to 2 or a name "
                                              r"\(chat, alpaca, web\)"):
            load_config(path, [wrong])


def test_the_shipped_dataset_configs_run_from_anywhere(tmp_path: Path) -> None:
    loaded = load_config(REPO / "configs" / "mix.yaml")
    assert all(Path(p).is_absolute() for d in loaded.datasets for p in d.data_paths)


# ---------------------------------------------------------------- URLs and hub datasets


def test_urls_are_read_through_fsspec_as_local_files_are(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    settings, make = KINDS["instruction"]
    rows = make()
    config = parse_config({**settings, "preprocessing": {"deduplicate": False}})
    want = run(config, [str(write_jsonl(tmp_path / "rows.jsonl", rows))], tmp_path / "want")
    local = tmp_path / "local"
    local.mkdir()
    memory = fsspec.filesystem("memory")
    for layout in ("jsonl.gz", "parquet", "arrow-stream", "csv"):
        for path in WRITERS[layout](rows, local):
            memory.pipe(f"/bucket/{layout}/{Path(path).name}", Path(path).read_bytes())
    for layout in ("jsonl.gz", "parquet", "arrow-stream", "csv"):
        got = run(config, [f"memory://bucket/{layout}/"], tmp_path / f"got-{layout}")
        assert _shards(got) == _shards(want), layout
        assert got["inputs"][0]["path"].startswith("memory://") and got["inputs"][0]["sha256"] is None
    globbed = run(config, ["memory://bucket/*/data.parquet"], tmp_path / "glob")
    assert _shards(globbed) == _shards(want)
    by_file_url = run(config, [f"file://{local}/data.parquet"], tmp_path / "file-url")
    assert _shards(by_file_url) == _shards(want)
    with pytest.raises(ConfigError, match="memory://bucket/nothing.jsonl"):
        run(config, ["memory://bucket/nothing.jsonl"], tmp_path / "none")


def test_a_url_that_cannot_be_reached_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # fsspec's FTP filesystem connects as it is made: the refused connection, or a host not found, was said
    # as "[Errno 111] Connection refused" naming no input (a traceback under validate).
    fsspec = pytest.importorskip("fsspec")
    from gpu_prep.commands.validate import check_sample

    config = parse_config(KINDS["text"][0])
    for url in ("ftp://127.0.0.1:1/data.jsonl", "ftp://127.0.0.1:1/*.jsonl"):  # port 1: nothing listens
        with pytest.raises(ConfigError, match=rf"^input '{url.replace('*', '[*]')}': cannot be reached \(.*refused"):
            run(config, [url], tmp_path / "out")
        with pytest.raises(ConfigError, match=rf"^input '{url.replace('*', '[*]')}': cannot be reached"):
            check_sample(config, [url], 10)
    # a filesystem made, then refusing the listing (an S3 bucket not the user's)
    fsspec.filesystem("memory").pipe("/locked/data.jsonl", b'{"text": "a"}\n')
    monkeypatch.setattr(type(fsspec.filesystem("memory")), "exists", lambda self, path: (_ for _ in ()).throw(
        PermissionError("Access Denied")))
    with pytest.raises(ConfigError, match=r"^input 'memory://locked/data\.jsonl': cannot be reached \(Access Denied\)"):
        run(config, ["memory://locked/data.jsonl"], tmp_path / "out")


def test_a_folder_by_url_is_read_by_the_rules_of_a_local_folder(tmp_path: Path) -> None:
    # A notebook's stale copy under .ipynb_checkpoints, the datasets library's metadata and cache-*.arrow
    # files, a file of no known format: over a URL as on disk, none is read (they were, without a word).
    # file:// is a local path; a DatasetDict by URL is refused, and input.split with a URL too.
    fsspec = pytest.importorskip("fsspec")
    settings, make = KINDS["instruction"]
    rows = make()
    config = parse_config({**settings, "preprocessing": {"deduplicate": False}})
    local = tmp_path / "data"
    local.mkdir()
    want = run(config, [str(write_jsonl(local / "part.jsonl", rows))], tmp_path / "want")
    (local / ".ipynb_checkpoints").mkdir()
    write_jsonl(local / ".ipynb_checkpoints" / "part-checkpoint.jsonl", rows[:5])
    (local / "notes.md").write_text("# notes\n")
    saved = Path(_save_to_disk(rows, local)[0])  # a .map() leaves its cache-*.arrow beside the data
    (saved / "cache-0123.arrow").write_bytes(next(saved.glob("data-*.arrow")).read_bytes())
    memory = fsspec.filesystem("memory")
    for path in local.rglob("*"):
        if path.is_file():
            memory.pipe(f"/folder/{path.relative_to(local).as_posix()}", path.read_bytes())
    for given in ("memory://folder/", f"file://{local}"):
        got = run(config, [given], tmp_path / f"got-{given.split(':')[0]}")
        assert got["totals"]["rows_read"] == 2 * len(rows), given  # part.jsonl and the saved dataset's Arrow file
        assert _shards(got) == _shards(run(config, [str(local / "part.jsonl"), str(local / "saved")],
                                           tmp_path / f"local-{given.split(':')[0]}"))
        [(folder, unread)] = got["inputs_left_out"].items()
        assert unread["files"] == 1 and unread["first"][0].endswith("/notes.md"), (given, folder, unread)
    assert _shards(want)
    with pytest.raises(ConfigError, match="are the same file"):
        run(config, [str(local / "part.jsonl"), f"file://{local}/part.jsonl"], tmp_path / "twice")
    memory.pipe("/dict/dataset_dict.json", b'{"splits": ["train"]}')
    memory.pipe("/dict/train/data.jsonl", (local / "part.jsonl").read_bytes())
    with pytest.raises(ConfigError, match="holds a DatasetDict"):
        run(config, ["memory://dict/"], tmp_path / "dict")
    split = parse_config({**settings, "input": {**settings["input"], "split": "train"}})
    with pytest.raises(ConfigError, match="input.split 'train' names a split, and a URL has none"):
        run(split, ["memory://folder/"], tmp_path / "split")


def test_a_hub_dataset_entry_streams_through_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # Both libraries read those once, as they are imported (here, maybe before this test): offline now too, or
    # the missing dataset below is asked of the hub, with retries (23 s where no network answers).
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True)
    settings, make = KINDS["text"]
    rows = make()
    repo = tmp_path / "org-corpus"
    (repo / "data").mkdir(parents=True)
    write_jsonl(repo / "data" / "train.jsonl", rows)
    write_jsonl(repo / "data" / "test.jsonl", rows[:5])
    config = {**settings, "preprocessing": {"min_chars": 1, "deduplicate": False}}
    want = run(parse_config(config), [str(repo / "data" / "train.jsonl")], tmp_path / "want")
    hub = {"name": str(repo), "split": "train"}
    got = run(parse_config({**config, "datasets": [{"name": "corpus", "hub": hub}]}), [], tmp_path / "got")
    assert _shards(got) == {"corpus": _shards(want)["__default__"]}  # a dataset's domain is its name
    assert got["inputs"][0]["path"] == f"hub:{repo}:train"
    # Its version (the files datasets reads it from) is recorded, and a resume compares it: a dataset that
    # changed between a stop and --resume would give shards of two versions.
    from gpu_prep.run.checkpoint import run_identity
    from gpu_prep.run.context import hub_input

    version = got["inputs"][0]["version"]
    before = run_identity("c", [hub_input(hub, 0)], {"sha256": "t"})
    assert version and before["inputs"][0][2] == version
    write_jsonl(repo / "data" / "train.jsonl", [{**rows[0], "text": "changed " + rows[0]["text"]}, *rows[1:]])
    assert run_identity("c", [hub_input(hub, 0)], {"sha256": "t"}) != before
    with pytest.raises(ConfigError, match="hub dataset 'nobody/nothing': cannot load it"):
        run(parse_config({**config, "datasets": [{"name": "x", "hub": {"name": "nobody/nothing"}}]}), [], tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_hub_dataset_that_breaks_part_way_names_itself_and_its_last_row(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # A cache file cut short under datasets: pyarrow's error alone named neither the dataset nor the row.
    import gpu_prep.read.hub as hub
    import gpu_prep.run.context as context

    def broken(arguments: dict[str, Any]) -> Any:
        yield from ({"text": f"row {k} of the hub dataset"} for k in range(3))
        raise OSError("Expected to be able to read 7624 bytes for message body, got 7260")

    monkeypatch.setattr(hub, "hub_dataset", broken)
    monkeypatch.setattr(context, "hub_dataset", broken)
    config = {**KINDS["text"][0], "datasets": [{"name": "web", "hub": {"name": "acme/web", "split": "train"}}]}
    with pytest.raises(InputError, match=r"hub:acme/web:train: cannot read beyond row 3 \(OSError: Expected to be.*; "
                                         r"the dataset cannot be read on \(a damaged cache file, or rows of another"):
        run(parse_config(config), [], tmp_path / "out")


def test_a_dropped_columnar_row_is_located_by_row_group_or_record_batch(tmp_path: Path) -> None:
    rows = [{"text": f"row number {k} is long enough"} for k in range(100)]
    rows[41] = {"text": None}  # a null text: wrong_type
    files = _parquet(rows, tmp_path) + _arrow(True, ".arrow")(rows, tmp_path) + _json_array(rows, tmp_path)
    config = parse_config({"input": {"type": "text"}, "preprocessing": {"min_chars": 1}})
    for path, where in zip(files, ["row group 1, row 4", "record batch 1, row 12", "array index 41"]):
        out = tmp_path / f"out-{Path(path).name}"
        rejects = tmp_path / f"{Path(path).name}.rejects.jsonl"
        manifest = run(config, [path], out, Options(rejects=rejects))
        [entry] = [json.loads(line) for line in rejects.read_text().splitlines()]
        assert (entry["line"], entry["where"], entry["reason"]) == (42, where, "wrong_type"), path
        assert manifest["totals"]["rows_written"] == 99


@pytest.mark.parametrize("lists", ["list", "large_list"])
def test_parquet_categoricals_in_a_list_of_structs_over_row_groups_read_as_plain_text(lists: str, tmp_path: Path) -> None:
    # What Polars and pandas write for a categorical role: a dictionary in a list of structs. pyarrow cannot
    # read such a column over several row groups at once (it raised ArrowNotImplementedError, a traceback);
    # read a group at a time, the rows are those of the same data without the dictionary, on the host and
    # with the text columns beside it read as the device reads them.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpu_prep.read.columnar import batch_rows, parquet_rows

    rows = [{**r, "source": f"s{k % 3}"} for k, r in enumerate(chat_rows())]
    listed = pa.large_list if lists == "large_list" else pa.list_
    plain = pa.Table.from_pylist(rows, pa.schema([("messages", listed(pa.struct([("role", pa.string()),
                                                                                ("content", pa.string())]))),
                                                  ("source", pa.string())]))
    categorical = plain.cast(pa.schema([("messages", listed(pa.struct([("role", pa.dictionary(pa.int8(), pa.string())),
                                                                      ("content", pa.string())]))),
                                        ("source", pa.string())]))
    pq.write_table(plain, tmp_path / "plain.parquet", row_group_size=37)
    pq.write_table(categorical, tmp_path / "categorical.parquet", row_group_size=37)
    path = str(tmp_path / "categorical.parquet")
    assert [r.record for r in batch_rows(path, "parquet")] == rows
    device = lambda path, groups, columns: pq.ParquetFile(path).read_row_groups(groups, columns=columns)  # noqa: E731
    assert [r.record for r in parquet_rows(path, device)] == rows
    config = parse_config({**KINDS["chat"][0], "preprocessing": {"deduplicate": False}})
    want = run(config, [str(tmp_path / "plain.parquet")], tmp_path / "want", Options(chunk_rows=50))
    got = run(config, [path], tmp_path / "got", Options(chunk_rows=50))
    assert got["totals"]["rows_read"] == want["totals"]["rows_read"] == len(rows)
    assert _shards(got) == _shards(want)


@pytest.mark.parametrize("failure", ["damaged page", "not implemented"])
def test_a_parquet_row_group_pyarrow_cannot_read_stops_the_run_naming_file_and_group(
        failure: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Not a traceback, and not the rows before it taken for the whole file: the run stops naming the group.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpu_prep.errors import InputError

    [path] = _parquet([{"text": f"row number {k} is long enough"} for k in range(100)], tmp_path)
    if failure == "damaged page":  # row group 2's first page header overwritten
        column = pq.ParquetFile(path).metadata.row_group(2).column(0)
        at = column.dictionary_page_offset or column.data_page_offset
        data = bytearray(Path(path).read_bytes())
        data[at:at + 8] = b"\xff" * 8
        Path(path).write_bytes(bytes(data))
    else:  # as pyarrow answers a layout it does not read
        batches = pq.ParquetFile.iter_batches

        def iter_batches(self: Any, *args: Any, row_groups: list[int], **kwargs: Any) -> Any:
            if 2 in row_groups:
                raise pa.ArrowNotImplementedError("Nested data conversions not implemented for chunked array outputs")
            return batches(self, *args, row_groups=row_groups, **kwargs)
        monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
    config = parse_config({"input": {"type": "text"}, "preprocessing": {"min_chars": 1}})
    with pytest.raises(InputError, match=r"data\.parquet: cannot read row group 2 \((OSError|ArrowNotImplementedError): "):
        run(config, [path], tmp_path / "out")


@pytest.mark.parametrize("layout", ["parquet", "tsv.gz", "arrow-stream"])
def test_a_run_killed_on_any_format_resumes_to_the_same_bytes(layout: str, tmp_path: Path) -> None:
    from helpers import gpu_prep_cli, output_tree

    settings, make = KINDS["instruction"]
    folder = tmp_path / "in"
    folder.mkdir()
    [path] = WRITERS[layout](make(), folder)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**settings, "preprocessing": {"deduplicate": False}}))
    common = ["run", path, "-c", config, "-q", "--chunk-rows", 10, "--checkpoint-every", 0]
    assert gpu_prep_cli(*common, "-o", tmp_path / "want").returncode == 0
    killed = gpu_prep_cli(*common, "-o", tmp_path / "out", env={"GPU_PREP_FAILPOINT": "tokenize:4"})
    assert killed.returncode == -9, killed.stderr
    run(load_config(config), [path], tmp_path / "out", Options(resume=True, chunk_rows=10))
    skip = ("tokenizer.engine_choice",)  # worded from the rows sampled, which a resumed run may not see again
    assert output_tree(tmp_path / "out", *skip) == output_tree(tmp_path / "want", *skip)


@pytest.mark.parametrize("layout", ["parquet", "arrow-file"])
def test_a_cluster_cuts_parquet_and_arrow_files_at_row_groups_and_batches(layout: str, tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    from gpu_prep.read.inputs import expand_inputs
    from gpu_prep.read.rows import split_file

    settings, make = KINDS["chat"]
    rows = make()
    rows[50] = {"messages": []}  # dropped (empty) in a later part: its line must count across parts
    [path] = WRITERS[layout](rows, tmp_path)
    [file] = expand_inputs([path])
    parts = split_file(file, 20_000)
    assert len(parts) >= 3 and all(p.batches for p in parts)
    config = parse_config({**settings, "preprocessing": {"deduplicate": True}})
    want = run(config, [path], tmp_path / "want", Options(chunk_rows=16, rejects=tmp_path / "want.jsonl"))
    got = run(config, [path], tmp_path / "got", Options(chunk_rows=16, cluster="local:2", part_bytes=20_000,
                                                       rejects=tmp_path / "got.jsonl"))
    assert got["cluster"]["parts"] == len(parts)
    assert _shards(got) == _shards(want) and got["totals"] == want["totals"]
    assert (tmp_path / "got.jsonl").read_text() == (tmp_path / "want.jsonl").read_text()
    entries = [json.loads(line) for line in (tmp_path / "got.jsonl").read_text().split("\n") if line]
    assert [e["line"] for e in entries if e["reason"] == "empty"] == [51]


def test_a_folder_leaves_out_hidden_files_and_a_datasets_cache_folders_own_files(tmp_path: Path) -> None:
    # A notebook's stale checkpoint copy, and a load_dataset cache folder: its data file is read, not its
    # dataset_info.json or the cache file .map left beside it.
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from gpu_prep.read.inputs import expand_inputs

    folder = tmp_path / "data"
    (folder / ".ipynb_checkpoints").mkdir(parents=True)
    (folder / "train.jsonl").write_text('{"text": "a"}\n')
    (folder / ".ipynb_checkpoints" / "train-checkpoint.jsonl").write_text('{"text": "stale"}\n')
    (folder / ".hidden.jsonl").write_text('{"text": "hidden"}\n')
    cache = folder / "cache" / "json" / "default-0" / "0.0.0"
    cache.mkdir(parents=True)
    table = pa.table({"text": ["b"]})
    for name in ("json-train.arrow", "cache-1234abcd.arrow"):
        with ipc.new_stream(str(cache / name), table.schema) as writer:
            writer.write_table(table)
    (cache / "dataset_info.json").write_text('{"builder_name": "json"}')
    assert [f.path for f in expand_inputs([str(folder)])] == [str(cache / "json-train.arrow"), str(folder / "train.jsonl")]


EMPTY = {"empty.csv": b"", "empty.tsv": b"", "blank.csv": b"\n\r\n\n", "bom.csv": b"\xef\xbb\xbf",
         "bom16.tsv": b"\xff\xfe", "empty.csv.gz": gzip.compress(b""), "empty.json": b"",
         "blank.json": b"\xef\xbb\xbf \n",
         "header.csv": b"text\n", "empty.jsonl": b"", "empty-array.json": b"[]"}  # the last three as ever


@pytest.mark.parametrize("name", sorted(EMPTY))
def test_an_empty_file_is_no_rows(name: str, tmp_path: Path) -> None:
    # An empty CSV or TSV (no bytes, blank lines or a byte order mark alone) stopped the run as damaged
    # ("cannot read beyond line 0 ... Empty CSV file"), though no row is lost; an empty .json was one row
    # read and dropped as malformed_json.
    path = tmp_path / name
    path.write_bytes(EMPTY[name])
    assert list(file_rows(expand_inputs([str(path)])[0])) == []


def test_a_folder_with_an_empty_csv_part_writes_the_other_parts(tmp_path: Path) -> None:
    # As a writer that shards its output may leave: the empty part is no rows, not the end of the run.
    folder = tmp_path / "parts"
    folder.mkdir()
    for k, text in enumerate(["text\nfirst part's row\n", "", "text\nthird part's row\n"]):
        (folder / f"part-{k}.csv").write_text(text)
    config = parse_config({"input": {"type": "text"}, "preprocessing": {"min_chars": 1}})
    manifest = run(config, [str(folder)], tmp_path / "out")
    assert (manifest["totals"]["rows_read"], manifest["totals"]["rows_written"]) == (2, 2)


def test_a_ragged_csv_row_is_dropped_showing_its_text_and_a_doubled_header_refused(tmp_path: Path) -> None:
    # One row with a cell too few or too many is dirty data, not a damaged file: the rest is read.
    from gpu_prep.errors import ConfigError

    path = tmp_path / "ragged.csv"
    path.write_text('prompt,response\n"hello there","general"\n"only one field"\n"a","b","c extra"\n"ok","fine"\n')
    config = parse_config({"input": {"type": "instruction"}, "mask": {"response": "train"},
                           "preprocessing": {"min_chars": 0}})
    rejects = tmp_path / "rejects.jsonl"
    manifest = run(config, [str(path)], tmp_path / "out", Options(rejects=rejects))
    assert manifest["totals"]["rows_read"] == 4 and manifest["totals"]["rows_written"] == 2
    assert manifest["totals"]["rows_dropped"] == {"malformed_row": 2}
    entries = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert [(e["line"], e["reason"], e["detail"], e["row"]) for e in entries] == [
        (3, "malformed_row", "1 cells where the header has 2", '"only one field"'),
        (4, "malformed_row", "3 cells where the header has 2", '"a","b","c extra"')]
    # Numbered in their places (the parser skips them without saying where): the rows after keep theirs.
    from gpu_prep.read.delimited import csv_rows

    path.write_text("text,source\nrow one,a\nbad,row,extra\nrow three,c\n\nrow four,d\n\"only\"\nrow five,e\n")
    got = [(r.line, None if r.record is None else r.record["text"]) for r in csv_rows(str(path), None, ",")]
    assert got == [(2, "row one"), (3, None), (4, "row three"), (5, "row four"), (6, None), (7, "row five")]
    doubled = tmp_path / "doubled.csv"
    doubled.write_text("prompt,prompt,response\na,b,c\n")
    with pytest.raises(ConfigError, match=r"doubled\.csv'?: its header names the column 'prompt' more than once"):
        run(config, [str(doubled)], tmp_path / "out2")


@pytest.mark.parametrize("end", ["\n", "\r\n"])
def test_a_malformed_csv_record_a_quote_joins_lines_into_is_a_dropped_row_a_line(tmp_path: Path, end: str) -> None:
    # A stray '"' on line 3 closes on line 4: the parser reads the two as one record of one cell, which was
    # one malformed_row: 5 rows read of a file of 6 records, the valid record on line 4 counted nowhere.
    from gpu_prep.read.delimited import csv_rows

    path = tmp_path / "stray.csv"
    lines = ["text,id", "r1,1", '"r2 has a stray quote,2', 'r3,3"', "r4,4", "bad,row,extra", "r6,6"]
    path.write_bytes(end.join(lines).encode() + end.encode())
    got = [(r.line, r.record and r.record["text"], r.dropped and (*r.dropped, r.as_read))
           for r in csv_rows(str(path), None, ",")]
    joined = ("1 cells where the header has 2, in a record a quoted cell joins from 2 lines (a '\"' opened on one "
              "line and closed on another?): line {} of them; each is counted as a dropped row")
    assert got == [(2, "r1", None), (3, None, ("malformed_row", joined.format(1), '"r2 has a stray quote,2')),
                   (4, None, ("malformed_row", joined.format(2), 'r3,3"')), (5, "r4", None),
                   (6, None, ("malformed_row", "3 cells where the header has 2", "bad,row,extra")), (7, "r6", None)]
    config = parse_config({"input": {"type": "text"}, "preprocessing": {"min_chars": 0, "max_drop_share": 1.0}})
    totals = run(config, [str(path)], tmp_path / "out")["totals"]
    assert totals["rows_read"] == len(lines) - 1 and totals["rows_dropped"] == {"malformed_row": 3}


def test_malformed_csv_rows_keep_their_numbers_across_blocks_and_beside_long_cells(tmp_path: Path) -> None:
    # The parser reads blocks ahead (4 MiB each): a ragged row of a later block is numbered in its own
    # place; and a cell longer than the csv module's default limit does not stop the numbering pass.
    from gpu_prep.read.delimited import csv_rows

    bad = {10, 30_000, 59_990}
    lines = ["text,src"] + [f"bad{n},x,y" if n in bad else f"row {n} {'z' * 80},{n}" for n in range(2, 70_000)]
    path = tmp_path / "big.csv"
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size > 4 << 20  # more than one block
    got = [(r.line, r.record) for r in csv_rows(str(path), None, ",")]
    assert [n for n, record in got if record is None] == sorted(bad)
    assert all(int(record["src"]) == n for n, record in got if record is not None)
    long = tmp_path / "long.csv"
    long.write_text('prompt,response\n"only one field"\n"hello","' + "x" * 200_000 + '"\n"ok","fine"\n')
    assert [(r.line, r.record is None) for r in csv_rows(str(long), None, ",")] == [(2, True), (3, False), (4, False)]


@pytest.mark.parametrize(("name", "text"), [
    # the rows after the quote went into its cell (exit 0, even under --strict), or, with other cell
    # counts, into one malformed_row
    ("big.csv", 'prompt,response\nSay hi,Hello\nx,"open quote never closed\n' + "".join(f"q{i},a{i}\n" for i in range(1000))),
    ("ragged.csv", 'prompt,response\nSay hi,Hello\n"open quote never closed,foo\nrow3,bar\nrow4,baz\n'),
    ("quote.tsv", 'prompt\tresponse\nSay hi\tHello\nQuote this\t"To be\nq3\ta3\nq4\ta4'),
    ("late.csv.gz", "prompt,response\n" + "".join(f"q{i},a{i}\n" for i in range(2, 400_000)) + 'q,"open\nq,a\n'),
])
def test_a_quote_that_never_closes_stops_the_run_naming_its_record(tmp_path: Path, name: str, text: str) -> None:
    from gpu_prep.errors import InputError
    from gpu_prep.read.delimited import csv_rows

    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    layout, compression = split_name(name)
    record = 400_000 if name.startswith("late") else 3
    with pytest.raises(InputError, match=rf"{name.replace('.', '[.]')}: the file ends inside a quoted cell: a '\"' "
                                         rf"opened in record {record} \(the last, starting on line {record}\)"):
        list(csv_rows(str(path), compression, "," if layout == "csv" else "\t"))
    closed = tmp_path / "closed.csv"
    closed.write_text('prompt,response\n"closed ""at"" the end","a\nb"')  # closed at the very end: read
    assert [r.record for r in csv_rows(str(closed), None, ",")] == [{"prompt": 'closed "at" the end', "response": "a\nb"}]


def test_progress_counts_a_compressed_file_by_its_text(tmp_path: Path, fast_tokenizer: None) -> None:
    # Reading counts the text it reads, decompressed: a .jsonl.gz counted by its compressed size was at 100%
    # a fifth of the way in. gzip's trailer and a zstd frame's header say how much text the file holds.
    from gpu_prep.read.files import text_size

    rows = [{"text": f"row {i}: " + "the same words again and again " * 8} for i in range(6000)]
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path = tmp_path / "big.jsonl.gz"
    path.write_bytes(gzip.compress(text))
    assert text_size(str(path), "gzip", path.stat().st_size) == len(text) > 5 * path.stat().st_size
    header = b"\x28\xb5\x2f\xfd" + bytes([0xA0]) + (123456).to_bytes(4, "little") + b"\0" * 16  # single segment
    (tmp_path / "a.zst").write_bytes(header)
    assert text_size(str(tmp_path / "a.zst"), "zstd", len(header)) == 123456
    streamed = b"\x28\xb5\x2f\xfd" + bytes([0x00, 0x58]) + b"\0" * 16  # no content size: unknown
    (tmp_path / "b.zst").write_bytes(streamed)
    assert text_size(str(tmp_path / "b.zst"), "zstd", len(streamed)) is None
    # An xz file's streams each end in an index of their blocks' sizes: two streams, padding between them.
    xz = lzma.compress(text[:70000]) + b"\0" * 8 + lzma.compress(text[70000:], check=lzma.CHECK_SHA256)
    (tmp_path / "c.xz").write_bytes(xz)
    assert text_size(str(tmp_path / "c.xz"), "xz", len(xz)) == len(text)
    (tmp_path / "d.xz").write_bytes(xz[:-13])  # cut short: unknown, not a guess
    assert text_size(str(tmp_path / "d.xz"), "xz", len(xz) - 13) is None
    shares: list[float] = []
    options = Options(chunk_rows=500, progress=lambda rows, tokens, done, total: shares.append(done / total))
    run(parse_config({"input": {"type": "text"}, "preprocessing": {"min_chars": 1, "deduplicate": False}}),
        [str(path)], tmp_path / "out", options)
    assert len(shares) >= 10 and shares[len(shares) // 2] < 0.7 and shares[-1] > 0.9, shares


def test_a_csv_files_rows_carry_the_text_they_were_read_from(tmp_path: Path, fast_tokenizer: None) -> None:
    # So chunks of CSV close by size as JSON Lines chunks do, and progress has a share to show.
    from gpu_prep.read.delimited import csv_rows

    path = tmp_path / "qa.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["prompt", "response"])
        for i in range(40_000):
            writer.writerow([f"question {i}: " + "why? " * 6, f"answer {i}: " + "because. " * 6])
    assert sum(r.nbytes for r in csv_rows(str(path), None, ",")) == path.stat().st_size
    shares: list[float] = []
    options = Options(chunk_rows=100_000, progress=lambda rows, tokens, done, total: shares.append(done / total))
    run(parse_config({"input": {"type": "instruction"}, "preprocessing": {"deduplicate": False}}), [str(path)],
        tmp_path / "out", options)
    assert len(shares) >= 4 and shares == sorted(shares) and shares[0] < 0.5 and shares[-1] == 1.0, shares


def test_a_parquet_files_rows_share_its_bytes(tmp_path: Path, fast_tokenizer: None) -> None:
    # A columnar file's rows carry their share of its size: its chunks close by size, and a run of one
    # Parquet file shows its share climbing to 100% (it showed 0% to the end).
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpu_prep.read.columnar import batch_rows

    path = tmp_path / "docs.parquet"
    import hashlib

    texts = [" ".join(hashlib.sha256(f"{i}.{k}".encode()).hexdigest()[:9] for k in range(30)) for i in range(20_000)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=4000)  # hardly compressible: 6 MB
    assert sum(r.nbytes for r in batch_rows(str(path), "parquet")) == path.stat().st_size
    shares: list[float] = []
    options = Options(chunk_rows=100_000, progress=lambda rows, tokens, done, total: shares.append(done / total))
    run(parse_config({"input": {"type": "text"}, "preprocessing": {"min_chars": 1, "deduplicate": False}}),
        [str(path)], tmp_path / "out", options)
    assert len(shares) >= 3 and shares == sorted(shares) and 0 < shares[0] < 0.5 and shares[-1] == 1.0, shares


def test_a_json_lines_file_whose_first_line_is_a_json_value_but_no_object_is_read(tmp_path: Path) -> None:
    # Its first line is a row that is no object, dropped as such like any other line; it used to refuse the
    # whole file as "named as JSON, but it holds text".
    path = tmp_path / "odd.jsonl"
    path.write_text('123\n{"text": "a row"}\n"a string"\n')
    rows = list(file_rows(expand_inputs([str(path)])[0]))
    assert [r.record for r in rows] == [123, {"text": "a row"}, "a string"]
