"""Golden samples on the real bundled Qwen tokenizer, as readable text with the trained spans marked.

Each case runs the whole pipeline (gpu_prep.pipeline.run) on one row and reads the sample back with
gpu_prep.open_dataset, so a change anywhere from template rendering to the shard writer shows up here as a
diff a person can read. `pytest --update-golden` rewrites tests/golden/*.txt; review the diff before
committing it.
"""

from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Any

import pytest

from helpers import REPO, golden_document, load_json, marked_text, run_rows, samples

pytestmark = pytest.mark.usefixtures("fast_tokenizer")
GOLDEN = Path(__file__).resolve().parent / "golden"

MULTI_TURN = {
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "What is 3+3?"},
        {"role": "assistant", "content": "6"},
    ]
}
CHAT = {
    "version": 1,
    "input": {"type": "chat"},
    "mask": {"system": "mask", "user": "mask", "assistant": "train"},
}


def _with_scope(scope: str) -> dict[str, Any]:
    config = copy.deepcopy(CHAT)
    config["input"]["mask_scope"] = scope
    return config


# name -> (title, config, row); the instruction and pretraining cases use the shipped configs unchanged.
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "chat_multi_turn": ("chat, multi-turn, mask_scope content (assistant content + <|im_end|> trained)",
                        _with_scope("content"), MULTI_TURN),
    "chat_multi_turn_turn_scope": ("chat, multi-turn, mask_scope turn (whole assistant turn trained)",
                                   _with_scope("turn"), MULTI_TURN),
    "instruction": ("instruction row, configs/instruction.json (response + eos trained)",
                    load_json(REPO / "configs" / "instruction.json"),
                    {"instruction": "Translate to German: Good morning.", "output": "Guten Morgen."}),
    "pretrain": ("pretraining text row, configs/pretrain.json (every token trained)",
                 load_json(REPO / "configs" / "pretrain.json"),
                 {"content": "Byte-level BPE starts from the 256 possible bytes and repeatedly merges the most "
                             "frequent adjacent pair, so any text can be encoded without an unknown token."}),
}


def _check_golden(path: Path, actual: str, update: bool) -> None:
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
    if not path.exists():
        pytest.fail(f"{path} is missing; create it with `pytest --update-golden` and review it")
    expected = path.read_text(encoding="utf-8")
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            f"{path.name} (golden)", f"{path.name} (now)"))
        pytest.fail(f"output differs from {path}; if intended, rerun with --update-golden\n{diff}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str, qwen: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    title, config, row = CASES[name]
    out = run_rows(tmp_path, config, [row], tokenizer="qwen2.5", device="cpu")
    written = samples(out)
    assert len(written) == 1, "the golden row must be written, not dropped"
    ids, loss_mask = written[0]
    _check_golden(GOLDEN / f"{name}.txt", golden_document(title, qwen, ids, loss_mask),
                  request.config.getoption("--update-golden"))


# Mask checks found while reviewing the goldens: the trained runs of one conversation, spelled out from
# the Qwen2.5 template by hand.

TOOL_CONVERSATION = {
    "messages": [
        {"role": "system", "content": "S."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.",
         "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]
}
TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _trained_runs(tmp_path: Path, qwen: Any, config: dict[str, Any], row: dict[str, Any]) -> list[str]:
    (ids, loss_mask), = samples(run_rows(tmp_path, config, [row]))
    return re.findall("⟦(.*?)⟧", marked_text(qwen, ids, loss_mask), flags=re.DOTALL)


def test_content_scope_trains_assistant_content_and_end_of_turn(tmp_path: Path, qwen: Any) -> None:
    runs = _trained_runs(tmp_path, qwen, _with_scope("content"), MULTI_TURN)
    assert runs == ["4<|im_end|>", "6<|im_end|>"]


def test_turn_scope_does_not_train_the_default_system_prompt(tmp_path: Path, qwen: Any) -> None:
    config = {**_with_scope("turn"), "mask": {"system": "mask", "user": "train", "assistant": "train"}}
    row = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    runs = _trained_runs(tmp_path, qwen, config, row)
    assert runs == ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"]


def test_content_scope_trains_tool_calls_and_their_end_of_turn(tmp_path: Path, qwen: Any) -> None:
    runs = _trained_runs(tmp_path, qwen, _with_scope("content"), TOOL_CONVERSATION)
    assert runs == [f"Let me check.\n{TOOL_CALL}<|im_end|>", "Sunny.<|im_end|>"]


def test_turn_scope_does_not_train_the_tool_response(tmp_path: Path, qwen: Any) -> None:
    runs = _trained_runs(tmp_path, qwen, _with_scope("turn"), TOOL_CONVERSATION)
    assert runs and all("tool_response" not in run and "sunny" not in run for run in runs)
    assert runs[-1] == "<|im_start|>assistant\nSunny.<|im_end|>\n"
