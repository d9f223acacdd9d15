"""gpu-prep: declarative LLM training-data preprocessing into token shards with exact loss masks."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from gpu_prep.output.dataset import Dataset, Domain, open_dataset  # noqa: E402

open = open_dataset  # gpu_prep.open("out/"): a run's output, whatever its storage format  # noqa: A001

__all__ = ["Dataset", "Domain", "open", "open_dataset", "register", "__version__"]


def __getattr__(name: str) -> Any:
    # `from gpu_prep import register` (a plugin's builder, see gpu_prep/builders.py) imports the format
    # registry only when asked, so `import gpu_prep` stays as quick as reading a dataset needs.
    if name == "register":
        from gpu_prep.format import register

        return register
    raise AttributeError(f"module 'gpu_prep' has no attribute {name!r}")
