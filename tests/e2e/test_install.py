"""What `pip install .` brings into a fresh virtualenv: what gpu-prep uses at run time and nothing more.

pip resolves the install in a new, empty virtualenv (--dry-run --report: every package it would install,
with no download of the wheels themselves), so the check sees the real dependency tree, transitive ones
included: transformers (and with it PyTorch's advisory), Dask and RAPIDS must come only with their extras.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from helpers import REPO

# (huggingface-hub does come: HF tokenizers itself requires it.)
NOT_AT_RUN_TIME = {"transformers", "torch", "dask", "distributed", "dask-cuda", "cudf-cu12", "cupy-cuda12x",
                   "datasets"}


def _would_install(tmp_path: Path, target: str) -> set[str]:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    report = tmp_path / "report.json"
    done = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--quiet",
                           "--report", str(report), target], capture_output=True, text=True, timeout=600, cwd=REPO)
    if done.returncode != 0:
        if "Could not find a version" in done.stderr or "connection" in done.stderr.lower():
            pytest.skip(f"no package index reachable from here: {done.stderr.strip().splitlines()[-1]}")
        raise AssertionError(done.stderr)
    return {item["metadata"]["name"].lower().replace("_", "-") for item in json.loads(report.read_text())["install"]}


@pytest.mark.skipif(sys.version_info < (3, 10), reason="pip --report needs a recent pip")
def test_pip_install_brings_no_transformers_dask_or_rapids(tmp_path: Path) -> None:
    names = _would_install(tmp_path, ".")
    assert {"gpu-prep", "tokenizers", "pyarrow", "numpy", "jinja2", "h5py", "tiktoken"} <= names
    assert not names & NOT_AT_RUN_TIME, sorted(names & NOT_AT_RUN_TIME)


def test_the_cluster_extra_brings_dask(tmp_path: Path) -> None:
    names = _would_install(tmp_path, ".[cluster]")
    assert {"dask", "distributed", "bokeh"} <= names and "transformers" not in names
