"""Several datasets in one run (the seed's data_config): concatenation, mixing by sampling ratio with both
stopping strategies, data handlers, and the per-dataset figures in the manifest.

The mixed order is checked against the seed's interleaving written out here as its plain per-row loop
(numpy's default_rng(seed), 1000 draws at a time, a dataset starting over when its rows run out), which
shares no code with gpu-prep's streaming version."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import gpu_prep
from gpu_prep.config import load_config, parse_config
from gpu_prep.errors import ConfigError
from gpu_prep.pipeline import run
from gpu_prep.plugins import check_registered
from helpers import samples

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

SIZES = {"chat": 12, "qa": 9, "web": 6}


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """Three datasets of different shapes; every row names itself as <dataset>-<index>."""
    root = tmp_path / "data"
    (root / "qa").mkdir(parents=True)
    _write(root / "chat.jsonl", [{"messages": [{"role": "user", "content": f"Say chat-{i}."},
                                               {"role": "assistant", "content": f"chat-{i}"}]}
                                 for i in range(SIZES["chat"])])
    # Questions and answers under their own keys: a handler renames them to prompt / response.
    _write(root / "qa" / "part-0.jsonl", [{"question": f"Name qa-{i}.", "answer": f"qa-{i}", "id": i}
                                         for i in range(5)])
    _write(root / "qa" / "part-1.jsonl", [{"question": f"Name qa-{i}.", "answer": f"qa-{i}", "id": i}
                                         for i in range(5, SIZES["qa"])])
    _write(root / "web", [{"text": f"A page called web-{i}."} for i in range(SIZES["web"])])  # no extension
    return root


def _config(data: Path, ratios: tuple[float, float, float] | None, strategy: str = "all_exhausted",
            seed: int | None = None) -> dict[str, Any]:
    datasets = [
        {"name": "chat", "data_paths": [str(data / "chat.jsonl")], "domain": "chat"},
        # qa and web share a domain (a dataset's own is its name), so their interleaving can be read back.
        {"name": "qa", "data_paths": [str(data / "qa")], "domain": "mixed",
         "data_handlers": [{"name": "rename_columns",
                            "arguments": {"fn_kwargs": {"column_mapping": {"question": "prompt", "answer": "response"}},
                                          "remove_columns": ["id"]}}]},
        {"name": "web", "data_paths": [str(data / "web")], "builder": "jsonl", "domain": "mixed"},
    ]
    if ratios is not None:
        for spec, ratio in zip(datasets, ratios):
            spec["sampling"] = ratio
    processor: dict[str, Any] = {"type": "default", "sampling_stopping_strategy": strategy}
    if seed is not None:
        processor["seed"] = seed
    return {"input": {"type": "auto"}, "chat_template": "chatml",
            "mask": {"assistant": "train", "response": "train"},
            "preprocessing": {"min_chars": 0, "deduplicate": False},
            "dataprocessor": processor, "datasets": datasets}


def reference_order(lengths: list[int], ratios: list[float], seed: int, strategy: str) -> list[tuple[int, int]]:
    """(dataset, row) of each output row, by the seed's interleaving loop."""
    rng = np.random.default_rng(seed)
    exhausted, current, out = [False] * len(lengths), [0] * len(lengths), []
    stop = all if strategy == "all_exhausted" else any
    while True:
        for k in rng.choice(len(lengths), size=1000, p=ratios):
            if stop(exhausted):
                return out
            out.append((int(k), current[k]))
            current[k] += 1
            if current[k] >= lengths[k]:
                exhausted[k], current[k] = True, 0


def _order(out: Path) -> list[tuple[int, int]]:
    """(dataset, row) of each written sample, in the order the run wrote them (domains interleave, so
    each sample's place is read from the manifest's per-domain files in input order)."""
    tok = gpu_prep.tokenization.tokenizer.load_tokenizer("qwen2.5")
    names = list(SIZES)
    found = []
    dataset = gpu_prep.open_dataset(out)
    for name in dataset:
        for ids, _ in dataset[name]:
            source, index = re.search(r"(chat|qa|web)-(\d+)", tok.decode(ids)).groups()
            found.append((names.index(source), int(index)))
    return found


def _run(data: Path, config: dict[str, Any], out: Path) -> dict[str, Any]:
    return run(parse_config(config), [], out)


@pytest.mark.parametrize("strategy", ["all_exhausted", "first_exhausted"])
def test_mixing_follows_the_seed_interleaving(tmp_path: Path, data: Path, strategy: str) -> None:
    ratios = (0.5, 0.3, 0.2)
    config = _config(data, ratios, strategy)
    config["datasets"][0]["domain"] = "mixed"  # one domain, so the samples are stored in the mixed order
    manifest = _run(data, config, tmp_path / "out")
    want = reference_order(list(SIZES.values()), list(ratios), 42, strategy)
    assert manifest["totals"]["rows_written"] == len(want) == manifest["totals"]["rows_read"]
    assert _order(tmp_path / "out") == want
    per = {d["name"]: d for d in manifest["datasets"]}
    for k, name in enumerate(SIZES):
        drawn = sum(d == k for d, _ in want)
        assert per[name]["rows_written"] == drawn and per[name]["sampling"] == ratios[k]
        assert per[name]["share_of_rows"] == pytest.approx(drawn / len(want))
    from gpu_prep.run.manifest import summary_warnings

    warned = [w for w in summary_warnings(manifest) if "were not drawn" in w]
    if strategy == "first_exhausted":  # stopped as soon as one dataset had given all its rows
        assert any(per[n]["rows_written"] == SIZES[n] for n in SIZES)
        assert all(per[n]["rows_written"] <= SIZES[n] for n in SIZES)
        # The others' later rows are counted as not drawn, and the summary names each such dataset.
        assert all(per[n]["rows_read"] + per[n]["rows_not_drawn"] == SIZES[n] for n in SIZES)
        short = [n for n in SIZES if per[n]["rows_not_drawn"]]
        assert short and len(warned) == len(short)
        assert all(f"dataset {n!r}: {per[n]['rows_not_drawn']:,} of its {SIZES[n]:,} rows" in w for n, w in zip(short, warned))
        # The manifest of a run finished before these were counted (returned again by --resume) warns of none.
        old = {**manifest, "datasets": [{k: v for k, v in d.items() if k not in ("rows_not_drawn", "rows_drawn_again")}
                                         for d in manifest["datasets"]]}
        assert not [w for w in summary_warnings(old) if "were not drawn" in w]
    else:  # every dataset gave every row at least once; some gave rows again
        assert all(per[n]["rows_written"] >= SIZES[n] for n in SIZES)
        assert all(per[n]["rows_not_drawn"] == 0 for n in SIZES) and not warned
        assert all(per[n]["rows_drawn_again"] == per[n]["rows_read"] - SIZES[n] for n in SIZES)
        assert any(per[n]["rows_drawn_again"] for n in SIZES)
    assert sum(d["share_of_tokens"] for d in manifest["datasets"]) == pytest.approx(1.0)


def test_the_mix_is_deterministic_for_a_seed_and_changes_with_it(tmp_path: Path, data: Path) -> None:
    ratios = (0.5, 0.3, 0.2)
    first = _run(data, _config(data, ratios), tmp_path / "a")
    again = _run(data, _config(data, ratios), tmp_path / "b")
    other = _run(data, _config(data, ratios, seed=7), tmp_path / "c")
    assert first["domains"] == again["domains"]  # every shard's sha256, so the same bytes
    assert _order(tmp_path / "a") == _order(tmp_path / "b") != _order(tmp_path / "c")
    assert first["config"]["dataprocessor"]["seed"] == 42 and other["config"]["dataprocessor"]["seed"] == 7


def test_without_ratios_datasets_are_concatenated_in_order(tmp_path: Path, data: Path) -> None:
    manifest = _run(data, _config(data, None), tmp_path / "out")
    assert manifest["totals"]["rows_written"] == sum(SIZES.values())
    got = _order(tmp_path / "out")
    for k, n in enumerate(SIZES.values()):  # each dataset whole, in its files' order
        assert [r for d, r in got if d == k] == list(range(n))
    assert [d["rows_written"] for d in manifest["datasets"]] == list(SIZES.values())
    assert {d["name"]: len(d["files"]) for d in manifest["datasets"]} == {"chat": 1, "qa": 2, "web": 1}
    assert set(gpu_prep.open_dataset(tmp_path / "out")) == {"chat", "mixed"}  # the datasets' own domains


def test_a_yaml_data_config_runs_from_the_command_line(tmp_path: Path, data: Path) -> None:
    from typer.testing import CliRunner

    from gpu_prep.cli import app

    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(_config(data, (0.5, 0.3, 0.2))), encoding="utf-8")
    assert load_config(path).sampling_ratios() == [0.5, 0.3, 0.2]
    result = CliRunner().invoke(app, ["run", "-c", str(path), "-o", str(tmp_path / "out")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert re.search(r"dataset qa\s.*written.*of rows.*of tokens \(asked 30%\)", result.output)
    both = CliRunner().invoke(app, ["run", str(data / "chat.jsonl"), "-c", str(path), "-o", str(tmp_path / "x")])
    assert both.exit_code != 0 and "datasets name the inputs" in both.output


@pytest.mark.parametrize(("ratios", "message"), [
    ((0.5, 0.3, 0.3), "must sum to 1"),
    ((0.5, None, 0.5), "every dataset a sampling ratio, or none"),
    ((1.5, -0.25, -0.25), "less than or equal to 1"),
])
def test_bad_ratios_are_config_errors(data: Path, ratios: tuple, message: str) -> None:
    config = _config(data, None)
    for spec, ratio in zip(config["datasets"], ratios):
        spec["sampling"] = ratio
    with pytest.raises(ConfigError, match=message):
        parse_config(config)


def test_handlers_skip_and_fail_rows_for_their_reasons(tmp_path: Path, data: Path) -> None:
    config = _config(data, None)
    config["datasets"][0]["data_handlers"] = [
        {"name": "skip_large_text", "arguments": {"fn_kwargs": {"column_name": "note", "max_length": 3}}},
        {"name": "duplicate_column", "arguments": {"fn_kwargs": {"old_column": "missing", "new_column": "x"}}},
    ]
    manifest = _run(data, config, tmp_path / "out")
    chat = manifest["datasets"][0]
    assert chat["rows_written"] == 0 and chat["rows_dropped"] == {"missing_field": SIZES["chat"]}
    assert "data handler duplicate_column" in manifest["dropped_examples"]["missing_field"][0]["detail"]
    with pytest.raises(ConfigError, match="unknown data handler 'nope'"):
        check_registered(parse_config({**config, "datasets": [{"name": "d", "data_paths": ["x"],
                                                               "data_handlers": [{"name": "nope"}]}]}))


def test_a_plugin_registers_its_own_handler(tmp_path: Path, data: Path) -> None:
    from gpu_prep.plugins import load_plugins

    plugin = tmp_path / "shout.py"
    plugin.write_text("from gpu_prep.mix import register_handler\n"
                      "def shout(record, column):\n"
                      "    return {**record, column: record[column].upper()}\n"
                      "register_handler('shout', shout)\n", encoding="utf-8")
    load_plugins([str(plugin)])
    config = _config(data, None)
    config["datasets"][2]["data_handlers"] = [{"name": "shout", "arguments": {"fn_kwargs": {"column": "text"}}}]
    _run(data, config, tmp_path / "out")
    tok = gpu_prep.tokenization.tokenizer.load_tokenizer("qwen2.5")
    texts = [tok.decode(ids) for ids, _ in gpu_prep.open_dataset(tmp_path / "out")["mixed"]]
    assert "A PAGE CALLED WEB-0.<|im_end|>" in texts  # and the end-of-document token


def test_each_dataset_takes_its_own_input_and_mask_settings(tmp_path: Path, data: Path) -> None:
    config = _config(data, None)
    config["datasets"][0]["input"] = {"type": "chat"}
    config["datasets"][1]["input"] = {"type": "instruction"}
    config["datasets"][1]["mask"] = {"prompt": "train", "response": "train"}  # this one trains its prompts too
    config["datasets"][2]["input"] = {"type": "text"}
    config["input"] = {"type": "chat"}  # what a dataset without its own setting would use
    _run(data, config, tmp_path / "out")
    tok = gpu_prep.tokenization.tokenizer.load_tokenizer("qwen2.5")
    out = gpu_prep.open_dataset(tmp_path / "out")
    trained = [tok.decode(ids[mask == 1]) for ids, mask in out["mixed"]]
    assert trained[0].startswith("Name qa-0.") and "qa-0" in trained[0]  # prompt and response
    assert trained[-1] == "A page called web-5.<|im_end|>"  # a text row, every token, and its end of document
    chat = [tok.decode(ids[mask == 1]) for ids, mask in out["chat"]]
    assert chat[0] == "chat-0<|im_end|>"  # the chat dataset masks its prompts (the config's mask)
    with pytest.raises(ConfigError, match=r"datasets\[0\] \(chat\)"):
        check_registered(parse_config({**config, "datasets": [{**config["datasets"][0], "input": {"type": "nope"}}]}))


def test_a_sharegpt_dataset_in_a_mix_reads_its_rows_as_the_top_level_sharegpt_type_does(tmp_path: Path) -> None:
    # Its own input.type takes that type's defaults (conversations / from / value, the ShareGPT role names)
    # wherever the config sets none of those keys, as input.type sharegpt at the top level does.
    rows = [{"conversations": [{"from": "human", "value": f"Say sg-{i}."}, {"from": "gpt", "value": f"sg-{i}"}]}
            for i in range(4)]
    path = _write(tmp_path / "sg.jsonl", rows)
    common = {"version": 1, "tokenizer": "qwen2.5", "mask": {"assistant": "train"},
              "preprocessing": {"min_chars": 1}}
    top = run(parse_config({**common, "input": {"type": "sharegpt"}}), [str(path)], tmp_path / "top")
    mix = {**common, "datasets": [{"name": "sg", "data_paths": [str(path)], "input": {"type": "sharegpt"}}]}
    assert run(parse_config(mix), [], tmp_path / "mix")["totals"]["rows_written"] == top["totals"]["rows_written"] == 4
    def written(out: Path, domain: str | None = None) -> list[tuple[list[int], list[int]]]:
        return [(ids.tolist(), mask.tolist()) for ids, mask in samples(out, domain)]

    assert written(tmp_path / "mix", "sg") == written(tmp_path / "top")


def test_handlers_that_use_the_tokenizer(tmp_path: Path, data: Path) -> None:
    tok = gpu_prep.tokenization.tokenizer.load_tokenizer("qwen2.5")
    config = _config(data, None)
    config["datasets"][0]["input"] = {"type": "text"}
    config["datasets"][0]["data_handlers"] = [
        {"name": "apply_tokenizer_chat_template", "arguments": {"fn_kwargs": {}, "remove_columns": "all"}}]
    config["datasets"][2]["data_handlers"] = [
        {"name": "apply_dataset_formatting", "arguments": {"fn_kwargs": {"dataset_text_field": "text"}}}]
    config["datasets"][2]["input"] = {"type": "text"}
    _run(data, config, tmp_path / "out")
    out = gpu_prep.open_dataset(tmp_path / "out")
    chat = [tok.decode(ids) for ids, _ in out["chat"]]
    # A text row: the chat rendered with the run's template (config chat_template chatml, not the tokenizer's
    # own, which would add Qwen's default system prompt), ended by the end-of-document token.
    assert chat[0] == tok.engine.decode(tok.engine.encode(
        "<|im_start|>user\nSay chat-0.<|im_end|>\n<|im_start|>assistant\nchat-0<|im_end|>\n<|im_end|>").ids,
        skip_special_tokens=False)
    web = [tok.decode(ids) for ids, _ in out["mixed"]][-1]
    assert web == f"A page called web-5.{tok.eos_text}"  # the handler's eos ends it already: not added twice


def test_tokenize_and_apply_input_masking_gives_the_seeds_ids_and_labels(tmp_path: Path) -> None:
    # The seed's handler: input and output joined (a space where neither has one at the join, the eos after),
    # tokenized as one text, the labels -100 over the input's own token count. Its dataset reads the rows as
    # pre-tokenized; the reference here is transformers' tokenizer over the same tokenizer.json.
    from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
    from reference import hf_tokenizer

    rows = [{"q": "Question: is water wet? Answer:", "a": "Yes"}, {"q": "Say hi.\n", "a": "Hi there"},
            {"q": "2+2=", "a": " 4"}]
    path = _write(tmp_path / "qa.jsonl", rows)
    handler = {"name": "tokenize_and_apply_input_masking",
               "arguments": {"fn_kwargs": {"input_column_name": "q", "output_column_name": "a"}}}
    config = {"preprocessing": {"min_chars": 0, "deduplicate": False},
              "datasets": [{"name": "qa", "data_paths": [str(path)], "data_handlers": [handler]}]}
    assert parse_config(config).dataset_config(0).input.type == "pretokenized"
    run(parse_config(config), [], tmp_path / "out")
    hf = hf_tokenizer(bundled_tokenizer_dir("qwen2.5"))
    got = list(gpu_prep.open_dataset(tmp_path / "out")["qa"])
    assert len(got) == len(rows)
    for (ids, mask), row in zip(got, rows):
        glue = "" if row["q"].endswith((" ", "\n")) or row["a"].startswith(" ") else " "
        want = hf(row["q"] + glue + row["a"] + hf.eos_token)["input_ids"]
        prompt = len(hf(row["q"])["input_ids"])
        assert ids.tolist() == want
        assert mask.tolist() == [0] * prompt + [1] * (len(want) - prompt)


def test_the_shipped_mix_config_runs_on_the_examples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from helpers import REPO

    monkeypatch.chdir(REPO)  # its data_paths are relative to where gpu-prep runs
    manifest = run(load_config(REPO / "configs" / "mix.yaml"), [], tmp_path / "out")
    per = {d["name"]: d for d in manifest["datasets"]}
    assert [per[n]["sampling"] for n in ("chat", "alpaca", "web")] == [0.5, 0.3, 0.2]
    assert all(per[n]["rows_written"] > 0 for n in per)  # all_exhausted: every dataset given whole
    assert sum(d["rows_read"] for d in per.values()) == manifest["totals"]["rows_read"]


def test_a_datasets_domain_is_its_name_unless_it_names_one(tmp_path: Path, data: Path) -> None:
    config = _config(data, None)
    for spec in config["datasets"]:
        spec.pop("domain", None)
    _run(data, config, tmp_path / "out")
    assert set(gpu_prep.open_dataset(tmp_path / "out")) == {"chat", "qa", "web"}


def test_a_datasets_domain_holds_its_rows_that_name_none_under_the_domain_key(tmp_path: Path, data: Path) -> None:
    # output.domain_key names a row's domain; a row without that field goes to its dataset's domain (its
    # name by default), not to __default__.
    qa = data / "qa" / "part-0.jsonl"
    rows = [json.loads(line) for line in qa.read_text().splitlines()]
    _write(qa, [{**row, "topic": "trivia"} if row["id"] % 2 else {**row, "topic": ""} if row["id"] == 2 else row
                for row in rows])
    config = _config(data, None)
    config["output"] = {"domain_key": "topic"}
    config["datasets"][1].pop("domain", None)
    _run(data, config, tmp_path / "out")
    written = gpu_prep.open_dataset(tmp_path / "out")
    assert set(written) == {"chat", "qa", "mixed", "trivia"}
    assert len(written["trivia"]) == 2 and len(written["qa"]) == SIZES["qa"] - 2


def test_a_dataset_weighted_zero_is_no_problem_for_the_run(tmp_path: Path, data: Path) -> None:
    # Weighted 0 on purpose, it reads nothing and writes nothing: the run is still a useful one (exit 0).
    from gpu_prep.run.manifest import run_problems

    config = parse_config(_config(data, (1.0, 0.0, 0.0), "first_exhausted"))
    manifest = run(config, [], tmp_path / "out")
    assert [d["rows_read"] for d in manifest["datasets"]][1:] == [0, 0]
    assert [d["rows_not_drawn"] for d in manifest["datasets"]] == [0, *list(SIZES.values())[1:]]
    assert run_problems(manifest, config) == []


def test_a_handlers_wrong_arguments_are_a_config_error(tmp_path: Path, data: Path) -> None:
    # Known before any row is read: otherwise every row of the dataset fails (handler_error) the same way.
    from gpu_prep.errors import ConfigError

    config = _config(data, None)
    config["datasets"][1]["data_handlers"] = [
        {"name": "rename_columns", "arguments": {"fn_kwargs": {"mapping": {"question": "prompt"}}}}]
    with pytest.raises(ConfigError, match=r"dataset 'qa': data_handlers\[0\] \(rename_columns\), arguments.fn_kwargs: "
                                          r".*it takes column_mapping"):
        _run(data, config, tmp_path / "out")


def test_a_row_that_is_no_object_is_named_so_before_any_handler_runs(tmp_path: Path, data: Path) -> None:
    qa = data / "qa" / "part-0.jsonl"
    qa.write_text(qa.read_text() + "[1, 2]\n\"a string\"\n")
    manifest = _run(data, _config(data, None), tmp_path / "out")
    qa_counts = next(d for d in manifest["datasets"] if d["name"] == "qa")["rows_dropped"]
    assert qa_counts == {"not_an_object": 2}, qa_counts


def test_a_mixs_progress_never_goes_back(tmp_path: Path, data: Path) -> None:
    # A mix's chunks end in whichever dataset's file came last: the share shown never goes back, and it is
    # the bytes read, not "every file before this one" (which jumped to the last file's start at once).
    from gpu_prep.pipeline import Options

    shown: list[int] = []
    config = parse_config(_config(data, (0.5, 0.3, 0.2), "all_exhausted"))
    options = Options(chunk_rows=3, progress=lambda rows, tokens, done, total: shown.append(done))
    run(config, [], tmp_path / "out", options)
    assert len(shown) > 5 and shown == sorted(shown), shown
    total = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    assert shown[0] < total / 4
    # Web weighted 0.8 is read about five times through: the total is what the mix reads, so the share
    # climbs through the run instead of sitting at 100% from its first fifth.
    shares: list[float] = []
    config = parse_config(_config(data, (0.1, 0.1, 0.8), "all_exhausted"))
    options = Options(chunk_rows=3, progress=lambda rows, tokens, done, total: shares.append(done / total))
    run(config, [], tmp_path / "over", options)
    assert shares == sorted(shares) and shares[len(shares) // 2] < 0.8 and shares[-1] > 0.7, shares


def test_a_mix_that_would_drop_its_own_repeats_is_warned_about(tmp_path: Path, data: Path) -> None:
    # all_exhausted draws rows again; dedup drops every row drawn again, which undoes the weights: said
    # before the run starts (and by validate), and the warning's claim holds (no row written twice).
    from helpers import gpu_prep_cli

    config = _config(data, (0.2, 0.2, 0.6), "all_exhausted")
    assert parse_config(config).warnings() == []  # dedup off: the repeats are kept
    config["preprocessing"] = {**config["preprocessing"], "deduplicate": True}
    assert "drops each row drawn again" in " ".join(parse_config(config).warnings())
    first = {**config, "dataprocessor": {**config["dataprocessor"], "sampling_stopping_strategy": "first_exhausted"}}
    assert parse_config(first).warnings() == []
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(config))
    result = gpu_prep_cli("run", "-c", path, "-o", tmp_path / "out")
    assert "warning:" in result.stderr and "drawn again" in result.stderr, result.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    web = next(d for d in manifest["datasets"] if d["name"] == "web")
    assert web["rows_read"] > SIZES["web"] and web["rows_written"] == SIZES["web"]
    # The repeats dropped are the mix's own: no advice to compare whole texts instead of first characters.
    assert "dedup_prefix_chars" not in result.stderr


@pytest.mark.parametrize(("setting", "message"), [
    ({"text_kee": "body"}, "datasets.2.input.text_kee: unknown key; did you mean 'text_key'? allowed keys here: type,"),
    ({"messages_key": 5}, "datasets.2.input.messages_key: 5 is invalid: Input should be a valid string"),
    ({"think_mode": "skip"}, "datasets.2.input.think_mode: 'skip' is not allowed; allowed: 'keep' or 'drop'"),
])
def test_a_datasets_own_input_settings_are_checked_as_the_top_levels_are(data: Path, setting: dict, message: str) -> None:
    # (Several mistakes: one line each.)
    # Named by their place in the file, with the same help (the nearest key, the keys allowed) as a mistake in
    # the top-level input section gets.
    config = _config(data, None)
    config["datasets"][2]["input"] = {**config["datasets"][2].get("input", {}), **setting}
    with pytest.raises(ConfigError) as caught:
        parse_config(config)
    assert message in str(caught.value) and "(top level)" not in str(caught.value), caught.value


def test_several_mistakes_in_a_datasets_settings_are_a_line_each(data: Path) -> None:
    config = _config(data, None)
    config["datasets"][2]["input"] = {**config["datasets"][2].get("input", {}), "text_kee": "x", "think_mode": "skip"}
    with pytest.raises(ConfigError) as caught:
        parse_config(config)
    lines = [line.strip() for line in str(caught.value).splitlines()]
    assert any(line.startswith("datasets.2.input.text_kee: unknown key") for line in lines)
    assert any(line.startswith("datasets.2.input.think_mode: 'skip' is not allowed") for line in lines)


def test_validate_samples_a_mix_in_the_order_the_run_takes_it(data: Path) -> None:
    # Its role counts describe the mixed sample the run would read, not the first file's first rows.
    from gpu_prep.commands.validate import check_sample

    ratios = (0.5, 0.3, 0.2)
    report = check_sample(parse_config(_config(data, ratios)), [], 10)
    first = reference_order(list(SIZES.values()), list(ratios), 42, "all_exhausted")[:10]
    chats = sum(k == 0 for k, _ in first)
    assert report.rows == 10 and 0 < chats < 10
    assert report.roles == {"user": chats, "assistant": chats}
