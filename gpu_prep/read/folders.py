"""Folders the datasets library wrote (save_to_disk, DatasetDict, its cache): which Arrow files are one split."""


from __future__ import annotations

import json
import re
from pathlib import Path

from gpu_prep.errors import ConfigError


def dataset_folder_files(folder: Path, split: str | None) -> list[str] | None:
    """The Arrow files of a `save_to_disk` folder (of one split of a DatasetDict folder), or of one split of
    a folder the datasets library's cache holds (dataset_info.json beside <builder>-<split>[-NNNNN-of-NNNNN]
    .arrow files), in order; None for a folder that is none of these."""
    if (folder / "dataset_dict.json").is_file():
        folder = folder / _split_of(folder, "a DatasetDict", split_names(folder), split)
    if (folder / "state.json").is_file():
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        return [str(folder / entry["filename"]) for entry in state.get("_data_files", [])]
    if (folder / "dataset_info.json").is_file():
        splits = split_names(folder)
        if splits:
            chosen = re.escape(_split_of(folder, "a datasets cache folder", splits, split))
            name = re.compile(rf"-{chosen}(-\d{{5}}-of-\d{{5}})?\.arrow$")
            return sorted(str(p) for p in folder.iterdir() if name.search(p.name))
    return None


def split_names(folder: Path) -> list[str]:
    """The splits a DatasetDict folder (dataset_dict.json) or a datasets cache folder (dataset_info.json,
    without the state.json of one saved dataset) holds; none for any other folder."""
    if (folder / "dataset_dict.json").is_file():
        return list(json.loads((folder / "dataset_dict.json").read_text(encoding="utf-8")).get("splits", []))
    if (folder / "dataset_info.json").is_file() and not (folder / "state.json").is_file():
        return list(json.loads((folder / "dataset_info.json").read_text(encoding="utf-8")).get("splits") or {})
    return []


def default_split(splits: list[str]) -> str:
    """The split read where input.split names none: train, or the only one."""
    return "train" if "train" in splits or len(splits) != 1 else splits[0]


def _split_of(folder: Path, what: str, splits: list[str], split: str | None) -> str:
    """The split to read (input.split; else train, or the only one), refused when the folder lacks it."""
    chosen = split or default_split(splits)
    if chosen not in splits:
        raise ConfigError(f"input {str(folder)!r}: {what} with the splits {', '.join(splits)}; "
                          f"{'input.split ' + repr(split) + ' is not one of them' if split else 'name one with input.split'}")
    return chosen


# ---------------------------------------------------------------- rows of each format

