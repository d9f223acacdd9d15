"""The builder contract plugins register under (gpu_prep/format/contract.py), as the seed spec's Extension asks:

    @register("my_format")
    class MyFormatBuilder:
        def build(self, item, config, tokenizer) -> dict | None: ...

A class builder is made once; a builder taking a tokenizer gets the run's, with the transformers-like
surface; a returned {"ids", "loss_mask", "domain"} is written as it is, in that domain; None skips the row
(skipped_by_builder); an exception drops it (builder_error, which --strict stops at). Two-argument
builders returning Segments, and three-argument ones returning a Conversation, go on working.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from gpu_prep import register
from gpu_prep.format.contract import BuilderTokenizer, build_row, tokens_from_dict
from gpu_prep.cli import app
from gpu_prep.config import parse_config
from gpu_prep.errors import Drop
from gpu_prep.format import Conversation, RowError, Segments, registered
from helpers import load_json, run_rows, samples, write_jsonl

pytestmark = pytest.mark.usefixtures("fast_tokenizer")


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The types these tests register are gone after each (other tests list the known types)."""
    import gpu_prep.format

    monkeypatch.setattr(gpu_prep.format.registry, "_BUILDERS", dict(gpu_prep.format.registry._BUILDERS))

SEED_PLUGIN = '''
from gpu_prep import register


@register("seed_qa")
class SeedQABuilder:
    made = 0

    def __init__(self):
        type(self).made += 1
        self.calls = 0

    def build(self, item: dict, config, tokenizer) -> dict | None:
        self.calls += 1
        if item.get("skip"):
            return None
        if item.get("boom"):
            raise ValueError(f"no answer for {item['prompt']!r}")
        prompt = tokenizer.encode(item["prompt"], add_special_tokens=False)
        answer = tokenizer.encode(item["answer"], add_special_tokens=False) + [tokenizer.eos_token_id]
        return {"ids": prompt + answer, "loss_mask": [0] * len(prompt) + [1] * len(answer),
                "domain": item.get("source")}
'''

ROWS = [
    {"prompt": "What is 2 + 2?", "answer": "4", "source": "math"},
    {"prompt": "Who wrote Hamlet?", "answer": "Shakespeare.", "source": "wiki"},
    {"prompt": "Skip me", "answer": "never written", "source": "math", "skip": True},
    {"prompt": "What is 3 * 3?", "answer": "9", "source": "math"},
    {"prompt": "No domain here", "answer": "the usual one"},
    {"prompt": "Explode", "answer": "never written", "source": "wiki", "boom": True},
]
CONFIG = {"input": {"type": "seed_qa"}, "preprocessing": {"min_chars": 0}}


def _invoke(*args: Any) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def _seed_run(tmp_path: Path, *extra: Any) -> tuple[Result, Path]:
    plugin = tmp_path / "seed_plugin.py"
    plugin.write_text(SEED_PLUGIN, encoding="utf-8")
    config = tmp_path / "seed.json"
    config.write_text(json.dumps(CONFIG), encoding="utf-8")
    data = write_jsonl(tmp_path / "qa.jsonl", ROWS)
    out = tmp_path / "out"
    return _invoke("run", data, "-c", config, "-o", out, "-q", "--plugin", plugin, *extra), out


def _expected(tok: Any, row: dict[str, Any]) -> tuple[list[int], list[int]]:
    prompt = tok.engine.encode(row["prompt"], add_special_tokens=False).ids
    answer = tok.engine.encode(row["answer"], add_special_tokens=False).ids + [tok.engine.token_to_id(tok.eos_text)]
    return prompt + answer, [0] * len(prompt) + [1] * len(answer)


def test_seed_class_builder_writes_its_ids_and_masks_in_its_domains(tmp_path: Path, qwen: Any) -> None:
    rejects = tmp_path / "rejects.jsonl"
    done, out = _seed_run(tmp_path, "--rejects", rejects)
    assert done.exit_code == 0, done.output
    for domain, rows in (("math", [ROWS[0], ROWS[3]]), ("wiki", [ROWS[1]]), ("__default__", [ROWS[4]])):
        written = [(ids.tolist(), mask.tolist()) for ids, mask in samples(out, domain)]
        assert written == [_expected(qwen, row) for row in rows], domain
    builder = registered("seed_qa").call.__self__
    assert type(builder).made == 1 and builder.calls == len(ROWS)  # one instance, called on every row
    manifest = load_json(out / "manifest.json")
    assert manifest["totals"]["rows_dropped"] == {"builder_error": 1, "skipped_by_builder": 1}
    assert manifest["inputs"][0]["rows_dropped"] == {"builder_error": 1, "skipped_by_builder": 1}
    entries = {e["reason"]: e for e in map(json.loads, rejects.read_text(encoding="utf-8").splitlines())}
    assert entries["skipped_by_builder"]["line"] == 3 and "returned None" in entries["skipped_by_builder"]["detail"]
    assert entries["builder_error"]["line"] == 6
    assert entries["builder_error"]["detail"] == "builder 'seed_qa' raised ValueError: no answer for 'Explode'"
    assert "Traceback" not in entries["builder_error"]["detail"]


def test_strict_stops_at_a_builder_error_naming_the_row_but_not_at_a_skip(tmp_path: Path) -> None:
    stopped, _ = _seed_run(tmp_path, "--strict")
    assert stopped.exit_code != 0 and "Traceback" not in stopped.output
    said = " ".join(stopped.output.split())  # rich wraps long lines
    assert "qa.jsonl:6" in said and "builder error" in said and "ValueError: no answer for 'Explode'" in said
    assert "qa.jsonl:3" not in said  # the skipped row went by


def test_validate_builds_the_sample_with_the_tokenizer(tmp_path: Path) -> None:
    plugin = tmp_path / "seed_plugin.py"
    plugin.write_text(SEED_PLUGIN, encoding="utf-8")
    config = tmp_path / "seed.json"
    config.write_text(json.dumps(CONFIG), encoding="utf-8")
    data = write_jsonl(tmp_path / "qa.jsonl", ROWS)
    checked = _invoke("validate", "-c", config, data, "--plugin", plugin)
    assert checked.exit_code == 0, checked.output
    said = " ".join(checked.output.split())
    assert "4 would be written" in said and "skipped_by_builder" in said and "builder_error" in said


def test_two_argument_function_returning_segments_still_works(tmp_path: Path, qwen: Any) -> None:
    @register("contract_qa_segments")
    def build(record: dict[str, Any], config: Any) -> Segments:
        return Segments([(record["q"] + "\n", "prompt"), (record["a"], "response")], add_eos=True)

    assert not registered("contract_qa_segments").takes_tokenizer
    out = run_rows(tmp_path, {"input": {"type": "contract_qa_segments"}, "mask": {"prompt": "mask", "response": "train"},
                              "preprocessing": {"min_chars": 0}}, [{"q": "Name a prime.", "a": "Seven."}])
    (ids, mask), = samples(out)
    prompt = qwen.engine.encode("Name a prime.\n", add_special_tokens=False).ids
    answer = qwen.engine.encode("Seven.", add_special_tokens=False).ids + [qwen.engine.token_to_id(qwen.eos_text)]
    assert ids.tolist() == prompt + answer and mask.tolist() == [0] * len(prompt) + [1] * len(answer)


def test_three_argument_function_returning_a_conversation_renders_like_chat(tmp_path: Path) -> None:
    seen = []

    @register("contract_qa_chat")
    def build(record: dict[str, Any], config: Any, tokenizer: BuilderTokenizer) -> Conversation:
        seen.append(tokenizer)
        return Conversation([{"role": "user", "content": record["q"]}, {"role": "assistant", "content": record["a"]}])

    rows = [{"q": "Name a prime.", "a": "Seven."}, {"q": "And an even one?", "a": "Two."}]
    chat = [{"messages": [{"role": "user", "content": r["q"]}, {"role": "assistant", "content": r["a"]}]} for r in rows]
    base = {"mask": {"assistant": "train"}, "preprocessing": {"min_chars": 0}}
    built = run_rows(tmp_path, {**base, "input": {"type": "contract_qa_chat"}}, rows, name="built")
    plain = run_rows(tmp_path, {**base, "input": {"type": "chat"}}, chat, name="plain")
    assert [(i.tolist(), m.tolist()) for i, m in samples(built)] == [(i.tolist(), m.tolist()) for i, m in samples(plain)]
    assert len(seen) == 2 and seen[0] is seen[1] and isinstance(seen[0], BuilderTokenizer)


def test_the_builder_tokenizer_has_the_transformers_surface(qwen: Any) -> None:
    tok = BuilderTokenizer(qwen)
    text = "Hello, world! <|im_end|>"
    ids = qwen.engine.encode(text, add_special_tokens=False).ids
    assert tok.encode(text, add_special_tokens=False) == ids == tok(text)["input_ids"]
    assert tok(text)["attention_mask"] == [1] * len(ids) and tok([text, "x"])["input_ids"][0] == ids
    assert tok.decode(ids) == text and tok.batch_decode([ids]) == [text]
    assert tok.eos_token == qwen.eos_text and tok.eos_token_id == qwen.engine.token_to_id(qwen.eos_text)
    assert tok.pad_token_id == qwen.engine.token_to_id(qwen.special_tokens["pad_token"])
    assert tok.convert_tokens_to_ids("<|im_end|>") == qwen.engine.token_to_id("<|im_end|>")
    assert tok.convert_tokens_to_ids(["<|im_end|>"]) == [qwen.engine.token_to_id("<|im_end|>")]
    assert tok.convert_ids_to_tokens(ids[:2]) == tok.tokenize(text)[:2]
    assert tok.vocab_size == qwen.engine.get_vocab_size(with_added_tokens=False) < len(tok)
    assert len(tok) == qwen.engine.get_vocab_size(with_added_tokens=True) and tok.get_vocab()["<|im_end|>"] == ids[-1]
    assert tok.eos_token in tok.all_special_tokens and tok.chat_template == qwen.chat_template
    assert tok.backend_tokenizer is qwen.engine


@pytest.mark.parametrize(("result", "reason", "fragment"), [
    ({"ids": [1, 2], "loss_mask": [0, 1], "domain": "d", "labels": [1, 2]}, Drop.BUILDER_ERROR, "'labels'"),
    ({"ids": [1, 2]}, Drop.BUILDER_ERROR, "no loss_mask"),
    ({"ids": "1 2", "loss_mask": [0, 1]}, Drop.BUILDER_ERROR, "ids as a str; it must be a list"),
    ({"ids": [1, 2.0], "loss_mask": [0, 1]}, Drop.BUILDER_ERROR, "ids[1] = 2.0: token ids are integers"),
    ({"ids": [1, True], "loss_mask": [0, 1]}, Drop.BUILDER_ERROR, "ids[1] = True"),
    ({"ids": [1, 10**9], "loss_mask": [0, 1]}, Drop.BUILDER_ERROR, "ids[1] = 1000000000, outside the vocabulary (0 to 99)"),
    ({"ids": [-1], "loss_mask": [1]}, Drop.BUILDER_ERROR, "outside the vocabulary"),
    ({"ids": [1, 2], "loss_mask": [1]}, Drop.BUILDER_ERROR, "1 loss_mask entries for 2 ids"),
    ({"ids": [1, 2], "loss_mask": [0, 2]}, Drop.BUILDER_ERROR, "loss_mask[1] = 2: a loss mask holds 0 and 1"),
    ({"ids": [1], "loss_mask": [1], "domain": 7}, Drop.BUILDER_ERROR, "domain 7"),
    ({"ids": [], "loss_mask": []}, Drop.EMPTY, "no ids"),
])
def test_a_dict_that_breaks_the_contract_drops_the_row_naming_the_rule(result: dict, reason: str, fragment: str) -> None:
    with pytest.raises(RowError) as raised:
        tokens_from_dict("mine", result, 100)
    assert raised.value.reason == reason and fragment in raised.value.detail, raised.value.detail


def test_a_valid_dict_becomes_tokens_and_other_returns_are_refused() -> None:
    import numpy as np

    tokens = tokens_from_dict("mine", {"ids": np.array([5, 6]), "loss_mask": [False, True]}, 100)
    assert (tokens.ids, tokens.trained, tokens.domain) == ([5, 6], [False, True], None)

    @register("contract_returns_a_list")
    def build(record: dict[str, Any], config: Any) -> Any:
        return [1, 2, 3]

    with pytest.raises(RowError) as raised:
        build_row("contract_returns_a_list", {}, parse_config({}), None)
    assert raised.value.reason == Drop.BUILDER_ERROR and "returned a list" in raised.value.detail


def test_row_error_keeps_its_reason_and_a_class_needs_a_build_method() -> None:
    @register("contract_row_error")
    class Refuses:
        def build(self, item: dict, config: Any, tokenizer: Any) -> dict:
            raise RowError(Drop.MISSING_FIELD, "field 'q' is missing")

    with pytest.raises(RowError) as raised:
        build_row("contract_row_error", {}, parse_config({}), object())
    assert (raised.value.reason, raised.value.detail) == (Drop.MISSING_FIELD, "field 'q' is missing")
    with pytest.raises(TypeError, match="has no build"):
        register("contract_no_build")(type("NoBuild", (), {}))


def test_on_a_cluster_the_workers_load_the_plugin_and_write_the_same(tmp_path: Path) -> None:
    pytest.importorskip("dask.distributed")
    from gpu_prep.pipeline import Options, run
    from gpu_prep.plugins import load_plugins
    from helpers import output_tree

    plugin = tmp_path / "seed_plugin.py"
    plugin.write_text(SEED_PLUGIN, encoding="utf-8")
    load_plugins([str(plugin)])  # the driver's registry; each worker loads it from Options.plugins
    rows = [{**row, "prompt": f"{row['prompt']} #{k}"} for k in range(12) for row in ROWS]
    data = write_jsonl(tmp_path / "qa.jsonl", rows)
    for name, cluster in (("single", None), ("cluster", "local:2")):
        run(parse_config(CONFIG), [str(data)], tmp_path / name, Options(
            cluster=cluster, plugins=(str(plugin),), part_bytes=1500, chunk_rows=16,
            rejects=tmp_path / f"{name}.rejects.jsonl"))
    single, clustered = output_tree(tmp_path / "single", "cluster"), output_tree(tmp_path / "cluster", "cluster")
    assert single == clustered
    assert (tmp_path / "single.rejects.jsonl").read_bytes() == (tmp_path / "cluster.rejects.jsonl").read_bytes()
    manifest = load_json(tmp_path / "cluster" / "manifest.json")
    assert manifest["cluster"]["parts"] >= 3 and manifest["cluster"]["workers"] == 2
    totals = manifest["totals"]
    assert totals["rows_dropped"] == {"builder_error": 12, "skipped_by_builder": 12} and totals["rows_written"] == 48
