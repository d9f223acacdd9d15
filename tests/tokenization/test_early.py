"""The console script's head start (gpu_prep/tokenization/early.py): the engine the last run of a command used is built
while the CLI imports, and a run takes it only where it is that engine of that very tokenizer file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpu_prep.tokenization import early

from gpu_prep.tokenization import builds
from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
from gpu_prep.tokenization.tokenizer import load_tokenizer
from helpers import REPO, gpu_prep_cli, output_tree


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache and a tokenizer folder of this test's own (so no other test's build answers for it), and the
    module's state as a new process has it."""
    tokenizer = tmp_path / "tok"
    shutil.copytree(bundled_tokenizer_dir("qwen2.5"), tokenizer)  # built once, in the session's cache
    monkeypatch.setenv("GPU_PREP_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(early, "_STATE", {"command": None, "hint": None, "key": None, "recipe": None, "future": None})
    return tokenizer


def _use(tokenizer: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    """What early.start does for argv, then what a run does: load the tokenizer, start its builds, choose;
    each time as a new process would, with no engine built yet."""
    monkeypatch.setattr(builds, "_BUILDS", {})
    early.start(argv)
    pending = early._STATE["future"]
    tok = load_tokenizer(str(tokenizer))
    tok.prepare_engines("auto")
    built = builds._BUILDS[("fastokens", tok._engine_key())]
    tok.use_engine("auto", ["hello world", "<|im_start|>user\ncafe\u0301<|im_end|>"], 2)
    assert tok.active.name == "fastokens"
    return pending, built


def test_the_second_run_of_a_command_starts_from_the_first_ones_engine(fresh: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["gpu-prep", "run", "-c", "config.json", "data.jsonl", "-o", "out", "--tokenizer", str(fresh)]
    assert early.command_of(argv)[1:] == ["config.json", str(fresh)]
    assert early.command_of(["gpu-prep", "check", "-c", "config.json"]) is None
    pending, _ = _use(fresh, argv, monkeypatch)
    assert pending is None  # nothing known yet; the run leaves its hint
    hint = early.hint_path(early.command_of(argv))
    assert hint.is_file()
    pending, built = _use(fresh, [*argv[:-2], "other.jsonl", *argv[-2:]], monkeypatch)  # other data: the same command
    assert pending is not None and pending.result()[1] == "NFC"  # built from ranks: gpu-prep normalizes
    assert early._STATE["future"] is None  # claimed by the run
    assert built.result().tokenizer is pending.result()[0]


def test_a_changed_tokenizer_file_or_another_command_gets_no_guess(fresh: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["gpu-prep", "run", "--config=config.json", "data.jsonl", "--tokenizer", str(fresh)]
    _use(fresh, argv, monkeypatch)
    early.start(["gpu-prep", "run", "-c", "another.json", "data.jsonl", "--tokenizer", str(fresh)])
    assert early._STATE["future"] is None
    (fresh / "tokenizer.json").write_bytes((fresh / "tokenizer.json").read_bytes())  # a new mtime
    early.start(argv)
    assert early._STATE["future"] is None


def test_a_run_that_takes_another_engine_leaves_no_guess(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["gpu-prep", "run", "-c", "config.json", "--tokenizer", str(fresh)]
    _use(fresh, argv, monkeypatch)
    hint = early.hint_path(early.command_of(argv))
    assert hint.is_file()
    tok = load_tokenizer(str(fresh))
    tok.use_engine("hf", ["hello"], 1)  # the config now asks for HF tokenizers
    assert not hint.exists()
    assert early.command_of([*argv, "--cluster", "local:2"]) is None


def test_a_guess_that_is_not_this_runs_engine_is_left_alone(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["gpu-prep", "run", "-c", "config.json", "--tokenizer", str(fresh)]
    _use(fresh, argv, monkeypatch)
    early.start(argv)
    key, recipe = early._STATE["key"][1], early._STATE["recipe"]
    assert early.claim("tiktoken", key, lambda: recipe) is None  # another engine of the file
    assert early.claim("fastokens", ("/elsewhere", 1, 2), lambda: recipe) is None  # another file
    assert early.claim("fastokens", key, lambda: {**recipe, "form": None}) is None  # another way of building it

    def unknown() -> None:  # the installed fastokens has no metadata: the run's own build says so
        raise ModuleNotFoundError("fastokens")

    assert early.claim("fastokens", key, unknown) is None
    assert early._STATE["future"] is not None


def test_a_rank_file_of_another_fastokens_version_is_not_taken(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The rank file's name holds the fastokens version that wrote it: a hint naming another one (fastokens
    # was upgraded since) is built from, but the run, whose own recipe names today's file, does not take it.
    argv = ["gpu-prep", "run", "-c", "config.json", "--tokenizer", str(fresh)]
    _use(fresh, argv, monkeypatch)
    hint = early.hint_path(early.command_of(argv))
    ranks = Path(json.loads(hint.read_text())["recipe"]["ranks"])
    older = ranks.with_name(ranks.name.replace("fastokens-", "fastokens-0.0.0-", 1))
    shutil.copy(ranks, older)
    hint.write_text(hint.read_text().replace(json.dumps(str(ranks))[1:-1], json.dumps(str(older))[1:-1]))
    pending, built = _use(fresh, argv, monkeypatch)
    assert pending is not None and early._STATE["future"] is pending  # started, and left unclaimed
    assert built.result().form == "NFC"  # the run built its own, from today's rank file
    assert built.result().tokenizer is not pending.result()[0]


def test_a_failed_guess_falls_back_to_the_usual_build(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fastokens

    argv = ["gpu-prep", "run", "-c", "config.json", "--tokenizer", str(fresh)]
    _use(fresh, argv, monkeypatch)
    calls = []
    real = fastokens.Tokenizer.from_tiktoken

    def failing_once(*args: object, **kwargs: object) -> object:
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("the early build failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(fastokens.Tokenizer, "from_tiktoken", staticmethod(failing_once))
    pending, built = _use(fresh, argv, monkeypatch)
    with pytest.raises(RuntimeError, match="the early build failed"):
        pending.result()
    assert built.result().form == "NFC" and len(calls) == 2  # built again, from the rank file, by the usual path


def test_the_console_script_writes_the_same_output_with_a_head_start(tmp_path: Path) -> None:
    env = {"GPU_PREP_CACHE": str(tmp_path / "cache")}
    args = ["run", "-c", REPO / "configs" / "sft.json", REPO / "examples" / "chat.jsonl", "-q"]
    outputs = []
    for k in range(3):  # the first leaves the rank file, the second the hint, the third starts from it
        result = gpu_prep_cli(*args, "-o", tmp_path / f"out{k}", env=env)
        assert result.returncode == 0, result.stderr
        outputs.append(output_tree(tmp_path / f"out{k}", "seconds", "tokenizer.engine_check"))
    assert list((tmp_path / "cache" / "early").glob("hint*.json"))
    assert outputs[0] == outputs[1] == outputs[2]


def test_the_console_script_guesses_before_it_imports_the_cli(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import gpu_prep.cli
    from gpu_prep import launch

    seen = []
    monkeypatch.setattr(gpu_prep.cli, "main", lambda: seen.append(early._STATE["command"]))
    monkeypatch.setattr(sys, "argv", ["gpu-prep", "run", "-c", "config.json", "data.jsonl"])
    launch.main()
    assert seen == [[str(fresh.parent), "config.json", ""]]  # the command was known before the CLI ran
