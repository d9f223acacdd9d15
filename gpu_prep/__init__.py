"""gpu-prep: declarative LLM training-data preprocessing into token shards with exact loss masks."""

__version__ = "0.1.0"

from gpu_prep.output.dataset import Dataset, Domain, open_dataset  # noqa: E402

open = open_dataset  # gpu_prep.open("out/"): a run's output, whatever its storage format  # noqa: A001

__all__ = ["Dataset", "Domain", "open", "open_dataset", "__version__"]
