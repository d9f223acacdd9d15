"""gpu_prep.open serves only what the run wrote: an edited meta.json, files of other sizes, offsets that go
backwards, a mask value other than 0 and 1 or an id outside the vocabulary are refused by name, never served.

Opening checks what costs a stat or a look at the JSON; a shard's offsets are checked when it is first read,
and every sample's ids and mask as it is served; open(out, verify=True) is `gpu-prep verify` (checksums,
every value of every shard) before anything is served.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gpu_prep
from gpu_prep.durable import manifest_checksum, sha256_file, write_json_atomic
from helpers import load_json, run_rows

ROWS = [{"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}
        for i in range(20)]
DOMAIN = "__default__"


def _run(tmp_path: Path, qwen: Any, storage_format: str) -> Path:
    import gpu_prep.pipeline

    config = {"mask": {"assistant": "train"}, "output": {"storage_format": storage_format, "max_tokens_per_shard": 200}}
    with pytest.MonkeyPatch.context() as patch:  # the session's tokenizer, not a fresh load per run
        patch.setattr(gpu_prep.pipeline, "load_tokenizer", lambda spec, revision=None: qwen)
        return run_rows(tmp_path, config, ROWS)


@pytest.fixture(scope="module")
def pristine(qwen: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("reader"), qwen, "bin")


@pytest.fixture
def out(pristine: Path, tmp_path: Path) -> Path:
    """A copy of a sound bin run of four shards, to damage."""
    copy = tmp_path / "out"
    shutil.copytree(pristine, copy)
    return copy


def _sign(out: Path) -> None:
    """Record the domain as it now is (each shard file's sha256, meta.json as the manifest's copy, every
    file's size, the manifest's checksum), as a writer with a bug would have: only the reader's own checks
    can then find what is wrong."""
    directory = out / DOMAIN
    meta = load_json(directory / "meta.json")
    for shard in meta["shards"]:
        shard["sha256"] = {key: sha256_file(directory / name) for key, name in shard["files"].items()}
    write_json_atomic(directory / "meta.json", meta)
    manifest = load_json(out / "manifest.json")
    manifest["domains"][DOMAIN] = meta
    manifest["files"] = {name: (out / name).stat().st_size for name in manifest["files"]}
    manifest["manifest_sha256"] = manifest_checksum(manifest)
    write_json_atomic(out / "manifest.json", manifest)


def _rewrite(path: Path, dtype: str, index: int, value: int) -> None:
    values = np.fromfile(path, dtype=dtype)
    values[index] = value
    values.tofile(path)


def _meta(out: Path) -> dict[str, Any]:
    return load_json(out / DOMAIN / "meta.json")


def _raises(pattern_path: Path, *rest: str) -> Any:
    return pytest.raises(ValueError, match=re.escape(str(pattern_path)) + ".*" + ".*".join(map(re.escape, rest)))


def test_a_sound_output_opens_verified_and_serves_what_totals_say(out: Path) -> None:
    dataset = gpu_prep.open(out, verify=True)
    domain = dataset[DOMAIN]
    assert domain.num_shards == 4
    served = list(domain)
    assert len(served) == domain.totals()["num_samples"] == len(ROWS)
    assert sum(len(ids) for ids, _ in served) == dataset.totals()["num_tokens"]


def test_a_removed_shard_entry_is_refused(out: Path) -> None:
    meta_path = out / DOMAIN / "meta.json"
    meta = _meta(out)
    last = meta["shards"].pop()
    write_json_atomic(meta_path, meta)
    # Its totals still count the removed shard: 15 samples served where totals() says 20.
    with _raises(meta_path, "3 shard entries hold 15 samples", "num_samples says 20"):
        gpu_prep.open(out)
    with _raises(meta_path, "3 shard entries hold 15 samples"):
        gpu_prep.Domain(out / DOMAIN)  # a domain opened alone is held to its own meta.json
    # Totals made to agree: the manifest's copy of meta.json (which its checksum covers) does not.
    for key in ("num_samples", "num_tokens", "num_trained_tokens"):
        meta[key] -= last[key]
    write_json_atomic(meta_path, meta)
    with _raises(meta_path, "differs from the manifest's copy", "shards (3 entries, the manifest's 4)"):
        gpu_prep.open(out)
    # And that copy re-signed too: the manifest still lists the shard's files.
    _sign(out)
    with _raises(out / DOMAIN / "loss_mask.00003.bin", "listed in the manifest", "no shard entry"):
        gpu_prep.open(out)


def test_files_that_disagree_with_the_counts_or_the_manifest_are_refused_at_open(out: Path) -> None:
    meta = _meta(out)
    meta["shards"][1]["num_tokens"] += 1
    meta["num_tokens"] += 1
    write_json_atomic(out / DOMAIN / "meta.json", meta)
    _sign(out)
    tokens = meta["shards"][1]["num_tokens"] - 1
    with _raises(out / DOMAIN / "sequence.00001.bin", f"({tokens} tokens of int64)", f"records {tokens + 1} tokens"):
        gpu_prep.open(out)


def test_an_h5_shard_of_another_size_than_the_manifest_records_is_refused(qwen: Any, tmp_path: Path) -> None:
    out = _run(tmp_path, qwen, "h5")
    shard = out / DOMAIN / "data.00002.h5"
    with open(shard, "ab") as handle:
        handle.write(b"\0")
    with _raises(shard, "bytes, where the manifest records"):
        gpu_prep.open(out)


def test_offsets_that_go_backwards_are_refused_before_a_sample_of_their_shard(out: Path) -> None:
    offsets = out / DOMAIN / "sample_offsets.00001.bin"
    values = np.fromfile(offsets, dtype="<i8")
    _rewrite(offsets, "<i8", 2, int(values[1]) - 3)
    _sign(out)
    domain = gpu_prep.open(out)[DOMAIN]  # opening reads no shard
    assert len(domain[0][0])  # shard 0 is sound
    with _raises(offsets, "sample 1 runs from", "back to"):
        domain[5]
    with _raises(offsets, "sample 1 runs from"):
        gpu_prep.open(out, verify=True)


def test_offsets_that_end_short_of_the_data_are_refused(out: Path) -> None:
    offsets = out / DOMAIN / "sample_offsets.bin"
    last = int(np.fromfile(offsets, dtype="<i8")[-1])
    _rewrite(offsets, "<i8", -1, last - 1)
    _sign(out)
    with _raises(offsets, f"end at {last - 1}", f"{last} tokens"):
        list(gpu_prep.open(out)[DOMAIN])


def test_a_mask_value_of_2_is_never_served(out: Path) -> None:
    mask = out / DOMAIN / "loss_mask.00002.bin"
    first = _meta(out)["shards"][0]["num_samples"] + _meta(out)["shards"][1]["num_samples"]  # shard 2's first sample
    _rewrite(mask, "<i8", 3, 2)
    _sign(out)
    domain = gpu_prep.open(out)[DOMAIN]
    assert domain[first - 1][1].max() == 1  # the samples before it are served
    with _raises(mask, f"sample {first}", "loss_mask value of 2"):
        domain[first]
    with _raises(mask, "loss_mask value of 2"):
        gpu_prep.open(out, verify=True)


@pytest.mark.parametrize("bad", [151665, -1])
def test_an_id_outside_the_vocabulary_is_never_served(out: Path, bad: int) -> None:
    sequence = out / DOMAIN / "sequence.bin"
    _rewrite(sequence, "<i8", 7, bad)
    _sign(out)
    assert _meta(out)["tokenizer"]["vocab_size"] == 151665
    domain = gpu_prep.open(out)[DOMAIN]
    assert len(domain[-1][0])  # another shard's samples are served
    with _raises(sequence, "sample 0", f"token id {bad}", "outside the vocabulary (0 to 151664)"):
        domain[0]
    with _raises(sequence, f"token id {bad}", "outside the vocabulary"):
        gpu_prep.open(out, verify=True)


def test_a_checksum_mismatch_is_refused_with_verify(out: Path) -> None:
    sequence = out / DOMAIN / "sequence.00003.bin"
    values = np.fromfile(sequence, dtype="<i8")
    _rewrite(sequence, "<i8", 0, int(values[0]) ^ 1)  # another id of the vocabulary: the size and every value fit
    assert len(gpu_prep.open(out)[DOMAIN][-1][0])  # without verify, what is cheap to check holds
    with _raises(out, "sequence.00003.bin does not match its recorded sha256"):
        gpu_prep.open(out, verify=True)
