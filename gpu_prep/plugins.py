"""Plugins: Python modules that add input types (format.register) and so on. Nothing is imported because
a config names it; a plugin runs only when the user names it with --plugin (a module name or a .py file),
or when an installed package declares it under the entry-point group "gpu_prep.plugins".
"""

from __future__ import annotations

import importlib
import importlib.util
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from gpu_prep.config import PipelineConfig
from gpu_prep.errors import ConfigError
from gpu_prep.format import registered_types
from gpu_prep.run.handlers import HANDLERS

ENTRY_POINT_GROUP = "gpu_prep.plugins"


def _load(name: str) -> ModuleType:
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"--plugin {name!r}: no such file")
        spec = importlib.util.spec_from_file_location(f"gpu_prep_plugin_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(name)


def load_plugins(names: list[str]) -> list[str]:
    """Import the installed packages' plugins, then each named one; returns what was loaded."""
    loaded = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            point.load()
        except Exception as exc:  # noqa: BLE001  an installed plugin that fails is named, not a traceback
            raise ConfigError(f"plugin {point.name!r} ({point.value}, installed entry point): {type(exc).__name__}: {exc}") from None
        loaded.append(point.value)
    for name in names:
        try:
            _load(name)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(f"--plugin {name!r}: cannot load it: {type(exc).__name__}: {exc}") from None
        loaded.append(name)
    return loaded


# TRL's trainers that read paired preference rows (prompt, chosen, rejected): input.type preference here.
TRL_PAIRED = frozenset({"dpo", "orpo", "cpo", "reward", "ipo", "simpo"})


def check_registered(config: PipelineConfig, source: str = "<config>") -> None:
    """Refuse names no registry knows: the input types (the config's and each dataset's own) and the data
    handlers. Run once plugins have loaded, since a plugin may register either; the schema cannot know them."""
    problems = []
    types = registered_types()
    for k, spec in enumerate(config.datasets or []):
        own = config.dataset_config(k).input.type
        if own != config.input.type and own not in types:
            problems.append(f"datasets[{k}] ({spec.name}): input.type {own!r} is not known; allowed: {', '.join(types)}")
        for h, handler in enumerate(spec.data_handlers):
            if handler.name not in HANDLERS:
                problems.append(f"datasets.{k}.data_handlers.{h}.name: unknown data handler {handler.name!r}; known: "
                                f"{', '.join(sorted(HANDLERS))} (more can be registered by a --plugin)")
    if config.input.type not in types:
        hint = "did you mean 'preference' (TRL's paired rows)? " if config.input.type in TRL_PAIRED else ""
        problems.insert(0, f"input.type: {config.input.type!r} is not known; {hint}allowed: {', '.join(types)}")
    if problems:
        raise ConfigError(f"{source}: invalid config\n  " + "\n  ".join(problems))
