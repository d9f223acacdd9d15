"""Every cuDF / CuPy / RMM entry point the GPU code calls exists and takes the keywords it is given.

No machine of this project has a GPU, so the GPU code is checked where it can be: against the real wheels,
which import without a device. CI installs them (see .ci/run) and sets GPU_PREP_REQUIRE_GPU_WHEELS=1, so
there a missing wheel fails instead of skipping.
"""

from __future__ import annotations

import importlib
import inspect
import os
from typing import Any

import pytest

from gpu_prep import backend

REQUIRED = os.environ.get("GPU_PREP_REQUIRE_GPU_WHEELS") == "1"
ENTRY_POINTS = backend.GPU_API


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if REQUIRED:
            raise
        pytest.skip(f"{module} is not installed ({exc}); CI installs the gpu wheels")


def _resolve(root: Any, path: str) -> Any:
    target = root
    for part in path.split("."):
        target = inspect.getattr_static(target, part) if inspect.isclass(target) else getattr(target, part)
        if isinstance(target, (staticmethod, classmethod)):
            target = target.__func__
    return target


@pytest.mark.parametrize("module, path, keywords", ENTRY_POINTS, ids=[f"{m}:{p}" for m, p, _ in ENTRY_POINTS])
def test_entry_point_exists_with_its_keywords(module: str, path: str, keywords: tuple[str, ...]) -> None:
    target = _resolve(_import(module), path)
    assert target is not None
    if isinstance(target, property) or not keywords:
        return
    parameters = inspect.signature(target).parameters
    missing = [k for k in keywords if k not in parameters]
    assert not missing, f"{module}.{path} no longer takes {missing}; it takes {list(parameters)}"


def test_gpu_wheels_are_the_pinned_versions() -> None:
    cudf = _import("cudf")
    cupy = _import("cupy")
    assert cudf.__version__.startswith("26.10"), cudf.__version__
    major, minor = (int(x) for x in cupy.__version__.split(".")[:2])
    assert (major, minor) >= (14, 0) and cupy.__version__ != "14.1.0", cupy.__version__


def test_without_a_gpu_auto_falls_back_and_gpu_names_what_is_missing() -> None:
    _import("cupy")
    if backend.gpu_missing_reason() is None:
        pytest.skip("a GPU is available here")
    assert backend.select_backend("auto").name == "cpu"
    with pytest.raises(backend.ConfigError, match="--device gpu: .*(driver|device|extra)"):
        backend.select_backend("gpu")


def _xp_uses() -> dict[str, set[str]]:
    """Every `xp.NAME` the package's array code uses (the code CuPy runs on a GPU), with the keywords of
    the calls made to it, read from the source so that no new call can escape the check."""
    import ast
    from pathlib import Path

    uses: dict[str, set[str]] = {}
    for path in Path(backend.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "xp":
                uses.setdefault(node.attr, set())
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "xp"):
                uses.setdefault(node.func.attr, set()).update(k.arg for k in node.keywords if k.arg)
    return uses


def test_the_source_uses_xp_at_all() -> None:
    assert {"cumsum", "searchsorted", "zeros"} <= set(_xp_uses())


@pytest.mark.parametrize("name, keywords", sorted((n, tuple(sorted(k))) for n, k in _xp_uses().items()))
def test_every_xp_call_exists_in_cupy_with_its_keywords(name: str, keywords: tuple[str, ...]) -> None:
    cupy = _import("cupy")
    target = getattr(cupy, name, None)
    assert target is not None, f"cupy has no {name}"
    if isinstance(target, cupy.ufunc):  # ufuncs take out= and dtype= by their own protocol
        assert set(keywords) <= {"out", "dtype"}, f"cupy.{name} is a ufunc; keywords {keywords}"
        return
    if not keywords:
        return
    parameters = inspect.signature(target).parameters
    missing = [k for k in keywords if k not in parameters]
    assert not missing, f"cupy.{name} no longer takes {missing}; it takes {list(parameters)}"
