"""What happens to rows longer than max_seq_len (preprocessing.truncation), text rows closed by eos, and
template-free segments. Expected samples are cut by hand from the same rows run without a limit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_prep.config import parse_config
from gpu_prep.errors import InputError
from gpu_prep.pipeline import Options, run
from helpers import run_rows, samples, write_jsonl

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

ROWS = [{"text": " ".join(f"word{i}x{k}" for k in range(n))} for i, n in enumerate([3, 40, 9, 120, 25])]
LIMIT = 32


def _text(truncation: str | None, max_seq_len: int = LIMIT, **extra: Any) -> dict[str, Any]:
    rules = {"max_seq_len": max_seq_len, "min_chars": 0}
    if truncation is not None:
        rules["truncation"] = truncation
    return {"input": {"type": "text", **extra}, "preprocessing": rules}


@pytest.fixture
def whole(tmp_path: Path) -> list[np.ndarray]:
    return [ids for ids, _ in samples(run_rows(tmp_path, _text(None, 1 << 20), ROWS, name="whole"))]


def test_right_keeps_the_first_tokens_and_the_end_of_document(tmp_path: Path, whole: list[np.ndarray]) -> None:
    # The eod appended to a text row closes it still (documents packed or concatenated stay apart, as a
    # tokenizer's [SEP] survives truncation): a long row keeps its first LIMIT - 1 tokens and the eod.
    got = [ids for ids, _ in samples(run_rows(tmp_path, _text("right"), ROWS))]
    assert [g.tolist() for g in got] == [w.tolist() if len(w) <= LIMIT else [*w[:LIMIT - 1], w[-1]] for w in whole]
    assert any(len(w) > LIMIT for w in whole)
    default = [ids for ids, _ in samples(run_rows(tmp_path, _text(None), ROWS, name="default"))]
    assert [d.tolist() for d in default] == [g.tolist() for g in got]  # right is the default


def test_left_keeps_the_last_tokens(tmp_path: Path, whole: list[np.ndarray]) -> None:
    got = [ids for ids, _ in samples(run_rows(tmp_path, _text("left"), ROWS))]
    assert [g.tolist() for g in got] == [w[-LIMIT:].tolist() for w in whole]


def test_drop_counts_long_rows_and_keeps_the_rest(tmp_path: Path, whole: list[np.ndarray]) -> None:
    data = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    manifest = run(parse_config(_text("drop")), [str(data)], tmp_path / "out", Options(rejects=tmp_path / "rejects.jsonl"))
    short = [w for w in whole if len(w) <= LIMIT]
    assert [ids.tolist() for ids, _ in samples(tmp_path / "out")] == [w.tolist() for w in short]
    assert manifest["totals"]["rows_dropped"] == {"too_many_tokens": len(whole) - len(short)}
    lines = [json.loads(x)["line"] for x in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    assert lines == [i + 1 for i, w in enumerate(whole) if len(w) > LIMIT]


def test_raise_stops_at_the_first_long_row(tmp_path: Path, whole: list[np.ndarray]) -> None:
    data = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    first = next(i + 1 for i, w in enumerate(whole) if len(w) > LIMIT)
    with pytest.raises(InputError, match=rf"rows.jsonl:{first}: over max_seq_len {LIMIT} tokens"):
        run(parse_config(_text("raise")), [str(data)], tmp_path / "out")


@pytest.mark.parametrize("cap", [50, 1 << 20])
def test_split_cuts_long_rows_into_windows_and_loses_nothing(tmp_path: Path, whole: list[np.ndarray],
                                                             cap: int) -> None:
    config = _text("split")
    config["output"] = {"max_tokens_per_shard": cap}
    out = run_rows(tmp_path, config, ROWS)
    got = [ids for ids, _ in samples(out)]
    want = [w[k:k + LIMIT] for w in whole for k in range(0, len(w), LIMIT)]
    assert all(len(w) % LIMIT != 1 for w in whole)  # no lone tail here: see the test below
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert all(len(g) <= LIMIT for g in got)


def test_split_under_wrapped_packing_wraps_whole_documents(tmp_path: Path, whole: list[np.ndarray]) -> None:
    # wrapped cuts the stream of samples every max_seq_len itself: windows cut first would be samples of their
    # own, and a row would restart positions (and lose a loss term) where a document's windows meet.
    import gpu_prep

    config = _text("split")
    config["preprocessing"]["packing"] = "wrapped"
    out = run_rows(tmp_path, config, ROWS)
    domain = gpu_prep.open(out)["__default__"]
    stream = np.concatenate([domain[i][0] for i in range(len(domain))])
    assert stream.tolist() == np.concatenate(whole).tolist()  # nothing lost, every row full but the last
    assert all(len(domain[i][0]) == LIMIT for i in range(len(domain) - 1))
    starts = np.cumsum([0, *map(len, whole)])[:-1]
    for i in range(len(domain)):  # a sample starts only where a document does, or where a row does
        inside = {int(b) + i * LIMIT for b in domain.segments(i)[:-1]}
        assert inside <= {*starts.tolist(), i * LIMIT}, (i, sorted(inside))


def test_split_never_leaves_the_eos_alone_in_a_window(tmp_path: Path, qwen: Any) -> None:
    row = {"text": " ".join(f"w{k}" for k in range(60))}
    [(whole, _)] = samples(run_rows(tmp_path, _text(None, 1 << 20, add_eos=True), [row], name="whole"))
    assert whole[-1] == qwen.special_ids()["eos_id"]
    limit = (len(whole) - 1) // 2  # two full windows and one token over: the eos
    got = [ids.tolist() for ids, _ in samples(run_rows(tmp_path, _text("split", limit, add_eos=True), [row]))]
    assert got == [whole[:limit].tolist(), whole[limit:2 * limit - 1].tolist(), whole[2 * limit - 1:].tolist()]
    assert got[-1][-1] == qwen.special_ids()["eos_id"] and len(got[-1]) == 2
    assert sum(got, []) == whole.tolist()


@pytest.mark.parametrize("kind", ["chat", "instruction", "segments", "auto"])
def test_split_is_refused_for_rows_with_turns(kind: str) -> None:
    # Windows cut wherever they fall would split turns and leave windows with nothing trained.
    from gpu_prep.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"truncation split .* for pretraining text .*; input.type {kind} is not"):
        parse_config({"input": {"type": kind}, "preprocessing": {"truncation": "split"}})
    parse_config({"input": {"type": "pretokenized"}, "preprocessing": {"truncation": "split"}})


def test_text_rows_can_close_with_eos_after_their_bos(tmp_path: Path, qwen: Any) -> None:
    [(ids, mask)] = samples(run_rows(tmp_path, _text(None, 1 << 20, add_eos=True), ROWS[:1]))
    assert qwen.decode(ids) == (qwen.prefix_text or "") + ROWS[0]["text"] + qwen.eos_text
    assert mask.all()


def test_segments_train_what_they_label(tmp_path: Path, qwen: Any) -> None:
    rows = [{"segments": [{"text": "Question: why?\n", "label": False}, {"text": "Because it is.", "label": True},
                          {"text": "\n-- footer", "label": False}]}]
    [(ids, mask)] = samples(run_rows(tmp_path, {"input": {"type": "segments"}}, rows))
    assert qwen.decode(ids) == "Question: why?\nBecause it is.\n-- footer"
    assert qwen.decode(ids[mask == 1]) == "Because it is."


@pytest.mark.parametrize(("row", "reason"), [
    ({"segments": [{"text": "x"}]}, "missing_field"),
    ({"segments": [{"text": "x", "label": "yes"}]}, "wrong_type"),
    ({"segments": "text"}, "wrong_type"),
    ({"segments": [{"text": "", "label": True}]}, "empty"),
])
def test_bad_segments_are_dropped_for_their_reason(tmp_path: Path, row: dict, reason: str) -> None:
    data = write_jsonl(tmp_path / "rows.jsonl", [row])
    manifest = run(parse_config({"input": {"type": "segments"}}), [str(data)], tmp_path / "out")
    assert manifest["totals"]["rows_dropped"] == {reason: 1}


def _conversation(turns: int, reasoning: bool = False) -> list[dict]:
    messages = [{"role": "system", "content": "You keep count."}]
    for t in range(turns):
        answer = {"role": "assistant", "content": f"Answer {t}: " + "ok " * 30}
        if reasoning:
            answer["reasoning_content"] = f"Thinking about {t}: " + "hmm " * 40
        messages += [{"role": "user", "content": f"Question {t}: " + "why " * 30}, answer]
    return messages


def _structured_run(tmp_path: Path, qwen: Any, messages: list[dict], limit: int, template: str = "chatml"):
    config = {"chat_template": template, "input": {"type": "chat"}, "mask": {"assistant": "train"},
              "preprocessing": {"max_seq_len": limit, "truncation": "structured", "min_chars": 0}}
    name = f"s{len(list(tmp_path.glob('s*-out')))}"
    out = run_rows(tmp_path, config, [{"messages": messages}], name=name)
    [(ids, mask)] = samples(out)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    return qwen.decode(ids), len(ids), manifest["totals"]


def test_structured_keeps_the_system_and_latest_turns_and_drops_the_oldest(tmp_path: Path, qwen: Any) -> None:
    messages = _conversation(6)
    whole, n, _ = _structured_run(tmp_path, qwen, messages, 100_000)
    two_turns = sum(len(qwen.engine.encode(m["content"]).ids) + 5 for m in messages[-4:]) + 20
    text, n, totals = _structured_run(tmp_path, qwen, messages, two_turns)
    assert n <= two_turns and text.startswith("<|im_start|>system\nYou keep count.")
    kept = [t for t in range(6) if f"Question {t}:" in text]
    assert kept == [4, 5] or kept == [3, 4, 5]  # the latest whole turns, oldest first, nothing cut inside
    assert text.endswith(whole[-len(text) + len("<|im_start|>system\nYou keep count.<|im_end|>\n"):])
    assert totals["parse_report"]["structured_dropped_turns"] == 6 - len(kept)
    assert totals["rows_truncated"] == 1


@pytest.mark.parametrize("limit,last_cut", [(60, "left"), (60, "prompt"), (110, "left"), (125, "left")])
def test_structured_trims_reasoning_before_cutting_tokens(tmp_path: Path, limit: int, last_cut: str) -> None:
    # The one turn fits without its reasoning (under 98 tokens), not with it (139): the reasoning keeps its
    # first tokens, as many as fit (the seed's "trim reasoning_content in kept turns"); where even none would
    # not fit, it goes whole and the last cut takes the first tokens (left, the seed's) or the question's end.
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    qwen3 = load_tokenizer("qwen3")
    messages = _conversation(1, reasoning=True)
    config = {"tokenizer": "qwen3", "input": {"type": "chat"}, "mask": {"assistant": "train"},
              "preprocessing": {"max_seq_len": limit, "truncation": "structured", "structured_last_cut": last_cut,
                                "min_chars": 0}}
    out = run_rows(tmp_path, config, [{"messages": messages}], name=f"r{limit}{last_cut}")
    [(ids, _)] = samples(out)
    text = qwen3.decode(ids)
    totals = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["totals"]
    assert totals["parse_report"]["structured_dropped_reasoning"] == 1
    assert totals["parse_report"]["structured_dropped_turns"] == 0
    assert len(ids) <= limit and "Answer 0:" in text
    kept = text.count("hmm")
    if limit < 90 and last_cut == "left":
        assert kept == 0 and "Thinking about" not in text and len(ids) == limit
        assert not text.startswith("<|im_start|>system") and totals["parse_report"]["structured_cut_content"] == 0
    elif limit < 90:
        assert kept == 0 and "Thinking about" not in text and text.startswith(
            "<|im_start|>system\nYou keep count.<|im_end|>\n<|im_start|>user\nQuestion")
        assert totals["parse_report"]["structured_cut_content"] == 1
    else:  # as much reasoning as fits: one token more would not
        assert "Question 0:" in text and 0 < kept < 40
        assert len(ids) > limit - 3


LONG_PROMPT = [{"role": "system", "content": "SYSTEM RULE: always answer in French."},
               {"role": "user", "content": "Explain this text: " + " ".join(f"word{k}" for k in range(300))},
               {"role": "assistant", "content": "It is a list of words."}]


def test_structured_falls_back_to_the_last_tokens(tmp_path: Path, qwen: Any) -> None:
    # The seed's last step (structured_last_cut: left, the default): what the turns cannot bring under
    # max_seq_len loses its first tokens.
    messages = _conversation(3)
    text, n, totals = _structured_run(tmp_path, qwen, messages, 40)
    assert n == 40 and "Answer 2:" in text and "Question 1:" not in text
    assert totals["parse_report"]["structured_dropped_turns"] == 2


@pytest.mark.parametrize("method", ["roles", "generation"])
def test_structured_cuts_the_end_of_a_long_prompt_and_keeps_the_system_and_headers(tmp_path: Path, method: str) -> None:
    # structured_last_cut: prompt. One turn too long for max_seq_len: the question keeps its first tokens, as many as fit (as
    # LLaMA-Factory keeps a prompt's start), and the system message, headers and answer stay whole. The
    # sample is exactly transformers' rendering of the cut conversation, ids and assistant mask.
    from reference import hf_tokenizer, write_tokenizer_dir
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    folder = write_tokenizer_dir(tmp_path / "tok")
    config = {"tokenizer": str(folder), "input": {"type": "chat", "mask_method": method}, "mask": {"assistant": "train"},
              "preprocessing": {"max_seq_len": 128, "truncation": "structured", "structured_last_cut": "prompt",
                                "min_chars": 0}}
    out = run_rows(tmp_path, config, [{"messages": LONG_PROMPT}])
    [(ids, mask)] = samples(out)
    tok = load_tokenizer(str(folder))
    kept = tok.decode(ids).split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
    question = LONG_PROMPT[1]["content"]
    assert question.startswith(kept) and len(kept) < len(question)
    cut = [LONG_PROMPT[0], {"role": "user", "content": kept}, LONG_PROMPT[2]]
    want = hf_tokenizer(folder).apply_chat_template(cut, tokenize=True, return_dict=True,
                                                    return_assistant_tokens_mask=True)
    assert ids.tolist() == list(want["input_ids"]) and mask.tolist() == list(want["assistant_masks"])
    n = tok.count_tokens(kept)  # as many as fit: one token more would not
    longer = [LONG_PROMPT[0], {"role": "user", "content": tok.first_tokens(question, n + 1)}, LONG_PROMPT[2]]
    assert len(ids) <= 128 < len(hf_tokenizer(folder).apply_chat_template(longer, tokenize=True, return_dict=True)["input_ids"])
    totals = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["totals"]
    assert totals["parse_report"]["structured_cut_content"] == 1 and totals["rows_truncated"] == 1


def test_structured_drops_a_row_whose_trained_text_alone_is_too_long(tmp_path: Path, qwen: Any) -> None:
    # The latest turn's answer and headers take more than max_seq_len even with the oldest turns dropped and
    # the question cut to one token: the row is dropped, saying why, rather than written from mid-text.
    config = {"chat_template": "chatml", "input": {"type": "chat"}, "mask": {"assistant": "train"},
              "preprocessing": {"max_seq_len": 40, "truncation": "structured", "structured_last_cut": "prompt",
                                "min_chars": 0}}
    out = run_rows(tmp_path, config, [{"messages": _conversation(3)}])
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["totals"]["rows_dropped"] == {"too_many_tokens": 1}
    [example] = manifest["dropped_examples"]["too_many_tokens"]
    assert example["detail"] == ("over max_seq_len 40 tokens with the longest untrained content (a user message's) "
                                 "cut to its first token: structured truncation keeps the system messages, the "
                                 "latest turn's headers and its trained text whole")


def test_a_row_with_nothing_trained_says_why(tmp_path: Path) -> None:
    # Trained text cut off by max_seq_len, against a mask rule that names no role of the rows (a typo).
    rows = [{"messages": [{"role": "user", "content": "a question of several words, " * 4},
                          {"role": "assistant", "content": "the answer"}]},
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    base = {"input": {"type": "chat"}, "chat_template": "chatml", "preprocessing": {"deduplicate": False}}
    cut = {**base, "mask": {"assistant": "train"}, "preprocessing": {"deduplicate": False, "max_seq_len": 16}}
    manifest = json.loads((run_rows(tmp_path, cut, rows, name="cut") / "manifest.json").read_text())
    [example] = manifest["dropped_examples"]["no_trained_tokens"]
    assert example["detail"] == "no trained token within the max_seq_len 16 tokens kept (the trained part was cut off)"
    typo = json.loads((run_rows(tmp_path, {**base, "mask": {"assitant": "train"}}, rows, name="typo")
                       / "manifest.json").read_text())
    assert typo["totals"]["rows_dropped"] == {"no_trained_tokens": 2}
    assert typo["dropped_examples"]["no_trained_tokens"][0]["detail"].startswith(
        "nothing in the row is trained: no message (or field) of a role whose mask rule is train")


def test_structured_takes_a_think_block_qwen3_splits_off_as_reasoning(tmp_path: Path) -> None:
    # Qwen3 writes a <think> block in an assistant's content as the turn's reasoning: structured truncation
    # trims it as it trims reasoning_content, instead of keeping it and cutting the row's first tokens (the
    # user's turn and the header) away.
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    qwen3 = load_tokenizer("qwen3")
    thought = "Let me think step by step about this. " * 40
    rows = [{"messages": [{"role": "user", "content": f"What is 2+2? ({k})"}, answer]} for k, answer in enumerate([
        {"role": "assistant", "content": "4", "reasoning_content": thought},
        {"role": "assistant", "content": f"<think>{thought}</think>4"},
        {"role": "assistant", "content": f"Okay. <think>{thought}</think>4"}])]
    config = {"tokenizer": "qwen3", "input": {"type": "chat"}, "mask": {"assistant": "train"},
              "preprocessing": {"max_seq_len": 64, "truncation": "structured", "min_chars": 0, "deduplicate": False}}
    out = run_rows(tmp_path, config, rows)
    texts = [qwen3.decode(ids) for ids, _ in samples(out)]
    assert len(texts) == 3 and all(t.startswith("<|im_start|>user\nWhat is 2+2?") for t in texts), texts
    assert len({t.replace(f"({k})", "") for k, t in enumerate(texts)}) == 1  # the three written alike
    totals = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["totals"]
    assert totals["parse_report"]["structured_dropped_reasoning"] == 3
