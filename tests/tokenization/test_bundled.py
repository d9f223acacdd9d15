"""The bundled Qwen tokenizer is the real one: ids equal tiktoken's on Qwen's own ranks, on real text."""

from __future__ import annotations

import unicodedata

import pytest

from corpora import sharegpt_chats
from gpu_prep.tokenization.bundled import QWEN_FIRST_ADDED_ID, QWEN_PATTERN, _QWEN25_ADDED, _ranks_file

tiktoken = pytest.importorskip("tiktoken")


@pytest.fixture(scope="module")
def reference():
    from tiktoken.load import load_tiktoken_bpe

    special = {t: QWEN_FIRST_ADDED_ID + i for i, t in enumerate(_QWEN25_ADDED)}
    return tiktoken.Encoding("qwen-ranks", pat_str=QWEN_PATTERN, mergeable_ranks=load_tiktoken_bpe(str(_ranks_file())),
                             special_tokens=special)


def test_ids_equal_tiktoken_on_real_conversations(qwen, reference) -> None:
    texts = [m["content"] for chat in sharegpt_chats(300) for m in chat["messages"]]
    texts += ["naïve café", "e\u0301", "emoji 👩‍👩‍👧 and CJK 中文", "  leading\n\n\ntrailing  \t"]
    ours = [e.ids for e in qwen.engine.encode_batch_fast(texts, add_special_tokens=False)]
    # Qwen normalizes to NFC before splitting; tiktoken does not, so it gets the NFC text.
    theirs = reference.encode_batch([unicodedata.normalize("NFC", t) for t in texts], allowed_special="all")
    differing = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert not differing, f"{len(differing)} of {len(texts)} texts differ, first: {texts[differing[0]][:200]!r}"


def test_added_tokens_sit_at_published_ids(qwen) -> None:
    assert qwen.engine.token_to_id("<|endoftext|>") == 151643
    assert qwen.engine.token_to_id("<|im_start|>") == 151644
    assert qwen.engine.token_to_id("<|im_end|>") == 151645
    assert qwen.engine.token_to_id("<|file_sep|>") == 151664
    assert qwen.engine.encode("<|im_start|>user", add_special_tokens=False).ids[0] == 151644


def test_byte_table_covers_every_token(qwen, reference) -> None:
    # The table's byte length of every id equals the length of the bytes tiktoken maps that id to.
    for token_id in range(0, 151665, 7):
        assert qwen.token_bytes[token_id] == len(reference.decode_single_token_bytes(token_id)), token_id
    assert qwen.normalization == "NFC"
    assert qwen.prefix_text == ""
    assert "<|im_end|>" in qwen.end_of_turn_tokens()


def test_our_ranks_conversion_is_transformers_tiktoken_converter_exactly() -> None:
    """gpu-prep converts the tiktoken ranks itself (transformers is not needed at run time); the BPE it
    builds must be the one transformers' TikTokenConverter builds: the same vocabulary and the same merges
    in the same order (a merge out of order changes ids only on some words)."""
    import json

    converter = pytest.importorskip("transformers.convert_slow_tokenizer")
    from gpu_prep.tokenization.bundled import ranks_to_bpe, read_ranks

    vocab, merges = ranks_to_bpe(read_ranks(_ranks_file()))
    model = json.loads(converter.TikTokenConverter(vocab_file=str(_ranks_file()), pattern=QWEN_PATTERN).converted().to_str())["model"]
    assert vocab == model["vocab"]
    assert [list(m) for m in merges] == [m.split(" ") if isinstance(m, str) else list(m) for m in model["merges"]]
    assert len(merges) > 100_000


def test_byte_alphabet_is_a_bijection_onto_printable_characters() -> None:
    from gpu_prep.tokenization.bundled import byte_alphabet

    alphabet = byte_alphabet()
    assert sorted(alphabet) == list(range(256)) and len(set(alphabet.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in alphabet.values())
    assert alphabet[ord("a")] == "a" and alphabet[ord(" ")] == "\u0120"  # the space every GPT-2 vocabulary shows as Ġ
