"""What a tokenizer spec names (a folder, a bundled tokenizer, or a model id in the Hugging Face hub cache),
and what its folder's tokenizer_config.json says; when it names none, what to give instead.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import orjson

from gpu_prep.errors import ConfigError
from gpu_prep.read.hub import looks_like_model_id, resolve_model_id

# The special tokens of tokenizer_config.json a Tokenizer knows by name.
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


# Files a tokenizer.json can be made from with transformers: what each is, the tokenizer_config.json
# transformers needs beside it to know the class, and the packages the conversion needs.
CONVERTIBLE = {
    "tokenizer.model": ("a SentencePiece model", '{"tokenizer_class": "LlamaTokenizer", "legacy": false, '
                        '"bos_token": "<s>", "eos_token": "</s>"} (its own class and tokens)',
                        "transformers sentencepiece protobuf"),
    "vocab.txt": ("a WordPiece vocabulary", '{"tokenizer_class": "BertTokenizer"} (add "do_lower_case": false '
                  'for a cased one)', "transformers"),
}


def _conversion(path: Path, name: str) -> str:
    """How to make a tokenizer.json from `path`, a file of the kind CONVERTIBLE names `name`."""
    what, config, packages = CONVERTIBLE[name]
    folder, named = (str(path.parent), "") if path.name == name else ("FOLDER", f" as {name}")
    return (f"{path.name} is {what}; make a tokenizer.json from it with transformers (pip install {packages}): "
            f"with it{named} in {folder} and a tokenizer_config.json such as {config}, run python -c \"from "
            f"transformers import AutoTokenizer; AutoTokenizer.from_pretrained('{folder}').save_pretrained('OUT')\" "
            "and give OUT as the tokenizer")


def _file_given(spec: str, path: Path) -> str:
    """What to give instead of a file (the tokenizer is a folder)."""
    head = f"tokenizer {spec!r} is a file; give the folder that holds tokenizer.json and tokenizer_config.json"
    if path.name == "tokenizer.json":
        return f"{head}: {path.parent}"
    kind = "tokenizer.model" if path.name.endswith(".model") or ".model." in path.name else path.name
    return f"{head}. {_conversion(path, kind)}" if kind in CONVERTIBLE else head


def _no_folder(spec: str, path: Path, hub: ConfigError) -> str:
    """What reads as a model id that the hub has not got, but whose organisation is a folder here (tok/lama3
    beside tok/llama3): most likely a path mistyped."""
    names = sorted(p.name for p in path.parent.iterdir() if p.is_dir())
    close = [str(path.parent / name) for name in difflib.get_close_matches(path.name, names, n=3)]
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    return (f"tokenizer {spec!r}: there is no folder {path} (the folder {path.parent} is here, so this most likely "
            f"names a path in it){hint}; as a model id: {hub}")


def _with_special_tokens_map(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """The tokenizer config with the special tokens of special_tokens_map.json put in, as transformers does
    where the config is of the older kind (no added_tokens_decoder): the map's entries win. Folders saved so
    (Llama-2's and Mistral's first releases) name their bos and eos there alone."""
    if "added_tokens_decoder" in config or not path.is_file():
        return config
    tokens = orjson.loads(path.read_bytes())
    if not isinstance(tokens, dict):
        raise ValueError(f"{path.name} holds {type(tokens).__name__}, not an object")
    return {**config, **tokens}


def tokenizer_folder(spec: str, revision: str | None = None) -> tuple[Path, str]:
    """The folder `spec` names (a directory, the name of a bundled tokenizer, or a model id in the hub cache at
    revision, else main) and where it came from, as meta.json says it: the directory, "bundled <name>" or
    "<model id>@<commit>". The folder must hold a tokenizer.json."""
    from gpu_prep.tokenization.bundled import bundled_names, bundled_tokenizer_dir

    directory, source = Path(spec), spec
    if directory.is_file():  # not a hub id, however it reads
        raise ConfigError(_file_given(spec, directory))
    if not directory.is_dir():
        if spec in bundled_names():
            directory, source = bundled_tokenizer_dir(spec), f"bundled {spec}"
        elif looks_like_model_id(spec):
            try:
                directory, commit = resolve_model_id(spec, revision)
            except ConfigError as exc:  # a model id, unless its organisation is a folder here: then a path mistyped
                raise ConfigError(_no_folder(spec, directory, exc) if directory.parent.is_dir() else str(exc)) from None
            source = f"{spec}@{commit}"
        else:
            raise ConfigError(f"tokenizer {spec!r}: no such directory, not a bundled tokenizer "
                              f"({', '.join(bundled_names())}) and not a model id (organisation/name)")
    if not (directory / "tokenizer.json").is_file():
        source_file = next((name for name in CONVERTIBLE if (directory / name).is_file()), None)
        hint = f"; {_conversion(directory / source_file, source_file)}" if source_file else ""
        raise ConfigError(f"tokenizer {spec!r}: tokenizer.json is missing in {directory}{hint}")
    return directory, source


def read_config(directory: Path) -> dict[str, Any]:
    """The folder's tokenizer_config.json with special_tokens_map.json's tokens put in; without the file, no
    special tokens, as HF loads it."""
    path = directory / "tokenizer_config.json"
    config = orjson.loads(path.read_bytes()) if path.is_file() else {}
    return _with_special_tokens_map(config, directory / "special_tokens_map.json")


def special_tokens(config: dict[str, Any]) -> dict[str, str]:
    """The special tokens the tokenizer config names (SPECIAL_TOKEN_KEYS -> their text)."""
    return {key: text for key in SPECIAL_TOKEN_KEYS if (text := _token_text(config.get(key))) is not None}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None
