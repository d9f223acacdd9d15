"""The QLoRA seed's config, written as its docs write it, runs unchanged: configs/qlora_seed.yaml holds the
seed's flat keys (dataset_schema, messages_field, assistant_roles, truncate_side, extract_think_tags,
max_length, reasoning_keys), read as other names of gpu-prep's keys (gpu_prep/config/qlora_keys.py).

The reference is transformers: each row's conversation (prompt_response rows as a user turn and an
assistant turn, inline <think> and reasoning keys moved to reasoning_content, as the seed's
canonicalize_row does) rendered with apply_chat_template, and the assistant's content and the <|im_end|>
closing it found in that rendering by hand. gpu-prep's ids must equal apply_chat_template's, and its loss
mask must train exactly those tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, gpu_prep_cli, load_json, samples, write_jsonl
from reference import hf_tokenizer

from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
from gpu_prep.config import load_config, parse_config
from gpu_prep.errors import ConfigError
from gpu_prep.format import Conversation, detect_schema, get_builder

SEED_CONFIG = REPO / "configs" / "qlora_seed.yaml"
HEADER, END = "<|im_start|>assistant\n", "<|im_end|>"

# Rows of both of the seed's schemas, each beside the conversation the seed's canonicalize_row makes of it.
CASES: list[tuple[dict[str, Any], list[dict[str, Any]]]] = [
    ({"messages": [{"role": "system", "content": "You are a helpful assistant."},
                   {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]},
     [{"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]),
    ({"prompt": "What is the capital of France?", "response": "Paris, on the Seine."},
     [{"role": "user", "content": "What is the capital of France?"},
      {"role": "assistant", "content": "Paris, on the Seine."}]),
    ({"prompt": "Name a prime above 10.", "response": "<think>11 has no divisor but 1 and itself.</think>11."},
     [{"role": "user", "content": "Name a prime above 10."},
      {"role": "assistant", "content": "11.", "reasoning_content": "11 has no divisor but 1 and itself."}]),
    ({"messages": [{"role": "user", "content": "Is 91 prime?"},
                   {"role": "assistant", "content": "<think>\n91 = 7 * 13.\n</think>\n\nNo: 91 is 7 times 13."}]},
     [{"role": "user", "content": "Is 91 prime?"},
      {"role": "assistant", "content": "No: 91 is 7 times 13.", "reasoning_content": "91 = 7 * 13."}]),
    ({"messages": [{"role": "user", "content": "What is 17 * 3?"},
                   {"role": "assistant", "content": "51.", "thinking": "17 * 3 = 51."},
                   {"role": "user", "content": "Spell it."},
                   {"role": "assistant", "content": "Fifty-one.", "reason": "Say it in words."}]},
     [{"role": "user", "content": "What is 17 * 3?"},
      {"role": "assistant", "content": "51.", "reasoning_content": "17 * 3 = 51."},
      {"role": "user", "content": "Spell it."},
      {"role": "assistant", "content": "Fifty-one.", "reasoning_content": "Say it in words."}]),
]


def reference(hf: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """apply_chat_template's ids, and a mask training each assistant message's content and the <|im_end|>
    that closes it (a token is trained when any of its characters is, as transformers' assistant mask)."""
    text = hf.apply_chat_template(messages, tokenize=False)
    spans, start = [], 0
    for message in (m for m in messages if m["role"] == "assistant"):
        start = text.index(HEADER, start) + len(HEADER)
        end = text.index(END, start)
        assert text[end - len(message["content"]):end] == message["content"], "the content closes its turn"
        spans.append((end - len(message["content"]), end + len(END)))
        start = end
    encoded = hf(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a < high and b > low for low, high in spans)) for a, b in encoded["offset_mapping"]]
    ids = hf.apply_chat_template(messages, tokenize=True)["input_ids"]
    assert ids == encoded["input_ids"], "the template's tokenization is the text's"
    return ids, mask


def run_seed_config(tmp_path: Path, rows: list[dict[str, Any]], *options: str) -> Path:
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    out = tmp_path / "out"
    done = gpu_prep_cli("run", "-c", SEED_CONFIG, data, "-o", out, "-q", *options)
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.parametrize("tokenizer", ["qwen2.5", "qwen3"])
def test_the_seed_config_gives_apply_chat_template_ids_and_trains_only_the_assistant(tmp_path: Path,
                                                                                      tokenizer: str) -> None:
    out = run_seed_config(tmp_path, [row for row, _ in CASES], "--tokenizer", tokenizer)
    hf = hf_tokenizer(bundled_tokenizer_dir(tokenizer))
    got = samples(out)
    assert len(got) == len(CASES)
    for k, ((ids, mask), (_, messages)) in enumerate(zip(got, CASES)):
        want_ids, want_mask = reference(hf, messages)
        assert ids.tolist() == want_ids, f"row {k}: ids differ from apply_chat_template"
        assert mask.tolist() == want_mask, f"row {k}: trained tokens differ: {hf.decode(ids[mask == 1])!r}"
    totals = load_json(out / "manifest.json")["totals"]
    assert totals["rows_by_schema"] == {"chat": 3, "prompt_response": 2}
    assert totals["trained_tokens_by_role"] == {"assistant": totals["trained_tokens"]}
    assert totals["parse_report"]["extracted_think_from_content"] == 2
    assert totals["parse_report"]["moved_reasoning_keys"] == 2


def test_the_readme_command_runs_the_example(tmp_path: Path) -> None:
    done = gpu_prep_cli("run", "-c", "configs/qlora_seed.yaml", "examples/qlora_seed.jsonl", "-o", tmp_path / "out", "-q")
    assert done.returncode == 0, done.stderr
    totals = load_json(tmp_path / "out" / "manifest.json")["totals"]
    assert totals["rows_written"] == 5 and totals["rows_by_schema"] == {"chat": 3, "prompt_response": 2}


def test_truncate_side_left_prunes_the_oldest_turns_as_the_seed_does(tmp_path: Path) -> None:
    """max_length (set on the command line in the seed's own spelling) too small for the whole conversation:
    the oldest turn after the system message goes, the system message and the latest turn stay whole."""
    system = {"role": "system", "content": "Answer briefly."}
    old = [{"role": "user", "content": "Tell me about rivers. " * 20}, {"role": "assistant", "content": "Rivers flow. " * 30}]
    latest = [{"role": "user", "content": "And lakes?"}, {"role": "assistant", "content": "Lakes are still."}]
    hf = hf_tokenizer(bundled_tokenizer_dir("qwen2.5"))
    want_ids, want_mask = reference(hf, [system, *latest])
    out = run_seed_config(tmp_path, [{"messages": [system, *old, *latest]}], "--set", f"max_length={len(want_ids)}")
    (ids, mask), = samples(out)
    assert ids.tolist() == want_ids and mask.tolist() == want_mask
    assert load_json(out / "manifest.json")["totals"]["parse_report"]["structured_dropped_turns"] == 1


SEED = {"dataset_schema": "auto", "messages_field": "chats", "assistant_roles": ["assistant", "tool"],
        "truncate_side": "left", "max_length": 4096, "extract_think_tags": True, "reasoning_keys": ["why"],
        "think_mode": "drop", "think_max_tokens": 64, "think_loss": True}


def test_each_seed_key_sets_its_gpu_prep_key() -> None:
    config = parse_config(SEED)
    inp, pre = config.input, config.preprocessing
    assert (inp.type, inp.auto_prompt_type) == ("auto", "prompt_response")
    assert inp.messages_key == "chats" and inp.roles_to_train == ["assistant", "tool"]
    assert (pre.truncation, pre.max_seq_len) == ("structured", 4096)
    assert (inp.extract_think_tags, inp.reasoning_keys) == (True, ["why"])
    assert (inp.think_mode, inp.think_max_tokens, inp.think_loss) == ("drop", 64, True)
    assert [config.action(r) for r in ("system", "user", "assistant", "tool")] == ["mask", "mask", "train", "train"]
    assert parse_config({"dataset_schema": "messages"}).input.type == "chat"
    assert parse_config({"dataset_schema": "prompt_response"}).input.type == "prompt_response"


def test_the_config_file_is_the_seeds_own_keys() -> None:
    """Nothing but the seed's spellings in it, and they mean what the seed says."""
    import yaml

    assert set(yaml.safe_load(SEED_CONFIG.read_text(encoding="utf-8"))) == {
        "dataset_schema", "messages_field", "assistant_roles", "truncate_side", "extract_think_tags",
        "max_length", "reasoning_keys"}
    config = load_config(SEED_CONFIG)
    assert (config.input.type, config.input.auto_prompt_type, config.preprocessing.truncation) == \
        ("auto", "prompt_response", "structured")


@pytest.mark.parametrize("config, named", [
    ({"max_length": 4096, "preprocessing": {"max_seq_len": 2048}}, "preprocessing.max_seq_len"),
    ({"messages_field": "chats", "input": {"messages_key": "messages"}}, "input.messages_key"),
    ({"messages_field": "chats", "input": {"field_messages": "messages"}}, "input.field_messages"),
    ({"dataset_schema": "messages", "input": {"type": "sharegpt"}}, "input.type"),
    ({"dataset_schema": "auto", "input": {"type": "auto", "auto_prompt_type": "instruction"}}, "input.auto_prompt_type"),
    ({"truncate_side": "left", "preprocessing": {"truncation": "right"}}, "preprocessing.truncation"),
    ({"extract_think_tags": True, "input": {"extract_think_tags": False}}, "input.extract_think_tags"),
    ({"reasoning_keys": ["why"], "input": {"reasoning_keys": ["thinking"]}}, "input.reasoning_keys"),
    ({"assistant_roles": ["assistant"], "input": {"roles_to_train": ["user"]}}, "input.roles_to_train"),
    ({"assistant_roles": ["assistant"], "mask": {"assistant": "mask"}}, "mask.assistant"),
    ({"assistant_roles": ["assistant"], "mask": {"user": "train"}}, "mask.user"),
    ({"assistant_roles": ["assistant"], "mask_default": "train"}, "mask_default"),
])
def test_a_seed_key_and_its_gpu_prep_key_that_disagree_are_refused(config: dict, named: str) -> None:
    alias = next(iter(config))
    with pytest.raises(ConfigError, match=rf"{alias}.*{named}.*disagree"):
        parse_config(config)


def test_a_seed_key_and_its_gpu_prep_key_that_agree_are_one_setting() -> None:
    config = parse_config({"max_length": 1024, "preprocessing": {"max_seq_len": 1024}, "truncate_side": "left",
                           "dataset_schema": "auto", "input": {"type": "auto", "field_messages": "chats"},
                           "messages_field": "chats", "assistant_roles": ["assistant"], "mask": {"assistant": "train"}})
    assert (config.preprocessing.max_seq_len, config.input.messages_key, config.action("assistant")) == (1024, "chats", "train")


@pytest.mark.parametrize("config, message", [
    ({"truncate_side": "right"}, "cannot be honoured.*preprocessing.truncation: right"),
    ({"truncate_side": "middle"}, "truncate_side: 'middle' is not allowed"),
    ({"dataset_schema": "alpaca"}, "dataset_schema: 'alpaca' is not allowed; allowed: 'messages', 'prompt_response', 'auto'"),
    ({"assistant_roles": "assistant"}, "assistant_roles: give a list of role names"),
    ({"input": {"dataset_schema": "auto"}}, "input.dataset_schema: unknown key; .*input.type"),
])
def test_what_cannot_be_honoured_is_refused_saying_why(config: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(config)


def test_a_conflict_in_a_config_file_stops_the_cli_naming_both_keys(tmp_path: Path) -> None:
    config = tmp_path / "seed.yaml"
    config.write_text("dataset_schema: auto\nmax_length: 4096\npreprocessing:\n  max_seq_len: 2048\n", encoding="utf-8")
    data = write_jsonl(tmp_path / "data.jsonl", [{"prompt": "Hi.", "response": "Hello."}])
    done = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", "-q")
    assert done.returncode == 2 and "max_length: 4096" in done.stderr and "preprocessing.max_seq_len is 2048" in done.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_gpu_preps_own_auto_keeps_prompt_response_rows_template_free() -> None:
    """Only the seed's dataset_schema auto (or input.auto_prompt_type) sends them through the template."""
    row = {"prompt": "Hi.", "response": "<think>greet</think>Hello."}
    assert detect_schema(row, parse_config({"input": {"type": "auto"}})) == "instruction"
    seed = parse_config({"dataset_schema": "auto", "extract_think_tags": True})
    assert detect_schema(row, seed) == "prompt_response"
    shape = get_builder("prompt_response")(row, seed)
    assert isinstance(shape, Conversation)
    assert shape.messages == [{"role": "user", "content": "Hi."},
                              {"role": "assistant", "content": "Hello.", "reasoning_content": "greet"}]


def test_prompt_response_rows_are_checked_like_instruction_rows() -> None:
    from gpu_prep.format import RowError

    config = parse_config({"dataset_schema": "prompt_response"})
    build = get_builder("prompt_response")
    for row, reason in [({"prompt": "Hi."}, "missing_field"), ({"prompt": "Hi.", "response": 3}, "wrong_type"),
                        ({"prompt": "Hi.", "response": "  "}, "empty")]:
        with pytest.raises(RowError) as caught:
            build(row, config)
        assert caught.value.reason == reason, json.dumps(row)


def test_resolve_moves_the_seed_keys_and_leaves_a_config_without_them_alone() -> None:
    from gpu_prep.config.qlora_keys import resolve

    roles = ("system", "user", "assistant", "tool")
    plain = {"input": {"type": "chat"}}
    assert resolve(plain, roles) is plain
    moved = resolve({"dataset_schema": "messages", "max_length": 512, "assistant_roles": ["assistant"],
                     "input": {"messages_key": "messages"}}, roles)
    assert moved == {"input": {"messages_key": "messages", "type": "chat", "roles_to_train": ["assistant"]},
                     "preprocessing": {"max_seq_len": 512}}
    with pytest.raises(ValueError, match=r"mask.user is 'train'"):
        resolve({"assistant_roles": ["assistant"], "mask": {"user": "train"}}, roles)
