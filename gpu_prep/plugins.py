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

from gpu_prep.errors import ConfigError

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
