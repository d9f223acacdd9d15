"""The output of one fixed corpus, pinned by its sha256: one process running the stages in turn, the
threaded one, and a 2-worker Dask cluster must all write exactly these bytes.

The pin was taken before the pipeline was reorganised into run/, cluster/ and output/, so a refactor that
changes a single byte of shards, meta.json, the manifest's counts or the rejects file fails here. It moves
only with a deliberate change of output (then say why in the commit that updates it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from corpora import sharegpt_chats
from gpu_prep.config import load_config, parse_config
from gpu_prep.durable import JOURNAL
from gpu_prep.pipeline import Options, run
from helpers import REPO, write_jsonl

PINNED = "6d09eb5f6390783766e576032df82a2b6f9586d63f4ba3e59a464cd115c63d9c"
PINNED_EXAMPLE = "f1108f8a2db5cd6ef07d39dd6419a02e153b2cf91239293b9c983f0c1fb7b1be"
MANIFEST_KEYS = ("totals", "domains", "packing")  # what the manifest says that no path or timing enters


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 ShareGPT conversations in three domains, 40 of them repeated, a few bad lines."""
    chats = sharegpt_chats(300)
    rows = [{**chat, "source": ("code", "chat", "../etc")[k % 3]} for k, chat in enumerate(chats)]
    rows += rows[10:50] + ["{not json", "[1, 2]", {"messages": "a string"}, {"source": "chat"}]
    return write_jsonl(tmp_path_factory.mktemp("pinned") / "corpus.jsonl", rows)


def _config() -> object:
    config = json.loads((REPO / "configs" / "sft.json").read_text(encoding="utf-8"))
    config["preprocessing"] = {**config.get("preprocessing", {}), "max_seq_len": 1024, "min_chars": 20}
    config["output"] = {**config.get("output", {}), "domain_key": "source", "max_tokens_per_shard": 60_000}
    return parse_config(config)


def tree_sha256(out: Path, rejects: Path) -> str:
    """sha256 over every file of the output but the manifest, the manifest's path-free counts, and the
    rejects file with the folder it and the corpus are in taken out."""
    digest = hashlib.sha256()
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.name not in ("manifest.json", JOURNAL)):
        digest.update(path.relative_to(out).as_posix().encode() + b"\0" + path.read_bytes())
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    digest.update(json.dumps({k: manifest.get(k) for k in MANIFEST_KEYS}, sort_keys=True).encode())
    folder = json.dumps(str(rejects.parent))[1:-1].encode()
    digest.update(rejects.read_bytes().replace(folder, b"<folder>"))
    return digest.hexdigest()


@pytest.mark.parametrize("how", ["serial", "threads", "cluster"])
def test_the_output_is_pinned(tmp_path: Path, corpus: Path, how: str) -> None:
    if how == "cluster":
        pytest.importorskip("distributed")
    options = {"serial": Options(overlap=False, chunk_rows=40, workers=1),
               "threads": Options(chunk_rows=64, workers=2),
               "cluster": Options(chunk_rows=50, cluster="local:2", part_bytes=200_000)}[how]
    rejects = corpus.parent / f"{how}.rejects.jsonl"
    out = tmp_path / "out"
    manifest = run(_config(), [str(corpus)], out, dataclasses.replace(options, rejects=rejects))
    assert manifest["totals"]["rows_dropped"]["duplicate"] >= 40
    assert len(manifest["domains"]) == 3
    assert tree_sha256(out, rejects) == PINNED


def test_the_example_config_is_pinned_too(tmp_path: Path) -> None:
    """The README's first command's config on its example: shards and meta.json byte for byte."""
    out = tmp_path / "out"
    run(load_config(REPO / "configs" / "sft.json"), [str(REPO / "examples" / "chat.jsonl")], out)
    digest = hashlib.sha256()
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.name not in ("manifest.json", JOURNAL)):
        digest.update(path.relative_to(out).as_posix().encode() + b"\0" + path.read_bytes())
    assert digest.hexdigest() == PINNED_EXAMPLE
