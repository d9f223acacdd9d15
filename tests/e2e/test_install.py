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

import pytest

from helpers import REPO

# (huggingface-hub does come: HF tokenizers itself requires it.)
NOT_AT_RUN_TIME = {"transformers", "torch", "dask", "distributed", "dask-cuda", "cudf-cu12", "cupy-cuda12x",
                   "datasets"}


TARGETS = (".", ".[cluster]")
pytestmark = pytest.mark.skipif(sys.version_info < (3, 10), reason="pip --report needs a recent pip")


@pytest.fixture(scope="module")
def would_install(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """For each of TARGETS, the names of every package pip would install into one new, empty virtualenv; the
    resolutions run side by side (each takes pip some seconds)."""
    root = tmp_path_factory.mktemp("install")
    env = root / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    running = {target: (root / f"report{k}.json", subprocess.Popen(
        [str(env / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--quiet", "--report",
         str(root / f"report{k}.json"), target], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO))
        for k, target in enumerate(TARGETS)}
    names = {}
    for target, (report, pip) in running.items():
        _, stderr = pip.communicate(timeout=600)
        if pip.returncode != 0:
            if "Could not find a version" in stderr or "connection" in stderr.lower():
                pytest.skip(f"no package index reachable from here: {stderr.strip().splitlines()[-1]}")
            raise AssertionError(stderr)
        names[target] = {item["metadata"]["name"].lower().replace("_", "-")
                         for item in json.loads(report.read_text())["install"]}
    return names


def test_pip_install_brings_no_transformers_dask_or_rapids(would_install: dict[str, set[str]]) -> None:
    names = would_install["."]
    assert {"gpu-prep", "tokenizers", "pyarrow", "numpy", "jinja2", "h5py", "tiktoken"} <= names
    assert not names & NOT_AT_RUN_TIME, sorted(names & NOT_AT_RUN_TIME)


def test_the_cluster_extra_brings_dask(would_install: dict[str, set[str]]) -> None:
    names = would_install[".[cluster]"]
    assert {"dask", "distributed", "bokeh"} <= names and "transformers" not in names
