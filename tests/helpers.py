"""Helpers shared by the end-to-end tests: run the real pipeline, read samples back, show them as text.

`marked_text` is the reusable piece: a sample's tokens as readable text with the trained spans wrapped in
markers. It works on bytes, not on per-token decodes, so a multi-byte character split across tokens (or
across a mask boundary) is never mangled silently. A future `gpu-prep inspect` wants the same function.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import traceback
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np

import gpu_prep
from gpu_prep.render.sandbox import ChatTemplate
from gpu_prep.config import parse_config
from gpu_prep.commands.inspect import CLOSE, OPEN, marked_text, token_bytes  # noqa: F401  (shared with the tests)
from gpu_prep.pipeline import Options, run

REPO = Path(__file__).resolve().parent.parent
Sample = tuple[np.ndarray, np.ndarray]


def golden_document(title: str, tok: Any, ids: np.ndarray, loss_mask: np.ndarray) -> str:
    """A golden file: a header, the marked text (plus one newline), then the ids and loss_mask lines."""
    return (
        f"# {title}\n"
        f"# tokenizer {tok.name}; trained tokens are wrapped in {OPEN} {CLOSE}; one newline follows the text\n"
        f"{marked_text(tok, ids, loss_mask)}\n"
        f"ids: {' '.join(str(int(i)) for i in ids)}\n"
        f"loss_mask: {' '.join(str(int(m)) for m in loss_mask)}\n"
    )


def hf_engine(folder: Path) -> dict[str, str]:
    """The tokenizer setting for a folder of this test's own: HF tokenizers encodes (these tests are about
    templates and masks, which do not depend on the engine; each folder would cost a fast engine's build)."""
    return {"name": str(folder), "engine": "hf"}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """Rows as JSON Lines; a str row is written verbatim (malformed lines, blank lines)."""
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False)) + "\n")
    return path


def load_json(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def run_rows(tmp_path: Path, config: dict[str, Any], rows: list[Any], name: str = "run", **kwargs: Any) -> Path:
    """Write rows to a JSONL file, run the real pipeline on it, return the output directory."""
    inputs = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    out = tmp_path / f"{name}-out"
    run(parse_config(config), [str(inputs)], out, Options(**kwargs))
    return out


def sample_bytes(out: Path) -> dict[str, list[bytes]]:
    """By domain directory: each sample as its ids' and mask's bytes, in stored order."""
    ds = gpu_prep.open_dataset(out)
    return {name: [ids.astype(np.int64).tobytes() + b"|" + mask.astype(np.int8).tobytes() for ids, mask in ds[name]]
            for name in ds}


def samples(out_dir: Path, domain: str | None = None) -> list[Sample]:
    """All samples of one domain (the only one when domain is None), in stored order."""
    ds = gpu_prep.open_dataset(out_dir)
    if domain is None:
        assert len(ds) == 1, f"expected one domain, got {list(ds)}"
        domain = next(iter(ds))
    return [(ids.copy(), mask.copy()) for ids, mask in ds[domain]]


def render_chat(tok: Any, messages: list[dict[str, Any]]) -> str:
    """The conversation as the tokenizer sees it: the real chat template, then its Unicode normalization."""
    text = ChatTemplate(tok.chat_template, tok.special_tokens).render(messages)
    return unicodedata.normalize(tok.normalization, text) if tok.normalization else text


def as_from_a_terminal() -> None:
    """A child's Ctrl-C as a terminal gives it: a suite started with SIGINT ignored (nohup, a background job
    of a script) passes SIG_IGN on to its children, and Python then never raises KeyboardInterrupt in them,
    so the tests that press Ctrl-C would test nothing. For subprocess's preexec_fn."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def gpu_prep_cli(*args: Any, env: dict[str, str | None] | None = None, timeout: int = 300, process: bool = False
                 ) -> subprocess.CompletedProcess[str]:
    """`gpu-prep` with these arguments, from the repository's folder: the CLI's own app in this process (its
    tokenizers and engine builds are kept for the next call, which spares each call the second or two a new
    process spends on imports, loading the tokenizer and building the fast engine), or with process=True, or
    env (variables to set, None to unset) given, the installed console script in a subprocess (GPU_PREP_CACHE
    is inherited from conftest): for what only a process shows (signals, failpoints, the early engine
    build, the exit without teardown)."""
    if process or env is not None:
        script = Path(sys.executable).parent / "gpu-prep"
        assert script.exists(), f"the gpu-prep console script is not installed next to {sys.executable}"
        merged = {**os.environ, **(env or {})}  # COLUMNS=200 among them (conftest)
        return subprocess.run([str(script), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                              cwd=REPO, env={k: v for k, v in merged.items() if v is not None},
                              preexec_fn=as_from_a_terminal)
    return in_process(*args)


def in_process(*args: Any) -> subprocess.CompletedProcess[str]:
    """The CLI's app run here as the console script runs it (gpu_prep.cli.main without its exit), its output
    and exit status taken as a subprocess's would be; an exception the CLI lets out is status 1 with its
    traceback on stderr, as the interpreter gives it."""
    from gpu_prep.cli import app, exit_status

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    argv = [str(a) for a in args]
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                app(args=argv, prog_name="gpu-prep")
                code = 0
            except SystemExit as exc:
                code = exit_status(exc.code)
            except KeyboardInterrupt:
                code = 130
            except Exception:  # noqa: BLE001  the interpreter's last words
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["gpu-prep", *argv], code, out.getvalue(), err.getvalue())


def output_tree(root: Path, *run_keys: str) -> dict[str, bytes]:
    """Every finished file of an output by its path (of a finished run, the journal of what it wrote too;
    temporaries, and the journal of a run still going, are not finished), the manifest without the keys that
    say how the run went (timings and run_keys, dotted for nested ones): what two runs of one config must
    agree on."""
    files = {}
    finished = (root / "manifest.json").exists()
    for path in sorted(root.rglob("*")):
        if path.is_file() and (not path.name.startswith(".") or finished and path.name == ".gpu-prep-files"):
            data = path.read_bytes()
            if path.name == "manifest.json":
                manifest = json.loads(data)
                for key in ("seconds", *run_keys):
                    *parents, last = key.split(".")
                    node = manifest
                    for name in parents:
                        node = node.get(name, {})
                    node.pop(last, None)
                data = json.dumps(manifest, sort_keys=True).encode()
            files[path.relative_to(root).as_posix()] = data
    return files
