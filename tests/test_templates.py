"""Chat template sources (the config's chat_template): the tokenizer's, named templates written here, a
Jinja string or file, and ChatML as a fallback. Named templates are checked against their chat formats
written out by hand; runs with them train exactly the assistant contents and their end of turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_prep.chat_template import ChatTemplate
from gpu_prep.config import parse_config
from gpu_prep.errors import ConfigError
from gpu_prep.templates import NAMED, resolve_template
from helpers import run_rows, samples

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

CONVERSATION = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
                {"role": "assistant", "content": "Goodbye."}]
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}
EXPECTED = {
    "chatml": "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
              "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
              "<|im_start|>assistant\nGoodbye.<|im_end|>\n",
    "llama3": "<s><|start_header_id|>system<|end_header_id|>\n\nBe terse.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nGoodbye.<|eot_id|>",
    "gemma": "<s><start_of_turn>user\nBe terse.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
             "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\nGoodbye.<end_of_turn>\n",
    "mistral": "<s>[INST] Be terse.\n\nHi there [/INST]Hello.</s>[INST] Bye [/INST]Goodbye.</s>",
    "deepseek": "<s>Be terse.<\uff5cUser\uff5c>Hi there<\uff5cAssistant\uff5c>Hello.<\uff5cend\u2581of\u2581sentence\uff5c>"
                "<\uff5cUser\uff5c>Bye<\uff5cAssistant\uff5c>Goodbye.<\uff5cend\u2581of\u2581sentence\uff5c>",
    "qwen3": "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
             "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
             "<|im_start|>assistant\nGoodbye.<|im_end|>\n",
}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_templates_write_their_chat_format(name: str) -> None:
    assert ChatTemplate(NAMED[name], SPECIALS).render(CONVERSATION, None) == EXPECTED[name]


@pytest.mark.parametrize("name", ["chatml", "llama3", "gemma", "mistral", "deepseek", "qwen3"])
def test_runs_with_a_named_template_train_the_assistant_turns(tmp_path: Path, qwen: Any, name: str) -> None:
    config = {"chat_template": name, "input": {"type": "chat"}, "mask": {"assistant": "train"}}
    [(ids, mask)] = samples(run_rows(tmp_path, config, [{"messages": CONVERSATION}]))
    closing = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "gemma": "<end_of_turn>", "mistral": qwen.eos_text,
               "deepseek": "<\uff5cend\u2581of\u2581sentence\uff5c>", "qwen3": "<|im_end|>"}
    trained = qwen.decode(ids[mask == 1])
    # Where the template's markers are not tokens of this vocabulary (all but chatml here), a token may
    # straddle a span's edge and is then trained (any of its bytes in the span, transformers' rule).
    if name in ("chatml", "qwen3"):
        assert trained.replace("\n", "") == f"Hello.{closing[name]}Goodbye.{closing[name]}"
    assert f"Hello.{closing[name]}" in trained and f"Goodbye.{closing[name]}" in trained
    assert "Hi there" in qwen.decode(ids) and "Hi there" not in trained and "terse" not in trained


def test_a_jinja_string_or_file(tmp_path: Path, qwen: Any) -> None:
    jinja = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    path = tmp_path / "mine.jinja"
    path.write_text(jinja)
    for choice in (jinja, str(path)):
        config = {"chat_template": choice, "input": {"type": "chat"}, "mask": {"assistant": "train"}}
        [(ids, mask)] = samples(run_rows(tmp_path, config, [{"messages": CONVERSATION[1:3]}], name=f"r{len(choice)}"))
        assert qwen.decode(ids) == "<user>Hi there</user><assistant>Hello.</assistant>"
        trained = qwen.decode(ids[mask == 1])
        assert "Hello." in trained and len(trained) <= len("Hello.") + 4 and "Hi" not in trained


def test_the_fallback_is_used_only_without_a_tokenizer_template() -> None:
    assert resolve_template("tokenizer_default_fallback_chatml", "OWN") == ("OWN", ())
    assert resolve_template("tokenizer_default_fallback_chatml", None) == (NAMED["chatml"], ("<|im_end|>",))
    assert resolve_template("tokenizer_default", None) == (None, ())


def test_unknown_or_missing_templates_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="chat_template 'vicuna' is not known"):
        parse_config({"chat_template": "vicuna"})
    with pytest.raises(ConfigError, match="cannot read it"):
        resolve_template(str(tmp_path / "absent.jinja"), None)


def test_qwen3_shows_reasoning_only_after_the_last_user_turn(tmp_path: Path, qwen: Any) -> None:
    turns = [dict(m) for m in CONVERSATION]
    turns[2]["reasoning_content"] = "greeting back"
    turns[4]["reasoning_content"] = "\nsaying goodbye\n"
    rendered = ChatTemplate(NAMED["qwen3"], SPECIALS).render(turns, None)
    assert "greeting back" not in rendered
    assert "<|im_start|>assistant\n<think>\nsaying goodbye\n</think>\n\nGoodbye.<|im_end|>" in rendered
    config = {"chat_template": "qwen3", "input": {"type": "chat"}, "mask": {"assistant": "train"}}
    [(ids, mask)] = samples(run_rows(tmp_path, config, [{"messages": turns}]))
    assert "saying goodbye" in qwen.decode(ids)
    assert qwen.decode(ids[mask == 1]) == "Hello.<|im_end|>Goodbye.<|im_end|>"


def test_qwen3_lists_tools_and_writes_calls_and_results_as_its_family_does() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    turns = [{"role": "system", "content": "S."}, {"role": "user", "content": "Q"},
             {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}},
                                                                 {"function": {"name": "f", "arguments": '{"x": 2}'}}]},
             {"role": "tool", "content": "one"}, {"role": "tool", "content": "two"},
             {"role": "assistant", "content": "Done."}]
    want = ('<|im_start|>system\nS.\n\n# Tools\n\n<tools>\n'
            '{"type": "function", "function": {"name": "f", "parameters": {}}}\n</tools><|im_end|>\n'
            '<|im_start|>user\nQ<|im_end|>\n'
            '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "f", "arguments": {"x": 2}}\n</tool_call><|im_end|>\n'
            '<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n</tool_response>'
            '<|im_end|>\n<|im_start|>assistant\nDone.<|im_end|>\n')
    assert ChatTemplate(NAMED["qwen3"], SPECIALS).render(turns, tools) == want
