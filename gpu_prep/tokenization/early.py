"""The fast engine's build, started before the console script's imports.

A run spends its first 0.2 s importing (one core busy) and then waits about 0.8 s for fastokens to build
from its cached rank file (gpu_prep.tokenization.engines); on two cores that build is on the run's critical path. The
console script (gpu_prep/launch.py) therefore starts it first thing, on a guess: the tokenizer the last
run of the same command used. A command is the working directory with `-c/--config` and `--tokenizer` as given (the data files may
differ); its hint, in GPU_PREP_CACHE/early/, names the tokenizer.json (with its size and modification time),
the rank file and what fastokens needs beside it. A guess is only used where the run, once it has parsed
its config, asks for that very engine of that very file (builds.start_builds looks it up by the same key
it builds under) built from the same recipe (engines.rank_recipe: the rank file, whose name holds the
fastokens version that wrote it, pattern, added tokens, normal form); a wrong guess costs a core a second,
never a wrong id. Nothing here may stop a run: any error leaves the guess unmade.

Only the standard library is imported at module level, so that `import gpu_prep.tokenization.early` is quick.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

HINT_FORMAT = 2
# command: this process's (command_of); hint: the one read for it at start; key and recipe: what the early
# build is of, and future its result until a run claims it.
_STATE: dict[str, Any] = {"command": None, "hint": None, "key": None, "recipe": None, "future": None}
_LOCK = threading.Lock()


def command_of(argv: list[str]) -> list[str] | None:
    """What names a `gpu-prep run` command's tokenizer: [working directory, config, --tokenizer]; None for
    any other command."""
    args = argv[1:]
    if not args or args[0] != "run" or any(a == "--cluster" or a.startswith("--cluster=") for a in args):
        return None  # a cluster's workers load their own engines
    found: dict[str, str] = {}
    for i, arg in enumerate(args):
        for flag, names in (("config", ("-c", "--config")), ("tokenizer", ("--tokenizer",))):
            if arg in names and i + 1 < len(args):
                found[flag] = args[i + 1]
            elif any(arg.startswith(f"{n}=") for n in names if n.startswith("--")):
                found[flag] = arg.split("=", 1)[1]
    if "config" not in found:
        return None
    return [os.getcwd(), found["config"], found.get("tokenizer", "")]


def file_key(tokenizer_json: Path) -> tuple[str, int, int]:
    """What names a tokenizer.json to the engine builds (builds.start_builds) and in a hint: its folder,
    size and modification time."""
    stat = tokenizer_json.stat()
    return str(tokenizer_json.parent.resolve()), stat.st_size, stat.st_mtime_ns


def hint_path(command: list[str]) -> Path:
    from gpu_prep.tokenization.bundled import cache_root

    digest = hashlib.sha256(json.dumps(command).encode()).hexdigest()[:24]
    return cache_root() / "early" / f"hint{HINT_FORMAT}-{digest}.json"


def start(argv: list[str]) -> None:
    """Remember the command, and start building the engine its last run used, in a thread of its own."""
    try:
        command = command_of(argv)
        if command is None:
            return
        _STATE["command"] = command
        hint = _STATE["hint"] = json.loads(hint_path(command).read_text(encoding="utf-8"))
        key = file_key(Path(hint["tokenizer_json"]))
        if list(key) != hint["key"] or not Path(hint["recipe"]["ranks"]).is_file():
            return  # the file changed since: no guess
    except Exception:  # noqa: BLE001  a missing or unreadable hint: no guess
        return
    future: Future = Future()

    recipe = hint["recipe"]  # engines.rank_recipe's, built as FastokensEngine.build builds it

    def build() -> None:
        # No version lookup first (importlib.metadata takes 20 ms to import, and the GIL from the CLI's
        # imports): the rank file's name carries the fastokens version that wrote it, and claim() compares it.
        try:
            import fastokens

            built = fastokens.Tokenizer.from_tiktoken(recipe["ranks"], pattern=recipe["pattern"],
                                                      special_tokens=recipe["added"])
            future.set_result((built, recipe["form"], recipe["ranks"]))
        except BaseException as exc:  # noqa: BLE001  whoever claims it builds again instead
            future.set_exception(exc)

    _STATE.update(key=(hint["engine"], key), recipe=recipe, future=future)
    # Not a daemon, as builds.in_thread explains; the console script leaves with os._exit in any case.
    threading.Thread(target=build, name="gpu-prep-early-build").start()


def claim(name: str, cache_key: Any, recipe: Callable[[], dict[str, Any] | None]) -> Future | None:
    """The early build's future (of (fastokens tokenizer, normal form, rank file)) if it is this engine of this file,
    built from the recipe the run would build from (recipe(): engines.rank_recipe, the rank file, whose name
    holds the installed fastokens' version, the pattern, added tokens and normal form; asked only where an
    early build of this file is pending, and a recipe that cannot be made is no match); taken once."""
    with _LOCK:
        if _STATE["future"] is None or _STATE["key"] != (name, tuple(cache_key)):
            return None
        try:
            if _STATE["recipe"] != recipe():
                return None
        except Exception:  # noqa: BLE001  the run's own build reports what is wrong
            return None
        future, _STATE["future"] = _STATE["future"], None
        return future


def remember(engine: str, cache_key: Any, tokenizer_json: Path, recipe: dict[str, Any]) -> None:
    """After a run of this command chose `engine`, which builds from a rank file as `recipe` says
    (engines.rank_recipe): the hint its next run starts from. Written only where it changes; a hint that
    cannot be written costs the next run its head start."""
    command = _STATE["command"]
    if command is None:
        return
    hint = {"engine": engine, "key": list(cache_key), "tokenizer_json": str(tokenizer_json), "recipe": recipe}
    if hint != _STATE["hint"]:  # else the hint this run started from says so already
        from gpu_prep.tokenization.bundled import keep_cache_file

        keep_cache_file(hint_path(command), json.dumps(hint).encode("utf-8"))
        _STATE["hint"] = hint


def forget() -> None:
    """This command's run chose another engine, or one not built from a rank file: its next run guesses
    nothing rather than build an engine it will not take."""
    command, _STATE["hint"] = _STATE["command"], None
    if command is not None:
        try:
            hint_path(command).unlink(missing_ok=True)
        except OSError:
            pass
