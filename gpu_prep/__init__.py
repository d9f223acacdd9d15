"""gpu-prep: declarative LLM training-data preprocessing into token shards with exact loss masks."""

__version__ = "0.1.0"

from gpu_prep.reader import Dataset, Domain, open_dataset  # noqa: E402

__all__ = ["Dataset", "Domain", "open_dataset", "__version__"]
