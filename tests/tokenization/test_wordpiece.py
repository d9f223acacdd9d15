"""WordPiece vocabularies (BERT uncased) on the CPU: ids equal an independent reference, the pure-Python
BERT tokenizer from transformers, including [CLS]/[SEP] and HF-style truncation that keeps [SEP]."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
from gpu_prep.errors import ConfigError
from helpers import run_rows, samples

TEXTS = [
    "Memory-mapped files let a program treat a file on disk as if it were an array in memory.",
    "Héllo, WORLD! Ünïcödé accents are stripped; naïve café façade.",
    "中文和日本語の文字は一字ずつ分けられる。한국어도 있습니다.",
    "Punctuation!!! (brackets) [square] {curly} 'quotes' \"double\" — dashes – and… ellipses?",
    "Numbers 3.14159, 2,718 and 1e-9; emails a.b@c.de; URLs https://example.org/x?y=z#frag.",
    "A word far longer than any vocabulary piece: " + "x" * 120 + " then more words after it.",
    "Tabs\tand\nnewlines\r\nand  multiple   spaces, plus a zero\u200bwidth space and control \x07 bell.",
]


@pytest.fixture(scope="module")
def bert_dir() -> Path:
    try:
        return bundled_tokenizer_dir("bert-uncased")
    except ConfigError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def reference(bert_dir: Path):
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    return BertTokenizerLegacy(vocab_file=str(bert_dir / "vocab.txt"), do_lower_case=True)


def _text_config(max_seq_len: int) -> dict:
    return {"tokenizer": "bert-uncased", "input": {"type": "text"},
            "preprocessing": {"max_seq_len": max_seq_len, "min_chars": 1, "deduplicate": False}}


@pytest.mark.parametrize("max_seq_len", [512, 16])
def test_text_rows_match_the_python_bert_tokenizer(tmp_path: Path, reference, max_seq_len: int) -> None:
    out = run_rows(tmp_path, _text_config(max_seq_len), [{"text": t} for t in TEXTS])
    got = [ids.tolist() for ids, _ in samples(out)]
    expected = [reference(t, truncation=True, max_length=max_seq_len)["input_ids"] for t in TEXTS]
    assert got == expected
    assert all(mask.all() for _, mask in samples(out))


def test_instruction_rows_mask_the_prompt_pieces(tmp_path: Path, reference) -> None:
    config = {"tokenizer": "bert-uncased", "input": {"type": "instruction"},
              "mask": {"prompt": "mask", "response": "train"}}
    out = run_rows(tmp_path, config, [{"prompt": "What is the capital of Canada?", "response": "Ottawa."}])
    ((ids, mask),) = samples(out)
    prompt = reference("What is the capital of Canada?", add_special_tokens=False)["input_ids"]
    response = reference("Ottawa.", add_special_tokens=False)["input_ids"]
    assert ids.tolist() == [101, *prompt, *response, 102]
    assert mask.tolist() == [0] * (1 + len(prompt)) + [1] * len(response) + [0]
    # BERT has no eos to close the response with: the run says so before it starts (qwen2.5's has one).
    from gpu_prep.config import parse_config
    from gpu_prep.pipeline import Options, run

    for tokenizer, warned in (("bert-uncased", True), ("qwen2.5", False)):
        said: list[str] = []
        run(parse_config({**config, "tokenizer": tokenizer}), [str(out.parent / "run.jsonl")],
            tmp_path / f"warned-{tokenizer}", Options(warn=said.append))
        hits = [w for w in said if "has no eos token, which closes an instruction row's trained response" in w]
        assert len(hits) == warned and (not warned or "'[SEP]' the tokenizer closes each text with" in hits[0]), said


def test_chat_rows_are_masked_by_the_tokenizers_offsets(tmp_path: Path, reference) -> None:
    """WordPiece drops spaces and lower-cases, so no byte arithmetic places its tokens: the offsets HF
    tokenizers reports do, and exactly the assistant's words are trained."""
    template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    config = {"tokenizer": "bert-uncased", "chat_template": template, "input": {"type": "chat"},
              "mask": {"assistant": "train"}, "preprocessing": {"min_chars": 1}}
    rows = [{"messages": [{"role": "user", "content": "Héllo, what is  the CAPITAL?"},
                          {"role": "assistant", "content": "  Ottawa, naïvely.  "}]}]
    out = run_rows(tmp_path, config, rows)
    [(ids, mask)] = samples(out)
    words = reference("Ottawa, naïvely.", add_special_tokens=False)["input_ids"]
    assert ids[mask == 1].tolist() == words
    rendered = "user: Héllo, what is  the CAPITAL?\nassistant:   Ottawa, naïvely.  \n"
    assert ids.tolist() == reference(rendered, add_special_tokens=False)["input_ids"]
