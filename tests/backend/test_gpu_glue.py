"""The GPU backend's own code around cuDF calls, run on the CPU with the cuDF calls stood in for.

The stand-ins return what the real calls are documented to return (a list<int> column per row, its lengths
and its flattened leaves); the tokenizing itself is done by HF tokenizers, so what is checked here is the
assembly: special pieces, empty pieces and the scatter of every piece's ids into place.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from gpu_prep.backend import GpuWordPiece
from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
from gpu_prep.errors import ConfigError
from gpu_prep.tokenization.tokenizer import load_tokenizer


class _Column(list):
    """Enough of a cudf.Series for the calls GpuWordPiece makes."""

    def __init__(self, values: Any, dtype: str | None = None) -> None:
        super().__init__(values)

    @property
    def list(self) -> Any:
        rows = self
        return types.SimpleNamespace(len=lambda: _Column(len(r) for r in rows),
                                     leaves=_Column(i for r in rows for i in r))

    def fillna(self, value: Any) -> _Column:
        return _Column(value if v is None else v for v in self)

    def to_numpy(self) -> np.ndarray:
        return np.array(list(self), dtype=np.int64)


@pytest.fixture
def bert(monkeypatch: pytest.MonkeyPatch):
    try:
        tok = load_tokenizer(str(bundled_tokenizer_dir("bert-uncased")))
    except ConfigError as exc:
        pytest.skip(str(exc))
    monkeypatch.setitem(sys.modules, "cudf", types.SimpleNamespace(Series=_Column))
    engine = GpuWordPiece.__new__(GpuWordPiece)
    engine.special_ids = {t.content: i for i, t in tok.engine.get_added_tokens_decoder().items()}
    engine.normalizer = types.SimpleNamespace(normalize=lambda texts: texts)
    engine.vocabulary = types.SimpleNamespace(tokenize=lambda texts, max_words_per_row: _Column(
        tok.engine.encode(t, add_special_tokens=False).ids for t in texts))
    return tok, engine


@pytest.mark.parametrize("pieces", [
    ["[CLS]", "Hello, world!", "[SEP]"],
    ["[CLS]", "What is the capital of Canada?", "Ottawa.", "[SEP]", "[CLS]", "Second row", "[SEP]"],
    ["plain only", "two pieces"],
    ["[CLS]", "[SEP]"],
    ["[CLS]", "", "x", "[SEP]"],
    [],
])
def test_gpu_wordpiece_assembles_pieces_like_the_cpu_engine(bert, pieces: list[str]) -> None:
    tok, engine = bert
    ids, counts = engine.encode(pieces)
    cpu_ids, cpu_counts = tok.encode(pieces)
    assert ids.tolist() == cpu_ids.tolist()
    assert counts.tolist() == cpu_counts.tolist()
    assert ids.dtype == np.int64 and counts.dtype == np.int64


@pytest.mark.parametrize("same_keys", [True, False])
def test_gpu_digests_are_the_cpu_digests(monkeypatch: pytest.MonkeyPatch, same_keys: bool) -> None:
    import hashlib

    from gpu_prep.backend import CPU, GpuBackend

    class Strings(_Column):
        @property
        def str(self) -> Any:
            return types.SimpleNamespace(slice=lambda start, stop: Strings(t[start:stop] for t in self))

        def hash_values(self, method: str) -> Any:
            assert method == "md5"
            hexes = [hashlib.md5(t.encode("utf-8")).hexdigest() for t in self]
            return types.SimpleNamespace(to_arrow=lambda: types.SimpleNamespace(to_pylist=lambda: hexes))

    monkeypatch.setitem(sys.modules, "cudf", types.SimpleNamespace(Series=Strings))
    texts = ["é" * 250, "short", "", "🙂" * 300]
    keys = texts if same_keys else [t[::-1] + "k" for t in texts]
    gpu, cpu = GpuBackend("gpu", np).digests(keys, 200), CPU.digests(keys, 200)
    assert gpu == cpu and len(set(cpu)) == 4
    assert cpu == [hashlib.md5(k[:200].encode("utf-8")).digest() for k in keys]
    assert GpuBackend("gpu", np).digests([], 200) == []
    whole = GpuBackend("gpu", np).digests(keys, None)  # dedup_prefix_chars null: the whole key
    assert whole == CPU.digests(keys, None) == [hashlib.md5(k.encode("utf-8")).digest() for k in keys]


def test_cupy_without_cudf_is_chosen_by_name_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # A machine with CuPy and a GPU but no cuDF: auto stays on the CPU (the GPU backend as designed needs
    # both); --device gpu runs the arrays on the device and every string step as the CPU backend does.
    import hashlib

    from gpu_prep import backend

    monkeypatch.setattr(backend, "gpu_missing_reason", lambda: None)
    monkeypatch.setitem(sys.modules, "cupy", np)
    monkeypatch.setitem(sys.modules, "cudf", None)  # `import cudf` raises ImportError
    monkeypatch.setitem(sys.modules, "rmm", None)
    assert backend.cudf_missing_reason().startswith("cuDF cannot be imported (")
    assert backend.select_backend("auto") is backend.CPU
    interval = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        gpu = backend.select_backend("gpu", gpu_spill=True)  # nothing of cuDF's to spill: not an error
        # CuPy gives up the GIL at every launch: the GPU backend has it handed back sooner (benchmarks/RESULTS.md).
        assert sys.getswitchinterval() == pytest.approx(backend.GPU_SWITCH_INTERVAL)
    finally:
        sys.setswitchinterval(interval)
    assert gpu.name == "gpu" and gpu.xp is np and gpu.strings is False
    assert gpu.json_range_reader() is None
    texts = ["é" * 250, "short"]
    assert gpu.digests(texts, 200) == [hashlib.md5(t[:200].encode()).digest() for t in texts]
    bert = load_tokenizer(str(bundled_tokenizer_dir("bert-uncased")))
    assert gpu.encoder(bert) == bert.encode  # WordPiece on the host engine, not nvtext
    with pytest.raises(ConfigError, match="gpu.rmm_pool_size: RMM is not installed"):
        backend.select_backend("gpu", gpu_pool_size="1GiB")


def test_the_gpu_backends_larger_chunks_write_the_same_bytes(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The GPU backend reads chunks chunk_scale times as large as the CPU's: the chunks differ, the output
    # may not. Chunks are made small here so that a few hundred conversations cut both ways.
    import gpu_prep.run.local as local
    import gpu_prep.run.masking as masking
    from corpora import sharegpt_chats
    from gpu_prep.backend import Backend, GpuBackend
    from gpu_prep.config import parse_config
    from gpu_prep.pipeline import Options, run
    from helpers import write_jsonl

    assert GpuBackend.chunk_scale > Backend.chunk_scale == 1
    monkeypatch.setattr(local, "CHUNK_BYTES", 32 << 10)
    masked = []
    original = masking.mask_rows
    monkeypatch.setattr(masking, "mask_rows", lambda *args: masked.append(len(args[1])) or original(*args))
    data = write_jsonl(tmp_path / "chat.jsonl", sharegpt_chats(300))
    config = parse_config({"input": {"type": "chat"}, "mask": {"assistant": "train"},
                           "preprocessing": {"max_seq_len": 1024}, "output": {"max_tokens_per_shard": 40_000}})
    outputs = []
    for scale in (1, GpuBackend.chunk_scale):
        monkeypatch.setattr(Backend, "chunk_scale", scale)
        masked.clear()
        manifest = run(config, [str(data)], tmp_path / f"scale{scale}", Options(device="cpu"))
        outputs.append(({name: [s["sha256"] for s in meta["shards"]] for name, meta in manifest["domains"].items()},
                        manifest["totals"], len(masked)))
    (small, small_totals, small_chunks), (large, large_totals, large_chunks) = outputs
    assert small_chunks > large_chunks > 1  # the runs were cut differently
    assert large == small and large_totals == small_totals and sum(len(v) for v in small.values()) > 1


def test_the_cudf_range_reader_asks_for_chat_messages_as_a_list_of_structs(monkeypatch: pytest.MonkeyPatch) -> None:
    # read_json_range's own code: the columns read/jsonl.py asks for become cuDF dtypes (a string; a list of
    # structs of strings for messages), the range and recovery mode are passed on, and a range cuDF
    # refuses is None (read/jsonl.py then parses it line by line).
    from gpu_prep.backend import read_json_range

    seen: dict[str, Any] = {}
    rows = [{"messages": [{"role": "user", "content": "hi"}], "source": "a"}]

    def read_json(path: str, **options: Any) -> Any:
        seen.update(options, path=path)
        if options["byte_range"][0] > 0:
            raise RuntimeError("cuDF could not read this range")
        return types.SimpleNamespace(to_arrow=lambda: pa.Table.from_pylist(rows))

    stand_in = types.SimpleNamespace(read_json=read_json, ListDtype=lambda element: ("list", element),
                                     StructDtype=lambda fields: ("struct", dict(fields)))
    monkeypatch.setitem(sys.modules, "cudf", stand_in)
    columns = {"source": "str", "messages": {"role": "str", "content": "str"}}
    assert read_json_range("/data/chat.jsonl", 0, 100, columns).to_pylist() == rows
    assert seen == {"path": "/data/chat.jsonl", "lines": True, "byte_range": [0, 100], "prune_columns": True,
                    "on_bad_lines": "recover",
                    "dtype": {"source": "str", "messages": ("list", ("struct", {"role": "str", "content": "str"}))}}
    assert read_json_range("/data/chat.jsonl", 100, 100, columns) is None


def test_the_cudf_parquet_reader_asks_for_row_groups_without_an_index(monkeypatch: pytest.MonkeyPatch) -> None:
    # read_parquet_groups' own code: the row groups and columns are passed on, pandas metadata is not read
    # (an index a writer stored would come back as a column) nor an index written out, and a read cuDF
    # refuses is None (sources.parquet_rows then reads the group with pyarrow).
    from gpu_prep.backend import read_parquet_groups

    seen: dict[str, Any] = {}
    rows = [{"text": "hello"}]

    def read_parquet(path: str, **options: Any) -> Any:
        seen.update(options, path=path)
        if options["row_groups"] != [0]:
            raise RuntimeError("cuDF could not read this row group")
        return types.SimpleNamespace(to_arrow=lambda **kw: seen.update(to_arrow=kw) or pa.Table.from_pylist(rows))

    monkeypatch.setitem(sys.modules, "cudf", types.SimpleNamespace(read_parquet=read_parquet))
    assert read_parquet_groups("/data/a.parquet", [0], ["text"]).to_pylist() == rows
    assert seen == {"path": "/data/a.parquet", "columns": ["text"], "row_groups": [0], "use_pandas_metadata": False,
                    "to_arrow": {"preserve_index": False}}
    assert read_parquet_groups("/data/a.parquet", [1], ["text"]) is None
