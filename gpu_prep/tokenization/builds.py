"""The fast engines' builds: each built once per process, in a thread of its own (both engines release the
GIL) while the run reads its first rows, and kept for the next run of the same tokenizer in this process.
Neither built engine can be saved, so a process builds each one it uses; the build the console script
started early (early.py) is taken where it is that engine of that very file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from gpu_prep.tokenization.engines import FAST_ENGINES, FastokensEngine, Unusable, build_engine, rank_recipe


def in_thread(work: Callable[[], Any], name: str = "engine-build") -> Future:
    """work() in a thread of its own. Not a daemon: a daemon thread still inside a Rust engine when the
    interpreter exits is unwound through Rust's panic guard, and the process aborts ("FATAL: exception not
    rethrown") instead of exiting with its code; a run that fails early waits for the build (a second) instead."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as exc:  # noqa: BLE001  handed to whoever waits
            future.set_exception(exc)

    threading.Thread(target=run, name=f"gpu-prep-{name}").start()
    return future


_BUILDS: dict[tuple[str, Any], Future] = {}  # building one takes about a second: once per process
_BUILDS_LOCK = threading.Lock()
# Engines kept built, the most recent first: a run uses one, and a process that runs many tokenizers in turn
# (a notebook, a test suite) must not keep them all (a Qwen3 fastokens engine holds about 350 MB).
KEPT_BUILDS = 4


def _forget_old_builds() -> None:
    """Drop the oldest finished builds past KEPT_BUILDS (under _BUILDS_LOCK); one still building stays, as
    someone waits for it."""
    for key in [k for k, f in _BUILDS.items() if f.done()][:max(0, len(_BUILDS) - KEPT_BUILDS)]:
        del _BUILDS[key]


def candidates(requested: str) -> tuple[str, ...]:
    """The fast engines tokenizer.engine lets a run try, in order."""
    return FAST_ENGINES if requested == "auto" else () if requested == "hf" else (requested,)


def start_builds(requested: str, spec: dict[str, Any], path: Path, cache_key: Any) -> None:
    """Start building, in a thread of its own, the first fast engine a run may use (as part of loading the
    tokenizer; the run reads its first rows meanwhile); the next is built only once that one is out (a
    build it would not use costs a core its second). cache_key names the tokenizer.json (path, size,
    mtime): a process builds each engine of it once."""
    for name in candidates(requested)[:1]:
        with _BUILDS_LOCK:
            if (name, cache_key) not in _BUILDS:
                _forget_old_builds()
                _BUILDS[(name, cache_key)] = _started_early(name, spec, path, cache_key) \
                    or in_thread(lambda name=name: build_engine(name, spec, path))


def _started_early(name: str, spec: dict[str, Any], path: Path, cache_key: Any) -> Future | None:
    """The build the console script started before its imports (gpu_prep.tokenization.early), where it is this engine of
    this file; if that build failed, the usual one, started then."""
    from gpu_prep.tokenization import early

    started = early.claim(name, cache_key, lambda: rank_recipe(spec, path) if name == "fastokens" else None)
    if started is None:
        return None

    def take() -> FastokensEngine:
        try:
            tokenizer, form, ranks = started.result()
        except Exception:  # noqa: BLE001  the guess went wrong: build as a run without one does
            return build_engine(name, spec, path)
        # Built from the rank file: named, so that a rank file whose engine differs from HF is dropped as the
        # run's own build from it would be (choose_engine).
        return FastokensEngine(tokenizer, form, ranks)

    return in_thread(take)


def fast_engine(name: str, spec: dict[str, Any], path: Path, cache_key: Any) -> tuple[Any, str | None]:
    """(the built engine, None), or (None, why it cannot run this tokenizer)."""
    future = None
    while future is None:  # (a build forgotten, by other tokenizers' builds, before it was taken: again)
        start_builds(name, spec, path, cache_key)
        with _BUILDS_LOCK:
            future = _BUILDS.get((name, cache_key))
    try:
        return future.result(), None
    except Unusable as exc:
        return None, str(exc)


def forget_build(name: str, cache_key: Any) -> None:
    """Drop the build of this engine of this tokenizer.json, so the next run of it builds again."""
    with _BUILDS_LOCK:
        _BUILDS.pop((name, cache_key), None)
