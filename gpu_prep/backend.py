"""The backend seam: the array module `xp` (numpy or cupy) and the few operations that differ by device.

Every algorithm over arrays (mask projection, offsets arithmetic, truncation, sharding) is written once
against `xp` in the stage modules, so the CPU tests execute the code the GPU runs. This is the only module
that imports cupy, cudf or rmm, and it does so lazily: `import gpu_prep` never needs them.

Every cuDF/CuPy/RMM entry point used here is listed in GPU_API and checked against the installed wheels
by tests/test_gpu_api_contract.py, so a renamed or removed API fails CI even though CI has no GPU.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_prep.errors import ConfigError

GPU_EXTRA = 'pip install "gpu-prep[gpu]"'

# (module, attribute path, keyword arguments passed): what the GPU code below calls.
GPU_API: list[tuple[str, str, tuple[str, ...]]] = [
    ("cupy", "is_available", ()),
    ("cupy", "asarray", ()),
    ("cupy", "asnumpy", ()),
    ("cupy", "cuda.runtime.getDeviceCount", ()),
    ("cudf", "Series", ("dtype",)),
    ("cudf", "Series.str", ()),
    ("cudf", "Series.hash_values", ("method",)),
    ("cudf", "Series.to_arrow", ()),
    ("cudf", "set_option", ()),
    ("cudf.core.accessors.string", "StringMethods.slice", ("start", "stop")),
    ("rmm", "reinitialize", ("pool_allocator", "initial_pool_size", "maximum_pool_size")),
]


@dataclass(frozen=True)
class Backend:
    """The CPU backend; the GPU backend overrides the few operations that run on the device."""

    name: str
    xp: Any

    def asarray(self, host: np.ndarray) -> Any:
        """Host array -> this backend's device."""
        return self.xp.asarray(host)

    def to_host(self, array: Any) -> np.ndarray:
        return np.asarray(array)

    def md5_prefix(self, texts: list[str], chars: int) -> list[bytes]:
        """MD5 digests of each text's first `chars` characters (code points), as hashlib computes them."""
        return [hashlib.md5(t[:chars].encode("utf-8")).digest() for t in texts]


class GpuBackend(Backend):
    """Arrays in CuPy; string hashing in cuDF. Results are the CPU backend's, byte for byte."""

    def to_host(self, array: Any) -> np.ndarray:
        return self.xp.asnumpy(array)

    def md5_prefix(self, texts: list[str], chars: int) -> list[bytes]:
        import cudf

        if not texts:
            return []
        # Series.str.slice counts code points like Python slicing; hash_values(md5) hashes the UTF-8 bytes
        # and returns lowercase hex. No text is null here, so no null-hashes-like-"" surprise.
        hex_digests = cudf.Series(texts, dtype="str").str.slice(0, chars).hash_values(method="md5")
        return [bytes.fromhex(h) for h in hex_digests.to_arrow().to_pylist()]


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


def configure_gpu_memory(pool_size: int | str | None, spill: bool) -> None:
    """An RMM pool of pool_size (None: RMM's default allocator), then cuDF spilling to host if asked.

    Order matters: RMM first, then spilling, then any data."""
    import cudf
    import rmm

    if pool_size:
        rmm.reinitialize(pool_allocator=True, initial_pool_size=pool_size, maximum_pool_size=None)
    if spill:
        cudf.set_option("spill", True)


def select_backend(device: str, gpu_pool_size: int | str | None = None, gpu_spill: bool = False) -> Backend:
    """auto -> the GPU when CuPy can use one, else the CPU; gpu -> the GPU or a clear error."""
    if device == "cpu":
        return CPU
    missing = gpu_missing_reason()
    if missing is None:
        import cupy

        configure_gpu_memory(gpu_pool_size, gpu_spill)
        return GpuBackend("gpu", cupy)
    if device == "gpu":
        raise ConfigError(f"--device gpu: {missing}")
    return CPU
