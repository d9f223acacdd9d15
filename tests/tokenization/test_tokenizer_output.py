"""The tokenizer travels with the output, and model ids resolve through a Hugging Face hub cache.

meta.json and the manifest say which tokenizer made the shards (its source, a sha256 over its files, its
vocabulary size and special ids) and the files themselves are copied to OUT/tokenizer, where transformers
and `gpu-prep inspect` load them. Model ids are resolved offline from a hub cache the test lays out itself
(models--org--name/refs and snapshots, as huggingface_hub writes it); nothing is fetched.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
from gpu_prep.errors import ConfigError
from gpu_prep.read.hub import looks_like_model_id
from gpu_prep.tokenization.tokenizer import load_tokenizer
from helpers import gpu_prep_cli, run_rows, samples

CHAT = {"input": {"type": "chat"}, "mask": {"assistant": "train"}}
ROWS = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}],
         "source": "tokenizer"}]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, model_id: str, source: Path, branch: str = "main") -> Path:
    """A hub cache holding a model's tokenizer files at COMMIT, its branch pointing there."""
    repo = root / f"models--{model_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(source / name, snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / branch).write_text(COMMIT)
    return root


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("huggingface_hub")
    cache = hub_cache(tmp_path / "hub", "Qwen/Qwen2.5-7B-Instruct", bundled_tokenizer_dir("qwen2.5"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_meta_and_manifest_say_which_tokenizer_and_its_files_travel(tmp_path: Path, qwen: Any) -> None:
    config = {**CHAT, "output": {"domain_key": "source"}}
    out = run_rows(tmp_path, config, ROWS)
    manifest = json.loads((out / "manifest.json").read_text())
    [domain] = manifest["domains"].values()
    about = domain["tokenizer"]
    assert about["source"] == "bundled qwen2.5" and about["vocab_size"] == 151665
    assert (about["eos_id"], about["pad_id"], about["bos_id"], about["eod_id"]) == (151645, 151643, None, 151645)
    assert manifest["tokenizer"]["sha256"] == about["sha256"]
    # No machine-local path: the cache the bundled tokenizer was built in appears nowhere in the manifest.
    assert str(qwen.directory) not in json.dumps(manifest) and "directory" not in manifest["tokenizer"]
    # A domain named "tokenizer" does not take the copy's folder.
    folder = next(p.name for p in out.iterdir() if p.name.startswith("tokenizer-"))
    assert (out / "tokenizer" / "tokenizer.json").is_file() and len(samples(out, folder)) == 1
    copy = load_tokenizer(str(out / "tokenizer"))
    assert copy.summary()["sha256"] == about["sha256"]
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    [(ids, _)] = samples(out, folder)
    assert hf.apply_chat_template(ROWS[0]["messages"], tokenize=False) == hf.decode(ids.tolist())


def test_the_template_the_run_used_travels_too(tmp_path: Path) -> None:
    out = run_rows(tmp_path, {**CHAT, "chat_template": "chatml"}, ROWS)
    copied = (out / "tokenizer" / "chat_template.jinja").read_text(encoding="utf-8")
    from gpu_prep.render.templates import named_template

    assert copied == named_template("chatml")
    assert json.loads((out / "manifest.json").read_text())["chat_template"]["source"].startswith("named 'chatml'")


def test_inspect_reads_the_copy(tmp_path: Path, qwen: Any) -> None:
    out = run_rows(tmp_path, CHAT, ROWS)
    result = gpu_prep_cli("inspect", out, "--plain", env={"GPU_PREP_CACHE": str(tmp_path / "empty-cache")})
    assert result.returncode == 0, result.stderr
    assert "⟦Hello there.<|im_end|>⟧" in result.stdout


def test_a_model_id_resolves_offline_from_the_hub_cache(tmp_path: Path, offline_cache: Path) -> None:
    config = {**CHAT, "tokenizer": "Qwen/Qwen2.5-7B-Instruct"}
    out = run_rows(tmp_path, config, ROWS)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"]["source"] == f"Qwen/Qwen2.5-7B-Instruct@{COMMIT}"
    assert str(offline_cache) not in json.dumps(manifest)
    by_commit = run_rows(tmp_path, {**config, "tokenizer": {"name": "Qwen/Qwen2.5-7B-Instruct", "revision": COMMIT}},
                         ROWS, name="by-commit")
    assert samples(by_commit)[0][0].tolist() == samples(out)[0][0].tolist()


def test_a_missing_model_id_says_which_and_how_to_get_it(tmp_path: Path, offline_cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"tokenizer 'meta-llama/Llama-3.1-8B-Instruct': not in the hub cache "
                                          r".*HF_HUB_OFFLINE is set; .*hf download meta-llama/Llama-3.1-8B-Instruct"):
        load_tokenizer("meta-llama/Llama-3.1-8B-Instruct")
    with pytest.raises(ConfigError, match="at revision 'v2'.* `hf download Qwen/Qwen2.5-7B-Instruct --revision v2 --include"):
        load_tokenizer("Qwen/Qwen2.5-7B-Instruct", "v2")
    result = gpu_prep_cli("run", "-c", "configs/sft.json", "examples/chat.jsonl", "-o", tmp_path / "o",
                          "--tokenizer", "nobody/nothing", env={"HF_HUB_CACHE": str(offline_cache), "HF_HUB_OFFLINE": "1"})
    assert result.returncode != 0 and "nobody/nothing" in result.stderr and "hf download" in result.stderr


def test_a_mistyped_folder_that_reads_as_a_model_id_is_named_as_a_path(tmp_path: Path, offline_cache: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # tok/lama3 reads as a model id, but tok/ is a folder here: a typo of tok/llama3, not a model to download.
    (tmp_path / "tok" / "llama3").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_tokenizer("tok/lama3")
    message = str(caught.value)
    assert message.startswith("tokenizer 'tok/lama3': there is no folder tok/lama3")
    assert "did you mean 'tok/llama3'?" in message
    # A model id the hub cache has loads though a folder here is named as its organisation (./Qwen/...).
    (tmp_path / "Qwen" / "Qwen2.5-0.5B").mkdir(parents=True)
    assert load_tokenizer("Qwen/Qwen2.5-7B-Instruct").source == f"Qwen/Qwen2.5-7B-Instruct@{COMMIT}"


def test_what_reads_as_a_model_id() -> None:
    assert looks_like_model_id("Qwen/Qwen2.5-7B-Instruct") and looks_like_model_id("meta-llama/Llama-3.1-8B")
    assert not any(looks_like_model_id(s) for s in ("qwen2.5", "./tok", "/abs/tok", "a/b/c", "org/", "../x"))
