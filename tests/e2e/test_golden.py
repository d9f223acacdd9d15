"""Golden samples on the real bundled Qwen tokenizer, as readable text with the trained spans marked.

Each case runs the whole pipeline (gpu_prep.pipeline.run) on one row and reads the sample back with
gpu_prep.open_dataset, so a change anywhere from template rendering to the shard writer shows up here as a
diff a person can read. `pytest --update-golden` rewrites tests/e2e/golden/*.txt; review the diff before
committing it.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

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


def _shipped(name: str) -> dict[str, Any]:
    path = REPO / "configs" / name
    return load_json(path) if path.suffix == ".json" else yaml.safe_load(path.read_text(encoding="utf-8"))


def _example(name: str, line: int = 0) -> Any:
    return json.loads((REPO / "examples" / name).read_text(encoding="utf-8").splitlines()[line])


MIXED_SHAPES = ("messages", "sharegpt", "prompt_response", "alpaca", "text", "segments", "pretokenized")
QWEN3_ROW = {
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                "parameters": {"type": "object",
                                                               "properties": {"city": {"type": "string"}}}}}],
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "<think>It said sunny.</think>Sunny in Paris."},
    ],
}

# name -> (title, config, row); the cases named after a shipped config run it unchanged on the first row
# of its example file.
CASES: dict[str, tuple[str, dict[str, Any], Any]] = {
    "sharegpt": ("ShareGPT row, configs/sharegpt.yaml", _shipped("sharegpt.yaml"), _example("sharegpt.jsonl")),
    "alpaca": ("Alpaca row, configs/alpaca.yaml", _shipped("alpaca.yaml"), _example("alpaca.jsonl")),
    "segments": ("template-free segments, configs/segments.yaml", _shipped("segments.yaml"),
                 _example("segments.jsonl")),
    **{f"auto_{shape}": (f"input.type auto on a {shape} row, configs/auto.yaml", _shipped("auto.yaml"),
                         _example("mixed.jsonl", k)) for k, shape in enumerate(MIXED_SHAPES)},
    "multi_dialogue": ("a row that is a list of messages, with a knowledge role the template skips",
                       CHAT, [{"role": "system", "content": "Use the notes."},
                              {"role": "knowledge", "content": "Paris is in France."},
                              {"role": "user", "content": "Where is Paris?"},
                              {"role": "assistant", "content": "In France."}]),
    "qwen3_reasoning_tools": ("qwen3 template, reasoning (one inline <think>) and a tool call, think_loss on",
                              {"chat_template": "qwen3", "input": {"type": "chat", "extract_think_tags": True,
                                                                   "think_loss": True},
                               "mask": {"assistant": "train"}}, QWEN3_ROW),
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
