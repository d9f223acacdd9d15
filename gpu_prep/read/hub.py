"""The Hugging Face hub: model ids ("Qwen/Qwen2.5-7B-Instruct") as tokenizer folders, through the hub cache,
and datasets (a config's `hub:` entry) streamed by the datasets library, with what names their version.

The cache is read first, as transformers reads it (HF_HOME, HF_HUB_CACHE; HF_TOKEN for gated models), so a
machine that has the model needs no network; with HF_HUB_OFFLINE=1 nothing else is tried. Otherwise only the
tokenizer's files are downloaded, never weights. huggingface_hub comes with the `hub` extra.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpu_prep.errors import ConfigError, InputError
from gpu_prep.read.row import ReadRow

# What a tokenizer folder holds (no weights): the files transformers reads to build a tokenizer.
TOKENIZER_PATTERNS = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                      "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.txt", "vocab.json",
                      "merges.txt", "additional_chat_templates/*.jinja"]
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def looks_like_model_id(spec: str) -> bool:
    return _MODEL_ID.match(spec) is not None


def resolve_model_id(model_id: str, revision: str | None = None) -> tuple[Path, str]:
    """The local folder of a model id's tokenizer files and the commit it is at."""
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise ConfigError(f"tokenizer {model_id!r} is a model id, which needs huggingface_hub: "
                          'pip install "gpu-prep[hub]"') from None
    where = f"tokenizer {model_id!r}" + (f" at revision {revision!r}" if revision else "")
    get = f"hf download {model_id}" + (f" --revision {revision}" if revision else "")
    # Read from the environment now (huggingface_hub reads it once, when first imported).
    cache = os.environ.get("HF_HUB_CACHE") or (os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME")
                                               else constants.HF_HUB_CACHE)
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE") or constants.HF_HUB_OFFLINE
    try:
        folder = snapshot_download(model_id, revision=revision, allow_patterns=TOKENIZER_PATTERNS, cache_dir=cache,
                                   local_files_only=True)
    except LocalEntryNotFoundError:
        if offline:
            raise ConfigError(f"{where}: not in the hub cache ({cache}) and HF_HUB_OFFLINE is set; "
                              f"on a machine with network run `{get} --include 'tokenizer*' "
                              "'*.jinja'` (or point HF_HOME / HF_HUB_CACHE at a cache that has it)") from None
        try:
            folder = snapshot_download(model_id, revision=revision, allow_patterns=TOKENIZER_PATTERNS, cache_dir=cache,
                                       token=os.environ.get("HF_TOKEN") or None)
        except Exception as exc:  # noqa: BLE001  network, authentication, unknown repository: one message
            raise ConfigError(f"{where}: not in the hub cache ({cache}) and not downloadable "
                              f"({type(exc).__name__}: {exc}); for a gated model set HF_TOKEN, or download it "
                              f"where there is network with `{get}`") from None
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(f"{where}: the hub cache's snapshot {folder} has no tokenizer.json; download the "
                          f"tokenizer files with `{get} --include 'tokenizer*' '*.jinja'`")
    return folder, folder.name


def hub_dataset(arguments: dict[str, Any]) -> Any:
    """A streamed datasets.IterableDataset (a ConfigError naming the dataset when it cannot be loaded)."""
    name = arguments["name"]
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"hub dataset {name!r}: needs the datasets library: pip install \"gpu-prep[hub]\"") from None
    try:
        return datasets.load_dataset(name, arguments.get("config"), split=arguments.get("split", "train"),
                                     revision=arguments.get("revision"), data_files=arguments.get("data_files"),
                                     streaming=True)
    except Exception as exc:  # noqa: BLE001  not found, offline, gated, no such split: one message
        raise ConfigError(f"hub dataset {name!r}: cannot load it ({type(exc).__name__}: {exc}); offline it must be "
                          "in the datasets cache (HF_HOME), or give a local folder") from None


def hub_version(dataset: Any) -> str | None:
    """What names the version of a streamed hub dataset, hashed: the files datasets reads it from (a hub URL
    holds the revision; a file on disk, the datasets cache's included, is named with its size and modification
    time). None where datasets does not say (its internals differ): only the name is compared then."""
    def strings(value: Any) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for item in value.values():
                yield from strings(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield from strings(item)

    try:
        sources = sorted(set(strings(dataset._ex_iterable.kwargs)))
    except AttributeError:
        return None
    if not sources:
        return None
    named = [f"{p}|{stat.st_size}|{stat.st_mtime_ns}" if os.path.isfile(p) and (stat := os.stat(p)) else p
             for p in sources]
    return hashlib.sha256("\n".join(named).encode("utf-8")).hexdigest()


def check_hub_version(where: str, dataset: Any, version: str | None) -> None:
    """An InputError when the dataset is not the version the run found at its start (None: not known)."""
    if version is not None and (now := hub_version(dataset)) != version:
        raise InputError(f"{where}: the dataset changed since the run started (its files were {version[:12]}, now "
                         f"{str(now)[:12]}); run again on a dataset nothing writes to")


def hub_rows(where: str, arguments: dict[str, Any], version: str | None) -> Iterator[ReadRow]:
    """A hub dataset's rows, streamed, numbered from 1, from the version the run started with."""
    dataset = hub_dataset(arguments)
    check_hub_version(where, dataset, version)
    for row, record in enumerate(dataset, start=1):
        yield ReadRow(row, dict(record), 0)
