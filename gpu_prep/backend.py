"""The backend seam: the array module `xp` (numpy or cupy) and the few operations that differ by device.

Every algorithm over arrays (mask projection, offsets arithmetic, truncation, sharding) is written once
against `xp` in the stage modules, so the CPU tests execute the code the GPU runs. This is the only module
that imports cupy, cudf or rmm, and it does so lazily: `import gpu_prep` never needs them.

Every cuDF/CuPy/RMM entry point used here (and dask-cuda's, used by cluster/driver.py) is listed in GPU_API and
checked against the installed wheels by tests/backend/test_gpu_api_contract.py, so a renamed or removed API fails CI
even though CI has no GPU.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_prep.errors import ConfigError
from gpu_prep.ragged import offsets_from_lengths, row_of

# What encoder() is handed: a loaded tokenizer (gpu_prep.tokenization.tokenizer.Tokenizer; not imported here, so that the
# seam depends on nothing above it): .encode, .model, .engine, .lowercases().
Tokenizer = Any
# A reader of JSON Lines byte ranges: (path, offset, size, columns) -> an Arrow table of those columns, a row
# for each line that starts in the range, or None where it cannot. columns maps a name to "str" (a string
# field) or to {key: "str", ...} (a list of objects with those string fields).
ReadRange = Callable[[str, int, int, dict[str, Any]], Any]
# A reader of Parquet row groups: (path, row groups, columns) -> an Arrow table of those columns, or None where
# it cannot.
ReadGroups = Callable[[str, list[int], list[str]], Any]

GPU_EXTRA = 'pip install "gpu-prep[gpu]"'
log = logging.getLogger("gpu_prep")
# CuPy lets go of the GIL around every kernel launch and copy, and takes it back only when the thread holding
# it (the host stages' Python) yields, after the switch interval (5 ms by default): a mask stage of a hundred
# launches then waited half a second on an H200 beside 0.1 s of work. The GPU backend shortens the interval.
GPU_SWITCH_INTERVAL = 0.0005

# (module, attribute path, keyword arguments passed): what the GPU code below calls.
GPU_API: list[tuple[str, str, tuple[str, ...]]] = [
    ("cupy", "is_available", ()),
    ("cupy", "asarray", ()),
    ("cupy", "asnumpy", ()),
    ("cupy", "cuda.runtime.getDeviceCount", ()),
    # ragged.segment_mins on the device (fuzzy.py's MinHash): CuPy has no minimum.reduceat, it scatters.
    ("cupy", "minimum.at", ()),
    ("cudf", "Series", ("dtype",)),
    ("cudf", "Series.str", ()),
    ("cudf", "Series.hash_values", ("method",)),
    ("cudf", "Series.to_arrow", ()),
    ("cudf", "Series.to_numpy", ()),
    ("cudf", "Series.fillna", ()),
    ("cudf", "set_option", ()),
    ("cudf.core.accessors.string", "StringMethods.slice", ("start", "stop")),
    ("rmm", "reinitialize", ("pool_allocator", "initial_pool_size", "maximum_pool_size")),
    ("cudf.core.wordpiece_tokenize", "WordPieceVocabulary", ("vocabulary",)),
    ("cudf.core.wordpiece_tokenize", "WordPieceVocabulary.tokenize", ("text", "max_words_per_row")),
    ("cudf.core.character_normalizer", "CharacterNormalizer", ("do_lower", "special_tokens")),
    ("cudf.core.character_normalizer", "CharacterNormalizer.normalize", ("text",)),
    ("cudf", "Series.list", ()),
    ("cudf.core.accessors.lists", "ListMethods.len", ()),
    ("cudf.core.accessors.lists", "ListMethods.leaves", ()),
    ("cudf", "read_json", ("lines", "byte_range", "dtype", "prune_columns", "on_bad_lines")),
    ("cudf", "ListDtype", ("element_type",)),
    ("cudf", "StructDtype", ("fields",)),
    ("cudf", "DataFrame.to_arrow", ("preserve_index",)),
    ("cudf", "read_parquet", ("columns", "row_groups", "use_pandas_metadata")),
    # cluster/driver.py's local cluster of GPU workers (one per GPU) with the config's memory pool and spilling.
    ("dask_cuda", "LocalCUDACluster", ("n_workers", "threads_per_worker", "rmm_pool_size", "enable_cudf_spill")),
]


@dataclass(frozen=True)
class Backend:
    """The CPU backend; the GPU backend overrides the few operations that run on the device."""

    name: str
    xp: Any
    # Chunks of input are this many times read.CHUNK_BYTES: each chunk's mask stage costs the GPU backend a
    # hundred kernel launches, each a wait for the GIL while the host stages run, so it takes fewer, larger ones.
    chunk_scale = 1

    def asarray(self, host: np.ndarray) -> Any:
        """Host array -> this backend's device."""
        return self.xp.asarray(host)

    def to_host(self, array: Any) -> np.ndarray:
        return np.asarray(array)

    def digests(self, keys: list[str], chars: int | None) -> list[bytes]:
        """The MD5 digest of each key's first `chars` characters (None: of the whole key), as hashlib
        computes it."""
        return [hashlib.md5(k[:chars].encode("utf-8")).digest() for k in keys]

    def encoder(self, tok: Tokenizer) -> Callable[[list[str]], tuple[np.ndarray, np.ndarray]]:
        """What turns text pieces into (flat ids, tokens per piece): the tokenizer's own engine here."""
        return tok.encode

    def json_range_reader(self) -> ReadRange | None:
        """What reads byte ranges of JSON Lines as columns on this device; None: read line by line."""
        return None

    def parquet_reader(self) -> ReadGroups | None:
        """What decodes Parquet row groups on this device; None: pyarrow on the host."""
        return None


@dataclass(frozen=True)
class GpuBackend(Backend):
    """Arrays in CuPy; string hashing, the byte-range reader and WordPiece in cuDF. Results are the CPU
    backend's, byte for byte.

    strings=False: cuDF is not installed (`--device gpu` on a machine with CuPy alone). The array stages
    still run on the device; the string steps are the CPU backend's, which give the same bytes."""

    strings: bool = True
    chunk_scale = 4

    def to_host(self, array: Any) -> np.ndarray:
        return self.xp.asnumpy(array)

    def digests(self, keys: list[str], chars: int | None) -> list[bytes]:
        if not self.strings or not keys:
            return super().digests(keys, chars)
        import cudf

        # str.slice counts code points like Python; hash_values(md5) hashes the UTF-8 bytes and returns
        # lowercase hex. No key is null here, so no null-hashes-like-"" surprise.
        column = cudf.Series(keys, dtype="str")
        hex_digests = (column if chars is None else column.str.slice(0, chars)).hash_values(method="md5")
        return [bytes.fromhex(h) for h in hex_digests.to_arrow().to_pylist()]

    def json_range_reader(self) -> ReadRange | None:
        return read_json_range if self.strings else None

    def parquet_reader(self) -> ReadGroups | None:
        return read_parquet_groups if self.strings else None

    def encoder(self, tok: Tokenizer) -> Callable[[list[str]], tuple[np.ndarray, np.ndarray]]:
        # WordPiece runs on the GPU; byte-level BPE cannot run exactly in cuDF, so it stays on the CPU
        # engine and its ids move to the device for the mask stage.
        if tok.model == "WordPiece" and self.strings:
            return GpuWordPiece(tok).encode
        return tok.encode


def read_json_range(path: str, offset: int, size: int, columns: dict[str, Any]) -> Any:
    """The rows that start in bytes [offset, offset + size) of a JSON Lines file, as an Arrow table of these
    columns ("str": a string field; {key: "str", ...}: a list of objects with those string fields, chat
    messages); None when cuDF cannot read the range (read/jsonl.py then parses it line by line)."""
    import cudf

    dtype = {name: "str" if kind == "str" else cudf.ListDtype(cudf.StructDtype(kind)) for name, kind in columns.items()}
    try:
        # A fixed schema (dtype + prune_columns, which reaches into the messages' objects) so every range
        # agrees; a malformed line becomes an all-null row, which read/jsonl.py sees and answers by parsing the
        # range line by line.
        frame = cudf.read_json(path, lines=True, byte_range=[offset, size], dtype=dtype, prune_columns=True,
                               on_bad_lines="recover")
    except Exception:  # noqa: BLE001  anything cuDF refuses is read by the strict parser instead
        return None
    return frame.to_arrow()


def read_parquet_groups(path: str, groups: list[int], columns: list[str]) -> Any:
    """These columns of a Parquet file's row groups, decoded by cuDF, as an Arrow table; None when cuDF
    cannot read them (sources.parquet_rows then reads them with pyarrow, which says what is wrong)."""
    import cudf

    try:
        # No pandas metadata: an index the file's writer stored must not come back as a column.
        frame = cudf.read_parquet(path, columns=columns, row_groups=groups, use_pandas_metadata=False)
    except Exception:  # noqa: BLE001
        return None
    return frame.to_arrow(preserve_index=False)


class GpuWordPiece:
    """BERT-style WordPiece with nvtext: CharacterNormalizer (lower case, accents, spaces around
    punctuation and CJK) then WordPieceVocabulary. Pieces that are exactly a special token ([CLS], [SEP])
    map straight to its id, as HF tokenizers' added-token matching does."""

    def __init__(self, tok: Tokenizer) -> None:
        import cudf
        from cudf.core.character_normalizer import CharacterNormalizer
        from cudf.core.wordpiece_tokenize import WordPieceVocabulary

        vocab = tok.engine.get_vocab(with_added_tokens=False)
        by_id = [""] * (max(vocab.values()) + 1)
        for token, index in vocab.items():
            by_id[index] = token
        self.vocabulary = WordPieceVocabulary(cudf.Series(by_id, dtype="str"))
        self.special_ids = {t.content: i for i, t in tok.engine.get_added_tokens_decoder().items()}
        specials = cudf.Series(sorted(self.special_ids), dtype="str")
        self.normalizer = CharacterNormalizer(do_lower=tok.lowercases(), special_tokens=specials)

    def encode(self, pieces: list[str]) -> tuple[np.ndarray, np.ndarray]:
        import cudf

        special = np.array([p in self.special_ids for p in pieces], dtype=bool)
        counts = np.ones(len(pieces), dtype=np.int64)
        plain = [p for p, s in zip(pieces, special) if not s]
        plain_ids = np.zeros(0, dtype=np.int64)
        if plain:
            normalized = self.normalizer.normalize(cudf.Series(plain, dtype="str"))
            tokens = self.vocabulary.tokenize(normalized, max_words_per_row=0)
            counts[~special] = tokens.list.len().fillna(0).to_numpy().astype(np.int64)
            plain_ids = tokens.list.leaves.to_numpy().astype(np.int64)
        offsets = offsets_from_lengths(np, counts)
        ids = np.empty(int(offsets[-1]), dtype=np.int64)
        ids[offsets[:-1][special]] = [self.special_ids[p] for p, s in zip(pieces, special) if s]
        # Scatter the plain pieces' ids into their places, in piece order.
        plain_offsets = offsets_from_lengths(np, counts[~special])
        owner = row_of(np, plain_offsets, len(plain_ids))
        ids[offsets[:-1][~special][owner] + np.arange(len(plain_ids)) - plain_offsets[owner]] = plain_ids
        return ids, counts


CPU = Backend("cpu", np)


def gpu_missing_reason() -> str | None:
    """None when CuPy can use a GPU; otherwise one sentence saying what is missing."""
    try:
        import cupy
    except ImportError:
        return f"the gpu extra is not installed ({GPU_EXTRA})"
    if cupy.is_available():
        return None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError, or a loader error when libcuda itself is absent
        text = f"{type(exc).__name__}: {exc}"
        if "NoDevice" in text:
            return "no CUDA device is visible (check CUDA_VISIBLE_DEVICES and that a GPU is attached)"
        if "Driver" in text or "libcuda" in text or "DynamicLib" in text:
            return "no usable NVIDIA driver was found (libcuda is missing or older than the CUDA runtime)"
        return f"CUDA cannot be used: {text}"
    return f"CuPy reports no usable GPU ({count} device(s) seen)"


def cudf_missing_reason() -> str | None:
    """None when cuDF imports; otherwise why not (the GPU backend then keeps its string steps on the host)."""
    try:
        import cudf  # noqa: F401
    except Exception as exc:  # ImportError, or a CUDA library mismatch raised while loading libcudf
        return f"cuDF cannot be imported ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    return None


def configure_gpu_memory(pool_size: int | str | None, spill: bool, strings: bool = True) -> None:
    """An RMM pool of pool_size (None: RMM's default allocator), then cuDF spilling to host if asked.

    Order matters: RMM first, then spilling, then any data. Without cuDF (strings=False) there is no cuDF
    memory to spill, and a pool asked for needs RMM all the same."""
    if pool_size:
        try:
            import rmm
        except ImportError:
            raise ConfigError(f"gpu.rmm_pool_size: RMM is not installed ({GPU_EXTRA})") from None
        rmm.reinitialize(pool_allocator=True, initial_pool_size=pool_size, maximum_pool_size=None)
    if spill and strings:
        import cudf

        cudf.set_option("spill", True)


def select_backend(device: str, gpu_pool_size: int | str | None = None, gpu_spill: bool = False) -> Backend:
    """auto -> the GPU when CuPy can use one and cuDF is installed, else the CPU; gpu -> the GPU or a clear
    error. `--device gpu` with CuPy but no cuDF runs the array stages on the device and says so."""
    if device == "cpu":
        return CPU
    missing = gpu_missing_reason()
    if missing is None:
        import cupy

        no_cudf = cudf_missing_reason()
        if no_cudf is not None and device != "gpu":
            return CPU  # the GPU backend as designed needs both; half of it is chosen only by name
        if no_cudf is not None:
            log.warning("--device gpu: %s; the arrays run on the GPU, reading and hashing strings on the host "
                        "(%s for all of it)", no_cudf, GPU_EXTRA)
        configure_gpu_memory(gpu_pool_size, gpu_spill, strings=no_cudf is None)
        sys.setswitchinterval(min(sys.getswitchinterval(), GPU_SWITCH_INTERVAL))
        return GpuBackend("gpu", cupy, strings=no_cudf is None)
    if device == "gpu":
        raise ConfigError(f"--device gpu: {missing}")
    return CPU
