"""gpu-prep: declarative LLM training-data preprocessing into token shards with exact loss masks."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["Dataset", "Domain", "open", "open_dataset", "register", "__version__"]


def __getattr__(name: str) -> Any:
    # Imported when first asked for, so that `import gpu_prep.<module>` costs only that module: the reader
    # (gpu_prep.open("out/"), a run's output whatever its storage format, with Dataset and Domain) and the
    # format registry (`from gpu_prep import register`, a plugin's builder, see gpu_prep/format/contract.py).
    if name in ("Dataset", "Domain", "open", "open_dataset"):
        from gpu_prep.output import dataset

        return dataset.open_dataset if name == "open" else getattr(dataset, name)
    if name == "register":
        from gpu_prep.format import register

        return register
    raise AttributeError(f"module 'gpu_prep' has no attribute {name!r}")
