"""The QLoRA seed's config keys, read as other names of gpu-prep's own.

The QLoRA seed's dataset pipeline writes its settings as flat keys of its training config
(`dataset_schema: auto`, `max_length: 4096`, ...). A user who copies its example puts them at the top of a
gpu-prep config, so they are read there: before the config is checked, each is moved to the gpu-prep key
that means the same. One given beside that key must say the same thing, else the config is refused naming
both (as input.train_on_eot and input.train_on_eos are): two spellings of one setting must never disagree
silently, whichever would win.
"""

from __future__ import annotations

from typing import Any

# Seed key -> (section, gpu-prep key, that key's other names): one setting, with the same values.
SAME_VALUES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "messages_field": ("input", "messages_key", ("field_messages",)),
    "max_length": ("preprocessing", "max_seq_len", ()),
    "extract_think_tags": ("input", "extract_think_tags", ()),
    "reasoning_keys": ("input", "reasoning_keys", ()),
    "think_mode": ("input", "think_mode", ()),
    "think_max_tokens": ("input", "think_max_tokens", ()),
    "think_loss": ("input", "think_loss", ()),
}
# dataset_schema's values and the input keys each means. The seed's auto renders prompt/response rows with
# the chat template, as its prompt_response schema does; gpu-prep's own auto reads them as template-free
# instruction rows, so the seed's auto also sets input.auto_prompt_type.
SCHEMAS: dict[str, dict[str, str]] = {
    "messages": {"type": "chat"},
    "prompt_response": {"type": "prompt_response"},
    "auto": {"type": "auto", "auto_prompt_type": "prompt_response"},
}
# truncate_side's values and the truncation each means: the seed prunes the oldest middle turns, then the
# kept turns' reasoning, and only then cuts tokens from the left, which is gpu-prep's structured truncation.
SIDES: dict[str, str] = {"left": "structured"}
SEED_KEYS = (*SAME_VALUES, "dataset_schema", "truncate_side", "assistant_roles")


def resolve(data: Any, template_roles: tuple[str, ...]) -> Any:
    """The config with the seed's top-level keys moved to gpu-prep's (data itself when it has none);
    template_roles: the roles a chat template knows (what assistant_roles' "no other role" covers)."""
    if not isinstance(data, dict) or not any(key in data for key in SEED_KEYS):
        return data
    data = dict(data)
    for alias, (section, key, names) in SAME_VALUES.items():
        if alias in data:
            value = data.pop(alias)
            _place(data, alias, value, section, {key: value}, names)
    if "dataset_schema" in data:
        value = data.pop("dataset_schema")
        _place(data, "dataset_schema", value, "input", _schema(value))
    if "truncate_side" in data:
        value = data.pop("truncate_side")
        _place(data, "truncate_side", value, "preprocessing", {"truncation": _truncation(value)})
    if "assistant_roles" in data:
        _assistant_roles(data, data.pop("assistant_roles"), template_roles)
    return data


def _place(data: dict[str, Any], alias: str, value: Any, section: str, settings: dict[str, Any],
           names: tuple[str, ...] = ()) -> None:
    """Write settings into data[section]; a setting already there (under its key or one of its other
    names) must have the value the alias means."""
    part = data.get(section)
    if part is None:
        part = {}
    if not isinstance(part, dict):  # a ValueError, as pydantic reports it with the config's other errors
        raise ValueError(f"{section} must be a mapping of keys (the QLoRA seed's {alias} goes into it)")  # noqa: TRY004
    part = dict(part)
    meaning = ", ".join(f"{section}.{key}: {want!r}" for key, want in settings.items())
    for key, want in settings.items():
        for name in (key, *names):
            if name in part and part[name] != want:
                raise ValueError(f"{alias}: {value!r} is the QLoRA seed's spelling of {meaning}, and "
                                 f"{section}.{name} is {part[name]!r}: they disagree; give one of them")
        if not any(name in part for name in names):
            part[key] = want
    data[section] = part


def _schema(value: Any) -> dict[str, str]:
    if value not in SCHEMAS:
        raise ValueError(f"dataset_schema: {value!r} is not allowed; allowed: {', '.join(map(repr, SCHEMAS))} "
                         "(the QLoRA seed's schemas; gpu-prep's other input types are set with input.type)")
    return SCHEMAS[value]


def _truncation(side: Any) -> str:
    if side == "right":
        raise ValueError("truncate_side: 'right' cannot be honoured: the QLoRA seed's truncation prunes turns "
                         "and then cuts from the left (gpu-prep's preprocessing.truncation: structured, which "
                         "truncate_side: left means); for plain right truncation, with no turns pruned, write "
                         "preprocessing.truncation: right instead")
    if side not in SIDES:
        raise ValueError(f"truncate_side: {side!r} is not allowed; allowed: 'left'")
    return SIDES[side]


def _assistant_roles(data: dict[str, Any], roles: Any, template_roles: tuple[str, ...]) -> None:
    """assistant_roles trains those roles and no other: input.roles_to_train, with mask rules and
    mask_default that may not train another role or mask one of them."""
    if not isinstance(roles, list) or not roles or not all(isinstance(r, str) for r in roles):
        raise ValueError(f"assistant_roles: give a list of role names, e.g. ['assistant'], not {roles!r}")
    _place(data, "assistant_roles", roles, "input", {"roles_to_train": roles})
    rules = data.get("mask")
    for role, action in (rules.items() if isinstance(rules, dict) else ()):
        if (action == "mask" and role in roles) or (action == "train" and role in template_roles and role not in roles):
            raise ValueError(f"assistant_roles: {roles!r} trains exactly those roles, and mask.{role} is "
                             f"{action!r}: they disagree; give one of them")
    if data.get("mask_default") == "train":
        raise ValueError(f"assistant_roles: {roles!r} trains exactly those roles, and mask_default 'train' "
                         "would train every other role too: they disagree; give one of them")
