"""Near-duplicate removal (preprocessing.fuzzy_dedup): MinHash over word n-grams, LSH bands, decided in
input order over the rows about to be written, each drop naming the kept row it shares a band with.

Quality is measured against exact Jaccard similarity of the same shingles, computed here in Python: recall
on planted near-copies of real documents, and false drops (a dropped row whose named row is not similar
to it) on the distinct documents."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from corpora import sharegpt_chats
from gpu_prep.config import parse_config
from gpu_prep.errors import ConfigError, Drop
from gpu_prep.filter.fuzzy import NO_ROW, MinHasher, NearIndex, encode_texts, lsh_bands, shingle_hashes
from gpu_prep.splitmix import splitmix64
from gpu_prep.pipeline import Options, run
from gpu_prep.ragged import segment_mins
from helpers import output_tree, write_jsonl

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

def shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    """The word n-grams the module hashes, as Python makes them."""
    words = text.split()
    if not words:
        return set()
    return {tuple(words[i:i + n]) for i in range(max(len(words) - n + 1, 1))}


def jaccard(a: str, b: str) -> float:
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


@pytest.fixture(scope="module")
def documents() -> list[str]:
    """Real, distinct documents: ShareGPT answers of 80 words or more, none within Jaccard 0.5 of a kept one
    by a cheap first check (the same opening 12 words)."""
    seen, docs = set(), []
    for chat in sharegpt_chats(2500):
        for m in chat["messages"]:
            words = m["content"].split()
            if m["role"] == "assistant" and len(words) >= 80 and tuple(words[:12]) not in seen:
                seen.add(tuple(words[:12]))
                docs.append(m["content"])
    return docs[:900]


def near_copy(text: str, rng: random.Random) -> str:
    """The text with about one word in 120 changed: Jaccard about 0.9 over 5-word shingles."""
    words = text.split()
    for _ in range(max(1, len(words) // 120)):
        i = rng.randrange(len(words))
        words[i] = words[i][::-1] + "~"
    return " ".join(words)


# ---------------------------------------------------------------- the hashing


def test_splitmix64_is_vignas_generator_step() -> None:
    # The reference generator, in Python integers: state += gamma, then the finaliser. Seeded 0 its first
    # output is 0xE220A8397B1DCDAF, as published with the algorithm.
    def step(state: int) -> int:
        z = (state + 0x9E3779B97F4A7C15) & (2**64 - 1)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        return z ^ (z >> 31)

    values = np.random.default_rng(8).integers(0, 2**64, size=1000, dtype=np.uint64)
    assert splitmix64(np, values).tolist() == [step(int(v)) for v in values]
    assert int(splitmix64(np, np.zeros(1, np.uint64))[0]) == 0xE220A8397B1DCDAF


def test_bands_are_chosen_as_datasketch_chooses_them() -> None:
    # datasketch 2.0's MinHashLSH(threshold, num_perm) picks these (its _optimal_param, weights 0.5 / 0.5).
    assert lsh_bands(0.8, 128) == (9, 13)
    assert lsh_bands(0.5, 128) == (25, 5)
    assert lsh_bands(0.9, 256) == (9, 28)
    assert lsh_bands(0.7, 64) == (8, 8)


@pytest.mark.parametrize("scatter", [False, True])
def test_segment_mins_by_reduceat_and_by_scatter(scatter: bool) -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 5, size=200)
    lengths[:3] = 0
    lengths[-2:] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = rng.integers(0, 1 << 32, size=int(offsets[-1]), dtype=np.uint64).astype(np.uint32)
    got = segment_mins(np, values, offsets, 0xFFFFFFFF, scatter=scatter)
    want = [values[a:b].min() if b > a else 0xFFFFFFFF for a, b in zip(offsets[:-1], offsets[1:])]
    assert got.tolist() == [int(w) for w in want]


def test_shingles_are_the_word_ngrams_of_each_text() -> None:
    texts = ["one two three four five six", "", "   ", "alpha", "a b", "é\tb\nc  d\re\vf\fg", "one two three four five"]
    data, offsets = encode_texts(texts)
    hashes, starts = shingle_hashes(np, data, offsets, 5)
    assert np.diff(starts).tolist() == [len(shingles(t)) for t in texts] == [2, 0, 0, 1, 1, 3, 1]
    # Equal shingles hash equal wherever they are: "one two three four five" opens text 0 and is text 6.
    assert hashes[starts[0]] == hashes[starts[6]]
    assert len(set(hashes.tolist())) == len(hashes) - 1
    # Whitespace of any kind or amount separates the same words.
    d2, o2 = encode_texts(["one  two\tthree\nfour five six"])
    assert shingle_hashes(np, d2, o2, 5)[0].tolist() == hashes[:2].tolist()


def test_words_are_what_str_split_gives() -> None:
    # Every whitespace character Python knows, ASCII or not, among words of every script, emoji, controls
    # that are not whitespace, and the bytes of a lone surrogate; and each text hashed alone and together.
    wide = [chr(c) for c in range(0x3001) if chr(c).isspace()]
    pieces = ["word", "é", "日本語", "🙂", "\x00", "\x1b", "\u200b", "\ufeff", "\ud800", "a\u0301", "¢", "\u2030"]
    rng = random.Random(9)
    texts = ["".join(rng.choice(pieces + wide) for _ in range(rng.randrange(0, 40))) for _ in range(400)]
    texts += ["x" + s + "y" for s in wide] + wide
    hasher = shingle_hashes
    hashes, starts = hasher(np, *encode_texts(texts), 1)
    by_word: dict[str, int] = {}
    for k, text in enumerate(texts):
        words = text.split()
        got = hashes[starts[k]:starts[k + 1]].tolist()
        assert len(got) == len(words), (k, text)
        for word, h in zip(words, got):
            assert by_word.setdefault(word, h) == h, (k, word)
    assert len(set(by_word.values())) == len(by_word)


def test_keys_do_not_depend_on_the_batch_a_text_is_hashed_in(documents: list[str]) -> None:
    hasher = MinHasher(5, 128, 9, 13, 42)
    texts = documents[:40] + ["", "just three words"]
    together = hasher.band_keys(np, *encode_texts(texts))
    for k in (0, 17, 40, 41):
        alone = hasher.band_keys(np, *encode_texts([texts[k]]))
        assert (alone[0][0] == together[0][k]).all() and alone[1][0] == together[1][k]
    assert together[1].tolist() == [True] * 40 + [False, True]


def test_signatures_estimate_jaccard(documents: list[str]) -> None:
    rng = random.Random(5)
    hasher = MinHasher(5, 256, 1, 256, 7)
    pairs = [(d, near_copy(d, rng) if k % 2 else near_copy(near_copy(near_copy(d, rng), rng), rng))
             for k, d in enumerate(documents[:60])]
    pairs += [(documents[k], documents[k + 1]) for k in range(60, 80)]  # distinct: about 0
    signature, _ = hasher.signatures(np, *encode_texts([t for pair in pairs for t in pair]))
    estimate = (signature[0::2] == signature[1::2]).mean(axis=1)
    exact = np.array([jaccard(a, b) for a, b in pairs])
    assert np.abs(estimate - exact).max() < 0.12
    assert np.abs(estimate - exact).mean() < 0.03


def test_the_index_keeps_what_it_is_told_and_spills_alike(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 1 << 62, size=(300, 4), dtype=np.uint64)
    keys[50] = keys[10]  # row 50 shares every band with row 10
    keys[60, 2] = keys[20, 2]  # row 60 one band with row 20
    keys[70, 1] = keys[60, 1]  # row 70 one band with row 60, which is dropped: 70 is kept
    keys[80, 3] = keys[20, 3]
    keys[100, 3] = keys[20, 3]  # row 100 shares band 3 with row 20 and band 0 with row 95: 95 is named
    keys[100, 0] = keys[95, 0]
    signed = np.ones(300, bool)
    signed[90], keys[90] = False, keys[10]  # no words: never a near-duplicate, never remembered
    places = np.arange(1000, 1300, dtype=np.uint64)
    got = None
    for cuts in ((0, 55, 300), (0, 7, 65, 300), (0, 97, 300), (0, 100, 300), (0, 300)):
        for index in (NearIndex(), NearIndex(budget_bytes=200, spill_dir=tmp_path)):
            named = np.concatenate([index.decide(keys[a:b], signed[a:b], places[a:b]) for a, b in zip(cuts, cuts[1:])])
            assert got is None or (named == got).all(), cuts
            got = named
    assert index.seen.spilled
    dropped = {int(i): int(got[i]) for i in np.flatnonzero(got != NO_ROW)}
    assert dropped == {50: 1010, 60: 1020, 80: 1020, 100: 1095}
    # What a resumed run is given back (the records taken) decides the rest alike.
    first = NearIndex()
    first.decide(keys[:100], signed[:100], places[:100])
    resumed = NearIndex(np.frombuffer(b"".join(first.take_added()), "V16"))
    assert (resumed.decide(keys[100:], signed[100:], places[100:]) == got[100:]).all()


# ---------------------------------------------------------------- runs


def _run(tmp_path: Path, rows: list[dict], fuzzy: dict, name: str = "out", **options) -> tuple[dict, list[dict]]:
    data = tmp_path / "docs.jsonl"
    if not data.exists():
        write_jsonl(data, rows)
    config = parse_config({"input": {"type": "text"},
                           "preprocessing": {"max_chars": 10_000_000, "deduplicate": False, "fuzzy_dedup": fuzzy}})
    rejects = tmp_path / f"{name}.rejects.jsonl"
    manifest = run(config, [str(data)], tmp_path / name, Options(rejects=rejects, **options))
    return manifest, [json.loads(line) for line in rejects.read_text().splitlines()]


def _named_line(reject: dict) -> int:
    return int(reject["detail"].split(":")[-1].split(",")[0])


def test_recall_on_planted_copies_and_few_false_drops(tmp_path: Path, documents: list[str]) -> None:
    rng = random.Random(11)
    originals = documents[:600]
    copies = [near_copy(d, rng) for d in originals[:300]]
    similarity = [jaccard(d, c) for d, c in zip(originals, copies)]
    assert 0.85 < np.mean(similarity) < 0.95
    rows = [{"text": t} for t in originals + copies]
    # Exact dedup off: every copy is left to the near-duplicate rule.
    data = tmp_path / "docs.jsonl"
    write_jsonl(data, rows)
    config = parse_config({"input": {"type": "text"}, "preprocessing": {"deduplicate": False, "max_chars": 10_000_000,
                                                                         "fuzzy_dedup": {}}})
    manifest = run(config, [str(data)], tmp_path / "out", Options(rejects=tmp_path / "rejects.jsonl"))
    rejects = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    near = {r["line"]: _named_line(r) for r in rejects if r["reason"] == Drop.NEAR_DUPLICATE}
    assert manifest["totals"]["rows_dropped"] == {Drop.NEAR_DUPLICATE: len(near)}
    texts = {k + 1: t for k, t in enumerate(originals + copies)}
    caught = [line for line in range(601, 901) if near.get(line) == line - 600]
    assert len(caught) / 300 >= 0.9, len(caught)
    # False drops among the distinct documents: dropped, though not similar to the row named.
    false = [line for line in near if line <= 600 and jaccard(texts[line], texts[near[line]]) < 0.8]
    assert len(false) <= 0.01 * 600, false
    # Every row named is written, and comes before the row it is named for.
    assert all(named not in near and named < line for line, named in near.items())


def test_rejects_name_the_kept_row_whatever_the_chunks(tmp_path: Path, documents: list[str]) -> None:
    rng = random.Random(2)
    rows = [{"text": t} for d in documents[:40] for t in (d, near_copy(d, rng))]
    one, rejects_one = _run(tmp_path, rows, {}, "big", chunk_rows=1000)
    small, rejects_small = _run(tmp_path, rows, {}, "small", chunk_rows=3)
    assert rejects_one == rejects_small
    assert output_tree(tmp_path / "big", "tokenizer.engine_choice") == output_tree(tmp_path / "small", "tokenizer.engine_choice")
    near = [r for r in rejects_one if r["reason"] == Drop.NEAR_DUPLICATE]
    assert len(near) >= 30 and all(_named_line(r) == r["line"] - 1 for r in near)
    assert near[0]["detail"].startswith("shares a MinHash band with ") and str(tmp_path) in near[0]["detail"]
    assert one["totals"]["rows_written"] == 80 - len(near) and one["totals"]["rows_dropped"] == {Drop.NEAR_DUPLICATE: len(near)}


def test_a_row_dropped_later_is_not_a_row_to_name(tmp_path: Path, documents: list[str]) -> None:
    # The first copy is too long to keep (max_chars): the second is kept, and the third names it.
    doc = documents[0]
    rows = [{"text": doc + " padding" * 400}, {"text": doc}, {"text": doc + " end"}]
    write_jsonl(tmp_path / "docs.jsonl", rows)
    config = parse_config({"input": {"type": "text"}, "preprocessing": {"max_chars": len(doc) + 100, "deduplicate": False, "fuzzy_dedup": {}}})
    run(config, [str(tmp_path / "docs.jsonl")], tmp_path / "out", Options(rejects=tmp_path / "r.jsonl"))
    rejects = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [(1, Drop.TOO_LONG), (3, Drop.NEAR_DUPLICATE)]
    assert _named_line(rejects[1]) == 2


def test_chat_rows_are_compared_without_their_system_prompt(tmp_path: Path, documents: list[str]) -> None:
    system = {"role": "system", "content": " ".join(documents[5].split()[:300])}
    rows = [{"messages": [system, {"role": "user", "content": documents[k]},
                          {"role": "assistant", "content": documents[k + 1]}]} for k in range(0, 20, 2)]
    rows.append({"messages": [{"role": "user", "content": documents[0]},
                              {"role": "assistant", "content": documents[1] + " Thanks."}]})
    write_jsonl(tmp_path / "chat.jsonl", rows)
    config = parse_config({"input": {"type": "chat"}, "chat_template": "chatml", "mask": {"assistant": "train"},
                           "preprocessing": {"max_seq_len": 100_000, "deduplicate": False, "fuzzy_dedup": {}}})
    manifest = run(config, [str(tmp_path / "chat.jsonl")], tmp_path / "out", Options(rejects=tmp_path / "r.jsonl"))
    assert manifest["totals"]["rows_dropped"] == {Drop.NEAR_DUPLICATE: 1}
    (reject,) = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert reject["line"] == 11 and _named_line(reject) == 1


def test_true_and_false_switch_it_with_the_defaults() -> None:
    on = parse_config({"input": {"type": "text"}, "preprocessing": {"fuzzy_dedup": True}}).preprocessing.fuzzy_dedup
    assert on == parse_config({"input": {"type": "text"}, "preprocessing": {"fuzzy_dedup": {}}}).preprocessing.fuzzy_dedup
    assert (on.threshold, on.ngram, on.num_perm, on.bands) == (0.8, 5, 128, None)
    assert parse_config({"input": {"type": "text"},
                         "preprocessing": {"fuzzy_dedup": False}}).preprocessing.fuzzy_dedup is None


@pytest.mark.parametrize(("fuzzy", "message"), [({"bands": 200}, "cannot exceed num_perm"),
                                                 ({"threshold": 1.0}, "threshold"), ({"ngram": 0}, "ngram")])
def test_settings_that_cannot_work_are_refused(fuzzy: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"input": {"type": "text"}, "preprocessing": {"fuzzy_dedup": fuzzy}})


@pytest.mark.parametrize("fuzzy", [{}, {"num_perm": 100, "bands": 7}])
def test_the_manifest_records_the_banding_used(tmp_path: Path, fuzzy: dict) -> None:
    # Given bands, the threshold is not used and num_perm // bands rows make a band: the manifest says what
    # ran, and where a pair of rows is as likely as not to share a band.
    manifest, _ = _run(tmp_path, [{"text": f"document {k} with some words in it"} for k in range(20)], fuzzy)
    used = manifest["fuzzy_dedup"]
    bands, rows = used["bands"], used["rows_per_band"]
    assert (bands, rows) == ((7, 14) if fuzzy else lsh_bands(0.8, 128)) and used["permutations_used"] == bands * rows
    s = used["similarity_at_half"]
    assert abs(1 - (1 - s ** rows) ** bands - 0.5) < 1e-3


def test_a_row_the_mix_takes_again_is_named_as_its_own_earlier_occurrence(tmp_path: Path) -> None:
    small = write_jsonl(tmp_path / "small.jsonl", [{"text": f"a small document {k} with several words to shingle"}
                                                   for k in range(3)])
    big = write_jsonl(tmp_path / "big.jsonl", [{"text": f"another document {k} unlike the others {k * 7} at all"}
                                               for k in range(30)])
    config = parse_config({"input": {"type": "text"},
                           "preprocessing": {"deduplicate": False, "fuzzy_dedup": {}, "min_chars": 1},
                           "datasets": [{"name": "s", "data_paths": [str(small)], "sampling": 0.5},
                                        {"name": "b", "data_paths": [str(big)], "sampling": 0.5}]})
    rejects = tmp_path / "rejects.jsonl"
    run(config, [], tmp_path / "out", Options(rejects=rejects))
    again = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert again and all(r["file"] == str(small) for r in again)
    assert all("an earlier occurrence of this row (the mix takes it more than once)" in r["detail"] for r in again)
