"""The output directory's policy: what may be replaced, what marks it as a run, what a failure leaves."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpu_prep.errors import ConfigError

MANIFEST = "manifest.json"
RUN_MARKER = ".gpu-prep-run"
LOCK = ".gpu-prep-lock"  # holds the pid of the run writing the directory


def _holder(out_dir: Path) -> int | None:
    """The pid of a live process holding the directory's lock (None: no lock, or a stale one)."""
    try:
        pid = int((out_dir / LOCK).read_text(encoding="utf-8").split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # the run that held it was killed: stale
    except PermissionError:
        return pid  # alive, someone else's
    return pid


def check_lock(out_dir: Path) -> None:
    """Refuse an output another live run is writing."""
    pid = _holder(out_dir)
    if pid is not None:
        raise ConfigError(f"output {str(out_dir)!r} is being written by another gpu-prep run (pid {pid}); wait for "
                          "it, or stop it and pass --resume")


@contextmanager
def output_lock(out_dir: Path) -> Iterator[None]:
    """The directory is this run's while the block runs (a stale lock of a killed run is taken over)."""
    check_lock(out_dir)
    (out_dir / LOCK).write_text(f"{os.getpid()}\n", encoding="utf-8")
    try:
        yield
    finally:
        try:
            if (out_dir / LOCK).read_text(encoding="utf-8").split()[0] == str(os.getpid()):
                (out_dir / LOCK).unlink()
        except (OSError, IndexError):
            pass


def check_output(out_dir: Path, overwrite: bool, resume: bool) -> None:
    """Refuse an output that cannot be used, before any work (or deletion) is done."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"output {str(out_dir)!r} is a file, not a directory")
    if not (out_dir.is_dir() and any(out_dir.iterdir())):
        return
    if not (out_dir / MANIFEST).exists() and not (out_dir / RUN_MARKER).exists():
        raise ConfigError(f"output {str(out_dir)!r} holds files that are not a gpu-prep run; refusing to touch them")
    if not (overwrite or resume):
        raise ConfigError(f"output {str(out_dir)!r} is not empty; pass --resume to finish an interrupted run "
                          "or --overwrite to replace it")


def prepare_output(out_dir: Path, overwrite: bool, resume: bool = False) -> None:
    """Empty (or, resuming, keep) an output check_output accepted, and mark it as a gpu-prep run."""
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if resume:
            return
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Marks the directory as gpu-prep's from the start, so a run that stopped early can be replaced.
    (out_dir / RUN_MARKER).write_text("a gpu-prep run; finished once manifest.json exists\n", encoding="utf-8")


def remove_partial_files(out_dir: Path) -> None:
    """After a failed run: remove the temporary files of shards that were never finished."""
    for path in out_dir.rglob(".*.tmp"):
        path.unlink(missing_ok=True)
