"""The backend seam: the array module `xp` (numpy or cupy) and the few operations that differ by device.

Every algorithm over arrays (mask projection, offsets arithmetic, truncation, sharding) is written once
against `xp` in the stage modules, so the CPU tests execute the code the GPU runs. This is the only module
that imports cupy or cudf, and it does so lazily.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_prep.errors import ConfigError

GPU_EXTRA = 'pip install "gpu-prep[gpu]"'


@dataclass(frozen=True)
class Backend:
    name: str
    xp: Any

    def asarray(self, host: np.ndarray) -> Any:
        """Host array -> this backend's device."""
        return self.xp.asarray(host)

    def to_host(self, array: Any) -> np.ndarray:
        if self.xp is np:
            return np.asarray(array)
        return self.xp.asnumpy(array)

    def md5_prefix(self, texts: list[str], chars: int) -> list[bytes]:
        """MD5 digests of each text's first `chars` characters (code points), as hashlib computes them."""
        return [hashlib.md5(t[:chars].encode("utf-8")).digest() for t in texts]


CPU = Backend("cpu", np)


def _gpu_missing_reason() -> str | None:
    try:
        import cupy
    except ImportError:
        return f"the gpu extra is not installed ({GPU_EXTRA})"
    if not cupy.is_available():
        return "CuPy finds no usable CUDA device (no NVIDIA driver, or no GPU visible)"
    return None


def select_backend(device: str) -> Backend:
    """auto -> the GPU when CuPy can use one, else the CPU; gpu -> the GPU or a clear error."""
    if device == "cpu":
        return CPU
    missing = _gpu_missing_reason()
    if missing is None:
        import cupy

        return Backend("gpu", cupy)
    if device == "gpu":
        raise ConfigError(f"--device gpu: {missing}")
    return CPU
