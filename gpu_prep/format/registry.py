"""The registry of builders keyed by input.type: `register` (gpu-prep's own and plugins'), and lookup."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_prep.format.shapes import type_name

Builder = Callable[..., Any]  # (record, config) or (record, config, tokenizer) -> a Shape (plugins: see contract.py)


@dataclass(frozen=True)
class Registered:
    """A registered builder: what to call (a function, or the build method of the one instance of a class),
    whether it takes the tokenizer (a third positional parameter), and whether it is one of gpu-prep's own
    (defined in this package: called as it is, so a bug in it is not counted as a plugin's builder_error)."""

    call: Builder
    takes_tokenizer: bool
    builtin: bool


_BUILDERS: dict[str, Registered] = {}


def _own(module: str) -> bool:
    """Whether a builder's module is one of the format package's own."""
    return module.startswith(f"{__package__}.")


def register(name: str) -> Callable[[Any], Any]:
    """Register a builder for input.type `name`: a function build(record, config) or build(record, config,
    tokenizer), or a class whose build(self, item, config[, tokenizer]) is called on one instance made here
    (its __init__ takes no arguments). Returns what it was given, so it works as a decorator."""

    def add(builder: Any) -> Any:
        if isinstance(builder, type):
            if not callable(getattr(builder, "build", None)):
                raise TypeError(f"register({name!r}): class {builder.__name__} has no build(item, config[, tokenizer]) method")
            call = builder().build
        elif callable(builder):
            call = builder
        else:
            raise TypeError(f"register({name!r}): a builder is a function or a class, not {type_name(builder)}")
        _BUILDERS[name] = Registered(call, _takes_tokenizer(call), _own(getattr(builder, "__module__", None) or ""))
        return builder

    return add


def _takes_tokenizer(call: Builder) -> bool:
    try:
        params = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):  # a callable Python cannot introspect: the two-argument contract
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in params)


def from_plugin(name: str) -> bool:
    """Whether input.type `name` is a plugin's builder (not one of gpu-prep's own)."""
    return name in _BUILDERS and not _BUILDERS[name].builtin


def registered_types() -> list[str]:
    return sorted([*_BUILDERS, "auto"])


def registered(name: str) -> Registered:
    return _BUILDERS[name]


def get_builder(name: str) -> Builder:
    """What was registered for input.type `name`, to call as it is (builders.build_row applies the contract)."""
    return _BUILDERS[name].call
