"""Shared fixtures: the real bundled Qwen tokenizer (built once per session into a temp cache) and the toy
tokenizer of tests/toy.py that unit tests read ids off by eye."""

from __future__ import annotations

import collections
import ctypes
import gc
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The CLI runs in this process in most tests (helpers.in_process), as it does in a subprocess with COLUMNS=200:
# rich reads the width when its consoles are made, on gpu_prep's import.
os.environ["COLUMNS"] = "200"

from gpu_prep.config import parse_config  # noqa: E402  (after COLUMNS)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="Rewrite tests/e2e/golden/* from the current output.")


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Keep a developer's cache if set; otherwise a cache of this test session only.
    os.environ.setdefault("GPU_PREP_CACHE", str(tmp_path_factory.mktemp("gpu-prep-cache")))


@pytest.fixture(scope="session", autouse=True)
def _tokenizer_files_loaded_once() -> Iterator[None]:
    """HF tokenizers' load of a tokenizer.json (half a second for Qwen's) is done once for the runs that follow
    one another in this process, the CLI's included: load_outline's result is kept for the last few files,
    keyed by the folder and the outline's cache path (which holds the file's sha256 and the cache folder), so
    an edited file, another cache folder or a removed outline loads again. Each run still gets a Tokenizer
    of its own (engine choice, audit), made from the kept load as a warm load makes it."""
    from gpu_prep.tokenization import tokenizer as module

    real, kept_loads = module.load_outline, collections.OrderedDict()

    def load_outline(spec: str, directory: Path, kept: Path) -> Any:
        key = (str(directory), str(kept))
        if key not in kept_loads or not kept.exists():
            kept_loads[key] = real(spec, directory, kept)
            while len(kept_loads) > KEPT_TOKENIZER_LOADS:
                kept_loads.popitem(last=False)
        kept_loads.move_to_end(key)
        return kept_loads[key]

    load_outline.real = real  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "load_outline", load_outline)
        yield


@pytest.fixture(autouse=True)
def _real_tokenizer_loads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked real_tokenizer_loads (one about how loading goes) loads every time."""
    if request.node.get_closest_marker("real_tokenizer_loads"):
        from gpu_prep.tokenization import tokenizer as module

        monkeypatch.setattr(module, "load_outline", getattr(module.load_outline, "real", module.load_outline))


KEPT_TOKENIZER_LOADS = 3  # a Qwen engine holds some hundreds of MB: the suite's memory stays under 3 GB


@pytest.fixture(scope="module", autouse=True)
def _memory_back_after_each_file() -> Iterator[None]:
    """The suite loads many tokenizers one after another (each some hundreds of MB while in use); glibc keeps
    what they freed, so the process's size grew with every file. After each file the freed memory goes back."""
    yield
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to give back this way
        pass


@pytest.fixture(scope="session")
def qwen():
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    return load_tokenizer("qwen2.5")


@pytest.fixture(scope="session")
def toy(tmp_path_factory: pytest.TempPathFactory):
    """The toy tokenizer of tests/toy.py (one id per byte, ChatML), loaded once per session."""
    from gpu_prep.tokenization.tokenizer import load_tokenizer
    from toy import write_toy_tokenizer

    return load_tokenizer(str(write_toy_tokenizer(tmp_path_factory.mktemp("toy-tokenizer"))))


@pytest.fixture
def write_jsonl(tmp_path: Path):
    def write(rows: list, name: str = "data.jsonl") -> Path:
        path = tmp_path / name
        with open(path, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False)) + "\n")
        return path

    return write


@pytest.fixture
def make_config():
    def make(**sections) -> object:
        return parse_config(sections)

    return make


@pytest.fixture
def fast_tokenizer(qwen, monkeypatch: pytest.MonkeyPatch):
    """pipeline.run with the session's "qwen2.5" instead of a fresh 2-second load per run.

    Only the loading is shortcut: any other spec (a directory, a wrong name) goes to the real loader, so
    tokenizer errors are still the pipeline's own.
    """
    import gpu_prep.pipeline
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    def load(spec: str, revision: str | None = None):
        return qwen if spec == "qwen2.5" else load_tokenizer(spec, revision)

    monkeypatch.setattr(gpu_prep.pipeline, "load_tokenizer", load)
    return qwen


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked gpu run only where CuPy can use a GPU; elsewhere they skip, saying why."""
    from gpu_prep.backend import gpu_missing_reason

    marked = [item for item in items if "gpu" in item.keywords]
    reason = gpu_missing_reason() if marked else None
    if reason:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=f"no GPU: {reason}"))
