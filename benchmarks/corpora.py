"""Benchmark corpora built at run time from installed packages (nothing from them is committed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The ShareGPT reader is the tests' (tests/corpora.py); the benchmarks measure on the same conversations.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from corpora import sharegpt_chats, sharegpt_path, sharegpt_records  # noqa: E402,F401

def write_jsonl(rows: list[dict], path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def debian_docs(limit: int | None = None, package: str = "linux-doc-6.1") -> list[dict]:
    """Pretraining documents: the reStructuredText sources of a Debian documentation package (GPL-2 kernel
    docs by default), fetched with apt-get download into a cache folder on first use."""
    import gzip
    import os
    import subprocess
    import tempfile

    cache = Path(os.environ.get("GPU_PREP_CACHE", Path(tempfile.gettempdir()) / "gpu-prep-cache")) / "corpora" / package
    if not cache.exists():
        staging = Path(tempfile.mkdtemp(prefix="deb-"))
        subprocess.run(["apt-get", "download", package], cwd=staging, check=True, capture_output=True)
        (deb,) = staging.glob("*.deb")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(staging / "root")], check=True)
        cache.parent.mkdir(parents=True, exist_ok=True)
        (staging / "root").rename(cache)
    docs = []
    for path in sorted(cache.rglob("*.rst.gz")):
        text = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
        docs.append({"text": text, "source": path.parent.name})
        if limit is not None and len(docs) >= limit:
            break
    return docs
