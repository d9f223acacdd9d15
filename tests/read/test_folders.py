"""Folders the datasets library writes (read/folders.py): which Arrow files are one split, in order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_prep.errors import ConfigError
from gpu_prep.read.folders import dataset_folder_files, default_split, split_names


def _saved(folder: Path, *files: str) -> Path:
    """A save_to_disk folder: state.json lists its Arrow files in order."""
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": f} for f in files]}))
    return folder


def test_a_saved_dataset_reads_its_files_in_the_order_state_json_gives(tmp_path: Path) -> None:
    folder = _saved(tmp_path / "ds", "data-00001-of-00002.arrow", "data-00000-of-00002.arrow")
    assert dataset_folder_files(folder, None) == [str(folder / "data-00001-of-00002.arrow"),
                                                  str(folder / "data-00000-of-00002.arrow")]
    assert split_names(folder) == []  # one saved dataset has no splits


def test_a_dataset_dict_reads_train_or_the_named_split_and_refuses_one_it_lacks(tmp_path: Path) -> None:
    root = tmp_path / "dd"
    _saved(root / "train", "t.arrow")
    _saved(root / "test", "e.arrow")
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert split_names(root) == ["train", "test"]
    assert dataset_folder_files(root, None) == [str(root / "train" / "t.arrow")]
    assert dataset_folder_files(root, "test") == [str(root / "test" / "e.arrow")]
    with pytest.raises(ConfigError, match=r"a DatasetDict with the splits train, test; input.split 'dev' is not one"):
        dataset_folder_files(root, "dev")


def test_a_cache_folder_reads_the_shards_of_its_split_sorted(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    (root / "dataset_info.json").write_text(json.dumps({"splits": {"train": {}, "validation": {}}}))
    for name in ("json-train-00001-of-00002.arrow", "json-train-00000-of-00002.arrow", "json-validation.arrow"):
        (root / name).touch()
    assert dataset_folder_files(root, None) == [str(root / "json-train-00000-of-00002.arrow"),
                                                str(root / "json-train-00001-of-00002.arrow")]
    assert dataset_folder_files(root, "validation") == [str(root / "json-validation.arrow")]


def test_a_folder_of_no_such_kind_is_none_and_a_lone_split_is_the_default(tmp_path: Path) -> None:
    assert dataset_folder_files(tmp_path, None) is None
    assert default_split(["test"]) == "test"
    assert default_split(["test", "train"]) == "train"
    assert default_split(["a", "b"]) == "train"  # none is train: the error that follows names them
