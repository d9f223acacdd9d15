"""The command line: clear errors (exit 2, the key path and what is allowed, no traceback), and the shipped
configs run as they are on the shipped examples.

Most tests run in process with typer's CliRunner; one runs the installed `gpu-prep` console script in a
subprocess, the way a user does. Rich may wrap long messages, so messages are compared with all
whitespace removed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import gpu_prep
from gpu_prep.cli import app
from helpers import REPO, gpu_prep_cli

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

EXAMPLES = {"sft": "chat.jsonl", "instruction": "instruction.jsonl", "pretrain": "pretrain.jsonl"}


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def _assert_clear_error(result: Result, *fragments: str) -> None:
    """Exit 2 from our own handler (not a crash, not a click usage error), naming every fragment."""
    shown = result.stdout + result.stderr
    assert result.exit_code == 2, shown
    assert isinstance(result.exception, SystemExit), f"crashed with {result.exception!r}"
    assert "Traceback" not in shown and "error:" in shown, shown
    for fragment in fragments:
        assert _squash(fragment) in _squash(shown), f"{fragment!r} missing from:\n{shown}"


# name -> (file name, file text, fragments the message must contain)
BAD_CONFIGS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "unknown_key": ("c.json", '{"preprocessing": {"max_seq_lenn": 512}}',
                    ("preprocessing.max_seq_lenn", "unknown key")),
    "input_type": ("c.json", '{"input": {"type": "foo"}}',
                   ("input.type", "'foo'", "allowed: alpaca, auto, chat, instruction, kto, preference, pretokenized, prompt_response, segments, sharegpt, text")),
    "storage_format": ("c.json", '{"output": {"storage_format": "csv"}}',
                       ("output.storage_format", "'csv'", "'bin'", "'h5'")),
    "max_seq_len": ("c.json", '{"preprocessing": {"max_seq_len": 0}}',
                    ("preprocessing.max_seq_len", "greater than or equal to 1",
                     "allowed: integers from 1 to 2147483647")),
    # Past int64, these used to pass the schema and end the run in an OverflowError (numpy, readline).
    "max_seq_len_past_int64": ("c.json", '{"preprocessing": {"max_seq_len": 9223372036854775808}}',
                               ("preprocessing.max_seq_len: 9223372036854775808 is invalid",
                                "allowed: integers from 1 to 2147483647")),
    "max_seq_len_e30": ("c.yaml", "preprocessing:\n  max_seq_len: 1e30\n",
                        ("preprocessing.max_seq_len: '1e30' is invalid", "allowed: integers from 1 to 2147483647")),
    "max_row_bytes_e20": ("c.json", '{"input": {"max_row_bytes": 1e20}}',
                          ("input.max_row_bytes: 1e+20 is invalid", "allowed: integers from 2 to 1099511627776")),
    "dedup_memory_mb_inf": ("c.json", '{"preprocessing": {"dedup_memory_mb": 1e400}}',
                            ("preprocessing.dedup_memory_mb: inf is invalid", "finite number",
                             "allowed: finite numbers above 0")),
    "mask_value": ("c.yaml", "mask:\n  assistant: maybe\n", ("mask.assistant", "'maybe'", "'mask'", "'train'")),
    "yaml_syntax": ("c.yaml", "input:\n  type: [chat\n", ("not valid YAML", "line")),
    "json_syntax": ("c.json", '{"input": ', ("not valid JSON",)),
    "not_a_mapping": ("c.yaml", "- chat\n", ("must be a mapping",)),
}


def _config_file(tmp_path: Path, name: str) -> tuple[Path, tuple[str, ...]]:
    file_name, text, fragments = BAD_CONFIGS[name]
    path = tmp_path / file_name
    path.write_text(text, encoding="utf-8")
    return path, fragments


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_validate_rejects_a_bad_config(tmp_path: Path, name: str) -> None:
    path, fragments = _config_file(tmp_path, name)
    _assert_clear_error(_invoke("validate", "-c", path), str(path.name), *fragments)


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_run_rejects_a_bad_config_before_writing(tmp_path: Path, name: str) -> None:
    path, fragments = _config_file(tmp_path, name)
    out = tmp_path / "out"
    _assert_clear_error(_invoke("run", REPO / "examples" / "chat.jsonl", "-c", path, "-o", out), *fragments)
    assert not out.exists()


def _number_settings(kind: type) -> list[str]:
    """The key path of every setting of the config that takes a number of this kind (int, float), through
    its sections (fuzzy_dedup included), found from the models: a setting added later is covered too."""
    import typing

    from gpu_prep.config import PipelineConfig
    from gpu_prep.config.pipeline import _section

    found, todo = [], [("", PipelineConfig)]
    while todo:
        prefix, model = todo.pop()
        for name, field in model.model_fields.items():
            inner = _section(field.annotation)
            listed = any(typing.get_origin(a) is list for a in (field.annotation, *typing.get_args(field.annotation)))
            if hasattr(inner, "model_fields") and not listed:  # datasets' own sampling: test_datasets
                todo.append((f"{prefix}{name}.", inner))
            args = [typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a
                    for a in typing.get_args(field.annotation) or (field.annotation,)]
            if kind in args:
                found.append(prefix + name)
    return sorted(found)


def _nested(path: str, value: Any) -> dict[str, Any]:
    *sections, key = path.split(".")
    data: dict[str, Any] = {key: value}
    for section in reversed(sections):
        data = {section: data}
    return data


@pytest.mark.parametrize("value", [2 ** 63, -2 ** 63 - 1, 1e30, 10 ** 400])
def test_every_integer_setting_refuses_a_value_past_int64_naming_it_and_its_range(value: Any) -> None:
    # Such a value used to pass the schema and stop the run later in an OverflowError (numpy's int64,
    # readline's index-sized int); every integer setting, not only those seen to overflow.
    from gpu_prep.config import parse_config
    from gpu_prep.errors import ConfigError

    paths = _number_settings(int)
    assert {"preprocessing.max_seq_len", "input.max_row_bytes", "output.split_seed", "dataprocessor.seed",
            "preprocessing.fuzzy_dedup.ngram", "gpu.rmm_pool_size"} <= set(paths), paths
    for path in paths:
        with pytest.raises(ConfigError) as caught:
            parse_config(_nested(path, value))
        message = str(caught.value)
        said = rf"{re.escape(path)}: .* is invalid: .*; allowed: integers from -?[0-9]+ to [0-9]+$"
        assert re.search(said, message), message
        low, high = map(int, re.findall(r"from (-?[0-9]+) to ([0-9]+)$", message)[0])
        assert -2 ** 63 <= low <= high < 2 ** 63, message


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_every_float_setting_refuses_inf_and_nan(value: float) -> None:
    # dedup_memory_mb: 1e400 (inf) used to pass and end the run in an OverflowError (int(inf)).
    from gpu_prep.config import parse_config
    from gpu_prep.errors import ConfigError

    paths = _number_settings(float)
    assert {"preprocessing.dedup_memory_mb", "input.template_time_limit", "preprocessing.max_drop_share"} <= set(paths)
    for path in paths:
        with pytest.raises(ConfigError, match=rf"{re.escape(path)}: .* is invalid: Input should be a finite number; "
                                              "allowed: finite numbers"):
            parse_config(_nested(path, value))
    with pytest.raises(ConfigError, match=rf"output.splits.train: {value!r} is invalid: Input should be a finite"):
        parse_config({"output": {"splits": {"train": value}}})


def test_number_settings_have_bounds_where_larger_values_cannot_work() -> None:
    from gpu_prep.config import parse_config
    from gpu_prep.errors import ConfigError

    limits = {"preprocessing.max_seq_len": (1 << 31) - 1, "preprocessing.dedup_prefix_chars": (1 << 31) - 1,
              "input.max_row_bytes": 1 << 40, "preprocessing.fuzzy_dedup.ngram": 1024}
    for path, top in limits.items():
        parse_config(_nested(path, top))  # the bound itself is allowed
        with pytest.raises(ConfigError, match=rf"{re.escape(path)}: {top + 1} is invalid: Input should be less than or "
                                              rf"equal to {top}; allowed: integers from [0-9]+ to {top}$"):
            parse_config(_nested(path, top + 1))
    # numpy's generators take no negative seed (the mix's draws used to end in a ValueError); a pool is a size
    for path, value in [("dataprocessor.seed", -1), ("gpu.rmm_pool_size", -1)]:
        with pytest.raises(ConfigError, match=rf"{re.escape(path)}: -1 is invalid: Input should be greater than or "
                                              "equal to 0; allowed: integers from 0 to 9223372036854775807$"):
            parse_config(_nested(path, value))
    assert parse_config({"gpu": {"rmm_pool_size": "8GiB"}}).gpu.rmm_pool_size == "8GiB"  # a size still
    assert parse_config({"gpu": {"rmm_pool_size": 1e9}}).gpu.rmm_pool_size == 1_000_000_000
    assert parse_config({"output": {"split_seed": -5}}).output.split_seed == -5  # seeds that hash signed stay so
    # Finite but past any memory: its bytes, int(dedup_memory_mb * 2**20), used to overflow as a float.
    with pytest.raises(ConfigError, match=r"preprocessing.dedup_memory_mb: 1e\+303 is invalid: .*; allowed: finite "
                                          r"numbers above 0 and at most 1073741824$"):
        parse_config({"preprocessing": {"dedup_memory_mb": 1e303}})


@pytest.mark.parametrize("override", ["preprocessing.max_seq_len=1e30", "input.max_row_bytes=99999999999999999999",
                                      "preprocessing.dedup_memory_mb=.inf", "preprocessing.max_drop_share=.nan"])
@pytest.mark.parametrize("command", ["validate", "run"])
def test_an_out_of_range_number_given_with_set_is_a_config_error(tmp_path: Path, override: str, command: str) -> None:
    key = override.partition("=")[0]
    args = ["-c", REPO / "configs" / "sft.json", REPO / "examples" / "chat.jsonl", "--set", override]
    out = tmp_path / "out"
    result = _invoke(command, *args, *(["-o", out] if command == "run" else []))
    _assert_clear_error(result, "sft.json: invalid config", f"{key}:", "is invalid", "allowed:")
    assert not out.exists()


def test_unknown_key_message_names_the_allowed_keys(tmp_path: Path) -> None:
    path, _ = _config_file(tmp_path, "unknown_key")
    _assert_clear_error(_invoke("validate", "-c", path), "max_seq_len", "min_chars", "max_items")


@pytest.mark.parametrize("command", ["validate", "run"])
def test_missing_config_file(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "nope.json"
    args = ["-c", missing] if command == "validate" else [REPO / "examples" / "chat.jsonl", "-c", missing,
                                                          "-o", tmp_path / "out"]
    _assert_clear_error(_invoke(command, *args), str(missing), "cannot read the config")


def test_unknown_device(tmp_path: Path) -> None:
    result = _run_sft(tmp_path, "-o", tmp_path / "out", "--device", "tpu")
    _assert_clear_error(result, "--device 'tpu'", "allowed: auto, cpu, gpu")


def _run_sft(tmp_path: Path, *extra: Any, inputs: Any = None) -> Result:
    inputs = inputs if inputs is not None else REPO / "examples" / "chat.jsonl"
    return _invoke("run", inputs, "-c", REPO / "configs" / "sft.json", "-q", *extra)


def test_missing_tokenizer_directory(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-tokenizer"
    result = _run_sft(tmp_path, "-o", tmp_path / "out", "--tokenizer", missing)
    _assert_clear_error(result, f"tokenizer '{missing}'", "no such directory", "qwen2.5")


def test_tokenizer_directory_without_its_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty-tokenizer"
    empty.mkdir()
    _assert_clear_error(_run_sft(tmp_path, "-o", tmp_path / "out", "--tokenizer", empty), "tokenizer.json is missing")


def test_a_tokenizer_file_is_refused_saying_which_folder_to_give_or_how_to_make_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Relative, as users give them: "tok/tokenizer.json" reads like a hub id (organisation/name), and was
    # looked up on the hub.
    monkeypatch.chdir(tmp_path)
    for folder, names in (("tok", ("tokenizer.json", "tokenizer_config.json")), ("sp", ("tokenizer.model",)),
                          ("bert", ("vocab.txt",))):
        (tmp_path / folder).mkdir()
        for name in names:
            (tmp_path / folder / name).write_text("{}")
    run = lambda tokenizer: _run_sft(tmp_path, "-o", tmp_path / "out", "--tokenizer", tokenizer)  # noqa: E731
    _assert_clear_error(run("tok/tokenizer.json"), "'tok/tokenizer.json' is a file",
                        "give the folder that holds tokenizer.json and tokenizer_config.json: tok")
    _assert_clear_error(run("sp/tokenizer.model"), "is a file", "tokenizer.model is a SentencePiece model",
                        '"tokenizer_class": "LlamaTokenizer"', "pip install transformers sentencepiece protobuf",
                        "AutoTokenizer.from_pretrained('sp').save_pretrained('OUT')")
    _assert_clear_error(run("bert/vocab.txt"), "vocab.txt is a WordPiece vocabulary", '"BertTokenizer"',
                        "AutoTokenizer.from_pretrained('bert')")
    _assert_clear_error(run("sp"), "tokenizer.json is missing in sp", "tokenizer.model is a SentencePiece model",
                        "AutoTokenizer.from_pretrained('sp')")


def test_a_tokenizer_folder_without_tokenizer_config_json_loads_as_hf_loads_it(tmp_path: Path) -> None:
    # No special tokens and no chat template then: a run that needs the eos token says which key gives it.
    from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    folder = tmp_path / "only-json"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((bundled_tokenizer_dir("qwen2.5") / "tokenizer.json").read_bytes())
    tok = load_tokenizer(str(folder))
    assert tok.config == {} and tok.eos_text is None
    assert tok.encode(["hello world"])[0].tolist() == tok.engine.encode("hello world").ids
    pretrain = ("run", REPO / "examples" / "pretrain.jsonl", "-c", REPO / "configs" / "pretrain.json", "-q",
                "--tokenizer", folder)
    # (configs/pretrain.json names Qwen's <|endoftext|>: without it, the eos is what ends a document)
    _assert_clear_error(_invoke(*pretrain, "-o", tmp_path / "out", "--set", "input.eod_token=null"), "has no eos token",
                        "eos_token in its tokenizer_config.json", "input.eod_token")
    done = _invoke(*pretrain, "-o", tmp_path / "told", "--set", "input.eod_token=<|endoftext|>")
    assert done.exit_code == 0, done.stdout + done.stderr
    assert gpu_prep.open(tmp_path / "told")["__default__"].meta["tokenizer"]["eod_id"] == 151643


def test_missing_input_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    _assert_clear_error(_run_sft(tmp_path, "-o", tmp_path / "out", inputs=missing), f"input '{missing}'",
                        "no such file")


def test_input_glob_matching_nothing(tmp_path: Path) -> None:
    pattern = str(tmp_path / "*.jsonl")
    _assert_clear_error(_run_sft(tmp_path, "-o", tmp_path / "out", inputs=pattern), "matches nothing")


def test_output_path_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("not a directory", encoding="utf-8")
    _assert_clear_error(_run_sft(tmp_path, "-o", target), f"output '{target}'", "is a file")
    assert target.read_text(encoding="utf-8") == "not a directory"


def test_non_empty_output_needs_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run_sft(tmp_path, "-o", out).exit_code == 0
    _assert_clear_error(_run_sft(tmp_path, "-o", out), "is not empty", "--overwrite")
    assert _run_sft(tmp_path, "-o", out, "--overwrite").exit_code == 0  # a previous run may be replaced


def test_overwrite_never_deletes_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me", encoding="utf-8")
    _assert_clear_error(_run_sft(tmp_path, "-o", out, "--overwrite"), "not a gpu-prep run")
    assert (out / "notes.txt").read_text(encoding="utf-8") == "keep me"


def test_validate_takes_tokenizer_as_run_does(tmp_path: Path) -> None:
    # --tokenizer overrides the config's, for validate's sample run as for run (here: a folder that is none).
    sft, chat = REPO / "configs" / "sft.json", REPO / "examples" / "chat.jsonl"
    _assert_clear_error(_invoke("validate", "-c", sft, chat, "--tokenizer", tmp_path / "nowhere"),
                        f"tokenizer '{tmp_path / 'nowhere'}'", "no such directory")
    bert = _invoke("validate", "-c", sft, "--tokenizer", "bert-uncased")
    assert bert.exit_code == 0 and '"name": "bert-uncased"' in bert.stdout, bert.output
    plain = _invoke("validate", "-c", sft)
    assert plain.stdout.splitlines()[-1] == bert.stdout.splitlines()[-1]  # the sha256 is the file's, as run's


def test_a_run_that_cuts_most_rows_warns_naming_max_seq_len(tmp_path: Path) -> None:
    # Still exit 0 (the rows are written as asked), but a max_seq_len shorter than the typical row is rarely
    # meant; truncation split cuts pretraining text into windows on purpose, and is not warned about.
    chat, sft = REPO / "examples" / "chat.jsonl", REPO / "configs" / "sft.json"
    short = ("--set", "preprocessing.max_seq_len=16")
    cut = _invoke("run", chat, "-c", sft, "-o", tmp_path / "cut", *short, "--set", "preprocessing.truncation=left")
    warning = "10 of the 10 rows written (100%) were cut to preprocessing.max_seq_len (16 tokens, truncation left)"
    assert cut.exit_code == 0 and _squash(warning) in _squash(cut.stderr), cut.output
    checked = _invoke("validate", "-c", sft, chat, *short, "--set", "preprocessing.truncation=left")
    assert _squash(f"the sample run: {warning}") in _squash(checked.stderr), checked.output
    whole = _invoke("run", chat, "-c", sft, "-o", tmp_path / "whole")
    assert whole.exit_code == 0 and "were cut to" not in whole.stderr, whole.output
    pretrain = ("run", REPO / "examples" / "pretrain.jsonl", "-c", REPO / "configs" / "pretrain.json", *short)
    right = _invoke(*pretrain, "-o", tmp_path / "right")
    assert right.exit_code == 0 and "were cut to preprocessing.max_seq_len" in right.stderr, right.output
    windows = _invoke(*pretrain, "-o", tmp_path / "split", "--set", "preprocessing.truncation=split")
    assert windows.exit_code == 0 and "were cut to" not in windows.stderr, windows.output


def test_many_rows_dropped_by_a_shared_opening_warn_naming_dedup_prefix_chars(tmp_path: Path) -> None:
    # Twelve reviews under one 220-character instruction share their first 200 characters: eleven are dropped
    # as duplicates (41% of the rows read), which warns, still exit 0; whole-text dedup keeps them all, silently.
    from helpers import write_jsonl

    task = ("Classify the sentiment of the review below as positive or negative. Answer with one word, in lower "
            "case. Weigh the tone of the whole text rather than single words, and ignore any spelling mistakes "
            "that the reviewer made. Review:")
    assert len(task) > 200
    rows = [{"instruction": task, "input": f"review {k}: " + ("good " if k % 2 else "bad ") * 5,
             "output": "positive" if k % 2 else "negative"} for k in range(12)]
    rows += [{"instruction": f"Question {k}: what is {k} plus {k}? Show the sum and nothing else, as digits.",
              "input": "", "output": str(2 * k)} for k in range(15)]
    data = write_jsonl(tmp_path / "reviews.jsonl", rows)
    alpaca = REPO / "configs" / "alpaca.yaml"
    prefix = _invoke("run", data, "-c", alpaca, "-o", tmp_path / "prefix")
    warning = ("11 of the 27 rows read (41%) were dropped as duplicates of an earlier row's first 200 characters")
    assert prefix.exit_code == 0 and _squash(warning) in _squash(prefix.stderr), prefix.output
    assert _squash("preprocessing.dedup_prefix_chars: null compares whole texts") in _squash(prefix.stderr)
    whole = _invoke("run", data, "-c", alpaca, "-o", tmp_path / "whole", "--set", "preprocessing.dedup_prefix_chars=null")
    assert whole.exit_code == 0 and "dropped as duplicates" not in whole.stderr, whole.output
    assert json.loads((tmp_path / "whole" / "manifest.json").read_text(encoding="utf-8"))["totals"]["rows_written"] == 27
    # Repeats among pre-tokenized rows, which dedup hashes whole, are no shared opening: a mix says nothing of them.
    ids = write_jsonl(tmp_path / "ids.jsonl", [{"input_ids": [100 + k % 6, 7, 8, 9]} for k in range(12)])
    mix = tmp_path / "mix.yaml"
    mix.write_text(json.dumps({"version": 1, "tokenizer": "qwen2.5", "mask": {"prompt": "mask", "response": "train"},
                               "datasets": [{"name": "alpaca", "data_paths": [str(data)], "input": {"type": "alpaca"}},
                                            {"name": "ids", "data_paths": [str(ids)], "input": {"type": "pretokenized"}}],
                               "preprocessing": {"min_chars": 0}}))
    mixed = _invoke("run", "-c", mix, "-o", tmp_path / "mixed")
    assert mixed.exit_code == 0, mixed.output
    counts = json.loads((tmp_path / "mixed" / "manifest.json").read_text(encoding="utf-8"))["datasets"]
    assert [d["rows_dropped"].get("duplicate", 0) for d in counts] == [11, 6]
    assert _squash(warning.replace("of the 27", "of the 39").replace("(41%)", "(28%)")) in _squash(mixed.stderr)
    # A small file's one repeat says nothing of shared openings (the bundled example has one).
    example = _invoke("run", REPO / "examples" / "chat.jsonl", "-c", REPO / "configs" / "sft.json", "-o", tmp_path / "ex")
    assert example.exit_code == 0 and "dropped as duplicates" not in example.stderr, example.output


def _without_template(folder: Path) -> Path:
    """The bundled Qwen2.5 tokenizer in a folder whose tokenizer_config.json has no chat template."""
    from gpu_prep.tokenization.bundled import bundled_tokenizer_dir

    source = bundled_tokenizer_dir("qwen2.5")
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    return folder


@pytest.mark.parametrize(("bad", "said"), [
    (["--set", "chat_template_name=foo"], "chat_template_name 'foo'"),
    (["--set", "chat_template=nonexist.jinja"], "chat_template 'nonexist.jinja': cannot read it"),
    (["--tokenizer", "NO_TEMPLATE"], "chat rows need a chat template"),
    (["--tokenizer", "NO_TEMPLATE", "--set", "input.type=alpaca", "--set", "input.alpaca_render=chat_template"],
     "alpaca rows (input.alpaca_render: chat_template) need a chat template"),
    (["--set", "output.token_dtype=uint16"], "cannot hold the vocabulary's ids"),
    (["--cluster", "bogus"], "--cluster 'bogus'"),
])
def test_an_unusable_template_or_option_keeps_the_previous_output(tmp_path: Path, bad: list[str], said: str) -> None:
    # Exit 2 is found before the output is touched: --overwrite loses nothing, a fresh folder is not made.
    bad = [str(_without_template(tmp_path / "tok")) if a == "NO_TEMPLATE" else a for a in bad]
    out = tmp_path / "out"
    assert _run_sft(tmp_path, "-o", out).exit_code == 0
    before = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    _assert_clear_error(_run_sft(tmp_path, "-o", out, "--overwrite", *bad), said)
    assert {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
    assert _invoke("verify", out).exit_code == 0
    _assert_clear_error(_run_sft(tmp_path, "-o", tmp_path / "fresh", *bad), said)
    assert not (tmp_path / "fresh").exists()


def test_validate_accepts_the_sft_config() -> None:
    result = _invoke("validate", "-c", REPO / "configs" / "sft.json")
    assert result.exit_code == 0, result.output
    assert "ok" in result.stdout
    assert '"min_chars": 50' in result.stdout  # printed with the defaults filled in


# What each example file holds by construction (read off the example files, not the output):
# chat.jsonl line 9 repeats line 3, line 12 has a string for messages, line 13 is cut off mid-JSON;
# instruction.jsonl line 5 repeats line 1; pretrain.jsonl line 2 is under min_chars, line 5 repeats line 1.
EXPECTED_DROPS = {
    "sft": {"duplicate": 1, "wrong_type": 1, "malformed_json": 1},
    "instruction": {"duplicate": 1},
    "pretrain": {"too_short": 1, "duplicate": 1},
}


def _example_rows(name: str) -> int:
    lines = (REPO / "examples" / EXAMPLES[name]).read_text(encoding="utf-8").splitlines()
    return sum(1 for line in lines if line.strip())


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_shipped_configs_run_on_the_examples(tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    result = _invoke("run", REPO / "examples" / EXAMPLES[name], "-c", REPO / "configs" / f"{name}.json", "-o", out)
    assert result.exit_code == 0, result.output
    assert "rows written" in result.stdout  # the summary table
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    (entry,) = manifest["inputs"]
    assert entry["rows_dropped"] == EXPECTED_DROPS[name]
    assert entry["rows_read"] == _example_rows(name)
    assert entry["rows_written"] == entry["rows_read"] - sum(EXPECTED_DROPS[name].values())
    assert manifest["totals"]["trained_tokens"] > 0


def test_installed_script_reports_errors_and_runs(tmp_path: Path) -> None:
    bad, _ = _config_file(tmp_path, "storage_format")
    failed = gpu_prep_cli("validate", "-c", bad)
    assert failed.returncode == 2
    assert "output.storage_format" in failed.stderr and "'bin', 'h5', 'megatron' or 'parquet'" in failed.stderr
    assert "Traceback" not in failed.stderr + failed.stdout
    done = gpu_prep_cli("run", "examples/chat.jsonl", "-c", "configs/sft.json", "-o", tmp_path / "out", "-q")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_globs_and_folders_expand_in_sorted_order(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for name in ("b.jsonl", "a.jsonl"):
        row = {"messages": [{"role": "user", "content": f"from {name}"}, {"role": "assistant", "content": "ok"}]}
        (data / name).write_text(json.dumps(row) + "\n", encoding="utf-8")
    for n, inputs in enumerate([str(data / "*.jsonl"), str(data)]):
        out = tmp_path / f"out{n}"
        result = _run_sft(tmp_path, "-o", out, inputs=inputs)
        assert result.exit_code == 0, result.output
        manifest = json.loads((out / "manifest.json").read_text())
        assert [Path(e["path"]).name for e in manifest["inputs"]] == ["a.jsonl", "b.jsonl"]
        assert manifest["totals"]["rows_written"] == 2


def test_tokenizer_option_overrides_the_config(tmp_path: Path) -> None:
    from gpu_prep.tokenization.bundled import bundled_tokenizer_dir

    directory = bundled_tokenizer_dir("qwen3")  # another real template: no default system prompt injected
    out = tmp_path / "out"
    result = _run_sft(tmp_path, "-o", out, "--tokenizer", directory)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"]["source"] == str(directory)
    assert manifest["totals"]["rows_written"] > 0


def test_device_gpu_without_a_gpu_says_what_is_missing(tmp_path: Path) -> None:
    from gpu_prep.backend import gpu_missing_reason

    if gpu_missing_reason() is None:
        pytest.skip("a GPU is available here")
    result = _run_sft(tmp_path, "-o", tmp_path / "out", "--device", "gpu")
    assert result.exit_code == 2
    assert re.search(r"--device gpu: .*(extra|driver|device)", result.output.replace("\n", " "))
    assert "Traceback" not in result.output


def test_rejects_file_lists_every_dropped_row(tmp_path: Path) -> None:
    rejects = tmp_path / "rejects.jsonl"
    out = tmp_path / "out"
    result = _run_sft(tmp_path, "-o", out, "--rejects", rejects)
    assert result.exit_code == 0, result.output
    entries = [json.loads(line) for line in rejects.read_text().splitlines()]
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(entries) == sum(manifest["totals"]["rows_dropped"].values()) > 0
    by_reason = {e["reason"]: e for e in entries}
    assert set(by_reason) == set(manifest["totals"]["rows_dropped"])
    assert by_reason["malformed_json"]["row"].startswith('{"source"')  # the line as it was
    assert isinstance(by_reason["wrong_type"]["row"], dict)
    assert all(e["file"].endswith("chat.jsonl") and e["line"] >= 1 for e in entries)


def test_strict_stops_at_the_first_bad_row_naming_file_and_line(tmp_path: Path) -> None:
    result = _run_sft(tmp_path, "-o", tmp_path / "out", "--strict")
    assert result.exit_code == 1
    text = re.sub(r"\s+", " ", result.output)
    assert re.search(r"chat\.jsonl:12: wrong type: field 'messages' must be a list", text), text
    assert "Traceback" not in result.output


def test_a_run_stopped_by_strict_leaves_no_temporary_files_and_can_be_replaced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rejects = tmp_path / "rejects.jsonl"
    assert _run_sft(tmp_path, "-o", out, "--strict", "--rejects", rejects).exit_code == 1
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert not rejects.exists() and not list(tmp_path.glob(".rejects*"))
    assert not (out / "manifest.json").exists()
    refused = _run_sft(tmp_path, "-o", out)
    assert refused.exit_code == 2 and "--overwrite" in refused.output
    assert _run_sft(tmp_path, "-o", out, "--overwrite").exit_code == 0


def test_unwritable_output_and_non_utf8_config_are_clear_errors(tmp_path: Path) -> None:
    result = _run_sft(tmp_path, "-o", "/proc/gpu-prep-cannot-write-here")
    assert result.exit_code == 2 and "Traceback" not in result.output and "/proc/" in result.output
    assert "cannotwritethere" in _squash(result.output) and "give-oafolder" in _squash(result.output)  # -o's
    config = tmp_path / "latin1.json"
    config.write_bytes('{"mask": {"assistant": "train"}, "x": "caf\xe9"}'.encode("latin-1"))
    result = _invoke("validate", "-c", config)
    assert result.exit_code == 2 and "not UTF-8" in result.output


def test_plugins_load_only_when_named(tmp_path: Path) -> None:
    plugin = tmp_path / "shout_plugin.py"
    plugin.write_text(
        "from gpu_prep.format import Segments, register\n\n"
        "@register('shout_plugin_text')\n"
        "def build(record, config):\n"
        "    return Segments([(record['words'].upper(), 'text')], train_all=True)\n", encoding="utf-8")
    config = tmp_path / "shout.json"
    config.write_text(json.dumps({"input": {"type": "shout_plugin_text"}, "preprocessing": {"min_chars": 1}}))
    refused = _invoke("validate", "-c", config)  # a config naming a type never imports anything
    assert refused.exit_code == 2 and "shout_plugin_text" in _squash(refused.stdout + refused.stderr) and "notknown" in _squash(refused.stdout + refused.stderr)
    assert _invoke("validate", "-c", config, "--plugin", plugin).exit_code == 0
    data = tmp_path / "words.jsonl"
    data.write_text('{"words": "quiet words"}\n', encoding="utf-8")
    done = _invoke("run", data, "-c", config, "-o", tmp_path / "out", "-q", "--plugin", plugin)
    assert done.exit_code == 0, done.stdout + done.stderr
    missing = _invoke("validate", "-c", config, "--plugin", tmp_path / "nowhere.py")
    assert missing.exit_code == 2 and "nosuchfile" in _squash(missing.stdout + missing.stderr)


def test_inspect_shows_samples_with_their_trained_text(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _invoke("run", REPO / "examples" / "chat.jsonl", "-c", REPO / "configs" / "sft.json", "-o", out, "-q").exit_code == 0
    domain = sorted(p.name for p in out.iterdir() if p.is_dir())[0]
    shown = _invoke("inspect", out, "--domain", domain, "-n", "1", "--plain", "--ids")
    assert shown.exit_code == 0, shown.stdout
    assert f"# {domain} sample 0:" in shown.stdout
    assert "⟦" in shown.stdout and "<|im_end|>⟧" in shown.stdout and "*" in shown.stdout
    missing = _invoke("inspect", out, "--domain", "no-such-domain")
    assert missing.exit_code == 2 and "no-such-domain" in missing.stdout + missing.stderr


def test_stats_only_writes_nothing_and_debug_samples_shows_them(tmp_path: Path) -> None:
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("gpu-prep-stats-*"))
    shown = _invoke("run", REPO / "examples" / "chat.jsonl", "-c", REPO / "configs" / "sft.json", "--stats-only")
    assert shown.exit_code == 0, shown.stdout + shown.stderr
    assert "p99" in shown.stdout and "rows truncated" in shown.stdout
    assert set(Path(tempfile.gettempdir()).glob("gpu-prep-stats-*")) == before
    neither = _invoke("run", REPO / "examples" / "chat.jsonl", "-c", REPO / "configs" / "sft.json")
    assert neither.exit_code == 2 and "--stats-only" in neither.stdout + neither.stderr
    debug = _invoke("run", REPO / "examples" / "chat.jsonl", "-c", REPO / "configs" / "sft.json", "-o",
                    tmp_path / "out", "-q", "--debug-samples", "2")
    assert debug.exit_code == 0 and "sample 0:" in debug.stdout and "⟦" in debug.stdout


def test_inspect_and_the_summary_show_packed_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _invoke("run", REPO / "examples" / "chat.jsonl", "-c", REPO / "configs" / "sft_packed.yaml", "-o", out)
    assert done.exit_code == 0, done.stdout + done.stderr
    assert "sequences(bfd," in _squash(done.stdout) and "padding)" in _squash(done.stdout)
    meta = json.loads((out / "math" / "meta.json").read_text())
    shown = _invoke("inspect", out, "--domain", "math", "-n", "1", "--plain")
    assert shown.exit_code == 0, shown.stdout
    assert f"samples packed at {gpu_prep.open(out)['math'].segments(0)[1:-1].tolist()}" in shown.stdout
    assert meta["packing"]["num_segments"] == 3 and meta["num_samples"] == 1


def test_an_input_folders_files_that_are_not_read_are_named(tmp_path: Path) -> None:
    # Files whose names say no format are left out of a folder: run and validate warn naming them, the
    # manifest counts them; a folder of none gpu-prep reads by name, or of none at all, is refused saying so,
    # and a dataset's builder reads them.
    chat = (REPO / "examples" / "chat.jsonl").read_bytes()
    data, hadoop, empty = tmp_path / "data", tmp_path / "hadoop", tmp_path / "empty"
    for folder, names in ((data, ["a.jsonl", "b.jsonlines", "part-00000", "notes.xlsx", ".hidden"]),
                          (hadoop, ["part-00000", "part-00001"]), (empty, [".keep"])):
        folder.mkdir()
        for name in names:
            (folder / name).write_bytes(chat)
    sft = REPO / "configs" / "sft.json"
    result = _invoke("run", data, "-c", sft, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    warning = f"input folder '{data}': 3 file(s) in it are not read"
    assert _squash(warning) in _squash(result.stderr) and _squash("(b.jsonlines, notes.xlsx, part-00000)") in \
        _squash(result.stderr), result.stderr
    left = gpu_prep.open(tmp_path / "out").manifest["inputs_left_out"]
    assert left == {str(data): {"files": 3, "first": [str(data / n) for n in ("b.jsonlines", "notes.xlsx", "part-00000")]}}
    assert _squash(warning) in _squash(_invoke("validate", "-c", sft, data).stderr)
    _assert_clear_error(_run_sft(tmp_path, "-o", tmp_path / "out2", inputs=hadoop), f"input '{hadoop}'",
                        "holds 2 file(s), none named as a format gpu-prep reads (part-00000, part-00001)", "builder")
    _assert_clear_error(_run_sft(tmp_path, "-o", tmp_path / "out2", inputs=empty), "the folder holds no files")
    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps({**json.loads(sft.read_text()), "preprocessing": {"deduplicate": False},
                               "datasets": [{"name": "hadoop", "data_paths": [str(hadoop)], "builder": "jsonl"}]}))
    result = _invoke("run", "-c", mix, "-o", tmp_path / "out3", "-q")
    assert result.exit_code == 0, result.output
    assert [i["path"] for i in gpu_prep.open(tmp_path / "out3").manifest["inputs"]] == \
        [str(hadoop / "part-00000"), str(hadoop / "part-00001")]


def test_a_file_given_twice_in_one_list_of_inputs_is_refused_naming_both(tmp_path: Path) -> None:
    # Read twice, its rows would be written twice (dedup off) or dropped as duplicates the second time.
    folder = tmp_path / "data"
    folder.mkdir()
    chat = folder / "chat.jsonl"
    chat.write_bytes((REPO / "examples" / "chat.jsonl").read_bytes())
    (folder / "link.jsonl").symlink_to(chat)
    twice = {"named twice": ([chat, chat], f"'{chat}' and '{chat}'"),
             "spelled two ways": ([chat, f"{folder}/./chat.jsonl"], f"'{folder}/./chat.jsonl'"),
             "a symlink": ([chat, folder / "link.jsonl"], f"(a link to '{chat}')"),
             "a glob and a name": ([f"{folder}/c*.jsonl", chat], f"'{chat}' (from '{folder}/c*.jsonl')"),
             "a folder and a name": ([chat, folder], f"(from '{folder}')")}
    for case, (inputs, fragment) in twice.items():
        result = _invoke("run", *inputs, "-c", REPO / "configs" / "sft.json", "-q", "-o", tmp_path / "out")
        _assert_clear_error(result, fragment, "are the same file", "read twice")
    # Two datasets of a mix naming one file is a choice: both read it.
    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps({**json.loads((REPO / "configs" / "sft.json").read_text()),
                               "preprocessing": {"deduplicate": False},
                               "datasets": [{"name": "a", "data_paths": [str(chat)]},
                                            {"name": "b", "data_paths": [str(chat)]}]}))
    result = _invoke("run", "-c", mix, "-o", tmp_path / "out", "-q")
    assert result.exit_code == 0, result.output
    assert len(gpu_prep.open(tmp_path / "out").manifest["inputs"]) == 2


def test_an_interrupted_run_leaves_ctrl_c_to_its_caller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Called from Python (CliRunner, a notebook), an interrupted run used to leave SIGINT ignored for the
    # rest of the caller's process.
    import signal

    import gpu_prep.pipeline

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_prep.pipeline, "run", interrupted)
    before = signal.getsignal(signal.SIGINT)
    result = _run_sft(tmp_path, "-o", tmp_path / "out")
    assert result.exit_code == 130 and "resumeitwith" in _squash(result.output)
    assert signal.getsignal(signal.SIGINT) is before


def test_validate_fails_on_roles_a_mapping_leaves_out(tmp_path: Path) -> None:
    # Giving input.roles replaces the sharegpt default: a mapping without function_call and observation
    # has run write their rows without those turns (warned); validate calls it an error.
    data = tmp_path / "tools.jsonl"
    data.write_text(json.dumps({"conversations": [
        {"from": "human", "value": "Weather?"}, {"from": "function_call", "value": '{"name": "w", "arguments": {}}'},
        {"from": "observation", "value": "21C"}, {"from": "gpt", "value": "21 degrees."}]}) + "\n", encoding="utf-8")
    config = tmp_path / "partial.json"
    config.write_text(json.dumps({"input": {"type": "sharegpt", "roles": {"user": ["human"], "assistant": ["gpt"]}},
                                  "mask": {"assistant": "train"}}), encoding="utf-8")
    result = _invoke("validate", "-c", config, data)
    shown = _squash(result.stdout + result.stderr)
    assert result.exit_code == 2 and "role'function_call'" in shown and "role'observation'" in shown, shown
    config.write_text(json.dumps({"input": {"type": "sharegpt"}, "mask": {"assistant": "train"}}), encoding="utf-8")
    assert _invoke("validate", "-c", config, data).exit_code == 0


def test_off_a_terminal_progress_is_a_plain_line_and_the_resume_hint_is_the_same_command(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_prep.commands.console import Reporter, resume_command

    with Reporter(quiet=False, interval=0.0) as report:  # pytest's stderr is no terminal
        report(1_000, 20_000, 3_000_000, 4_000_000)
        report(2_000, 40_000, None, 0)  # the input's size unknown (stdin, a hub dataset): no share, no ETA
    first, second = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"progress: 75% of the input \(3\.0 of 4\.0 MB\), 1,000 rows \([\d,]+/s\), 20,000 tokens "
                        r"\([\d,]+/s\), ETA \d+:\d\d:\d\d", first), first
    assert re.fullmatch(r"progress: 2,000 rows \([\d,]+/s\), 40,000 tokens \([\d,]+/s\)", second), second
    with Reporter(quiet=True, interval=0.0) as report:
        report(1, 1, 1, 2)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr("sys.argv", ["gpu-prep", "run", "-c", "c.json", "data dir/x.jsonl", "-o", "out", "--overwrite"])
    assert resume_command() == "gpu-prep run -c c.json 'data dir/x.jsonl' -o out --resume"
