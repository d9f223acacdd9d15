"""The output directory's policy: what may be replaced, what marks it as a run, who may write it.

gpu-prep only ever removes what its journal (durable.py) says a run of its own created there: a file a
user keeps in the folder survives --overwrite and --resume. No output path may be, hold, or lie inside an
input, so a run can never write over what it reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gpu_prep.errors import ConfigError
from gpu_prep.durable import JOURNAL, journal_names, refuse_link, remove_written
from gpu_prep.output.writer import RESERVED_NAMES

MANIFEST = "manifest.json"
RUN_MARKER = ".gpu-prep-run"
LOCK = ".gpu-prep-lock"  # holds the pid of the run writing the directory, locked (flock) while it runs
CONTROL = {RUN_MARKER, LOCK, JOURNAL}  # the files that say whose folder it is


def check_paths(out_dir: Path, rejects: Path | None, inputs: Iterable[str], also_read: Iterable[str | None]) -> None:
    """Refuse an output directory or rejects file that is an input, holds one, or lies inside one; a
    rejects file that is or lies inside another path the run reads (also_read: its config, chat template,
    tokenizer folder, plugins); and an input (a file a folder gives) that is one of those."""
    for what, path in (("output", out_dir), ("--rejects", rejects)):
        if path is not None and (clash := _clash(path, inputs)):
            raise ConfigError(f"{what} {str(path)!r} {clash[0]} the input {str(clash[1])!r}; writing there could "
                              "destroy what is read: choose a path apart from the inputs")
    if rejects is not None and (clash := _clash(rejects, also_read)):
        raise ConfigError(f"--rejects {str(rejects)!r} {clash[0]} {str(clash[1])!r}, which the run reads (its config, "
                          "chat template, tokenizer or a plugin); writing there could destroy it: choose another path")
    if rejects is not None and Path(rejects).resolve() == out_dir.resolve():
        raise ConfigError(f"--rejects {str(rejects)!r} is the output directory; give a file")
    # A config.json beside the data in a folder given as input would be read as a row. (Each path resolved
    # once: a folder's inputs may be thousands.)
    readers = {Path(p).resolve() for p in also_read if p and "://" not in str(p) and os.path.exists(p)}
    for given in inputs:
        if readers and "://" not in str(given) and (target := Path(given).resolve()) in readers:
            raise ConfigError(f"input {str(given)!r} is {str(target)!r}, which the run reads as its config, "
                              "chat template, tokenizer or a plugin, not as data: move it out of the input folder, or "
                              "give the data files themselves")


def _clash(path: Path, sources: Iterable[str | Path | None]) -> tuple[str, Path] | None:
    """How path stands to the first local source it is, lies inside or holds (None: apart from them all)."""
    target = Path(path).resolve()
    for source in (Path(p).resolve() for p in sources if p and "://" not in str(p) and os.path.exists(p)):
        if target == source or target.is_relative_to(source) or source.is_relative_to(target):
            return "is" if target == source else "lies inside" if target.is_relative_to(source) else "holds", source
    return None


def check_rejects(rejects: Path, out_dir: Path, replace: bool, splits: Iterable[str]) -> None:
    """Refuse, before anything is written, a rejects path that would replace a file gpu-prep did not write
    for this run: a folder; inside the output, a place where the run writes its own files (a subfolder, a
    hidden name, manifest.json, tokenizer, a split's folder) or a file of the user's kept there; elsewhere, a
    file that exists, unless replace (--overwrite or --resume) says it may go on or be replaced."""
    target = rejects.resolve()
    if target.is_dir():
        raise ConfigError(f"--rejects {str(rejects)!r} is a folder; give a file")
    out = out_dir.resolve()
    if target.is_relative_to(out):
        name = target.relative_to(out)
        if len(name.parts) > 1 or name.name.startswith(".") or name.name in {*RESERVED_NAMES, *splits}:
            raise ConfigError(f"--rejects {str(rejects)!r} is where gpu-prep writes its own files in the output "
                              f"{str(out_dir)!r}; give a file directly in it with a name of your own (such as "
                              f"{str(out_dir / 'rejects.jsonl')!r}), or one outside it")
        if os.path.lexists(target) and name.as_posix() not in journal_names(out):
            raise ConfigError(f"--rejects {str(rejects)!r} is a file in the output folder that gpu-prep did not "
                              "write (--overwrite keeps such files); choose another path")
    elif os.path.lexists(rejects) and not replace:
        raise ConfigError(f"--rejects {str(rejects)!r} exists; pass --overwrite to replace it, or choose another path "
                          "(--resume goes on only with the rejects file its stopped run began)")


def rejects_name(out_dir: Path, rejects: Path | None) -> tuple[str, ...]:
    """The rejects file's name where it lies in the output directory, which no domain's folder may take."""
    if rejects is None or not rejects.resolve().is_relative_to(out_dir.resolve()):
        return ()
    return (rejects.resolve().relative_to(out_dir.resolve()).as_posix(),)


def _pid_in(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").split()[0]
    except (OSError, IndexError):
        return "unknown"


@contextmanager
def output_lock(out_dir: Path) -> Iterator[None]:
    """The directory is this run's while the block runs: another live run's lock is refused at once. The
    lock is the kernel's (flock on OUT/.gpu-prep-lock), so it dies with its process: a killed run's lock
    file is taken over, and two runs starting together cannot both win."""
    import fcntl

    _check_not_a_file(out_dir)
    created = not out_dir.exists()
    path = out_dir / LOCK
    while True:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            # Never through a link: the pid written into it would land wherever the link leads.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            refuse_link(out_dir, LOCK)
            raise ConfigError(f"output {str(out_dir)!r}: cannot write there ({exc.strerror or exc}); give -o a "
                              "folder that can be written") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"output {str(out_dir)!r} is being written by another gpu-prep run (pid "
                              f"{_pid_in(path)}); wait for it, or stop it and pass --resume") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break  # still the file at that path: not one a finishing run unlinked before we locked it
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # while still locked, so no one locks a file about to vanish
        os.close(fd)
        if created and not any(out_dir.iterdir()):
            out_dir.rmdir()  # a run refused before it wrote anything leaves no folder behind


def _check_not_a_file(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"output {str(out_dir)!r} is a file, not a directory")


def check_output(out_dir: Path, overwrite: bool, resume: bool) -> None:
    """Refuse an output that cannot be used, before any work (or deletion) is done."""
    _check_not_a_file(out_dir)
    if not (out_dir.is_dir() and set(os.listdir(out_dir)) - {LOCK}):
        return
    if not (out_dir / MANIFEST).exists() and not (out_dir / RUN_MARKER).exists():
        raise ConfigError(f"output {str(out_dir)!r} holds files that are not a gpu-prep run; refusing to touch them")
    if not (overwrite or resume):
        raise ConfigError(f"output {str(out_dir)!r} is not empty; pass --resume to finish an interrupted run "
                          "or --overwrite to replace it")
    if not (out_dir / JOURNAL).exists():
        raise ConfigError(f"output {str(out_dir)!r} has no list of the files gpu-prep wrote there ({JOURNAL}: an "
                          "older version wrote it); remove it yourself, or choose another folder")
    # Refuses a list that something else wrote over, and links where gpu-prep's files are, before any work.
    for name in sorted(CONTROL | {MANIFEST} | journal_names(out_dir)):
        refuse_link(out_dir, name)


def prepare_output(out_dir: Path, overwrite: bool, resume: bool = False) -> None:
    """Empty (or, resuming, keep) an output check_output accepted, and mark it as a gpu-prep run. Emptying
    removes the files the journal lists and nothing else."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if overwrite and not resume:
        remove_written(out_dir, keep=set())
        (out_dir / JOURNAL).unlink(missing_ok=True)
    # Marks the directory as gpu-prep's from the start, so a run that stopped early can be replaced.
    (out_dir / RUN_MARKER).write_text("a gpu-prep run; finished once manifest.json exists\n", encoding="utf-8")
    (out_dir / JOURNAL).touch()  # the list of what the run writes, empty until it writes


def remove_partial_files(out_dir: Path) -> None:
    """After a failed run that left no checkpoint to resume from: remove its temporary files (the journal's
    .tmp entries)."""
    names = journal_names(out_dir)
    remove_written(out_dir, keep={name for name in names if not name.endswith(".tmp")})
