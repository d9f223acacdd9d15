"""Input shapes other trainers use: ShareGPT conversations, custom message keys with role maps, roles to
train, and Alpaca-style instruction rows with custom formats. Each is checked against the plain shape it
stands for (the same samples, token for token), or against its prompt written out by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import gpu_prep
from gpu_prep.config import ALPACA_FORMAT, ALPACA_NO_INPUT_FORMAT, parse_config
from gpu_prep.format import dedup_text, get_builder
from gpu_prep.pipeline import run
from helpers import REPO, run_rows, samples

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

OPENAI = [
    {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4."}]},
    {"messages": [{"role": "user", "content": "Capital of Peru?"}, {"role": "assistant", "content": "Lima."},
                  {"role": "user", "content": "And of Chile?"}, {"role": "assistant", "content": "Santiago."}]},
]
CHAT = {"input": {"type": "chat"}, "mask": {"assistant": "train"}}


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))


def _sharegpt(rows: list[dict], names: dict[str, str]) -> list[dict]:
    return [{"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in r["messages"]]}
            for r in rows]


def test_sharegpt_rows_give_the_openai_rows_samples(tmp_path: Path) -> None:
    want = samples(run_rows(tmp_path, CHAT, OPENAI, name="openai"))
    rows = _sharegpt(OPENAI, {"system": "system", "user": "human", "assistant": "gpt"})
    got = samples(run_rows(tmp_path, {"input": {"type": "sharegpt"}, "mask": {"assistant": "train"}}, rows))
    assert _same(got, want)


@pytest.mark.parametrize("input_type", ["prompt_response", "auto"])
def test_trls_conversational_prompt_completion_rows_give_the_openai_rows_samples(tmp_path: Path, input_type: str) -> None:
    # TRL's SFT prompt-completion rows: the prompt's messages, then the completion's (here the last turn),
    # only the completion trained, as TRL trains it: the second row's first answer, in its prompt, is not.
    flagged = [{"messages": [{**m, "training": False} for m in r["messages"][:-1]] + r["messages"][-1:]} for r in OPENAI]
    want = samples(run_rows(tmp_path, CHAT, flagged, name="openai"))
    assert _same(want[:1], samples(run_rows(tmp_path, CHAT, OPENAI[:1], name="plain")))  # one answer: all trained
    rows = [{"prompt": r["messages"][:-1], "completion": r["messages"][-1:]} for r in OPENAI]
    unmarked = run_rows(tmp_path, {**CHAT, "input": {"type": input_type, "message_training_key": None}}, rows,
                        name="unmarked")  # no key to mark the prompt with: said, not trained whole
    assert json.loads((unmarked / "manifest.json").read_text())["totals"]["rows_dropped"] == {"wrong_type": 2}
    got = samples(run_rows(tmp_path, {**CHAT, "input": {"type": input_type}}, rows))
    assert _same(got, want)


def test_custom_keys_and_a_role_map_give_the_openai_rows_samples(tmp_path: Path) -> None:
    want = samples(run_rows(tmp_path, CHAT, OPENAI, name="openai"))
    rows = [{"dialogue": [{"speaker": {"system": "sys", "user": "person", "assistant": "bot"}[m["role"]],
                           "text": m["content"]} for m in r["messages"]]} for r in OPENAI]
    config = {"input": {"type": "chat", "field_messages": "dialogue",
                        "message_property_mappings": {"role": "speaker", "content": "text"},
                        "roles": {"system": ["sys"], "user": ["person"], "assistant": ["bot"]}},
              "mask": {"assistant": "train"}}
    assert _same(samples(run_rows(tmp_path, config, rows)), want)


def test_other_mapped_message_keys_are_renamed() -> None:
    config = parse_config({"input": {"message_property_mappings": {"reasoning_content": "thinking"}}})
    row = {"messages": [{"role": "assistant", "content": "4", "thinking": "2 and 2", "name": "calc"}]}
    message = get_builder("chat")(row, config).messages[0]
    assert message == {"role": "assistant", "content": "4", "reasoning_content": "2 and 2", "name": "calc"}


@pytest.mark.parametrize("input_type", ["chat", "auto"])
def test_plain_messages_are_read_as_the_long_way_reads_them(input_type: str) -> None:
    # A {role, content} message is taken as it is only where the long way would give the same message: its
    # role is not renamed (input.roles, or the sharegpt names auto knows), and no reasoning key reads its
    # role or content.
    row = {"messages": [{"role": "human", "content": "hi"}, {"role": "assistant", "content": "4"}]}
    plain = get_builder("chat")(row, parse_config({"input": {"type": input_type}}))
    want_first = {"role": "user" if input_type == "auto" else "human", "content": "hi"}
    assert plain.messages == [want_first, {"role": "assistant", "content": "4"}]
    assert plain.messages[1] is row["messages"][1]  # taken as it is, not copied
    odd = get_builder("chat")(row, parse_config({"input": {"type": input_type, "reasoning_keys": ["content"]}}))
    assert odd.messages[1]["reasoning_content"] == "4" and "moved_reasoning_keys" in odd.notes


def test_roles_to_train_combines_with_the_mask_rules(tmp_path: Path) -> None:
    by_mask = samples(run_rows(tmp_path, CHAT, OPENAI, name="mask"))
    by_roles = samples(run_rows(tmp_path, {"input": {"type": "chat", "roles_to_train": ["assistant"]}}, OPENAI,
                                name="roles"))
    assert _same(by_roles, by_mask)
    both = {"input": {"type": "chat", "roles_to_train": ["assistant", "user"]}, "mask": {"user": "mask"}}
    assert _same(samples(run_rows(tmp_path, both, OPENAI, name="both")), by_mask)  # `mask` names win
    config = parse_config({"input": {"roles_to_train": ["narrator"]}, "mask": {"user": "train"}})
    assert [config.action(r) for r in ("narrator", "user", "assistant")] == ["train", "train", "mask"]


def test_message_property_mappings_and_role_key_must_agree() -> None:
    with pytest.raises(Exception, match="disagree"):
        parse_config({"input": {"role_key": "a", "message_property_mappings": {"role": "b"}}})


ALPACA = {"input": {"type": "alpaca"}, "mask": {"response": "train"}, "preprocessing": {"min_chars": 0}}


@pytest.mark.parametrize(("row", "prompt"), [
    ({"instruction": "Add them.", "input": "2 and 3", "output": "5"},
     ALPACA_FORMAT.replace("{instruction}", "Add them.").replace("{input}", "2 and 3")),
    ({"instruction": "Say hi.", "input": "", "output": "hi"}, ALPACA_NO_INPUT_FORMAT.replace("{instruction}", "Say hi.")),
    ({"instruction": "Say hi.", "output": "hi", "system": "Be brief."},
     "Be brief.\n\n" + ALPACA_NO_INPUT_FORMAT.replace("{instruction}", "Say hi.")),
    ({"instruction": "Use {input} literally.", "input": "{system}", "output": "ok"},
     ALPACA_FORMAT.replace("{instruction}", "Use {input} literally.").replace("### Input:\n{input}", "### Input:\n{system}")),
])
def test_alpaca_rows_are_written_with_their_format(tmp_path: Path, qwen: Any, row: dict, prompt: str) -> None:
    [(ids, mask)] = samples(run_rows(tmp_path, ALPACA, [row]))
    assert qwen.decode(ids) == prompt + row["output"] + qwen.eos_text
    assert qwen.decode(ids[mask == 1]) == row["output"] + qwen.eos_text  # the prompt is masked


def test_a_custom_instruct_format(tmp_path: Path, qwen: Any) -> None:
    config = yaml.safe_load((REPO / "configs" / "mistral_instruct.yaml").read_text())
    [(ids, _)] = samples(run_rows(tmp_path, config, [{"input": "Why?", "output": "Because."}]))
    assert qwen.decode(ids) == "[INST] Why? [/INST]Because." + qwen.eos_text


def test_alpaca_rows_dedup_on_their_own_text() -> None:
    # Every row's prompt starts with the same long preamble; dedup must look past it.
    config = parse_config(ALPACA)
    build = get_builder("alpaca")
    a = build({"instruction": "One.", "output": "1"}, config)
    b = build({"instruction": "Two.", "output": "2"}, config)
    assert dedup_text(a) == "One.\n1" and dedup_text(a)[:200] != dedup_text(b)[:200]


@pytest.mark.parametrize(("config", "data", "rows"), [
    ("sharegpt.yaml", "sharegpt.jsonl", 3), ("alpaca.yaml", "alpaca.jsonl", 3), ("segments.yaml", "segments.jsonl", 2),
    ("auto.yaml", "mixed.jsonl", 7), ("reasoning_tools.yaml", "reasoning_tools.jsonl", 3),
    ("pretokenized.yaml", "pretokenized.jsonl", 3), ("chat_options.yaml", "chat_options.jsonl", 3),
])
def test_example_configs_run(tmp_path: Path, config: str, data: str, rows: int) -> None:
    from gpu_prep.pipeline import run

    manifest = run(parse_config(yaml.safe_load((REPO / "configs" / config).read_text())),
                   [str(REPO / "examples" / data)], tmp_path / "out")
    assert manifest["totals"]["rows_written"] == rows, json.dumps(manifest["totals"])
    assert 0 < manifest["totals"]["trained_tokens"] < manifest["totals"]["tokens"]


def test_the_reasoning_example_uses_what_its_config_turns_on(tmp_path: Path) -> None:
    from gpu_prep.pipeline import run
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    config = parse_config(yaml.safe_load((REPO / "configs" / "reasoning_tools.yaml").read_text()))
    manifest = run(config, [str(REPO / "examples" / "reasoning_tools.jsonl")], tmp_path / "out")
    report = manifest["totals"]["parse_report"]
    assert report["rows_with_tools"] == 1 and report["tools_parsed_from_string"] == 1
    assert report["moved_reasoning_keys"] == 2 and report["extracted_think_from_content"] == 1
    qwen3 = load_tokenizer("qwen3")
    (ids, mask), second, _ = list(gpu_prep.open_dataset(tmp_path / "out")["__default__"])
    trained = qwen3.decode(ids[mask == 1])
    assert "<think>\nThe user wants Paris; call the tool.\n</think>" in trained  # think_loss
    assert "get_weather" in trained and "18 and clear." in trained and "clear in Paris." in trained
    assert "Fifty-one" in qwen3.decode(second[0][second[1] == 1]) and "that is 51" not in qwen3.decode(
        second[0][second[1] == 1])  # train_detail masks characters 11 to 21


def test_compressed_inputs_read_like_plain_ones(tmp_path: Path) -> None:
    import gzip

    import pyarrow as pa

    from gpu_prep.errors import InputError
    from gpu_prep.pipeline import run

    data = b"".join(json.dumps(r).encode() + b"\n" for r in OPENAI * 3)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_bytes(data)
    (tmp_path / "data" / "b.jsonl.gz").write_bytes(gzip.compress(data))
    with pa.output_stream(str(tmp_path / "data" / "c.jsonl.zst"), compression="zstd") as out:
        out.write(data)
    (tmp_path / "data" / "d.json.gz").write_bytes(gzip.compress(json.dumps(OPENAI * 3).encode()))
    (tmp_path / "data" / "notes.md").write_text("not an input: a folder gives only the files it can read")
    config = parse_config({**CHAT, "preprocessing": {"deduplicate": False}})
    manifest = run(config, [str(tmp_path / "data")], tmp_path / "out")
    assert [Path(f["path"]).name for f in manifest["inputs"]] == ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d.json.gz"]
    assert [f["rows_written"] for f in manifest["inputs"]] == [6, 6, 6, 6]
    per_file = len(samples(tmp_path / "out")) // 4
    got = samples(tmp_path / "out")
    assert all(_same(got[:per_file], got[k * per_file:(k + 1) * per_file]) for k in range(4))
    cut = tmp_path / "cut.jsonl.gz"
    whole = gzip.compress(data * 200)
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match="cut.jsonl.gz: cannot decompress beyond line"):
        run(config, [str(cut)], tmp_path / "cut-out")


MIXED = [
    ("chat", OPENAI[0]),
    ("sharegpt", _sharegpt(OPENAI[1:], {"user": "human", "assistant": "gpt"})[0]),
    ("instruction", {"prompt": "Name a colour.", "response": "Teal."}),
    ("alpaca", {"instruction": "Add.", "input": "1 and 2", "output": "3"}),
    ("text", {"text": "A plain document of pretraining text."}),
    ("segments", {"segments": [{"text": "Q: ", "label": False}, {"text": "A.", "label": True}]}),
    ("pretokenized", {"input_ids": [100, 200, 300], "labels": [-100, 200, 300]}),
]
MIXED_RULES = {"mask": {"assistant": "train", "response": "train"}, "preprocessing": {"min_chars": 0}}


def test_auto_builds_each_row_by_its_shape(tmp_path: Path) -> None:
    rows = [row for _, row in MIXED] + [{"unrelated": 1}]
    config = {"input": {"type": "auto"}, **MIXED_RULES}
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from gpu_prep.pipeline import run

    manifest = run(parse_config(config), [str(data)], tmp_path / "auto")
    assert manifest["totals"]["rows_by_schema"] == {kind: 1 for kind, _ in MIXED}
    assert manifest["totals"]["rows_dropped"] == {"unknown_schema": 1}
    got = samples(tmp_path / "auto")
    for k, (kind, row) in enumerate(MIXED):  # each sample is what its own input type makes of it
        alone = samples(run_rows(tmp_path, {"input": {"type": kind}, **MIXED_RULES}, [row], name=kind))
        assert _same(got[k:k + 1], alone), kind


def test_pretokenized_rows_are_passed_through(tmp_path: Path) -> None:
    # A chat sample as gpu-prep writes it, handed back as a pre-tokenized row (with padding), comes out equal.
    [(ids, mask)] = samples(run_rows(tmp_path, CHAT, OPENAI[:1], name="chat"))
    row = {"input_ids": ids.tolist() + [0, 0], "attention_mask": [1] * len(ids) + [0, 0],
           "labels": [int(t) if m else -100 for t, m in zip(ids, mask)] + [-100, -100]}
    config = {"input": {"type": "pretokenized"}, "preprocessing": {"deduplicate": False}}
    assert _same(samples(run_rows(tmp_path, config, [row, {"input_ids": ids.tolist()}])),
                 [(ids, mask), (ids, np.ones_like(mask))])


@pytest.mark.parametrize(("row", "reason"), [
    ({"input_ids": [1, 2, 3], "labels": [2, 3, -100]}, "wrong_type"),  # shifted labels
    ({"input_ids": [1, 2, 3], "labels": [1, 2]}, "wrong_type"),
    ({"input_ids": [1, 10**9]}, "wrong_type"),
    ({"input_ids": [1, -5]}, "wrong_type"),
    ({"input_ids": "1 2 3"}, "wrong_type"),
    ({"input_ids": [1, 2.5]}, "wrong_type"),
    ({"input_ids": [1, 2], "attention_mask": [0, 0]}, "empty"),
    ({"input_ids": [1, 2], "attention_mask": [1, 2]}, "wrong_type"),
    ({"input_ids": [7, 8, 9], "attention_mask": [1, 0, 1]}, "wrong_type"),  # a hole is not padding
    ({"input_ids": [1, 2, 3], "labels": [-100, -100, -100]}, "no_trained_tokens"),
    ({"input_ids": []}, "empty"),
    ({"tokens": [1, 2]}, "missing_field"),
])
def test_bad_pretokenized_rows_are_dropped_for_their_reason(tmp_path: Path, row: dict, reason: str) -> None:
    from gpu_prep.pipeline import run

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row) + "\n")
    manifest = run(parse_config({"input": {"type": "pretokenized"}}), [str(data)], tmp_path / "out")
    assert manifest["totals"]["rows_dropped"] == {reason: 1}


def test_pretokenized_rows_say_what_is_wrong_and_are_deduplicated_whole(tmp_path: Path) -> None:
    from gpu_prep.format import RowError, build_pretokenized

    config = parse_config({"input": {"type": "pretokenized"}})
    for ids, detail in (([1, "2"], "input_ids[1] is str '2', not an integer"), ([True], "input_ids[0] is bool True")):
        with pytest.raises(RowError, match=re.escape(detail)):
            build_pretokenized({"input_ids": ids}, config)
    with pytest.raises(RowError, match=r"attention_mask\[1\] is 0 between tokens it keeps"):
        build_pretokenized({"input_ids": [7, 8, 9], "attention_mask": [1, 0, 1]}, config)
    padded = build_pretokenized({"input_ids": [0, 7, 8, 0], "attention_mask": [0, 1, 1, 0]}, config)
    assert padded.ids == [7, 8]
    # Rows sharing a long template header differ after it: ids written out, 200 characters hold only ~40 of them.
    header = list(range(1000, 1050))
    rows = [{"input_ids": header + [5, 6]}, {"input_ids": header + [9, 10]}, {"input_ids": header + [5, 6]}]
    from gpu_prep.pipeline import Options, run

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = run(config, [str(data)], tmp_path / "out", Options(rejects=tmp_path / "rejects.jsonl"))
    assert manifest["totals"]["rows_written"] == 2 and manifest["totals"]["rows_dropped"] == {"duplicate": 1}
    assert "it equals an earlier row (rows of this kind are hashed whole)" in (tmp_path / "rejects.jsonl").read_text()
    # Split cuts rows trained whole: a row over max_seq_len whose labels mask some tokens is refused, named;
    # one that fits is written as it is, its labels kept.
    split = parse_config({"input": {"type": "pretokenized"}, "preprocessing": {"truncation": "split", "max_seq_len": 4,
                                                                              "deduplicate": False}})
    data.write_text(json.dumps({"input_ids": list(range(100, 110)), "labels": [-100] * 5 + list(range(105, 110))})
                    + "\n" + json.dumps({"input_ids": list(range(200, 210))}) + "\n"
                    + json.dumps({"input_ids": [300, 301, 302], "labels": [-100, 301, 302]}) + "\n")
    manifest = run(split, [str(data)], tmp_path / "split", Options(rejects=tmp_path / "split.jsonl"))
    assert manifest["totals"]["rows_written"] == 2 and manifest["totals"]["rows_dropped"] == {"too_many_tokens": 1}
    assert "its 10 tokens are over max_seq_len (4) and its labels mask 5 of them: truncation split cuts only rows " \
           "trained whole" in (tmp_path / "split.jsonl").read_text()
    assert [m.tolist() for _, m in samples(tmp_path / "split")][-1] == [0, 1, 1]


@pytest.mark.parametrize("key", ["tools", "tool_schemas", "functions", "function_schemas"])
@pytest.mark.parametrize("form", ["list", "dict", "string"])
def test_tools_are_found_under_any_of_their_names(key: str, form: str) -> None:
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    value = {"list": [tool], "dict": tool, "string": json.dumps([tool])}[form]
    conv = get_builder("chat")({"messages": OPENAI[0]["messages"], key: value}, parse_config(CHAT))
    assert conv.tools == [tool]


def test_tools_reach_the_template_and_are_counted(tmp_path: Path, qwen: Any) -> None:
    from gpu_prep.pipeline import run

    tool = {"type": "function", "function": {"name": "lookup_weather", "parameters": {"type": "object"}}}
    rows = [{**OPENAI[0], "functions": json.dumps([tool])}, {**OPENAI[1], "tools": "{not json"}]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = run(parse_config(CHAT), [str(data)], tmp_path / "out")
    assert manifest["totals"]["parse_report"]["rows_with_tools"] == 1
    assert manifest["totals"]["parse_report"]["tools_parsed_from_string"] == 1
    assert manifest["totals"]["rows_dropped"] == {"wrong_type": 1}
    [(ids, mask)] = samples(tmp_path / "out")
    assert "lookup_weather" in qwen.decode(ids) and "lookup_weather" not in qwen.decode(ids[mask == 1])


def test_openai_wire_format_arguments_and_weights(tmp_path: Path, qwen: Any) -> None:
    # OpenAI's API gives a call's arguments as a JSON string; templates write them with tojson, so the string
    # would be trained quoted ("{\"city\": ...}"), which no tool-call parser reads back: parsed, counted.
    # Its fine-tuning rows mark a turn not to train with weight 0: not read unless named, and warned about.
    from gpu_prep.run.manifest import summary_warnings

    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    row = {"messages": [{"role": "user", "content": "Weather in Paris?"},
                        {"role": "assistant", "content": "", "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
                        {"role": "assistant", "content": "Bad guess.", "weight": 0},
                        {"role": "user", "content": "Again?"}, {"role": "assistant", "content": "18 C.", "weight": 1}]}
    config = {**CHAT, "tokenizer": "qwen2.5"}
    out = run_rows(tmp_path, config, [row], name="wire")
    [(ids, mask)] = samples(out)
    trained = qwen.decode(ids[mask == 1])
    assert '"arguments": {"city": "Paris"}' in trained and "Bad guess." in trained
    manifest = json.loads((out / "manifest.json").read_text())
    report = manifest["totals"]["parse_report"]
    assert report["tool_call_arguments_parsed"] == 1 and report["message_weight_not_read"] == 2
    assert any("set input.message_training_key: weight" in w for w in summary_warnings(manifest))
    # Qwen3's template writes a string as given (it tests `is string`): kept, as transformers passes it.
    out = run_rows(tmp_path, {**config, "tokenizer": "qwen3"}, [row], name="qwen3")
    [(ids, mask)] = samples(out)
    assert '"arguments": {"city":"Paris"}' in qwen.decode(ids[mask == 1])
    assert json.loads((out / "manifest.json").read_text())["totals"]["parse_report"]["tool_call_arguments_parsed"] == 0
    weighted = {**config, "input": {**config["input"], "message_training_key": "weight"}}
    out = run_rows(tmp_path, weighted, [row], name="weighted")
    [(ids, mask)] = samples(out)
    assert "Bad guess." not in qwen.decode(ids[mask == 1]) and "18 C." in qwen.decode(ids[mask == 1])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["totals"]["parse_report"]["message_weight_not_read"] == 0


def test_a_row_that_is_a_list_of_messages_is_a_conversation(tmp_path: Path) -> None:
    # Multi-dialogue files: each row is the messages themselves, with roles a template may not know.
    want = samples(run_rows(tmp_path, CHAT, OPENAI, name="openai"))
    got = samples(run_rows(tmp_path, CHAT, [r["messages"] for r in OPENAI], name="lists"))
    assert _same(got, want)
    from gpu_prep.pipeline import run

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(OPENAI[0]["messages"]) + "\n")
    manifest = run(parse_config({"input": {"type": "text"}}), [str(data)], tmp_path / "text-out")
    assert manifest["totals"]["rows_dropped"] == {"not_an_object": 1}


def test_auto_finds_sharegpt_rows_whatever_the_chat_key(tmp_path: Path) -> None:
    # messages_key names chat rows' key; sharegpt rows keep their own ("conversations").
    from gpu_prep.pipeline import run

    rows = [{"dialog": OPENAI[0]["messages"]}, _sharegpt(OPENAI[1:], {"user": "human", "assistant": "gpt"})[0]]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"input": {"type": "auto", "messages_key": "dialog"}, "mask": {"assistant": "train"}}
    manifest = run(parse_config(config), [str(data)], tmp_path / "out")
    assert manifest["totals"]["rows_by_schema"] == {"chat": 1, "sharegpt": 1}
    assert manifest["totals"]["rows_written"] == 2


def test_the_chat_options_example_trains_what_its_config_says(tmp_path: Path, qwen: Any) -> None:
    from gpu_prep.pipeline import run

    config = parse_config(yaml.safe_load((REPO / "configs" / "chat_options.yaml").read_text()))
    run(config, [str(REPO / "examples" / "chat_options.jsonl")], tmp_path / "out")
    trained = [qwen.decode(ids[mask == 1]) for ids, mask in samples(tmp_path / "out")]
    # train_on_eos last: only the last trained turn keeps its end-of-turn token.
    assert trained[0] == "Blue.Green.<|im_end|>"
    assert trained[1] == " Keep going!<|im_end|>"  # characters 0-18 masked by train_detail
    assert trained[2] == "4<|im_end|>"  # the wrong answer is masked by its own training flag


def test_auto_reads_messages_given_as_json_text(tmp_path: Path) -> None:
    # A CSV or Parquet column of messages holds JSON text; input.type chat reads it, and so must auto, which
    # picks a row's type by its keys (the row has a messages key).
    import csv

    from gpu_prep.format import detect_schema

    config = parse_config({"input": {"type": "auto"}})
    assert detect_schema({"messages": '[{"role": "user", "content": "hi"}]'}, config) == "chat"
    assert detect_schema({"conversations": ' [{"from": "human", "value": "hi"}]'}, config) == "sharegpt"
    assert detect_schema({"messages": "plain text", "text": "t"}, config) == "text"
    path = tmp_path / "chat.csv"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["messages"])
        for i in range(3):
            writer.writerow([json.dumps([{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}])])
    manifest = run(parse_config({"input": {"type": "auto"}, "chat_template": "chatml", "mask": {"assistant": "train"}}),
                   [str(path)], tmp_path / "out")
    assert manifest["totals"]["rows_written"] == 3
    assert manifest["totals"]["parse_report"]["messages_parsed_from_string"] == 3


def test_auto_reads_a_csv_of_several_shapes_by_the_cells_that_hold_something(tmp_path: Path) -> None:
    # Every column of a CSV is a key of every row, its empty cells "": they name no shape (an input_ids column
    # made every row pre-tokenized, and dropped it as wrong_type). A row whose filled cells name none is
    # read by its keys, as before (a text row of empty text is still a text row).
    import csv

    from gpu_prep.format import detect_schema

    config = parse_config({"input": {"type": "auto"}})
    assert detect_schema({"input_ids": "", "text": "hello"}, config) == "text"
    assert detect_schema({"input_ids": None, "prompt": "p", "response": "r"}, config) == "instruction"
    assert detect_schema({"text": ""}, config) == "text"
    path = tmp_path / "mixed.csv"
    chat = json.dumps([{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello there"}])
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerows([["messages", "text", "prompt", "response", "input_ids"], [chat, "", "", "", ""],
                          ["", "just a document", "", "", ""], ["", "", "2+2?", "4", ""]])
    manifest = run(parse_config({"input": {"type": "auto"}, "chat_template": "chatml",
                                 "mask": {"assistant": "train", "response": "train"},
                                 "preprocessing": {"min_chars": 0, "deduplicate": False}}), [str(path)], tmp_path / "out")
    assert manifest["totals"]["rows_written"] == 3, manifest["dropped_examples"]


def test_sharegpt_role_names_include_llama_factorys_and_stand_for_one_role_each() -> None:
    # LLaMA-Factory's sharegpt tags: a function_call turn is the assistant's tool call, observation its result.
    row = {"conversations": [{"from": "human", "value": "weather?"},
                             {"from": "function_call", "value": '{"name": "f", "arguments": {}}'},
                             {"from": "observation", "value": "18C"}, {"from": "gpt", "value": "18 degrees"}]}
    conv = get_builder("sharegpt")(row, parse_config({"input": {"type": "sharegpt"}}))
    assert [m["role"] for m in conv.messages] == ["user", "assistant", "tool", "assistant"]
    from gpu_prep.errors import ConfigError

    with pytest.raises(ConfigError, match=r"input\.roles: the row role 'human' is listed under both 'user' and 'assistant'"):
        parse_config({"input": {"type": "sharegpt", "roles": {"user": ["human"], "assistant": ["human", "gpt"]}}})


@pytest.mark.parametrize(("row", "detail"), [
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0] is a text part whose 'text' is null, not a string"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}]}]},
     "messages[0].content[0] is a 'image' part; only text parts"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [1, 2]},
     "field 'tools' must be a list of tool objects, got a list holding int"),
    ({"messages": "not json"}, "field 'messages' must be a list of messages (or JSON text of one), got a string that is"),
])
def test_wrong_shapes_are_named_as_they_are(row: dict[str, Any], detail: str) -> None:
    from gpu_prep.format import RowError

    with pytest.raises(RowError) as caught:
        get_builder("chat")(row, parse_config({}))
    assert caught.value.reason == "wrong_type" and detail in caught.value.detail, caught.value.detail


def test_near_copies_of_pretokenized_rows_are_found(tmp_path: Path) -> None:
    # Exact dedup hashes a pre-tokenized row whole; near-duplicate removal still shingles its ids.
    from gpu_prep.pipeline import run

    rows = [{"input_ids": list(range(1000, 1400))}, {"input_ids": [7, *range(1001, 1400)]},
            {"input_ids": list(range(5000, 5400))}]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = parse_config({"input": {"type": "pretokenized"}, "preprocessing": {"fuzzy_dedup": {}}})
    manifest = run(config, [str(data)], tmp_path / "out")
    assert manifest["totals"]["rows_written"] == 2 and manifest["totals"]["rows_dropped"] == {"near_duplicate": 1}


@pytest.mark.parametrize("kind", ["sharegpt", "auto"])
def test_a_bare_list_of_sharegpt_messages_is_a_conversation(tmp_path: Path, kind: str) -> None:
    # A conversation written as its messages alone, in ShareGPT's from / value, as chat's role / content are.
    from gpu_prep.pipeline import run

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps([{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there"}]) + "\n")
    config = parse_config({"input": {"type": kind}, "chat_template": "chatml", "mask": {"assistant": "train"}})
    manifest = run(config, [str(data)], tmp_path / kind)
    assert manifest["totals"]["rows_written"] == 1, manifest["dropped_examples"]


WEATHER = {"name": "get_weather", "description": "Get weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
SHAREGPT_CALL = {"conversations": [
    {"from": "human", "value": "Weather in Paris and Rome?"},
    {"from": "function_call", "value": json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}},
                                                   {"name": "get_weather", "arguments": {"city": "Rome"}}])},
    {"from": "observation", "value": '{"temp_c": 21}'}, {"from": "gpt", "value": "21 degrees in both."}],
    "tools": json.dumps([WEATHER])}  # LLaMA-Factory's layout: a bare schema, calls as JSON text
OPENAI_CALL = {"messages": [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": c}}} for c in ("Paris", "Rome")]},
    {"role": "tool", "content": '{"temp_c": 21}'}, {"role": "assistant", "content": "21 degrees in both."}],
    "tools": [{"type": "function", "function": WEATHER}]}


def test_llama_factorys_function_call_turns_are_the_openai_rows_tool_calls(tmp_path: Path, qwen: Any) -> None:
    # The default sharegpt roles read a function_call turn as the assistant's tool calls (a list: parallel
    # calls) and wrap bare tool schemas, so Qwen's template writes <tool_call> blocks, trained, as for the
    # OpenAI row (whose ids equal LLaMA-Factory's), not the bare JSON.
    want = samples(run_rows(tmp_path, CHAT, [OPENAI_CALL], name="openai"))
    out = run_rows(tmp_path, {"input": {"type": "sharegpt"}, "mask": {"assistant": "train"}}, [SHAREGPT_CALL])
    assert _same(samples(out), want)
    [(ids, mask)] = want
    assert qwen.decode(ids[mask == 1]).count("<tool_call>\n{\"name\": \"get_weather\"") == 2
    report = json.loads((out / "manifest.json").read_text())["totals"]["parse_report"]
    assert report["tool_calls_parsed"] == 1 and report["tool_schemas_wrapped"] == 1 and report["unknown_roles"] == {}


def test_a_function_call_turn_listed_under_assistant_stays_text() -> None:
    roles = {"user": ["human"], "assistant": ["gpt", "function_call"], "tool": ["observation"]}
    conv = get_builder("sharegpt")(SHAREGPT_CALL, parse_config({"input": {"type": "sharegpt", "roles": roles}}))
    assert conv.messages[1] == {"role": "assistant", "content": SHAREGPT_CALL["conversations"][1]["value"]}


@pytest.mark.parametrize(("call", "says"), [
    ("get_weather(city='Paris')", "it is not JSON"),
    ('{"arguments": {}}', "it holds an object with the keys ['arguments']"),
    ("[]", "it is an empty list"),
    ('["get_weather"]', "it holds str"),
])
def test_a_function_call_turn_that_is_no_call_drops_the_row_naming_it(call: str, says: str) -> None:
    from gpu_prep.format import RowError

    row = {"conversations": [{"from": "human", "value": "hi"}, {"from": "function_call", "value": call}]}
    with pytest.raises(RowError) as caught:
        get_builder("sharegpt")(row, parse_config({"input": {"type": "sharegpt"}}))
    assert caught.value.reason == "wrong_type" and says in caught.value.detail
    assert "field 'conversations[1].value' is a tool call (role 'function_call'" in caught.value.detail


def test_tool_calls_a_template_does_not_write_drop_the_row(tmp_path: Path) -> None:
    # ChatML writes nothing of tool_calls: written, the call would be lost and an empty reply trained.
    rejects = tmp_path / "rejects.jsonl"
    run_rows(tmp_path, {**CHAT, "chat_template": "chatml"}, [OPENAI_CALL, OPENAI[0]], rejects=rejects)
    [reject] = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert reject["reason"] == "template_error" and "writes nothing of the tool_calls of message 1" in reject["detail"]


HISTORY_ROW = {"instruction": "And 7 times 8?", "input": "", "output": "56.", "system": "You are a math tutor.",
               "history": [["6 times 7?", "42."], ["6 times 8?", "48."]]}


def test_alpaca_history_is_not_lost_silently(tmp_path: Path) -> None:
    # input.format has no place for earlier turns: the row is dropped, naming the option that keeps them.
    rejects = tmp_path / "rejects.jsonl"
    out = run_rows(tmp_path, ALPACA, [HISTORY_ROW, {**HISTORY_ROW, "history": []}], rejects=rejects)
    assert len(samples(out)) == 1
    [reject] = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert reject["reason"] == "wrong_type" and "field 'history' holds 2 earlier turn(s)" in reject["detail"]
    assert "input.alpaca_render: chat_template" in reject["detail"]


def test_alpaca_rows_through_the_chat_template_are_llama_factorys_messages(tmp_path: Path) -> None:
    # LLaMA-Factory's AlpacaDatasetConverter: system, the history's pairs, then instruction and input joined
    # by a newline (empty parts left out) and the output, rendered with the chat template.
    turns = [("system", "You are a math tutor."), ("user", "6 times 7?"), ("assistant", "42."),
             ("user", "6 times 8?"), ("assistant", "48."), ("user", "And 7 times 8?"), ("assistant", "56.")]
    chat = [{"messages": [{"role": r, "content": c} for r, c in turns]},
            {"messages": [{"role": "user", "content": "Add.\n2 and 3"}, {"role": "assistant", "content": "5"}]}]
    want = samples(run_rows(tmp_path, CHAT, chat, name="chat"))
    config = {"input": {"type": "alpaca", "alpaca_render": "chat_template"}, "mask": {"assistant": "train"}}
    rows = [HISTORY_ROW, {"instruction": "Add.", "input": "2 and 3", "output": "5"}]
    assert _same(samples(run_rows(tmp_path, config, rows)), want)


def test_alpaca_through_the_chat_template_is_masked_by_role() -> None:
    from gpu_prep.errors import ConfigError

    with pytest.raises(ConfigError, match="mask.user / mask.assistant"):
        parse_config({**ALPACA, "input": {"type": "alpaca", "alpaca_render": "chat_template"}})


def test_the_shipped_sharegpt_config_keeps_tool_turns(tmp_path: Path) -> None:
    # It once listed user, assistant and system roles as "the default": function_call and observation
    # turns were left out of every row, with warnings only.
    config = yaml.safe_load((REPO / "configs" / "sharegpt.yaml").read_text())
    out = run_rows(tmp_path, config, [SHAREGPT_CALL])
    totals = json.loads((out / "manifest.json").read_text())["totals"]
    assert totals["rows_written"] == 1 and totals["messages_left_out_by_template"] == {}
    assert totals["parse_report"]["tool_calls_parsed"] == 1
