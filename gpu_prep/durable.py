"""Durable files: written under a temporary name, flushed to disk, renamed once complete; checksums; and
the journal of what a run wrote.

Every file a run leaves (shards, meta.json, the manifest, the rejects file, checkpoints) goes through
these, so a run killed at any moment leaves no file under a final name that is not complete. Temporary
names are hidden and end in .tmp.

The journal (OUT/.gpu-prep-files) lists every path a run created in its output directory, written before
the file is: it is how --overwrite and --resume know what is gpu-prep's to remove, so a file a user put in
the folder is never touched, whenever the run that wrote the rest was stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpu_prep.errors import ConfigError

JOURNAL = ".gpu-prep-files"


class Journal:
    """The paths (relative to `root`, one JSON string a line) created in an output directory."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.given = Path(os.path.abspath(root))  # where the run's paths are built from (-o may be a link)
        self.names = journal_names(root)
        refuse_link(root, JOURNAL)
        self.handle = open(root / JOURNAL, "a", encoding="utf-8")  # noqa: SIM115  closed in close()
        self.lock = threading.Lock()

    def name_of(self, path: Path) -> str | None:
        """path's name relative to root, taken by its letters (a link inside root is not followed out of
        it); None where path is not in root."""
        absolute = Path(os.path.abspath(path))
        for base in (self.given, self.root):
            if absolute.is_relative_to(base):
                return absolute.relative_to(base).as_posix()
        return None

    def claim(self, path: Path) -> None:
        """Record `path` (inside root) as the run's, before it is created; a ConfigError where a link stands
        on the way to it (writing there would write through the link, out of the output folder)."""
        name = self.name_of(path)
        if name is None:
            return
        refuse_link(self.root, name)
        with self.lock:
            if name not in self.names:
                self.handle.write(json.dumps(name) + "\n")
                self.handle.flush()  # with the OS before the file exists: a killed run's files are all listed
                self.names.add(name)

    def close(self) -> None:
        self.handle.close()


_ACTIVE: list[Journal] = []


def journal_names(root: Path) -> set[str]:
    """The paths a journal lists (a line cut short by a kill is ignored: its file was never created)."""
    try:
        lines = (root / JOURNAL).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return set()
    names = set()
    for number, line in enumerate(lines, 1):
        try:
            name = json.loads(line)
        except ValueError:
            continue
        if not isinstance(name, str):  # written over by something else: which files are gpu-prep's is unknown
            raise ConfigError(f"{root / JOURNAL}: line {number} is not a file name, so this is not the list of "
                              "files gpu-prep wrote here; without it gpu-prep cannot tell its files from others: "
                              "remove the folder yourself, or choose another")
        names.add(name)
    return names


@contextmanager
def journal(root: Path) -> Iterator[Journal]:
    """Files created under `root` while the block runs are recorded in its journal (claim)."""
    current = Journal(root)
    _ACTIVE.append(current)
    try:
        yield current
    finally:
        _ACTIVE.remove(current)
        current.close()


def settle_journal(root: Path) -> None:
    """After a finished run: the journal lists the files it left, sorted, so that it is, like every other
    file of the run, a function of the inputs and config alone (not of the order chunks, checkpoints and
    temporaries came in, which a resume, a chunk size or output.shuffle changes). The new list is written
    beside the journal (listed in it first: a kill leaves nothing unknown) and renamed over it."""
    tmp = root / temporary_name(JOURNAL)
    with journal(root):
        claim(tmp)
    names = sorted(name for name in journal_names(root) if os.path.lexists(root / name) and name != tmp.name)
    with writing(tmp), open(tmp, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(name) + "\n" for name in names)
    finish_file(tmp, root / JOURNAL)


def claim(path: Path) -> None:
    """Record a path about to be created in the journal of the output directory holding it, if any."""
    for current in _ACTIVE:
        current.claim(path)


def linked_part(root: Path, name: str) -> Path | None:
    """The first path from root down to root/name (name itself included) that is a symbolic link, if any."""
    path = Path(root)
    for part in Path(name).parts:
        path = path / part
        if path.is_symlink():
            return path
    return None


def refuse_link(root: Path, name: str) -> None:
    """A ConfigError where a link stands on the way to root/name: gpu-prep writes and removes nothing
    through a link, which could lead out of its output folder."""
    if (link := linked_part(root, name)) is not None:
        raise ConfigError(f"{link} is a link (to {os.readlink(link)!r}) in the output {str(root)!r}, where "
                          f"gpu-prep writes {name!r}; it writes nothing through links, which could lead out of "
                          "the output folder: remove the link, or choose another output")


def remove_written(root: Path, keep: set[str]) -> None:
    """Remove every file the journal lists but `keep` (paths relative to root), then the directories that
    held them and are left empty; nothing else in root is touched, nor anything a link in root leads to (a
    link where a listed file was is removed itself, a file under a linked folder is left)."""
    names = {name for name in journal_names(root) - keep if linked_part(root, str(Path(name).parent)) is None}
    for name in names:
        (root / name).unlink(missing_ok=True)
    parents = {p for name in names for p in Path(name).parents if p != Path(".")}
    for directory in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        try:
            (root / directory).rmdir()
        except OSError:  # not empty (someone else's files), or gone
            pass


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Name the file in an OSError raised while writing it (a failed write() names none)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def create(path: Path, mode: str = "wb") -> Any:
    """Open a new file of the run's for writing, recorded in the journal first."""
    claim(path)
    with writing(path):
        return open(path, mode)  # noqa: SIM115  the caller closes it


def finish_file(tmp: Path, final: Path) -> None:
    """Make a fully written temporary file durable and give it its final name."""
    claim(final)
    with writing(tmp), open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(final.parent, os.O_RDONLY)
    try:
        with writing(final.parent):
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def start_writeback(fd: int) -> None:
    """Have the OS start writing a file's new data to disk now, without waiting for it (Linux does so for
    POSIX_FADV_DONTNEED), so that the fsync when the shard closes has little left to wait for."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def temporary_name(name: str) -> str:
    """What a file is called until it is complete (hidden, ending in .tmp)."""
    return f".{name}.tmp"


def temporary_path(path: Path) -> Path:
    return path.with_name(temporary_name(path.name))


def write_atomic(path: Path, data: bytes) -> None:
    tmp = temporary_path(path)
    with writing(tmp), create(tmp) as handle:  # closing flushes: its error named too
        handle.write(data)
    finish_file(tmp, path)


def write_json_atomic(path: Path, data: Any) -> None:
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode("utf-8"))


def copy_atomic(source: Path, path: Path) -> None:
    tmp = temporary_path(path)
    with open(source, "rb") as src, writing(tmp), create(tmp) as handle:
        shutil.copyfileobj(src, handle)
    finish_file(tmp, path)


def sha256_file(path: Path | str) -> str | None:
    """The file's sha256 (None for what is not a local file, a URL or a hub dataset: hashing it would read
    it all a second time)."""
    if not os.path.isfile(path):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# What a manifest's checksum covers: everything that describes the data (not timings or where it ran), so
# an edit to a total, the config or the file list is found by verify and the reader.
SIGNED = ("config", "config_sha256", "inputs", "inputs_left_out", "totals", "datasets", "dropped_examples", "packing",
          "domains", "files")


def manifest_checksum(manifest: dict[str, Any]) -> str:
    signed = {key: manifest[key] for key in SIGNED if key in manifest}
    return hashlib.sha256(json.dumps(signed, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def manifest_edited(path: Path, manifest: dict[str, Any]) -> str | None:
    """What is wrong with a manifest whose checksum no longer holds (None: it holds), naming its file."""
    if manifest.get("manifest_sha256") == manifest_checksum(manifest):
        return None
    return f"{path}: edited after the run (its totals, config or file list no longer match its manifest_sha256)"


def written_files(root: Path) -> dict[str, int]:
    """The finished files a run wrote in root (by the journal), with their sizes: not its temporaries or its
    own bookkeeping (.gpu-prep-*), which go when the run is complete."""
    found = {}
    for name in sorted(journal_names(root)):
        path = root / name
        if not name.endswith(".tmp") and not Path(name).name.startswith(".gpu-prep") and path.is_file():
            found[name] = path.stat().st_size
    return found

