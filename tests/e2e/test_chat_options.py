"""Chat training options beside the mask rules: which end-of-turn tokens are trained (train_on_eos),
per-message training flags, and training on the last turn only. Trained text is read back from the
samples and compared with the turns written out by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import run_rows, samples

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

EOT = "<|im_end|>"
TURNS = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi there"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
         {"role": "assistant", "content": "Goodbye."}]


def _trained(tmp_path: Path, qwen: Any, messages: list[dict], template: str | None = "chatml",
             mask: dict | None = None, sep: str = "", **options: Any) -> str:
    """The trained text of one conversation, its stretches apart joined by sep (template None: the
    tokenizer's own, Qwen2.5's)."""
    config = {"input": {"type": "chat", **options}, "mask": mask or {"assistant": "train"},
              **({"chat_template": template} if template else {})}
    name = f"run{len(list(tmp_path.glob('run*-out')))}"
    [(ids, mask_)] = samples(run_rows(tmp_path, config, [{"messages": messages}], name=name))
    trained = np.flatnonzero(mask_ == 1)
    return sep.join(qwen.decode(ids[part]) for part in np.split(trained, np.flatnonzero(np.diff(trained) > 1) + 1))


@pytest.mark.parametrize(("policy", "want"), [
    ("turn", f"Hello.{EOT}Goodbye.{EOT}"),
    ("last", f"Hello.Goodbye.{EOT}"),
    ("none", "Hello.Goodbye."),
    ("all", f"{EOT}{EOT}Hello.{EOT}{EOT}Goodbye.{EOT}"),
])
def test_train_on_eos(tmp_path: Path, qwen: Any, policy: str, want: str) -> None:
    assert _trained(tmp_path, qwen, TURNS, train_on_eos=policy) == want


def test_train_on_eos_all_trains_the_turns_the_template_writes_on_its_own(tmp_path: Path, qwen: Any) -> None:
    # Qwen2.5's template writes its default system prompt where a conversation has none: "all" is every
    # turn's end-of-turn token (Axolotl's: every one in the sequence), that turn's too; "turn" leaves it.
    untold = TURNS[1:]
    assert _trained(tmp_path, qwen, untold, template=None, train_on_eos="all") == \
        f"{EOT}{EOT}Hello.{EOT}{EOT}Goodbye.{EOT}"
    assert _trained(tmp_path, qwen, untold, template=None, train_on_eos="turn") == f"Hello.{EOT}Goodbye.{EOT}"
    assert _trained(tmp_path, qwen, TURNS, template=None, train_on_eos="all") == f"{EOT}{EOT}Hello.{EOT}{EOT}Goodbye.{EOT}"


CALL = [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOL_TURNS = [{"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": "Let me check.", "tool_calls": CALL},
              {"role": "tool", "content": "18 C"},
              {"role": "assistant", "content": "", "tool_calls": CALL},
              {"role": "tool", "content": "18 C"},
              {"role": "assistant", "content": "It is 18 C."}]


@pytest.mark.parametrize(("policy", "want"), [
    ("turn", f"Let me check.\n{CALL_TEXT}{EOT}|{CALL_TEXT}{EOT}|It is 18 C.{EOT}"),
    ("last", f"Let me check.\n{CALL_TEXT}|{CALL_TEXT}|It is 18 C.{EOT}"),
    ("none", f"Let me check.\n{CALL_TEXT}|{CALL_TEXT}|It is 18 C."),
])
def test_a_tool_call_is_trained_whether_or_not_the_end_of_turn_token_is(tmp_path: Path, qwen: Any, policy: str,
                                                                       want: str) -> None:
    # The call is the assistant's output: train_on_eos decides the end-of-turn token alone.
    assert _trained(tmp_path, qwen, TOOL_TURNS, template=None, sep="|", train_on_eos=policy) == want


def test_a_trained_tool_result_leaves_the_template_markup_around_it_untrained(tmp_path: Path, qwen: Any) -> None:
    # Qwen2.5 writes a result as <tool_response>\n...\n</tool_response>: neither tag is the tool's text.
    trained = _trained(tmp_path, qwen, TOOL_TURNS, template=None, mask={"tool": "train"}, sep="|")
    assert trained == f"18 C|{EOT}|18 C|{EOT}"


def test_train_end_of_turn_false_means_none(tmp_path: Path, qwen: Any) -> None:
    assert _trained(tmp_path, qwen, TURNS, train_end_of_turn=False) == "Hello.Goodbye."


def test_per_message_flags_override_the_role_rule(tmp_path: Path, qwen: Any) -> None:
    messages = [dict(m) for m in TURNS]
    messages[1]["training"] = True   # a user turn trained
    messages[2]["training"] = False  # an assistant turn masked
    assert _trained(tmp_path, qwen, messages) == f"Hi there{EOT}Goodbye.{EOT}"
    assert _trained(tmp_path, qwen, messages, message_training_key=None) == f"Hello.{EOT}Goodbye.{EOT}"


def test_per_message_flags_as_openai_weights_and_values_that_are_no_flag(tmp_path: Path, qwen: Any) -> None:
    # OpenAI's fine-tuning format marks turns with "weight": 0 / 1; null is no flag; any other value would
    # silently leave the turn to its role's rule, so the row is dropped naming the message and the value.
    messages = [dict(m) for m in TURNS]
    messages[1]["weight"], messages[2]["weight"], messages[4]["weight"] = 1, 0, None
    assert _trained(tmp_path, qwen, messages, message_training_key="weight") == f"Hi there{EOT}Goodbye.{EOT}"
    for value in ("false", 2, 0.0, [False]):
        bad = [dict(m) for m in TURNS]
        bad[2]["training"] = value
        config = {"chat_template": "chatml", "input": {"type": "chat"}, "mask": {"assistant": "train"},
                  "preprocessing": {"deduplicate": False}}
        manifest = json.loads((run_rows(tmp_path, config, [{"messages": bad}, {"messages": TURNS}],
                                        name=f"bad{len(list(tmp_path.glob('bad*')))}") / "manifest.json").read_text())
        assert manifest["totals"]["rows_dropped"] == {"wrong_type": 1}, value
        [example] = manifest["dropped_examples"]["wrong_type"]
        assert f"message 2's 'training' must be true or false (or 1 / 0), got {value!r}" in example["detail"]


def test_last_turn_only(tmp_path: Path, qwen: Any) -> None:
    assert _trained(tmp_path, qwen, TURNS, train_last_turn_only=True) == f"Goodbye.{EOT}"


def test_reasoning_keys_and_think_tags_become_reasoning_content() -> None:
    from gpu_prep.config import parse_config
    from gpu_prep.format import get_builder

    build = get_builder("chat")
    row = {"messages": [{"role": "user", "content": "2+2?"},
                        {"role": "assistant", "content": "4", "thinking": "two and two"}]}
    assert build(row, parse_config({})).messages[1] == \
        {"role": "assistant", "content": "4", "reasoning_content": "two and two"}
    inline = {"messages": [{"role": "user", "content": "2+2?"},
                           {"role": "assistant", "content": "<think>\ntwo and two\n</think>\n\n4"}]}
    assert build(inline, parse_config({"input": {"extract_think_tags": True}})).messages[1] == \
        {"role": "assistant", "content": "4", "reasoning_content": "two and two"}
    assert build(inline, parse_config({})).messages[1]["content"].startswith("<think>")  # off by default


def test_qwen3_renders_reasoning_and_does_not_train_it(tmp_path: Path) -> None:
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    qwen3 = load_tokenizer("qwen3")
    rows = [{"messages": [{"role": "user", "content": "2+2?"},
                          {"role": "assistant", "content": "4", "reasoning": "two and two make four"}]}]
    config = {"tokenizer": "qwen3", "input": {"type": "chat"}, "mask": {"assistant": "train"}}
    [(ids, mask)] = samples(run_rows(tmp_path, config, rows))
    assert "two and two make four" in qwen3.decode(ids)
    trained = qwen3.decode(ids[mask == 1])
    assert "4" in trained and "two and two" not in trained


def test_the_parse_report_counts_reasoning_moves_and_extractions(tmp_path: Path) -> None:
    from gpu_prep.config import parse_config
    from gpu_prep.pipeline import run

    rows = [{"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "thinking": "t"}]},
            {"messages": [{"role": "user", "content": "Q2"},
                          {"role": "assistant", "content": "<think>t2</think>A2"},
                          {"role": "assistant", "content": "A3", "reasoning_content": "kept as is"}]}]
    data = tmp_path / "rows.jsonl"
    import json

    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"input": {"type": "chat", "extract_think_tags": True}, "mask": {"assistant": "train"}}
    report = run(parse_config(config), [str(data)], tmp_path / "out")["totals"]["parse_report"]
    assert report["moved_reasoning_keys"] == 1 and report["extracted_think_from_content"] == 1
    assert report["rows_with_tools"] == 0 and report["unknown_roles"] == {}


def _qwen3_run(tmp_path: Path, rows: list[dict], **options: Any) -> tuple[Any, list, dict]:
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    qwen3 = load_tokenizer("qwen3")
    config = {"tokenizer": "qwen3", "input": {"type": "chat", **options}, "mask": {"assistant": "train"}}
    name = f"q3run{len(list(tmp_path.glob('q3run*-out')))}"
    out = run_rows(tmp_path, config, rows, name=name)
    return qwen3, samples(out), json.loads((out / "manifest.json").read_text(encoding="utf-8"))


REASONING_ROW = {"messages": [{"role": "user", "content": "2+2?"},
                              {"role": "assistant", "content": "4", "reasoning": "two and two make four, surely"}]}


def test_think_mode_drop_removes_reasoning_and_counts_it(tmp_path: Path) -> None:
    qwen3, [(ids, _)], manifest = _qwen3_run(tmp_path, [REASONING_ROW], think_mode="drop")
    assert "two and two" not in qwen3.decode(ids)
    assert manifest["totals"]["parse_report"]["dropped_think_messages"] == 1
    _, [(kept, _)], manifest = _qwen3_run(tmp_path, [REASONING_ROW])
    assert "two and two make four, surely" in qwen3.decode(kept)
    assert manifest["totals"]["parse_report"]["dropped_think_messages"] == 0


def test_think_max_tokens_keeps_the_first_tokens_of_each_reasoning(tmp_path: Path) -> None:
    qwen3, [(ids, _)], _ = _qwen3_run(tmp_path, [REASONING_ROW], think_max_tokens=3)
    text = qwen3.decode(ids)
    assert "<think>\ntwo and two\n</think>" in text and "make four" not in text


@pytest.mark.parametrize("think_loss", [False, True])
def test_think_loss_trains_the_shown_reasoning_with_its_turn(tmp_path: Path, think_loss: bool) -> None:
    qwen3, [(ids, mask)], _ = _qwen3_run(tmp_path, [REASONING_ROW], think_loss=think_loss)
    trained = qwen3.decode(ids[mask == 1])
    want = "<think>\ntwo and two make four, surely\n</think>\n\n4<|im_end|>" if think_loss else "4<|im_end|>"
    assert trained == want


@pytest.mark.parametrize("think_loss", [False, True])
def test_think_loss_trains_the_empty_block_the_template_writes_for_a_turn_without_reasoning(
        tmp_path: Path, think_loss: bool) -> None:
    # Qwen3 writes an empty <think></think> before the last turn's content when it has no reasoning; a
    # model trained with think_loss on a mix of turns with and without reasoning must learn to open and
    # close the block on both (as TRL's Qwen3 training template trains it).
    row = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    qwen3, [(ids, mask)], _ = _qwen3_run(tmp_path, [row], think_loss=think_loss)
    assert "<think>\n\n</think>" in qwen3.decode(ids)
    assert qwen3.decode(ids[mask == 1]) == ("<think>\n\n</think>\n\n4<|im_end|>" if think_loss else "4<|im_end|>")


def test_character_ranges_of_a_message_are_trained_or_masked_by_its_detail(tmp_path: Path, qwen: Any) -> None:
    answer = "I'm doing very well, thank you!"
    detail = [{"begin_offset": 0, "end_offset": 8, "train": False},  # "I'm doing", end included
              {"begin_offset": 21, "end_offset": 30, "train": True}]
    messages = [{"role": "user", "content": "How are you?"},
                {"role": "assistant", "content": answer, "train_detail": detail},
                {"role": "user", "content": "Say it again."},
                {"role": "assistant", "content": answer, "training": False,
                 "train_detail": [{"begin_offset": 10, "end_offset": 19, "train": True}]}]
    trained = _trained(tmp_path, qwen, messages)
    # First answer: masked "I'm doing", the rest trained as the role says, its end of turn too. Second one:
    # masked by its flag but for "very well," (characters 10 to 19; the token " very" holds character 10,
    # so it is trained whole), and no end of turn.
    assert trained == f" very well, thank you!{EOT} very well,"


def test_a_malformed_detail_drops_the_row_naming_the_rule(tmp_path: Path) -> None:
    import json

    rows = [{"messages": [{"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": "Hello", "train_detail": [{"begin_offset": 3,
                                                                                      "end_offset": 9, "train": True}]}]}]
    out = run_rows(tmp_path, {"chat_template": "chatml", "input": {"type": "chat"}, "mask": {"assistant": "train"}},
                   rows)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["totals"]["rows_dropped"] == {"wrong_type": 1}
    assert "train_detail" in manifest["dropped_examples"]["wrong_type"][0]["detail"]


def test_end_of_turn_tokens_can_be_named_and_train_on_eot_is_train_on_eos(tmp_path: Path, qwen: Any) -> None:
    template = ("{% for m in messages %}{{ m.role }}: {{ m.content }} [END]\n{% endfor %}")
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]

    def trained(**options: Any) -> str:
        config = {"chat_template": template, "input": {"type": "chat", **options}, "mask": {"assistant": "train"}}
        name = f"eot{len(list(tmp_path.glob('eot*-out')))}"
        [(ids, mask)] = samples(run_rows(tmp_path, config, [{"messages": messages}], name=name))
        return qwen.decode(ids[mask == 1])

    assert trained().strip() == "Hello"  # " [END]" is plain text to this tokenizer: not an end of turn
    assert trained(end_of_turn_tokens=["[END]"]).strip() == "Hello [END]"
    assert trained(end_of_turn_tokens=["[END]"], train_on_eot="none").strip() == "Hello"


def test_train_on_eot_and_train_on_eos_must_agree() -> None:
    from gpu_prep.config import parse_config
    from gpu_prep.errors import ConfigError

    assert parse_config({"input": {"train_on_eot": "all"}}).input.train_on_eos == "all"
    with pytest.raises(ConfigError, match="train_on_eot"):
        parse_config({"input": {"train_on_eot": "all", "train_on_eos": "none"}})
    # Axolotl's train_on_eos beside gpu-prep's train_end_of_turn: the two said different things, and false
    # silently won (train_on_eos all trained no end-of-turn token at all).
    for eos, flag in (("all", False), ("turn", False), ("none", True)):
        with pytest.raises(ConfigError, match=f"train_end_of_turn {str(flag).lower()} and train_on_eos {eos} disagree"):
            parse_config({"input": {"train_on_eos": eos, "train_end_of_turn": flag}})
    assert parse_config({"input": {"train_on_eos": "none", "train_end_of_turn": False}}).input.train_on_eos == "none"
    # a dataset of a mix that sets one of the two overrides the top level's pair, which agrees with itself
    mix = parse_config({"input": {"train_on_eos": "all", "train_end_of_turn": True},
                        "datasets": [{"name": "a", "data_paths": ["a.jsonl"], "input": {"train_on_eos": "none"}}]})
    assert mix.dataset_config(0).input.train_on_eos == "none"


@pytest.mark.parametrize("truncation", ["right", "left", "structured"])
def test_trained_tokens_are_counted_by_role_after_truncation(tmp_path: Path, qwen: Any, truncation: str) -> None:
    rows = [{"messages": TURNS}, {"text": "A plain document, trained whole."}]
    config = {"chat_template": "chatml", "input": {"type": "auto"}, "mask": {"user": "train", "assistant": "train"},
              "preprocessing": {"max_seq_len": 12, "truncation": truncation, "min_chars": 0}}
    out = run_rows(tmp_path, config, rows)
    totals = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["totals"]
    by_role = totals["trained_tokens_by_role"]
    assert sum(by_role.values()) == totals["trained_tokens"] and by_role["(whole pieces)"] > 0
    (_, chat_mask), (_, text_mask) = samples(out)
    assert by_role.get("user", 0) + by_role.get("assistant", 0) == int(chat_mask.sum())
    assert by_role["(whole pieces)"] == int(text_mask.sum())
    # Right truncation keeps the first turns (a user's only); left and structured the last (the assistant's goodbye).
    assert set(by_role) - {"(whole pieces)"} == ({"user"} if truncation == "right" else {"user", "assistant"})


INLINE_THINK = [{"messages": [{"role": "user", "content": "2+2?"},
                              {"role": "assistant", "content": "<think>\nSimple addition.\n</think>\n\n4"}]}]


def test_qwen3_takes_an_inline_think_block_in_the_last_turn_as_written(tmp_path: Path) -> None:
    # Qwen3's template moves a <think> block out of the last turn's content into its own; read as it is
    # (extract_think_tags off, the default) the content is trained whole, block included; read as the turn's
    # reasoning, the block is shown and not trained.
    qwen3, [(ids, mask)], manifest = _qwen3_run(tmp_path, INLINE_THINK)
    assert manifest["totals"]["rows_written"] == 1
    assert qwen3.decode(ids[mask == 1]) == "<think>\nSimple addition.\n</think>\n\n4<|im_end|>"
    # think_loss is false: the block is trained as content, and counted so (the run summary warns of it)
    assert manifest["totals"]["parse_report"]["think_blocks_trained"] == 1
    assert _qwen3_run(tmp_path, INLINE_THINK, think_loss=True)[2]["totals"]["parse_report"]["think_blocks_trained"] == 0
    # think_mode drop and think_max_tokens act on reasoning given apart, not on a block in the content: they
    # left it whole without a word; now each such block is counted (the summary says to set extract_think_tags)
    for option in ({"think_mode": "drop"}, {"think_max_tokens": 1}):
        report = _qwen3_run(tmp_path, INLINE_THINK, **option)[2]["totals"]["parse_report"]
        assert report["think_blocks_untouched"] == 1, option
        assert _qwen3_run(tmp_path, INLINE_THINK, extract_think_tags=True, **option)[2]["totals"]["parse_report"] \
            .get("think_blocks_untouched", 0) == 0
    assert manifest["totals"]["parse_report"]["think_blocks_untouched"] == 0
    # ... only where the message is trained: by its own flag, and under train_last_turn_only
    question, answer = INLINE_THINK[0]["messages"]
    last = {"role": "assistant", "content": "<think>\nAgain.\n</think>\n\n6"}  # Qwen3 shows the last turn's block
    flagged = [{"messages": [question, answer, {"role": "user", "content": "And 3+3?"}, {**last, "training": False}]}]
    assert _qwen3_run(tmp_path, flagged)[2]["totals"]["parse_report"]["think_blocks_trained"] == 0
    calls = [{"messages": [question, {"role": "assistant", "content": "<think>\nUse the tool.\n</think>\n\nChecking.",
                                      "tool_calls": CALL}, {"role": "tool", "content": "4"}, {"role": "assistant", "content": "4"}]}]
    for last_only, counted in ((False, 1), (True, 0)):  # both after the last user turn: the block is shown
        report = _qwen3_run(tmp_path, calls, train_last_turn_only=last_only)[2]["totals"]["parse_report"]
        assert report["think_blocks_trained"] == counted
    _, [(ids, mask)], _ = _qwen3_run(tmp_path, INLINE_THINK, extract_think_tags=True)
    assert "Simple addition." in qwen3.decode(ids) and qwen3.decode(ids[mask == 1]) == "4<|im_end|>"


EARLIER_THINK = [{"messages": [{"role": "user", "content": "2+2?"},
                               {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
                               {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6"}]}]


def test_a_think_block_the_template_strips_from_an_earlier_turn_is_counted(tmp_path: Path, qwen: Any) -> None:
    # Qwen3's template strips the reasoning of turns before the last user turn, an inline <think> block
    # included: the ids follow the template (transformers' rendering), and the parse report counts the block.
    # Qwen2.5's template writes the block as text: nothing is counted; nor is Qwen3's last turn's block.
    from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
    from reference import hf_tokenizer

    qwen3, [(ids, mask)], manifest = _qwen3_run(tmp_path, EARLIER_THINK)
    reference = hf_tokenizer(bundled_tokenizer_dir("qwen3")).apply_chat_template(
        EARLIER_THINK[0]["messages"], tokenize=True, return_dict=True)["input_ids"]
    assert ids.tolist() == list(reference) and "add them" not in qwen3.decode(ids)
    assert manifest["totals"]["parse_report"]["think_blocks_not_rendered"] == 1
    # a turn that thinks and calls a tool, stripped so: its block is counted once, not as text left out too
    calling = [{"messages": [{"role": "user", "content": "Weather in Paris?"},
                             {"role": "assistant", "content": "<think>Call the tool.</think>", "tool_calls": CALL},
                             {"role": "tool", "content": "18 C"}, {"role": "assistant", "content": "It is 18 C."},
                             {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "Welcome."}]}]
    _, _, manifest = _qwen3_run(tmp_path, calling)
    assert manifest["totals"]["parse_report"]["think_blocks_not_rendered"] == 1
    assert not manifest["totals"].get("messages_left_out_by_template")
    _, _, manifest = _qwen3_run(tmp_path, INLINE_THINK)
    assert manifest["totals"]["parse_report"]["think_blocks_not_rendered"] == 0
    config = {"input": {"type": "chat"}, "mask": {"assistant": "train"}}
    out = run_rows(tmp_path, config, EARLIER_THINK, name="qwen25")
    [(ids, _)] = samples(out)
    report = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["totals"]["parse_report"]
    assert "add them" in qwen.decode(ids) and report["think_blocks_not_rendered"] == 0


def test_the_run_summary_warns_of_think_blocks_the_template_stripped_or_trained(tmp_path: Path) -> None:
    from helpers import gpu_prep_cli, write_jsonl

    (tmp_path / "c.json").write_text(json.dumps({"tokenizer": "qwen3", "input": {"type": "chat"},
                                                 "mask": {"assistant": "train"}}))
    data = write_jsonl(tmp_path / "rows.jsonl", EARLIER_THINK + INLINE_THINK)
    result = gpu_prep_cli("run", "-c", tmp_path / "c.json", data, "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert "wrote nothing of the <think> block in the content of 1 message(s)" in said
    assert "1 trained message(s) hold a <think> block in their content, trained as content although " \
        "input.think_loss is false" in said


def test_a_think_block_no_reading_can_place_says_what_to_set(tmp_path: Path) -> None:
    # A template that closes no turn whose content holds <think>: neither reading of the block aligns, and
    # the row's drop says which setting reads the block as reasoning.
    template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if '<think>' not in m.content %}</{{ m.role }}>"
                "{% endif %}{% endfor %}")
    config = {"chat_template": template, "input": {"type": "chat"}, "mask": {"assistant": "train"}}
    plain = {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]}
    out = run_rows(tmp_path, config, INLINE_THINK + [plain], name="hint")
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    [example] = manifest["dropped_examples"]["template_error"]
    assert example["detail"].endswith("input.extract_think_tags: true reads a leading one as the turn's reasoning"), example


MID_THINK = [{"messages": [{"role": "user", "content": "2+2?"},
                           {"role": "assistant", "content": "Sure. <think>\nSimple addition.\n</think>4"}]}]


@pytest.mark.parametrize("extract", [False, True])
def test_qwen3_takes_a_think_block_after_other_text_as_its_template_writes_it(tmp_path: Path, extract: bool) -> None:
    # Qwen3's template splits a last turn holding </think> wherever the block stands, and writes no text
    # from before <think>: the row is trained as the template wrote it (it used to be dropped, as a
    # template_error naming the user's message). extract_think_tags moves only a leading block.
    qwen3, [(ids, mask)], manifest = _qwen3_run(tmp_path, MID_THINK, extract_think_tags=extract)
    assert manifest["totals"]["rows_written"] == 1
    assert qwen3.decode(ids[mask == 1]) == "<think>\nSimple addition.\n</think>\n\n4<|im_end|>"
    from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
    from reference import hf_tokenizer

    reference = hf_tokenizer(bundled_tokenizer_dir("qwen3")).apply_chat_template(
        MID_THINK[0]["messages"], tokenize=True, return_dict=True)["input_ids"]
    assert ids.tolist() == list(reference)


def test_reasoning_a_template_does_not_show_is_counted(tmp_path: Path) -> None:
    # Qwen2.5's template writes no reasoning: the rows are written without it, and the parse report says
    # how many; Qwen3's shows it (the last turn's), and nothing is counted.
    config = {"input": {"type": "chat"}, "mask": {"assistant": "train"}}
    out = run_rows(tmp_path, config, [REASONING_ROW], name="qwen25")
    report = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["totals"]["parse_report"]
    assert report["reasoning_not_rendered"] == 1 and report["moved_reasoning_keys"] == 1
    _, _, manifest = _qwen3_run(tmp_path, [REASONING_ROW])
    assert manifest["totals"]["parse_report"]["reasoning_not_rendered"] == 0
    assert manifest["totals"]["rows_truncated"] == 0


def test_reasoning_the_template_drops_by_design_is_not_counted(tmp_path: Path) -> None:
    # Qwen3 shows only the last turn's reasoning, and think_max_tokens keeps only its first tokens: neither
    # is a template that shows no reasoning.
    earlier = {"messages": [{"role": "user", "content": "1+1?"},
                            {"role": "assistant", "content": "2", "reasoning_content": "one and one"},
                            {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    _, _, manifest = _qwen3_run(tmp_path, [earlier])
    assert manifest["totals"]["parse_report"]["reasoning_not_rendered"] == 0
    long = {"messages": [{"role": "user", "content": "2+2?"},
                         {"role": "assistant", "content": "4", "reasoning_content": "two and two " * 40}]}
    _, _, manifest = _qwen3_run(tmp_path, [long], think_max_tokens=4)
    assert manifest["totals"]["parse_report"]["reasoning_not_rendered"] == 0


def test_a_rows_system_field_opens_a_conversation_without_one(tmp_path: Path, qwen: Any) -> None:
    # LLaMA-Factory's sharegpt rows keep the system prompt in a `system` column beside the conversation: it
    # opens the rendering in place of the template's default system prompt; a system message of the
    # conversation's own wins; input.field_system null reads none; a system field that is no string is a drop.
    import json

    from gpu_prep.config import parse_config
    from gpu_prep.pipeline import Options, run

    talk = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]
    rows = [{"conversations": talk, "system": "You are a pirate."},
            {"conversations": [{"from": "system", "value": "Own prompt."}, *talk], "system": "Not used."},
            {"conversations": talk, "system": ""},
            {"conversations": talk, "system": ["not", "text"]},
            {"conversations": [*talk, {"from": "system", "value": "Later own prompt."}], "system": "Not used either."}]
    data = tmp_path / "sg.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def rendered(field: Any) -> tuple[list[str], dict]:
        config = {"input": {"type": "sharegpt", "field_system": field}, "mask": {"assistant": "train"},
                  "preprocessing": {"deduplicate": False}}
        out = tmp_path / f"out-{field}"
        manifest = run(parse_config(config), [str(data)], out, Options(rejects=tmp_path / f"{field}.jsonl"))
        return [qwen.decode(ids) for ids, _ in samples(out)], manifest["totals"]

    texts, totals = rendered("system")
    assert "You are a pirate." in texts[0] and "You are Qwen" not in texts[0]
    assert "Own prompt." in texts[1] and "Not used." not in texts[1]
    assert "You are Qwen" in texts[2]  # an empty field: the template's default, as with no field
    assert "Not used either." not in texts[3]  # a system message of its own anywhere: no second one
    assert totals["parse_report"]["system_from_field"] == 1 and totals["parse_report"]["system_field_not_used"] == 2
    assert totals["rows_dropped"] == {"wrong_type": 1}
    texts, totals = rendered(None)
    assert "You are a pirate." not in texts[0] and totals["rows_written"] == 5


def test_a_chat_rows_system_field_taken_as_its_system_prompt_is_warned_about(tmp_path: Path) -> None:
    # Scraped chat data often keeps metadata in a `system` column (the model that wrote it): chat rows take
    # it as the system prompt by default (input.field_system), which replaced the template's own without a
    # word; the summary now says so. ShareGPT rows, whose system column is LLaMA-Factory's system prompt, not.
    from helpers import write_jsonl

    from gpu_prep.config import parse_config
    from gpu_prep.pipeline import Options, run
    from gpu_prep.run.manifest import summary_warnings

    messages = [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "A helpful assistant."}]
    config = {"input": {"type": "chat"}, "mask": {"assistant": "train"}, "preprocessing": {"min_chars": 0}}
    manifest = json.loads((run_rows(tmp_path, config, [{"messages": messages, "system": "gpt-4-0613"}]) /
                           "manifest.json").read_text(encoding="utf-8"))
    said = " ".join(summary_warnings(manifest))
    assert "1 chat row(s) took their system prompt from the row's 'system' field (input.field_system)" in said
    assert "set input.field_system: null" in said
    talk = [{"from": "human", "value": "Who are you?"}, {"from": "gpt", "value": "A helpful assistant."}]
    sharegpt = run_rows(tmp_path, {**config, "input": {"type": "sharegpt"}}, [{"conversations": talk, "system": "Be brief."}],
                        name="sg")
    manifest = json.loads((sharegpt / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["totals"]["parse_report"]["system_from_field"] == 1
    assert "system prompt from the row's" not in " ".join(summary_warnings(manifest))
    # in a mix the count is every dataset's, whatever its type: not said to be chat rows'
    rows = write_jsonl(tmp_path / "sg.jsonl", [{"conversations": talk, "system": "Be brief."}])
    mix = {**config, "datasets": [{"name": "sg", "data_paths": [str(rows)], "input": {"type": "sharegpt"}}]}
    manifest = run(parse_config(mix), [], tmp_path / "mix", Options())
    assert manifest["totals"]["parse_report"]["system_from_field"] == 1
    assert "system prompt from the row's" not in " ".join(summary_warnings(manifest))
