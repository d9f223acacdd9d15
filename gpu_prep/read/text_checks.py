"""Text that is not what it should be: the encoding a BOM says, bytes that are not UTF-8 (found, named by
byte, line and array element), and where a damaged compressed stream breaks."""

from __future__ import annotations

import codecs
from collections.abc import Callable
from typing import Any

from gpu_prep.errors import InputError
from gpu_prep.read.files import BOM_OF, BOMS, NOT_UTF8_FIX, READ_ERRORS, SCAN_BYTES, open_bytes



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
