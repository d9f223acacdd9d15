"""Tokenizer engines: tiktoken is used only where it equals HF on the run's own input, and output is the
same bytes whichever engine ran."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import run_rows

from corpora import adversarial_texts, sharegpt_chats
from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
from gpu_prep.tokenization.engines import tiktoken_problem
from gpu_prep.errors import ConfigError
from gpu_prep.tokenization.tokenizer import load_tokenizer


def _shard_hashes(manifest_dir: Path) -> dict:
    manifest = json.loads((manifest_dir / "manifest.json").read_text())
    return {name: [s["sha256"] for s in meta["shards"]] for name, meta in manifest["domains"].items()}


def _engine(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())["tokenizer"]


@pytest.mark.parametrize("input_type", ["chat", "text"])
def test_tiktoken_and_hf_write_identical_shards(tmp_path: Path, input_type: str) -> None:
    chats = sharegpt_chats(150)
    rows = chats if input_type == "chat" else [{"text": m["content"]} for c in chats for m in c["messages"]]
    outs = {}
    for engine in ("hf", "tiktoken", "fastokens", "auto"):
        config = {"tokenizer": {"name": "qwen2.5", "engine": engine}, "input": {"type": input_type},
                  "mask": {"assistant": "train"}, "preprocessing": {"deduplicate": False, "min_chars": 1}}
        outs[engine] = run_rows(tmp_path, config, rows, name=engine, chunk_rows=64)
    assert _engine(outs["hf"])["engine"] == "hf"
    assert _engine(outs["tiktoken"])["engine"] == "tiktoken"
    assert _engine(outs["fastokens"])["engine"] == "fastokens"
    assert _engine(outs["auto"])["engine"] == "fastokens"  # the fastest exact engine, first under auto
    assert "identical to HF" in _engine(outs["auto"])["engine_choice"]
    check = _engine(outs["auto"])["engine_check"]
    assert check["engine"] == "fastokens" and check["difference"] is None and check["pieces_checked"] > 0
    assert _engine(outs["hf"])["engine_check"] is None
    hashes = [_shard_hashes(outs[engine]) for engine in outs]
    assert all(h == hashes[0] for h in hashes)


def _reordered_qwen(tmp_path: Path) -> Path:
    """Qwen's vocabulary with its merges applied in reverse priority: valid BPE for HF, but tiktoken (and a
    rank file) ranks merges by id, so they disagree with HF on ordinary words."""
    source = bundled_tokenizer_dir("qwen2.5")
    target = tmp_path / "reordered"
    target.mkdir()
    shutil.copy(source / "tokenizer_config.json", target)
    spec = json.loads((source / "tokenizer.json").read_text())
    spec["model"]["merges"].reverse()
    spec["model"]["ignore_merges"] = False  # otherwise words found whole in the vocabulary skip the merges
    (target / "tokenizer.json").write_text(json.dumps(spec))
    return target


def test_a_vocabulary_whose_ids_are_not_in_merge_order_falls_back_to_hf(tmp_path: Path) -> None:
    target = _reordered_qwen(tmp_path)
    rows = [{"text": "Antidisestablishmentarianism, floccinaucinihilipilification and xqzvbnmlkjh."}]
    config = {"tokenizer": {"name": str(target), "engine": "tiktoken"}, "input": {"type": "text"},
              "preprocessing": {"min_chars": 1}}
    out = run_rows(tmp_path, config, rows, name="fallback")
    identity = _engine(out)
    assert identity["engine"] == "hf"
    assert "differs from HF" in identity["engine_choice"]
    hf_config = {**config, "tokenizer": {"name": str(target), "engine": "hf"}}
    assert _shard_hashes(out) == _shard_hashes(run_rows(tmp_path, hf_config, rows, name="hf"))


def test_wordpiece_runs_on_hf_saying_why_neither_fast_engine_can() -> None:
    try:
        tok = load_tokenizer("bert-uncased")
    except ConfigError as exc:
        pytest.skip(str(exc))
    assert "WordPiece" in tiktoken_problem(tok.spec)
    ids, counts = tok.use_engine("auto", ["hello"], sample_size=1)
    assert tok.engine_choice.startswith("hf: fastokens cannot run this tokenizer (")
    assert "BertNormalizer" in tok.engine_choice and "tiktoken cannot run this tokenizer (model is WordPiece" in tok.engine_choice
    assert tok.audit is None
    assert ids.tolist() == tok.engine.encode("hello", add_special_tokens=False).ids and counts.tolist() == [len(ids)]


def test_output_does_not_depend_on_workers_or_chunk_size(tmp_path: Path) -> None:
    rows = sharegpt_chats(120)
    config = {"tokenizer": {"name": "qwen2.5", "engine": "tiktoken"}, "mask": {"assistant": "train"},
              "preprocessing": {"max_seq_len": 512}, "output": {"max_tokens_per_shard": 20_000}}
    hashes = [
        _shard_hashes(run_rows(tmp_path, config, rows, name=f"w{workers}-c{chunk}", workers=workers, chunk_rows=chunk))
        for workers, chunk in [(1, 2048), (2, 7), (1, 1), (2, 64)]
    ]
    assert all(h == hashes[0] for h in hashes[1:])
    assert sum(len(v) for v in hashes[0].values()) > 1  # several shards, so shard cuts are compared too


# ---------------------------------------------------------------- the check all the way through

MARKER = "zebra-quartz"  # text only rows far past the first sample carry


def _corrupting(original):
    """A fast engine that is exact except on pieces with MARKER, where its first token is off by one: the
    kind of rare difference the first sample cannot see."""
    def encode(self, pieces):
        ids, counts = original(self, pieces)
        ids = ids.copy()
        starts = np.cumsum(counts) - counts
        for i, piece in enumerate(pieces):
            if MARKER in piece and counts[i]:
                ids[starts[i]] += 1
        return ids, counts
    return encode


def _late_marker_rows() -> list[dict]:
    rows = [{"text": m["content"]} for c in sharegpt_chats(200) for m in c["messages"]]
    rows = rows[:600]  # run in chunks of 50 rows: the first sample (of the first chunk) never sees row 450
    rows[450] = {"text": f"A line about the {MARKER} that only this row has."}
    return rows


@pytest.mark.parametrize("engine", ["fastokens", "tiktoken"])
def test_a_difference_after_the_first_sample_is_caught_and_re_encoded_by_hf(tmp_path: Path, engine: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_prep.tokenization import checks, engines

    monkeypatch.setattr(checks, "AUDIT_RATE", 1.0)  # every piece checked, so the one bad piece is seen
    engine_class = {"fastokens": engines.FastokensEngine, "tiktoken": engines.TiktokenEngine}[engine]
    monkeypatch.setattr(engine_class, "encode", _corrupting(engine_class.encode))
    rows = _late_marker_rows()
    config = {"tokenizer": {"name": "qwen2.5", "engine": engine}, "input": {"type": "text"},
              "preprocessing": {"deduplicate": False, "min_chars": 1}}
    out = run_rows(tmp_path, config, rows, name="caught", chunk_rows=50)
    identity = _engine(out)
    assert identity["engine"] == "hf"
    assert f"{engine} differs from HF" in identity["engine_choice"] and MARKER in identity["engine_choice"]
    assert MARKER in identity["engine_check"]["difference"]
    assert identity["engine_check"]["pieces_checked"] >= 450
    hf = run_rows(tmp_path, {**config, "tokenizer": {"name": "qwen2.5", "engine": "hf"}}, rows, name="hf")
    assert _shard_hashes(out) == _shard_hashes(hf)  # nothing the corrupt engine made was written


def test_under_strict_a_difference_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_prep.tokenization import checks, engines
    from gpu_prep.errors import EngineMismatch

    monkeypatch.setattr(checks, "AUDIT_RATE", 1.0)
    monkeypatch.setattr(engines.FastokensEngine, "encode", _corrupting(engines.FastokensEngine.encode))
    config = {"tokenizer": {"name": "qwen2.5", "engine": "auto"}, "input": {"type": "text"},
              "preprocessing": {"deduplicate": False, "min_chars": 1}}
    with pytest.raises(EngineMismatch, match=f"fastokens differs from HF.*{MARKER}.*--strict"):
        run_rows(tmp_path, config, _late_marker_rows(), name="strict", chunk_rows=50, strict=True)


def test_the_audit_checks_a_seeded_share_picked_by_each_piece_s_place(qwen) -> None:
    from gpu_prep.tokenization.checks import Audit
    from gpu_prep.tokenization.engines import HfEngine

    audit = Audit(HfEngine(qwen.engine), "fastokens", rate=0.01, seed=7)
    keys = np.arange(300_000, dtype=np.uint64)
    picked = audit.picks(keys)
    assert 2_600 < len(picked) < 3_400  # about 1%
    # A piece is picked for its key alone, wherever it lies in a batch: chunking cannot change the sample.
    assert np.array_equal(keys[picked[picked >= 1000]], keys[1000:][audit.picks(keys[1000:])])
    assert not np.array_equal(picked, Audit(HfEngine(qwen.engine), "fastokens", rate=0.01, seed=8).picks(keys))


def test_the_pieces_checked_do_not_depend_on_chunking_or_workers(tmp_path: Path) -> None:
    rows = sharegpt_chats(120)
    config = {"tokenizer": {"name": "qwen2.5"}, "mask": {"assistant": "train"}}
    checks = [_engine(run_rows(tmp_path, config, rows, name=f"c{chunk}", chunk_rows=chunk))["engine_check"]
              for chunk in (7, 64, 2048)]
    assert checks[0] == checks[1] == checks[2] and checks[0]["pieces_checked"] > 0


def test_fastokens_built_from_the_cached_ranks_file_equals_hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              qwen) -> None:
    # The first build reads tokenizer.json and leaves a ranks file in the cache dir; the next builds from it
    # (NFC applied by gpu-prep, as the tokenizer's normalizer asks) and must still equal HF, on NFD text too.
    from gpu_prep.tokenization.checks import first_difference
    from gpu_prep.tokenization.engines import FastokensEngine, HfEngine, ranks_cache_path

    monkeypatch.setenv("GPU_PREP_CACHE", str(tmp_path / "cache"))
    path = qwen.directory / "tokenizer.json"
    ranks = ranks_cache_path(path)
    assert not ranks.exists()
    first = FastokensEngine.build(qwen.spec, path)
    assert first.form is None and ranks.is_file()
    again = FastokensEngine.build(qwen.spec, path)
    assert again.form == "NFC"  # built from the ranks file
    texts = [m["content"] for c in sharegpt_chats(60) for m in c["messages"]] + adversarial_texts(random_count=500)
    texts.append("<|im_start|>user\ncafe\u0301 <|im_end|>")  # NFD, around added tokens
    assert first_difference(again.encode(texts), HfEngine(qwen.engine).encode(texts), texts) is None


def _unreachable_token_tokenizer(folder: Path) -> Path:
    """The smallest vocabulary with the Llama-3 property that matters here: a byte-level BPE tiktoken could run
    (one regex Split, then ByteLevel) holding a token no merge makes ("xyz": no two ranked pieces spell it, so
    fastokens refuses a rank file of this vocabulary), beside one merge ("ab") and an added token."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    from gpu_prep.tokenization.bundled import byte_alphabet

    vocab = {char: byte for byte, char in byte_alphabet().items()} | {"ab": 256, "xyz": 257}
    tokenizer = Tokenizer(models.BPE(vocab, [("a", "b")]))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r" ?\w+| ?[^\s\w]+|\s+"), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|end|>"])
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))
    return folder


def test_a_rank_file_fastokens_refuses_is_dropped_and_fastokens_built_from_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each use_engine stands for a run in a new process (no engine built yet). The first run writes the rank
    # file; fastokens refuses it on the second, which builds from tokenizer.json instead (and says why), and
    # no later run writes or reads a rank file for this tokenizer again.
    from gpu_prep.tokenization import builds, engines

    monkeypatch.setenv("GPU_PREP_CACHE", str(tmp_path / "cache"))
    folder = _unreachable_token_tokenizer(tmp_path / "tok")
    pieces = ["abxyz ab", "xyz<|end|>", "cab, xy z", "h\u00e9llo"]
    ranks = engines.ranks_cache_path(folder / "tokenizer.json")
    choices = []
    for _ in range(3):
        monkeypatch.setattr(builds, "_BUILDS", {})
        tok = load_tokenizer(str(folder))
        ids, counts = tok.use_engine("auto", pieces, len(pieces))
        assert tok.active.name == "fastokens"
        assert ids.tolist() == [i for p in pieces for i in tok.engine.encode(p, add_special_tokens=False).ids]
        choices.append(tok.engine_choice)
        if len(choices) == 1:
            assert ranks.is_file()
    assert "refused the cached rank file" in choices[1] and "did not decompose" in choices[1]
    assert choices[2] == choices[0] and "rank file" not in choices[0]
    assert not ranks.exists() and ranks.with_suffix(".refused").is_file()
    assert engines.rank_recipe(tok.spec, folder / "tokenizer.json") is None


def test_a_rank_file_whose_engine_differs_from_hf_is_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # fastokens builds from this rank file, but ranks by id where HF applies the merges in their own order:
    # the second run notices, drops the file and runs fastokens built from tokenizer.json, as the first did.
    from gpu_prep.tokenization import builds, engines

    monkeypatch.setenv("GPU_PREP_CACHE", str(tmp_path / "cache"))
    target = _reordered_qwen(tmp_path)
    rows = [{"text": "Antidisestablishmentarianism, floccinaucinihilipilification and xqzvbnmlkjh."}]
    config = {"tokenizer": {"name": str(target)}, "input": {"type": "text"}, "preprocessing": {"min_chars": 1}}
    identities, hashes = [], []
    for run in range(2):
        monkeypatch.setattr(builds, "_BUILDS", {})
        out = run_rows(tmp_path, config, rows, name=f"run{run}")
        identities.append(_engine(out))
        hashes.append(_shard_hashes(out))
    assert [i["engine"] for i in identities] == ["fastokens", "fastokens"]
    assert "a cached rank file made fastokens differ from HF and was dropped" in identities[1]["engine_choice"]
    ranks = engines.ranks_cache_path(target / "tokenizer.json")
    assert not ranks.exists() and ranks.with_suffix(".refused").is_file()
    assert hashes[0] == hashes[1]


def test_the_command_drops_a_rank_file_whose_engine_differs_from_hf_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # From the command line the second run's fastokens is the early build from the rank file (the hint the
    # first left): it used to carry no rank file's name, so the file stayed and the run fell back to HF.
    from gpu_prep.tokenization import engines
    from helpers import gpu_prep_cli

    target = _reordered_qwen(tmp_path)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"text": "Antidisestablishmentarianism, floccinaucinihilipilification."}) + "\n")
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"tokenizer": {"name": str(target)}, "input": {"type": "text"},
                                  "preprocessing": {"min_chars": 1}}))
    env = {"GPU_PREP_CACHE": str(tmp_path / "cache")}
    monkeypatch.setenv("GPU_PREP_CACHE", env["GPU_PREP_CACHE"])  # where the runs keep the rank file
    chosen = []
    for run in range(2):
        result = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / f"out{run}", "-q", env=env)
        assert result.returncode == 0, result.stderr
        chosen.append(_engine(tmp_path / f"out{run}")["engine"])
    assert chosen == ["fastokens", "fastokens"]
    assert engines.ranks_cache_path(target / "tokenizer.json").with_suffix(".refused").is_file()


def test_the_engine_taken_says_why_the_one_tried_before_it_was_not(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_prep.tokenization import builds, engines

    def broken(spec: dict, path: Path) -> None:
        raise RuntimeError("no such part\nmore detail")

    monkeypatch.setattr(builds, "_BUILDS", {})
    monkeypatch.setattr(engines.FastokensEngine, "build", staticmethod(broken))
    tok = load_tokenizer("qwen2.5")  # not the session's: its engine is chosen here
    tok.use_engine("auto", ["hello world"], 1)
    assert tok.active.name == "tiktoken"
    assert tok.engine_choice == ("tiktoken: identical to HF on a sample of 1 pieces of this input; "
                                 "fastokens cannot run this tokenizer (no such part)")


@pytest.mark.real_tokenizer_loads
def test_a_warm_tokenizer_load_takes_its_outline_from_the_cache(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The second load reads the outline kept by the first and loads HF tokenizers in a thread: everything the
    # run reads of the tokenizer is the same either way.
    from gpu_prep.tokenization.outline import _Loading

    monkeypatch.setenv("GPU_PREP_CACHE", str(tmp_path / "cache"))
    cold, warm = load_tokenizer("qwen2.5"), load_tokenizer("qwen2.5")
    assert not isinstance(cold.engine, _Loading) and isinstance(warm.engine, _Loading)
    assert list((tmp_path / "cache" / "tokenizers").glob("outline*.json"))
    for name in ("spec", "vocab_size", "prefix_text", "suffix_text", "special_tokens", "model"):
        assert getattr(warm, name) == getattr(cold, name), name
    assert np.array_equal(warm.token_bytes, cold.token_bytes)
    assert warm.summary() == cold.summary() and warm.end_of_turn_tokens() == cold.end_of_turn_tokens()
    assert warm.vocab_size == cold.engine.get_vocab_size(with_added_tokens=True) == 151665
    # The vocabulary is kept in a file of its own and read only when something asks: a run that asks nothing
    # never parses it. Without the file, the HF engine answers.
    fresh = load_tokenizer("qwen2.5")
    assert fresh.spec["model"]["vocab"]._vocab is None and fresh.token_id("<|im_end|>") == 151645
    assert fresh.spec["model"]["vocab"]._vocab is None  # an added token needs no vocabulary
    (vocab_file,) = (tmp_path / "cache" / "tokenizers").glob("outline*-vocab.json")
    vocab_file.unlink()
    assert load_tokenizer("qwen2.5").token_id("hello") == cold.engine.token_to_id("hello")
    assert warm.token_id("<|im_end|>") == cold.engine.token_to_id("<|im_end|>")
    assert warm.token_id("hello") == cold.engine.token_to_id("hello") and warm.token_id("no such token!") is None
    assert warm.engine.encode("hi there", add_special_tokens=False).ids == cold.engine.encode("hi there").ids
