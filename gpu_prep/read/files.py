"""An input's name and bytes: its format and compression by extension, local paths and URLs (fsspec), its
bytes opened decompressed (and converted to UTF-8 where a BOM says UTF-16 or UTF-32), its sizes, and which
files of a datasets folder are the library's own."""


from __future__ import annotations

import bz2
import codecs
import ftplib
import gzip
import io
import lzma
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import unquote
from typing import Any

from gpu_prep.errors import ConfigError


TEXT_LAYOUTS = ("jsonl", "json", "csv", "tsv", "txt")
LAYOUTS = (*TEXT_LAYOUTS, "parquet", "arrow", "feather")
EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv", ".txt": "txt",
              ".parquet": "parquet", ".arrow": "arrow", ".feather": "feather"}
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}
_MAGIC = {"gzip": b"\x1f\x8b", "bz2": b"BZh", "xz": b"\xfd7zXZ\x00", "zstd": b"\x28\xb5\x2f\xfd"}
LINE_LAYOUTS = ("jsonl", "csv", "tsv", "txt")  # their rows are numbered by line
# Byte order marks of the encodings other than UTF-8 that a text file may be in; UTF-32's first, as
# UTF-32 LE's BOM starts with UTF-16 LE's.
BOMS = {codecs.BOM_UTF32_LE: "utf-32-le", codecs.BOM_UTF32_BE: "utf-32-be",
        codecs.BOM_UTF16_LE: "utf-16-le", codecs.BOM_UTF16_BE: "utf-16-be"}
BOM_OF = {encoding: bom for bom, encoding in BOMS.items()}
# What reading a damaged file raises: decompressors' errors, pyarrow's (ArrowInvalid is a ValueError,
# ArrowIOError an OSError), a decode error (a ValueError). Nothing else is caught: it would hide a bug.
READ_ERRORS = (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error)
BATCH_ROWS = 4096  # Parquet and Arrow rows are turned into Python rows this many at a time
HEAD_BYTES = 4096  # how much of a file (decompressed) its checks look at
SCAN_BYTES = 1 << 20  # how much of a file the check of its whole text for UTF-8 reads at a time
NOT_UTF8_FIX = "gpu-prep reads UTF-8, or UTF-16 or UTF-32 with a BOM: convert it, e.g. iconv -f <encoding> -t UTF-8"
REJECT_TEXT = 1 << 20  # how much of a malformed row a rejects file keeps
KNOWN = ", ".join(sorted(EXTENSIONS)) + " (the text ones also " + ", ".join(sorted(COMPRESSIONS)) + ")"


def split_name(path: str) -> tuple[str | None, str | None]:
    """(layout, compression) by the file's name; (None, None) for a name gpu-prep does not know."""
    name = path.lower()
    compression = next((c for suffix, c in COMPRESSIONS.items() if name.endswith(suffix)), None)
    if compression is not None:
        name = name[: name.rindex(".")]
    layout = next((f for suffix, f in EXTENSIONS.items() if name.endswith(suffix)), None)
    if compression is not None and layout not in TEXT_LAYOUTS:
        return None, None
    return layout, compression


def local_path(path: str) -> str:
    """A file:// URL as the local path it names (read, and checked against the output, as one); any other
    path as it is."""
    return unquote(path[len("file://"):]) if path.startswith("file://") else path


def is_url(path: str) -> bool:
    """s3://, gs://, https://, hf://, memory://, file://, ...: read through fsspec."""
    return "://" in path


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of a URL and the path within it (a ConfigError when fsspec, or the package
    that provides the URL's protocol, is not installed)."""
    try:
        import fsspec
    except ImportError:
        raise ConfigError(f"input {url!r}: URLs are read through fsspec: pip install \"gpu-prep[remote]\"") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"input {url!r}: fsspec cannot open it ({exc}); install the package for its protocol "
                          "(s3fs, gcsfs, huggingface_hub, aiohttp)") from None


@contextmanager
def _reaching(url: str) -> Iterator[None]:
    """What fails while a URL's host is reached or its files listed (a host not found, a connection or a
    login refused, a bucket not the user's) as a ConfigError naming the input: the error alone names none."""
    try:
        yield
    except (OSError, ftplib.Error) as exc:
        raise ConfigError(f"input {url!r}: cannot be reached ({exc})") from None


READ_BUFFER = 1 << 20


def open_raw(path: str) -> Any:
    """The file's bytes as stored: a local file, or a URL through fsspec (streamed, seekable)."""
    if is_url(path):
        fs, inner = filesystem(path)
        return fs.open(inner, "rb")
    # A 1 MiB buffer: reading a line at a time through the default 8 KiB one makes a read call, and so a wait
    # for the GIL held by the other stages' threads, every line or two (0.2 s of a 72 MB chat file, 2 cores).
    return open(path, "rb", buffering=READ_BUFFER)  # noqa: SIM115  the caller closes it


def open_bytes(path: str, compression: str | None, encoding: str | None = None) -> Any:
    """A binary file object over the file's bytes, decompressed as they are read; with an encoding (a
    BOM's, see BOMS), its text converted to UTF-8 as it is read, the BOM left out."""
    handle = _decompressed(open_raw(path), compression)
    if encoding is None:
        return handle
    return io.BufferedReader(_Transcoded(handle, encoding), 1 << 20)


def _decompressed(raw: Any, compression: str | None) -> Any:
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "bz2":
        return bz2.BZ2File(raw, "rb")
    if compression == "xz":
        return lzma.LZMAFile(raw, "rb")
    if compression == "zstd":
        import pyarrow as pa

        return io.BufferedReader(_Raw(pa.input_stream(raw, compression="zstd")), 1 << 20)
    return raw


DATASETS_METADATA = frozenset({"dataset_info.json", "state.json", "dataset_dict.json"})


def datasets_own(name: str) -> bool:
    """Whether a file of this name, in a folder the datasets library wrote (a dataset_info.json beside it),
    is the library's own rather than data: its metadata, or a cache file .map and .filter leave."""
    return name in DATASETS_METADATA or (name.startswith("cache-") and name.endswith(".arrow"))


def remote_files(pattern: str) -> tuple[list[str], list[str]]:
    """A URL's files, as URLs, sorted: itself, a glob's matches, or a folder's files by the rules of a local
    folder (read.folder_files): none hidden or under a hidden folder (.ipynb_checkpoints), none of the
    metadata and cache-*.arrow files of a folder the datasets library wrote; and those left out, their
    names saying no layout gpu-prep reads. A DatasetDict's folder is refused: its splits are not read
    over a URL (give the split's folder); a host that cannot be reached, naming the URL (_reaching)."""
    with _reaching(pattern):  # some filesystems (FTP) connect as they are made
        fs, inner = filesystem(pattern)
        return _listed(pattern, fs, inner)


def _listed(pattern: str, fs: Any, inner: str) -> tuple[list[str], list[str]]:
    if any(c in inner for c in "*?["):
        found = [p for p in fs.glob(inner) if not fs.isdir(p)]
        return sorted(fs.unstrip_protocol(p) for p in found), []
    if not fs.isdir(inner):
        return ([fs.unstrip_protocol(inner)] if fs.exists(inner) else []), []
    root = inner.rstrip("/")
    files = [p for p in fs.find(inner) if not any(part.startswith(".") for part in p[len(root):].split("/"))]
    written = {p.rsplit("/", 1)[0] for p in files if p.rsplit("/", 1)[-1] == "dataset_info.json"}
    if any(p.rsplit("/", 1)[-1] == "dataset_dict.json" for p in files):
        raise ConfigError(f"input {pattern!r} holds a DatasetDict (dataset_dict.json), whose splits are not read over a "
                          "URL: give the folder of the split to read (its URL ending in /train, say)")
    read, left_out = [], []
    for path in files:
        folder, name = path.rsplit("/", 1)
        if folder in written and datasets_own(name):
            continue
        (read if split_name(path)[0] else left_out).append(fs.unstrip_protocol(path))
    return sorted(read), sorted(left_out)


def text_size(path: str, compression: str | None, size: int) -> int | None:
    """About how many bytes of text the file holds, for progress: its size uncompressed; a gzip file's
    from its trailer, an xz file's from its streams' indexes, a zstd file's from its first frame's header
    (None where none says, or a URL)."""
    if compression is None:
        return size
    if is_url(path) or compression not in ("gzip", "xz", "zstd") or size < 18:
        return None
    with open(path, "rb") as handle:
        if compression == "xz":
            return _xz_text_size(handle, size)
        if compression == "gzip":  # ISIZE: the text's size modulo 2**32 (of the last member)
            handle.seek(-4, os.SEEK_END)
            text = int.from_bytes(handle.read(4), "little")
            return text if text >= size else None  # wrapped past 4 GiB, or several members: unknown
        head = handle.read(18)
    # A zstd frame: magic, a descriptor byte, then the window, dictionary id and content size fields.
    if head[:4] != b"\x28\xb5\x2f\xfd":
        return None
    flags = head[4]
    single, size_flag, dict_flag = flags >> 5 & 1, flags >> 6, flags & 3
    width = (1, 2, 4, 8)[size_flag] if size_flag or single else 0
    start = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    if not width:
        return None
    value = int.from_bytes(head[start:start + width], "little")
    return value + 256 if width == 2 else value


def _xz_text_size(handle: Any, size: int) -> int | None:
    """The text an xz file holds: the uncompressed sizes its streams' indexes list, walking the streams from
    the end (each ends in a 12-byte footer giving its index's size; zero padding may follow a stream).
    None where the file is not laid out so."""
    end, text = size, 0
    while end > 0:
        handle.seek(end - 4)
        if handle.read(4) == b"\0" * 4:  # stream padding
            end -= 4
            continue
        if end < 24:
            return None
        handle.seek(end - 12)
        footer = handle.read(12)
        index_size = (int.from_bytes(footer[4:8], "little") + 1) * 4
        start = end - 12 - index_size
        if footer[10:] != b"YZ" or start < 12:
            return None
        handle.seek(start)
        index, at = handle.read(index_size), 1
        if index[:1] != b"\0":
            return None
        numbers: list[int] = []
        while len(numbers) < 1 or len(numbers) < 1 + 2 * numbers[0]:  # the record count, then (unpadded, text) pairs
            value = shift = 0
            while at < len(index) and shift < 63:
                byte = index[at]
                value, shift, at = value | (byte & 0x7F) << shift, shift + 7, at + 1
                if byte < 0x80:
                    break
            else:
                return None
            numbers.append(value)
        blocks = sum(-(-unpadded // 4) * 4 for unpadded in numbers[1::2])
        text += sum(numbers[2::2])
        end = start - blocks - 12  # this stream's header
        if end < 0:
            return None
    return text


def file_size(path: str) -> int:
    if is_url(path):
        fs, inner = filesystem(path)
        return int(fs.size(inner) or 0)
    return os.path.getsize(path)


class _Raw(io.RawIOBase):
    """A pyarrow input stream as a raw file, so a BufferedReader can read lines from it."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.stream.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.stream.close()
        super().close()


class _Transcoded(io.RawIOBase):
    """A UTF-16 or UTF-32 text file as UTF-8 bytes, converted block by block as they are read, so the
    readers of UTF-8 text read it unchanged (lines keep their numbers) and memory stays bounded. Bytes
    that are not valid in the encoding raise a UnicodeError naming their offset in the file."""

    def __init__(self, stream: Any, encoding: str) -> None:
        self.stream, self.encoding = stream, encoding
        self.decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
        self.offset = len(stream.read(len(BOM_OF[encoding])))  # bytes of the file given to the decoder so far
        self.pending = b""
        self.done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending and not self.done:
            data = self.stream.read(1 << 16)
            self.done = not data
            held = len(self.decoder.getstate()[0])  # bytes of a character cut by the previous block
            try:
                text = self.decoder.decode(data)
            except UnicodeDecodeError as exc:
                raise UnicodeError(f"not valid {self.encoding.upper()} at byte {self.offset - held + exc.start}: "
                                 f"{exc.reason}") from None
            if self.done and self.decoder.getstate()[0]:  # the file ends inside a character: it was cut short
                text += "\ufffd"  # (only its last row can hold it, and that row is cut too)
            self.pending = text.encode("utf-8")
            self.offset += len(data)
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def close(self) -> None:
        self.stream.close()
        super().close()
