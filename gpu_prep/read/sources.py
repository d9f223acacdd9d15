"""What an input file is, checked against its content, and the readers of the formats beyond JSON Lines.

A file's format comes from its extension (or, for a file without a known one, a dataset's `builder`) and
is then checked against its first bytes: a Parquet file starts with PAR1, an Arrow IPC file with ARROW1
and an Arrow stream with its continuation marker, a compressed file with its codec's magic, and text
formats must be text. An unknown extension or content that is not what the name says stops the run
before anything is written, naming the file and what was found: nothing is ever read as JSON Lines by
default.

Formats: JSON Lines, JSON arrays (streamed element by element, so memory stays bounded on a multi-GB
array), Parquet, Arrow IPC (file and stream, as the HF datasets cache and save_to_disk write them),
Feather, CSV and TSV (a header row names the columns; every cell is read as text), plain text (a document
per file, or per line with input.text_rows "line"); the text formats also gzip-, bz2-, xz- or
zstd-compressed, decompressed as they are read. A `save_to_disk` folder (state.json + .arrow files) is its
Arrow files in order; a DatasetDict folder (dataset_dict.json) is one split's (input.split).

Text is UTF-8 unless a byte order mark says UTF-16 or UTF-32 (LE or BE); such a file is converted to UTF-8
as it is read, so every reader sees UTF-8. The file's first bytes decide: a NUL byte (with no such BOM)
means binary data, and refuses the file before anything is written, naming the byte. Bytes that are not
UTF-8 refuse a CSV, TSV, plain text or JSON array file the same way (its reader could not go past them),
wherever they are in an uncompressed local file, whose whole text is checked (1 to 3 ms a MB); a compressed
file or a URL, which that would read twice, is stopped where its reader meets them, naming the same byte and
line. In JSON Lines they are their line's problem alone: that row is dropped as malformed_json. A Parquet or Arrow file whose footer cannot be read (a truncated
copy) is refused the same way.
"""

from __future__ import annotations

import bz2
import codecs
import ftplib
import gzip
import io
import json
import lzma
import os
import re
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote
from typing import Any

from gpu_prep.backend import ReadGroups
from gpu_prep.errors import ConfigError, Drop, InputError

TEXT_FORMATS = ("jsonl", "json", "csv", "tsv", "txt")
FORMATS = (*TEXT_FORMATS, "parquet", "arrow", "feather")
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
    """(format, compression) by the file's name; (None, None) for a name gpu-prep does not know."""
    name = path.lower()
    compression = next((c for suffix, c in COMPRESSIONS.items() if name.endswith(suffix)), None)
    if compression is not None:
        name = name[: name.rindex(".")]
    fmt = next((f for suffix, f in EXTENSIONS.items() if name.endswith(suffix)), None)
    if compression is not None and fmt not in TEXT_FORMATS:
        return None, None
    return fmt, compression


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
    names saying no format gpu-prep reads. A DatasetDict's folder is refused: its splits are not read
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


def bom_encoding(head: bytes) -> str | None:
    """The encoding a byte order mark at the start of the text says, when it is not UTF-8's (None: UTF-8,
    whose BOM the readers skip)."""
    return next((encoding for bom, encoding in BOMS.items() if head.startswith(bom)), None)


def text_problem(head: bytes, encoding: str | None, rows_per_line: bool) -> tuple[str, bytes]:
    """("", the head as UTF-8) when a text file's first bytes are text in its encoding (None: UTF-8); else
    (what they are, naming the byte and its line, b""). A NUL byte means binary data: no text format has
    one. Bytes that are not UTF-8 refuse a file whose reader would stop at them anyway (CSV, TSV, plain
    text, a JSON array); in JSON Lines (rows_per_line) they are a problem of their line alone, which the
    strict parser drops as malformed_json, so the head is returned as it is. A character cut short by the
    head's end is not a problem: the rest of the file is not read here."""
    bad = None
    if encoding is not None:
        skip = len(BOM_OF[encoding])
        try:
            head = codecs.getincrementaldecoder(encoding)(errors="strict").decode(head[skip:]).encode("utf-8")
        except UnicodeDecodeError as exc:
            return f"bytes that are not {encoding.upper()}, as its BOM says, at byte {skip + exc.start}", b""
    elif not rows_per_line:
        try:
            codecs.getincrementaldecoder("utf-8")(errors="strict").decode(head)
        except UnicodeDecodeError as exc:
            bad = exc.start
    nul = head.find(b"\x00")
    if nul >= 0:
        return (f"binary data (a NUL byte at byte {nul}, line {_line(head, nul)}; UTF-16 or UTF-32 text needs a "
                "byte order mark)"), b""
    if bad is not None:
        return f"{not_utf8(head[bad], bad, _line(head, bad))}; {NOT_UTF8_FIX}", b""
    return "", head


def _line(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def not_utf8(byte: int, offset: int, line: int, index: int | None = None) -> str:
    """What a byte that is not UTF-8 is and where: its offset in the (decompressed) text, its line and, in a
    JSON array, the array index of the element it is in (or comes before)."""
    element = "" if index is None else f", array index {index}"
    return f"text that is not UTF-8 (byte 0x{byte:02x} at byte {offset}, line {line}{element})"


def first_not_utf8(path: str, compression: str | None, to_the_end: bool) -> tuple[int, int] | None:
    """(the byte, its offset in the text) of the first byte of a UTF-8 file's text that is not UTF-8, or None
    where there is none. With to_the_end, a character cut by the text's end counts (a JSON array's reader
    keeps the whole elements before such a cut, so there it does not)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    offset = held = 0  # the text given to the decoder; the bytes of a character the previous block cut
    with open_bytes(path, compression) as handle:
        try:
            while data := handle.read(SCAN_BYTES):
                held = len(decoder.getstate()[0])
                decoder.decode(data)
                offset += len(data)
            held = len(decoder.getstate()[0])
            if to_the_end:
                decoder.decode(b"", final=True)
        except UnicodeDecodeError as exc:  # its object: the held bytes, then the block
            return exc.object[exc.start], offset - held + exc.start
    return None


def line_at(path: str, compression: str | None, offset: int) -> int:
    """The line of the text a byte offset is on (the file is read again up to it)."""
    line = 1
    with open_bytes(path, compression) as handle:
        while offset > 0 and (data := handle.read(min(offset, SCAN_BYTES))):
            line += data.count(b"\n")
            offset -= len(data)
    return line


def _up_to_a_break(handle: Any) -> Callable[[int], bytes]:
    """handle.read for a stream that may break part-way (a compressed file cut short): a block of what
    decompresses, the text before a break given first and the break raised on the next call (a block read
    whole would raise with the text before it unread). Read in the codec's small pieces (about 11 KB from
    gzip and xz) joined into whole blocks, so a reader that parses a block at a time is not made to parse
    more often."""
    read1 = getattr(handle, "read1", None)
    if read1 is None:
        return handle.read
    broke: list[BaseException] = []

    def take(size: int) -> bytes:
        if broke:
            raise broke.pop()
        parts, got = [], 0
        while got < size:
            try:
                data = read1(size - got)
            except READ_ERRORS as exc:
                if not parts:
                    raise
                broke.append(exc)
                break
            if not data:
                break
            parts.append(data)
            got += len(data)
        return b"".join(parts)
    return take


def lines_before_damage(path: str, compression: str) -> int:
    """How many whole lines of a compressed file's text decompress before it breaks (read again: a reader
    that decompresses a block ahead of its rows, as pyarrow's CSV reader does, cannot say)."""
    lines = 0
    with open_bytes(path, compression) as handle:
        take = _up_to_a_break(handle)
        try:
            while data := take(SCAN_BYTES):
                lines += data.count(b"\n")
        except READ_ERRORS:  # where the stream breaks
            pass
    return lines


class NotUtf8(InputError):
    """Text that is not UTF-8 met part-way through a CSV, TSV, plain text or JSON array file: the rows after
    it cannot be read. The whole text of an uncompressed local file is checked before anything is written
    (inspect_file), so the run meets this in a compressed file or a URL."""

    def __init__(self, path: str, compression: str | None, byte: int, offset: int, index: int | None = None) -> None:
        self.index = index
        super().__init__(f"{path}: {not_utf8(byte, offset, line_at(path, compression, offset), index)}; the rows "
                         f"after it cannot be read, so the run stops there ({NOT_UTF8_FIX})")


def _what(head: bytes) -> str:
    """What some first bytes look like, for an error message."""
    if head.startswith(b"PAR1"):
        return "Parquet"
    if head.startswith(b"ARROW1"):
        return "an Arrow IPC file"
    if head.startswith(b"\xff\xff\xff\xff"):
        return "an Arrow IPC stream"
    if head.startswith(b"FEA1"):  # pyarrow.feather.write_feather(..., version=1)
        return ("Feather version 1, which gpu-prep does not read (write it again as version 2: "
                "pyarrow.feather.write_feather(pyarrow.feather.read_table(path), new_path))")
    for codec, magic in _MAGIC.items():
        if head.startswith(magic):
            return f"{codec}-compressed data"
    if b"\x00" in head:
        return "binary data"
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    return f"text starting {text[:40]!r}" if text else "an empty file"


def inspect_file(path: str, fmt: str, compression: str | None) -> tuple[str, str | None]:
    """(layout, encoding) of a file whose first bytes agree with its format: "arrow" files are "arrow-file"
    or "arrow-stream", and a text file's encoding is its BOM's (None: UTF-8). A ConfigError naming the file
    and what was found when they do not: another format, binary data, text not in UTF-8, or (Parquet and
    Arrow) a footer or schema that cannot be read, as in a truncated copy. Reads the first HEAD_BYTES only,
    but for the whole text of an uncompressed local CSV, TSV, plain text or JSON array file (_not_utf8_past_head)."""
    with open_raw(path) as handle:
        raw = handle.read(64)
    if compression is not None and raw and not raw.startswith(_MAGIC[compression]):
        raise ConfigError(f"input {path!r}: named as {compression}-compressed, but it holds {_what(raw)}")
    try:
        with open_bytes(path, compression) as handle:
            raw = handle.read(HEAD_BYTES)
    except READ_ERRORS as exc:
        if compression is None:
            raise
        raise ConfigError(f"input {path!r}: cannot decompress it as {compression}: {exc}") from None
    if fmt == "parquet":
        if not raw.startswith(b"PAR1"):
            raise ConfigError(f"input {path!r}: named as Parquet, but it holds {_what(raw)}")
        return _readable(path, fmt), None
    if fmt in ("arrow", "feather"):
        if raw.startswith(b"ARROW1"):
            return _readable(path, "arrow-file"), None
        if raw.startswith(b"\xff\xff\xff\xff") and fmt == "arrow":
            return _readable(path, "arrow-stream"), None
        raise ConfigError(f"input {path!r}: named as {'Arrow' if fmt == 'arrow' else 'Feather'}, but it holds {_what(raw)}")
    if raw.startswith((b"PAR1", b"ARROW1", b"\xff\xff\xff\xff", *_MAGIC.values())):
        raise ConfigError(f"input {path!r}: named as {fmt.upper()} text, but it holds {_what(raw)}")
    encoding = bom_encoding(raw)
    text = ""
    if fmt in ("jsonl", "json"):
        text = raw.decode(encoding or "utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    lines_are_rows = fmt == "jsonl" or (fmt == "json" and text.startswith("{"))
    problem, head = text_problem(raw, encoding, lines_are_rows)
    if not problem and not lines_are_rows and encoding is None and len(raw) == HEAD_BYTES:
        problem = _not_utf8_past_head(path, compression, array=fmt == "json" and text.startswith("["))
    if problem:
        raise ConfigError(f"input {path!r}: named as {fmt.upper()} text, but it holds {problem}")
    if fmt in ("jsonl", "json"):
        if text and text[0] not in "{[" and not (fmt == "jsonl" and _json_line(text)):
            # (a JSON Lines file whose first line is JSON all the same, a number or a string, has that row
            # dropped as not_an_object like any other line)
            raise ConfigError(f"input {path!r}: named as {'JSON Lines' if fmt == 'jsonl' else 'JSON'}, but it holds "
                              f"{_what(head)}; name its format with a dataset's builder, or give it the extension of "
                              "what it is")
        if fmt == "json" and text.startswith("{"):  # one object per line, named .json; or one object over many
            if text.partition("\n")[0].strip() == "{":  # as json.dumps(indent=...), jq and JSON.stringify write it
                raise ConfigError(f"input {path!r}: holds one JSON object written over many lines, neither JSON Lines "
                                  "(an object a line) nor an array of rows; where its rows are a field's list "
                                  "({\"data\": [...]}), write them out as JSON Lines (jq -c '.data[]' FILE > rows.jsonl)")
            return "jsonl", encoding
        if fmt == "jsonl" and text.split("\n", 1)[0].strip() == "[":
            raise ConfigError(f"input {path!r}: named as JSON Lines, but it holds a JSON array written over many "
                              "lines (its first line is '['); name it .json to read its elements as rows")
    return fmt, encoding


def _not_utf8_past_head(path: str, compression: str | None, array: bool) -> str:
    """What text_problem says of bytes that are not UTF-8 beyond a CSV, TSV, plain text or JSON array file's
    head, so that they too stop the run before anything is written: the whole text of an uncompressed local
    file is checked (1 to 3 ms a MB of text with letters beyond ASCII, 0.2 ms of ASCII: 1 to 2% of a run;
    benchmarks/RESULTS.md). Not a compressed file or a URL, which that would read twice (decompressing
    costs 4 to 6 ms a MB with gzip, 13 with xz, 40 with bz2): their readers stop where they meet such
    bytes (NotUtf8). In a JSON array, the elements are found up to the byte (not parsed), to name the one
    it is in."""
    if compression is not None or is_url(path):
        return ""
    found = first_not_utf8(path, compression, to_the_end=not array)
    if found is None:
        return ""
    byte, offset = found
    index = None
    if array:
        try:
            for _ in json_array_rows(path, compression, lambda raw: (None, None)):
                pass
        except NotUtf8 as exc:
            index = exc.index
        except InputError:  # an element before the byte breaks the array: the run would stop there anyway
            pass
    return f"{not_utf8(byte, offset, line_at(path, compression, offset), index)}; {NOT_UTF8_FIX}"


def _json_line(text: str) -> bool:
    """Whether the first line of the text (when whole in it) is a JSON value."""
    line, _, rest = text.partition("\n")
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return bool(rest)


def _readable(path: str, layout: str) -> str:
    """The layout, once the file's footer (Parquet, Arrow IPC file) or schema (Arrow stream) is read; a
    ConfigError naming the file when it cannot be, as when the file was cut short."""
    try:
        column_names(path, layout)
    except (OSError, ValueError, EOFError) as exc:
        name = "a Parquet" if layout == "parquet" else "an Arrow IPC"
        raise ConfigError(f"input {path!r}: {name} file that cannot be read, truncated or damaged ({exc})") from None
    return layout


def column_names(path: str, layout: str) -> list[str]:
    """The columns of a Parquet or Arrow file, from its footer or schema alone (no rows are read)."""
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    if layout == "parquet":
        if not is_url(path):
            return pq.read_schema(path).names
        with open_raw(path) as handle:
            return pq.read_schema(handle).names
    with _source(path) as source:
        reader = ipc.open_stream(source) if layout == "arrow-stream" else ipc.open_file(source)
        return reader.schema.names


# ---------------------------------------------------------------- folders written by datasets


def dataset_folder_files(folder: Path, split: str | None) -> list[str] | None:
    """The Arrow files of a `save_to_disk` folder (of one split of a DatasetDict folder), or of one split of
    a folder the datasets library's cache holds (dataset_info.json beside <builder>-<split>[-NNNNN-of-NNNNN]
    .arrow files), in order; None for a folder that is none of these."""
    if (folder / "dataset_dict.json").is_file():
        folder = folder / _split_of(folder, "a DatasetDict", split_names(folder), split)
    if (folder / "state.json").is_file():
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        return [str(folder / entry["filename"]) for entry in state.get("_data_files", [])]
    if (folder / "dataset_info.json").is_file():
        splits = split_names(folder)
        if splits:
            chosen = re.escape(_split_of(folder, "a datasets cache folder", splits, split))
            name = re.compile(rf"-{chosen}(-\d{{5}}-of-\d{{5}})?\.arrow$")
            return sorted(str(p) for p in folder.iterdir() if name.search(p.name))
    return None


def split_names(folder: Path) -> list[str]:
    """The splits a DatasetDict folder (dataset_dict.json) or a datasets cache folder (dataset_info.json,
    without the state.json of one saved dataset) holds; none for any other folder."""
    if (folder / "dataset_dict.json").is_file():
        return list(json.loads((folder / "dataset_dict.json").read_text(encoding="utf-8")).get("splits", []))
    if (folder / "dataset_info.json").is_file() and not (folder / "state.json").is_file():
        return list(json.loads((folder / "dataset_info.json").read_text(encoding="utf-8")).get("splits") or {})
    return []


def default_split(splits: list[str]) -> str:
    """The split read where input.split names none: train, or the only one."""
    return "train" if "train" in splits or len(splits) != 1 else splits[0]


def _split_of(folder: Path, what: str, splits: list[str], split: str | None) -> str:
    """The split to read (input.split; else train, or the only one), refused when the folder lacks it."""
    chosen = split or default_split(splits)
    if chosen not in splits:
        raise ConfigError(f"input {str(folder)!r}: {what} with the splits {', '.join(splits)}; "
                          f"{'input.split ' + repr(split) + ' is not one of them' if split else 'name one with input.split'}")
    return chosen


# ---------------------------------------------------------------- rows of each format

Row = tuple[int, Any, "tuple[str, str, Any] | None", int]  # as read.py: number, record, error, bytes


def text_rows(path: str, compression: str | None, key: str, per_line: bool,
              encoding: str | None = None) -> Iterator[Row]:
    """Plain text: the whole file as one row {key: text}, or (per_line) each non-blank line as one."""
    with open_bytes(path, compression, encoding) as handle:
        stream = io.TextIOWrapper(handle, encoding="utf-8", errors="strict", newline="")
        if not per_line:
            text = stream.read().removeprefix("\ufeff")
            if text.strip():
                yield 1, {key: text}, None, len(text)
            return
        for line_no, line in enumerate(stream, start=1):
            if line_no == 1:
                line = line.removeprefix("\ufeff")
            line = line.rstrip("\r\n")
            if line.strip():
                yield line_no, {key: line}, None, len(line)


def json_array_rows(path: str, compression: str | None, parse: Any, block: int = 1 << 20,
                    encoding: str | None = None, cap: int | None = None) -> Iterator[Row]:
    """A JSON array, element by element: the text is decoded block by block and each element's end found
    with the standard decoder, then the element parsed by `parse` (the strict parser). Memory holds a
    block and the largest element, not the file. An element over `cap` characters (input.max_row_bytes)
    is a too_large row, not parsed. A file that is not an array is one row, parsed whole; an empty one
    (white space alone) is no rows.

    Where an element's end cannot be found, the elements after it could be neither read nor counted, so an
    InputError stops the run naming the element: one that is not valid JSON (an error that more text could
    not mend: see _ends_early), one whose end is not within `cap` characters (so garbage cannot fill memory),
    a missing ',' or content after the closing ']'. A ',' before the ']' is refused as JSON readers refuse it.
    An element nested too deep for the standard decoder has its end found by its brackets (_element_end).
    A file cut short keeps its whole elements; what follows the last one is one malformed_json row. Bytes
    that are not UTF-8 stop the file (never replaced: that would change the text silently) with a NotUtf8
    naming the element they are in, once the elements before them are read; a character cut by the file's
    end is not such bytes: only a cut element can hold it."""
    finder = json.JSONDecoder()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    with open_bytes(path, compression, encoding) as handle:
        take = _up_to_a_break(handle)
        buffer, pos, done = "", 0, False
        index = 0  # the elements read
        read = 0  # the bytes of text given to the decoder
        bad: tuple[int, int] | None = None  # the first byte that is not UTF-8, and its offset in the text

        def more() -> bool:
            nonlocal buffer, pos, done, read, bad
            if bad is not None:  # the text before it is read: the element being read holds it
                raise NotUtf8(path, compression, *bad, index)
            if done:
                return False
            data = take(block)
            done = not data
            held = len(decoder.getstate()[0])
            try:
                text = decoder.decode(data)
            except UnicodeDecodeError as exc:  # its object: the held bytes, then the block
                bad = exc.object[exc.start], read - held + exc.start
                text = exc.object[:exc.start].decode("utf-8")
            read += len(data)
            if done:  # an incomplete character left at the end: the file was cut inside it
                text += decoder.getstate()[0].decode("utf-8", errors="replace")
            buffer = buffer[pos:] + text
            pos = 0
            return bool(data) or bool(buffer)

        def skip(chars: str) -> None:
            nonlocal pos
            while True:
                while pos < len(buffer) and buffer[pos] in chars:
                    pos += 1
                if pos < len(buffer) or not more():
                    return

        more()
        buffer = buffer.removeprefix("\ufeff")
        skip(" \t\r\n")
        if pos >= len(buffer):  # no bytes, or white space alone: no rows, as `[]` (and an empty .jsonl)
            return
        if not buffer.startswith("[", pos):
            rest = buffer[pos:] + "".join(decoder.decode(chunk) for chunk in iter(lambda: handle.read(block), b""))
            rest += decoder.getstate()[0].decode("utf-8", errors="replace")
            record, error = parse(rest.encode("utf-8"))
            yield 1, record, error, len(rest)
            return
        pos += 1
        while True:
            skip(" \t\r\n")
            if buffer.startswith("]", pos):
                pos += 1
                skip(" \t\r\n")
                if pos < len(buffer):  # more after the array ([...][...] from `cat a.json b.json`)
                    raise _goes_on(path, f"not one JSON array: after the array's closing ']' (array index {index - 1} the "
                                   "last)", buffer[pos:pos + 40], "join the arrays into one, or write JSON Lines")
                return
            while True:  # the element's end; a block boundary may cut it (or a number) short
                try:
                    end = _element_end(finder, buffer, pos)
                except json.JSONDecodeError as exc:
                    if not _ends_early(exc, buffer):  # more text cannot mend it, and its end is unknown
                        raise _goes_on(path, f"array index {index} is not valid JSON ({exc.msg.removesuffix(' at')}, at character "
                                       f"{exc.pos - pos} of it)", buffer[exc.pos:exc.pos + 40], "mend that element, "
                                       "or write JSON Lines, where a bad row is dropped alone") from None
                    end = None
                if end is not None and (end < len(buffer) or done):
                    break
                if end is None and cap is not None and len(buffer) - pos > cap:
                    raise _goes_on(path, f"array index {index} ({buffer[pos:pos + 20]!r}...) does not end within "
                                   f"input.max_row_bytes ({cap:,} characters)", buffer[pos + cap:pos + cap + 40],
                                   "it is longer: raise the setting; or a string in it is not closed: mend it")
                if not more():
                    if end is not None:
                        break
                    yield index + 1, None, (Drop.MALFORMED_JSON, f"array index {index} is cut short: the file ends "
                                            "inside it", buffer[pos:pos + 200]), 0
                    return
            index += 1
            text = buffer[pos:end]
            if cap is not None and len(text) > cap:
                yield index, None, (Drop.TOO_LARGE, f"array index {index - 1} is over input.max_row_bytes "
                                    f"{cap:,}; not parsed", None), len(text)
            else:
                record, error = parse(text.encode("utf-8"))
                yield index, record, error, len(text)
            pos = end
            skip(" \t\r\n")
            if buffer.startswith(",", pos):
                pos += 1
                skip(" \t\r\n")
                if buffer.startswith("]", pos):  # as json.load, and a JSON Lines row with such a comma, refuse it
                    raise InputError(f"{path}: not valid JSON: a ',' after the last element (array index {index - 1}) "
                                     "before the closing ']'; remove it, so the file is read as JSON readers read it")
            elif pos >= len(buffer):  # the file ends before the array closes: cut short, nothing after is lost
                yield index + 1, None, (Drop.MALFORMED_JSON, f"the array is not closed: the file ends after array "
                                        f"index {index - 1}", None), 0
                return
            elif not buffer.startswith("]", pos):
                raise _goes_on(path, f"not one JSON array: after array index {index - 1}, with no ',' between",
                               buffer[pos:pos + 40], "add the comma, or write JSON Lines")


def _element_end(finder: json.JSONDecoder, text: str, pos: int) -> int | None:
    """Where the JSON value at text[pos] ends; None where the text ends inside it. The decoder recurses into
    arrays and objects, so one nested past Python's recursion limit (1000 levels) has its end found by its
    brackets alone: the strict parser then reads it as the same line of JSON Lines (up to 1024 levels) or
    drops it as malformed_json, and the elements after it are read."""
    try:
        return finder.raw_decode(text, pos)[1]
    except RecursionError:
        pass
    opened: list[str] = []
    for match in _NESTING.finditer(text, pos):
        token = match.group()
        if token == '"':  # a string the text ends inside
            return None
        if token in _CLOSES:
            opened.append(token)
        elif token in ("]", "}"):
            opener = opened.pop()
            if _CLOSES[opener] != token:
                raise json.JSONDecodeError(f"a {token!r} closes a {opener!r}", text, match.start())
            if not opened:
                return match.end()
        # else a whole string, passed over: brackets in it do not nest
    return None


# A whole JSON string, a bracket, or a '"' whose string the text ends inside (found by _element_end).
_NESTING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}"]', re.DOTALL)
_CLOSES = {"[": "]", "{": "}"}


# What Python's json scanner has read when it stops at the end of its text: a string, a literal (its
# position at the literal's start), a number's fraction or exponent (at the '.' or 'e' the number stops
# before), a \uXXXX escape (at its 'u', with fewer than 4 digits after), or nothing left. More text may
# complete these; an error anywhere else is where the text breaks a rule, and no text after it can mend it.
_UNFINISHED = ("null", "true", "false", "NaN", "Infinity", "-Infinity", ".", "e+", "e-", "E+", "E-")


def _ends_early(exc: json.JSONDecodeError, text: str) -> bool:
    """Whether the decoder failed only because the text ended, so that more of it may make it valid."""
    rest = text[exc.pos:]
    if exc.msg.startswith("Unterminated string"):
        return True
    if exc.msg.startswith("Invalid \\uXXXX"):
        return len(rest) <= 5
    return any(word.startswith(rest) for word in _UNFINISHED)


def _goes_on(path: str, problem: str, rest: str, fix: str) -> Exception:
    """The rows after this point could only be lost (not read, not counted): the run stops, saying so."""
    return InputError(f"{path}: {problem}, where the file goes on with {rest!r}; the rows after it would be "
                      f"lost, so the run stops ({fix})")


def locator(path: str, layout: str, number: int, batches: dict[str, list[int]]) -> str:
    """Where row `number` (as the reader numbers it, from 1) is, in the terms of its format: a line; an
    array's index, a hub dataset's row, a row group and row (Parquet), a record batch and row (Arrow), all
    counted from 0 as Python and pyarrow index them. batches caches each file's batch sizes."""
    if layout in ("parquet", "arrow-file", "arrow-stream"):
        sizes = batches.setdefault(path, [rows for rows, _ in batch_sizes(path, layout)])
        row = number - 1
        for k, size in enumerate(sizes):
            if row < size:
                return f"{'row group' if layout == 'parquet' else 'record batch'} {k}, row {row}"
            row -= size
    if layout == "json":
        return f"array index {number - 1}"
    if layout == "hub":
        return f"row {number - 1}"
    return f"line {number}"


def _source(path: str) -> Any:
    """A pyarrow source over the file: memory-mapped when local, streamed through fsspec for a URL."""
    import pyarrow as pa

    return pa.PythonFile(open_raw(path), mode="r") if is_url(path) else pa.memory_map(path)


def _batches(path: str, layout: str, start: int = 0, stop: int | None = None) -> Iterator[Any]:
    """The record batches of a Parquet file's row groups [start, stop), or of an Arrow IPC file's batches
    [start, stop) (an Arrow stream: all of them)."""
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    if layout == "parquet":
        parquet = pq.ParquetFile(open_raw(path) if is_url(path) else path)
        for group in range(start, parquet.metadata.num_row_groups if stop is None else stop):
            with _reading_group(path, group):
                yield from parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=[group])
        return
    with _source(path) as source:
        if layout == "arrow-stream":
            yield from ipc.open_stream(source)
            return
        reader = ipc.open_file(source)
        for k in range(start, reader.num_record_batches if stop is None else stop):
            yield reader.get_batch(k)


@contextmanager
def _reading_group(path: str, group: int) -> Iterator[None]:
    """Reading one Parquet row group: what pyarrow raises stops the run naming the file and the group.
    Row groups are read one at a time, as pq.read_table reads them: given several at once, pyarrow cannot
    read a nested column whose dictionary changes between groups (a list of structs with a dictionary
    field, as Polars and pandas write categoricals: "Nested data conversions not implemented for chunked
    array outputs")."""
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError) as exc:  # OSError: pyarrow's for a damaged page
        raise InputError(f"{path}: cannot read row group {group} ({type(exc).__name__}: {str(exc).strip()}); the "
                         "file is damaged or holds what pyarrow cannot read: its rows from that group on would be "
                         "lost, so the run stops") from None


def batch_rows(path: str, layout: str, start: int = 0, stop: int | None = None, first: int = 1) -> Iterator[Row]:
    """The rows of Parquet row groups or Arrow record batches [start, stop) (all by default), numbered
    from first."""
    rows = 0 if layout == "arrow-stream" else sum(n for n, _ in batch_sizes(path, layout))  # unknown before read
    row, share = first - 1, _byte_share(file_size(path), rows)
    for batch in _batches(path, layout, start, stop):
        for record, error in batch_records(batch):
            row += 1
            yield row, record, error, share(row)


def batch_records(batch: Any) -> Iterator[tuple[dict[str, Any] | None, tuple[str, str, Any] | None]]:
    """A record batch's rows as dicts; a row with a string that is not UTF-8 (pyarrow writes such strings
    without checking them) as None and its error, naming the column and the byte, whatever column it is:
    one bad cell stopped the whole run. The row shown keeps the cell with U+FFFD for the bad bytes."""
    import pyarrow as pa

    try:
        yield from ((record, None) for record in batch.to_pylist())
        return
    except UnicodeDecodeError:
        pass
    for k in range(batch.num_rows):
        record, bad = {}, None
        for name, column in zip(batch.schema.names, batch.columns):
            try:
                record[name] = column[k].as_py()
            except UnicodeDecodeError as exc:
                plain = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                record[name] = column[k].cast(pa.binary()).as_py().decode("utf-8", errors="replace") if plain else None
                bad = bad or (name, exc)
        if bad is None:
            yield record, None
        else:
            name, exc = bad
            yield None, (Drop.MALFORMED_ROW, f"column {name!r} holds text that is not UTF-8: byte "
                                             f"0x{exc.object[exc.start]:02x} at offset {exc.start} of a value", record)


def _byte_share(size: int, rows: int) -> Any:
    """Row n's share (from 1) of a columnar file's `size` bytes over its `rows` rows, the shares summing to
    its size: what a chunk's size and the run's progress count for it (0 where its rows are not known)."""
    return lambda n: n * size // rows - (n - 1) * size // rows if rows else 0


def _holds_text(kind: Any) -> bool:
    """Whether a Parquet column of this Arrow type is one the device decodes: strings, or lists and structs
    with strings in them (of strings, booleans, integers and doubles only)."""
    import pyarrow as pa

    def leaves(kind: Any) -> list[Any]:  # [None] where a leaf is of another type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return leaves(kind.value_type)
        if pa.types.is_struct(kind):
            return [leaf for i in range(kind.num_fields) for leaf in leaves(kind.field(i).type)] or [None]
        plain = (pa.types.is_string, pa.types.is_large_string, pa.types.is_boolean, pa.types.is_integer,
                 pa.types.is_float64)
        return [kind if any(is_kind(kind) for is_kind in plain) else None]

    found = leaves(kind)
    return None not in found and any(pa.types.is_string(k) or pa.types.is_large_string(k) for k in found)


def _same_shape(got: Any, want: Any) -> bool:
    """Whether a column decoded as `got` is one of the file's type `want` up to what cuDF changes in it:
    large strings for strings, list element names, and the null type for what holds nulls alone. (A cast
    alone would not do: it fills a struct's missing or renamed fields with nulls.)"""
    import pyarrow as pa

    types = pa.types
    if types.is_null(got):
        return True
    if types.is_list(want) or types.is_large_list(want):
        return (types.is_list(got) or types.is_large_list(got)) and _same_shape(got.value_type, want.value_type)
    if types.is_struct(want):
        return types.is_struct(got) and [f.name for f in got] == [f.name for f in want] and \
            all(_same_shape(g.type, w.type) for g, w in zip(got, want))
    if types.is_string(want) or types.is_large_string(want):
        return types.is_string(got) or types.is_large_string(got)
    return got == want


def parquet_rows(path: str, read_groups: ReadGroups, start: int = 0, stop: int | None = None,
                 first: int = 1) -> Iterator[Row]:
    """The rows of a local Parquet file's row groups [start, stop), as batch_rows gives them, with the
    columns that hold text decoded by read_groups (cuDF on the GPU backend) and the others by pyarrow. A row
    group read_groups cannot read, or reads into other rows or types than the file's, is read by pyarrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    schema, meta = parquet.schema_arrow, parquet.metadata
    device = [f.name for f in schema if _holds_text(f.type)]
    if not device or len(set(schema.names)) != len(schema.names):
        yield from batch_rows(path, "parquet", start, stop, first)
        return
    host = [name for name in schema.names if name not in device]
    target = pa.schema([schema.field(name) for name in device])
    row, share = first - 1, _byte_share(file_size(path), meta.num_rows)
    for group in range(start, meta.num_row_groups if stop is None else stop):
        with _reading_group(path, group):
            table = _as_decoded(read_groups(path, [group], device), target, meta.row_group(group).num_rows)
            if table is None:
                batches = parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=[group])
            else:
                rest = parquet.read_row_group(group, columns=host)
                columns = [table.column(name) if name in target.names else rest.column(name) for name in schema.names]
                batches = pa.Table.from_arrays(columns, schema=schema).to_batches(max_chunksize=BATCH_ROWS)
            for batch in batches:
                for record, error in batch_records(batch):
                    row += 1
                    yield row, record, error, share(row)


def _as_decoded(table: Any, target: Any, rows: int) -> Any:
    """The device's table of a row group in the file's own types (target), or None where it is not one
    (other rows, columns or types) or cannot be cast back."""
    import pyarrow as pa

    if table is None or table.num_rows != rows or table.column_names != target.names or \
            not all(_same_shape(got.type, want.type) for got, want in zip(table.schema, target)):
        return None
    try:  # cuDF gives large strings, and the null type for children that hold nulls alone
        return table.cast(target)
    except (pa.ArrowException, ValueError, TypeError):
        return None


def batch_sizes(path: str, layout: str) -> list[tuple[int, int]]:
    """(rows, bytes) of each Parquet row group (bytes uncompressed) or Arrow record batch, in order."""
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    if layout == "parquet":
        meta = pq.ParquetFile(open_raw(path) if is_url(path) else path).metadata
        return [(meta.row_group(i).num_rows, meta.row_group(i).total_byte_size) for i in range(meta.num_row_groups)]
    with _source(path) as source:
        if layout == "arrow-stream":
            return [(b.num_rows, b.nbytes) for b in ipc.open_stream(source)]
        reader = ipc.open_file(source)
        return [(batch.num_rows, batch.nbytes) for batch in map(reader.get_batch, range(reader.num_record_batches))]
