"""Loading a config: JSON or YAML (keys given twice refused), `--set` overrides, data paths relative to the
config's folder."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpu_prep.errors import ConfigError
from gpu_prep.config.pipeline import PipelineConfig, _describe


def parse_config(data: Any, source: str = "<config>") -> PipelineConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the config must be a mapping of keys, got {type(data).__name__}")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(e) for e in exc.errors(include_url=False)]
        raise ConfigError(f"{source}: invalid config\n  " + "\n  ".join(lines)) from None


class _TwiceError(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused where it names a key twice (the parser would keep the last silently)."""
    data = dict(pairs)
    if len(data) < len(pairs):
        twice = next(k for k in data if sum(key == k for key, _ in pairs) > 1)
        raise _TwiceError(f"key {twice!r} is given twice in one object; only one can hold")
    return data


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that names a key twice (it would keep the last silently)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:  # as written (a merge key << brings keys that may be overridden)
            if key_node.tag != "tag:yaml.org,2002:str":
                continue
            if key_node.value in seen:
                raise _TwiceError(f"line {key_node.start_mark.line + 1}: key {key_node.value!r} is given twice in one "
                                  "mapping; only one can hold")
            seen.add(key_node.value)
        return super().construct_mapping(node, deep)




def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> PipelineConfig:
    """The config file, with `key.path=value` overrides (values read as YAML) applied before it is checked."""
    path = Path(path)
    is_yaml = path.suffix.lower() in (".yaml", ".yml")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: the config is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeys) if is_yaml else json.loads(text, object_pairs_hook=_unique_keys)  # noqa: S506  a SafeLoader
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {'YAML' if is_yaml else 'JSON'}: {exc}") from None
    except _TwiceError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    data = _from_folder(data, path.parent)  # the file's paths are its folder's; --set values are the command line's
    for override in overrides:
        data = _override(data, override, path)
    return parse_config(data, str(path))


def _override(data: Any, override: str, path: Path) -> Any:
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {override!r}: write it as key.path=value, e.g. preprocessing.max_seq_len=4096")
    try:
        value = yaml.load(raw, Loader=_UniqueKeys) if raw.strip() else ""  # noqa: S506  a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {override!r}: the value is not YAML: {exc}") from None
    data = dict(data) if isinstance(data, dict) else {}
    node: Any = data
    names = key.strip().split(".")
    for depth, name in enumerate(names[:-1]):
        slot = _slot(node, name, override, names[:depth])
        child = node[slot] if isinstance(node, list) else node.get(slot)
        if isinstance(child, (dict, list)):
            child = type(child)(child)  # a copy: the parsed file is not changed in place
        elif names[depth + 1].isdigit():
            where = ".".join(names[:depth + 1])
            raise ConfigError(f"--set {override!r}: the config has no list {where} to index; give it whole, "
                              f"e.g. --set '{where}=[...]'")
        else:
            child = {"name": child} if name == "tokenizer" and child else {}
        node[slot] = child
        node = child
    node[_slot(node, names[-1], override, names[:-1])] = value
    return data


def _slot(node: Any, name: str, override: str, above: list[str]) -> Any:
    """Where `name` points in node: a key of a mapping; in a list (datasets), an index from 0 or the name of
    the entry whose `name` it is."""
    if not isinstance(node, list):
        return name
    if name.isdigit() and int(name) < len(node):
        return int(name)
    named = [k for k, entry in enumerate(node) if isinstance(entry, dict) and entry.get("name") == name]
    if named:
        return named[0]
    where = ".".join(above)
    if not node:
        raise ConfigError(f"--set {override!r}: {where} is an empty list; give it whole, e.g. --set '{where}=[...]'")
    names = [entry["name"] for entry in node if isinstance(entry, dict) and isinstance(entry.get("name"), str)
             and "." not in entry["name"]]  # a name with a dot in it is reached by its index
    raise ConfigError(f"--set {override!r}: {where} is a list of {len(node)}; give an index from 0 to {len(node) - 1}"
                      + (f" or a name ({', '.join(names)})" if names else ""))


def _from_folder(data: Any, folder: Path) -> Any:
    """Paths written in a config file are the config file's: its datasets' data_paths and a chat template
    file always, a tokenizer folder when one is there (else it is a bundled name or a model id)."""
    if not isinstance(data, dict):
        return data

    def here(value: Any) -> Any:
        local = isinstance(value, str) and value and not os.path.isabs(value) and "://" not in value
        return os.path.normpath(folder / value) if local else value

    data = dict(data)
    if isinstance(data.get("datasets"), list):
        data["datasets"] = [{**d, "data_paths": [here(p) for p in d["data_paths"]]}
                            if isinstance(d, dict) and isinstance(d.get("data_paths"), list) else d
                            for d in data["datasets"]]
    for key in ("chat_template", "chat_template_jinja"):
        template = data.get(key)
        if isinstance(template, str) and template.endswith((".jinja", ".j2")) and "{" not in template:
            data[key] = here(template)
    tokenizer = data.get("tokenizer")
    name = tokenizer.get("name") if isinstance(tokenizer, dict) else tokenizer
    if isinstance(name, str) and not os.path.isabs(name) and (folder / name).is_dir():
        data["tokenizer"] = {**tokenizer, "name": here(name)} if isinstance(tokenizer, dict) else here(name)
    elif isinstance(name, str) and not os.path.isabs(name) and os.path.isdir(name) and folder.resolve() != Path.cwd():
        # Read from here it would depend on where the command runs, not on where the config is.
        seen = os.path.relpath(os.path.abspath(name), folder.resolve())
        raise ConfigError(f"tokenizer {name!r}: a config's paths are its folder's, and {folder / name} is no folder "
                          f"(./{name} from here is one): write it as the config's folder sees it, {seen!r}")
    return data
