"""storage_format megatron: Megatron's indexed dataset (.bin/.idx, the layout of megatron-core's
indexed_dataset.py) plus a loss-mask sidecar, byte for byte, and the same samples as the default bin output."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest

import gpu_prep
from gpu_prep.output.verify import verify
from gpu_prep.config import OutputConfig
from gpu_prep.output.megatron import megatron_index
from helpers import run_rows, samples

pytestmark = pytest.mark.usefixtures("fast_tokenizer")


def test_the_index_of_a_hand_worked_example() -> None:
    # Two documents of 3 and 2 uint16 tokens: lengths [3, 2], pointers [0, 6], document indices [0, 1, 2].
    want = (b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([8]) + (2).to_bytes(8, "little")
            + (3).to_bytes(8, "little") + (3).to_bytes(4, "little") + (2).to_bytes(4, "little")
            + (0).to_bytes(8, "little") + (6).to_bytes(8, "little")
            + b"".join(k.to_bytes(8, "little") for k in (0, 1, 2)))
    got = megatron_index(np.array([3, 2]), np.dtype("<u2"))
    assert got == want and len(got) == 34 + 12 * 2 + 8 * 3 == 82


def test_the_token_type_follows_the_vocabulary() -> None:
    megatron = OutputConfig(storage_format="megatron")
    assert megatron.token_type(32_000) == "uint16" and megatron.token_type(65_499) == "uint16"
    assert megatron.token_type(65_500) == megatron.token_type(151_665) == "int32"
    assert OutputConfig().token_type(32_000) == "int64"  # bin keeps the seed's int64 unless asked


def _read_by_the_spec(idx_path: Path) -> list[np.ndarray]:
    """The documents of a .bin/.idx pair, read from the layout alone (not gpu-prep's reader)."""
    idx = idx_path.read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    version, code, count, docs = struct.unpack_from("<QBQQ", idx, 9)
    assert version == 1 and docs == count + 1
    dtype = {8: np.uint16, 4: np.int32}[code]
    lengths = np.frombuffer(idx, np.int32, count, 34)
    pointers = np.frombuffer(idx, np.int64, count, 34 + 4 * count)
    assert np.array_equal(np.frombuffer(idx, np.int64, docs, 34 + 12 * count), np.arange(docs))
    data = idx_path.with_name(idx_path.name[:-len(".idx")] + ".bin").read_bytes()
    return [np.frombuffer(data, dtype, n, p) for n, p in zip(lengths, pointers)]


def test_megatron_output_holds_the_same_samples_as_bin(tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": f"Question {k}?"}, {"role": "assistant", "content": f"Answer {k}."}]}
            for k in range(40)]
    base = {"chat_template": "chatml", "input": {"type": "chat"}, "mask": {"assistant": "train"},
            "preprocessing": {"min_chars": 0}}
    as_bin = run_rows(tmp_path, base, rows, name="bin")
    small = {**base, "output": {"storage_format": "megatron", "max_tokens_per_shard": 300}}  # several shards
    as_megatron = run_rows(tmp_path, small, rows, name="megatron")
    want = list(gpu_prep.open_dataset(as_bin)["__default__"])
    got = list(gpu_prep.open_dataset(as_megatron)["__default__"])
    assert len(got) == len(want) == 40
    for (a_ids, a_mask), (b_ids, b_mask) in zip(want, got):
        assert a_ids.tolist() == b_ids.tolist() and a_mask.tolist() == b_mask.tolist()
    domain = as_megatron / "__default__"
    shards = [domain / s["files"]["idx"] for s in json.loads((domain / "meta.json").read_text())["shards"]]
    assert len(shards) > 1
    documents = [doc for idx in shards for doc in _read_by_the_spec(idx)]
    assert [d.tolist() for d in documents] == [ids.tolist() for ids, _ in want]
    assert {d.dtype for d in documents} == {np.dtype(np.int32)}  # Qwen's vocabulary needs int32
    assert verify(as_megatron) == []
    (domain / "data.loss_mask.bin").write_bytes(b"\x02" + (domain / "data.loss_mask.bin").read_bytes()[1:])
    assert verify(as_megatron)  # a damaged sidecar is found


def test_megatron_cores_own_reader_reads_the_shards(tmp_path: Path) -> None:
    """megatron-core's IndexedDataset (it installs and imports without a GPU, with a CPU torch) reads every
    shard as the documents gpu-prep wrote; CI installs it for this test (.ci/run)."""
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset", reason="megatron-core is not installed")
    rows = [{"text": f"document {k}: " + " ".join(f"word{j}" for j in range(k % 17 + 3))} for k in range(60)]
    config = {"input": {"type": "text"}, "preprocessing": {"min_chars": 0},
              "output": {"storage_format": "megatron", "max_tokens_per_shard": 400}}
    out = run_rows(tmp_path, config, rows, name="megatron")
    domain = gpu_prep.open(out)["__default__"]
    want = [ids.tolist() for ids in (s[0] for s in domain)]
    got = []
    for shard in domain.meta["shards"]:
        prefix = str(domain.directory / shard["files"]["idx"])[:-len(".idx")]
        dataset = indexed.IndexedDataset(prefix)
        assert dataset.index.dtype == np.int32  # Qwen's vocabulary
        assert np.array_equal(dataset.document_indices, np.arange(len(dataset) + 1))
        assert dataset.sequence_lengths.tolist() == [len(dataset[i]) for i in range(len(dataset))]
        got += [dataset[i].tolist() for i in range(len(dataset))]
    assert len(domain.meta["shards"]) > 1 and got == want and len(got) == 60


def test_a_damaged_index_is_refused_by_name_and_inspect_says_so_in_a_line(tmp_path: Path) -> None:
    from helpers import gpu_prep_cli

    rows = [{"text": f"document {k} " * (k + 3)} for k in range(20)]
    out = run_rows(tmp_path, {"input": {"type": "text"}, "output": {"storage_format": "megatron"}}, rows)
    idx = out / "__default__" / "data.idx"
    pristine = idx.read_bytes()
    for damaged, message in ((pristine[:-10], "cut short or damaged"),
                             (pristine[:17] + bytes([99]) + pristine[18:], "dtype code 99")):
        idx.write_bytes(damaged)
        with pytest.raises(ValueError, match=rf"{idx}.*{message}"):
            gpu_prep.open(out)["__default__"][0]
        shown = gpu_prep_cli("inspect", out)
        assert shown.returncode == 1 and message in shown.stderr and "Traceback" not in shown.stderr, shown.stderr
        assert any(message in fault for fault in verify(out))
    idx.write_bytes(pristine)
    count = len(gpu_prep.open(out)["__default__"])
    past = gpu_prep_cli("inspect", out, "--start", count)
    assert past.returncode == 2 and f"holds {count} samples" in past.stderr, past.stderr


def _rewrite_signed(out: Path, name: str, data: bytes) -> None:
    """Write a domain file and record its new sha256 in meta.json and the manifest, as the run would have:
    only the layout checks can then find what is wrong with it."""
    from gpu_prep.durable import manifest_checksum, sha256_file, write_json_atomic

    path = out / "__default__" / name
    path.write_bytes(data)
    meta_path, manifest_path = out / "__default__" / "meta.json", out / "manifest.json"
    meta, manifest = json.loads(meta_path.read_text()), json.loads(manifest_path.read_text())
    for shard in meta["shards"]:
        for key, file in shard["files"].items():
            if file == name:
                shard["sha256"][key] = sha256_file(path)
    write_json_atomic(meta_path, meta)  # as the run writes it: the same size, as the manifest records
    manifest["domains"]["__default__"] = meta
    manifest["manifest_sha256"] = manifest_checksum(manifest)
    write_json_atomic(manifest_path, manifest)


def test_an_index_megatron_would_read_otherwise_fails_verify_by_its_layout(tmp_path: Path) -> None:
    # gpu-prep reads samples from the lengths alone; Megatron reads a sequence at its byte pointer and groups
    # sequences by the document indices. A writer that got those wrong, with its checksums recorded, would
    # pass a check of sums and sizes while Megatron trained on other tokens: the layout itself is checked.
    rows = [{"text": f"document {k} " * (k + 3)} for k in range(6)]
    config = {"input": {"type": "text"}, "preprocessing": {"min_chars": 0}, "output": {"storage_format": "megatron"}}
    out = run_rows(tmp_path, config, rows)
    idx = out / "__default__" / "data.idx"
    pristine = idx.read_bytes()
    count = struct.unpack_from("<Q", pristine, 18)[0]
    assert count == 6 and verify(out) == []
    pointers, documents = 34 + 4 * count, 34 + 12 * count

    def put(offset: int, fmt: str, *values: int) -> bytes:
        data = bytearray(pristine)
        struct.pack_into(fmt, data, offset, *values)
        return bytes(data)

    second = struct.unpack_from("<q", pristine, pointers + 8)[0]
    for damaged, message in ((put(9, "<Q", 2), "index version 2, where Megatron's indexed dataset is version 1"),
                             (put(pointers + 8, "<q", second + 4), f"sequence 1 has byte pointer {second + 4:,}, "
                                                                   f"where the lengths before it make {second:,}"),
                             (put(documents + 8, "<qq", 2, 1), "document indices do not run 0, 1, ..., 6"),
                             (put(documents + 8 * count, "<q", count + 1), "document indices do not run 0, 1, ..., 6")):
        _rewrite_signed(out, "data.idx", damaged)
        faults = verify(out)
        assert len(faults) == 1 and str(idx) in faults[0] and message in faults[0], faults
        with pytest.raises(ValueError, match=re.escape(message)):
            gpu_prep.open(out)["__default__"][0]
    _rewrite_signed(out, "data.idx", pristine)
    assert verify(out) == []


def test_megatron_output_that_would_cut_documents_by_default_is_warned_about() -> None:
    # Megatron's preprocessing never cuts a document (its trainer makes samples across them): a run that
    # would cut at max_seq_len only because truncation was left at its default says so before it starts.
    from gpu_prep.config import parse_config

    text = {"input": {"type": "text"}, "output": {"storage_format": "megatron"}}
    assert "truncation to split to keep every token" in " ".join(parse_config(text).warnings())
    for said in ("split", "right"):
        assert parse_config({**text, "preprocessing": {"truncation": said}}).warnings() == []
    assert parse_config({**text, "output": {"storage_format": "bin"}}).warnings() == []


def test_split_writes_each_document_whole_for_megatron(tmp_path: Path) -> None:
    # megatron-core's GPTDataset samples an indexed dataset by sequence, shuffled, and makes its own samples
    # across documents: a document cut into windows of sequences of their own would run, mid-sentence, into
    # another document's window with no end-of-document token between them. Megatron's preprocess_data.py
    # never cuts a document, and neither does truncation split here; bin still cuts windows.
    rows = [{"text": " ".join(f"word{i}x{k}" for k in range(n))} for i, n in enumerate([3, 40, 9, 120, 25])]
    config = {"input": {"type": "text"}, "preprocessing": {"max_seq_len": 16, "truncation": "split", "min_chars": 0},
              "output": {"storage_format": "megatron", "max_tokens_per_shard": 200}}
    out = run_rows(tmp_path, config, rows, name="megatron")
    windows = [ids for ids, _ in samples(run_rows(tmp_path, {**config, "output": {}}, rows, name="bin"))]
    domain = gpu_prep.open(out)["__default__"]
    eod = domain.meta["tokenizer"]["eod_id"]
    documents = [doc for shard in domain.meta["shards"]
                 for doc in _read_by_the_spec(domain.directory / shard["files"]["idx"])]
    assert len(documents) == len(rows) < len(windows) and len(domain.meta["shards"]) > 1
    assert [d.tolist() for d in documents] == [ids.tolist() for ids, _ in domain]
    assert np.concatenate(documents).tolist() == np.concatenate(windows).tolist()  # nothing lost
    assert all(d[-1] == eod and (d[:-1] != eod).all() for d in documents)  # one end-of-document token, at the end
    assert max(len(d) for d in documents) > 16 >= max(len(w) for w in windows)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["totals"]["rows_written"] == domain.meta["num_samples"] == len(rows)
    assert manifest["totals"]["rows_truncated"] == 0 and verify(out) == []
    # Nor is a pre-tokenized row with masked labels refused as one a window could leave untrained: none is cut.
    tokens = [{"input_ids": [5, 6, 7, 8] * 10, "labels": [-100] * 8 + [5, 6, 7, 8] * 8}]
    pretok = {**config, "input": {"type": "pretokenized"}}
    [(ids, mask)] = samples(run_rows(tmp_path, pretok, tokens, name="pretok"))
    assert ids.tolist() == tokens[0]["input_ids"] and mask.tolist() == [0] * 8 + [1] * 32
