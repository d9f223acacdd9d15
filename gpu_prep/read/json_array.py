"""JSON arrays, streamed element by element, so memory stays bounded on a multi-GB array: whole elements
kept where the array is cut short, an element nested past Python's recursion limit one malformed row."""


from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from gpu_prep.errors import Drop, Dropped, InputError
from gpu_prep.read.files import open_bytes
from gpu_prep.read.row import ReadRow
from gpu_prep.read.text_checks import NotUtf8, _up_to_a_break


# The strict parser: an element's text, its number (from 1) and its size -> its row.
Parse = Callable[[bytes, int, int], ReadRow]


def json_array_rows(path: str, compression: str | None, parse: Parse, block: int = 1 << 20,
                    encoding: str | None = None, cap: int | None = None) -> Iterator[ReadRow]:
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
    with open_bytes(path, compression, encoding) as handle:
        yield from _ArrayText(path, compression, handle, block).rows(parse, cap)


class _ArrayText:
    """A JSON file's text, decoded block by block as it is read: buffer[pos:] is what is not read yet."""

    def __init__(self, path: str, compression: str | None, handle: Any, block: int) -> None:
        self.path, self.compression, self.handle, self.block = path, compression, handle, block
        self.take = _up_to_a_break(handle)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self.finder = json.JSONDecoder()
        self.buffer, self.pos, self.done = "", 0, False
        self.index = 0  # the elements read
        self.read = 0  # the bytes of text given to the decoder
        self.bad: tuple[int, int] | None = None  # the first byte that is not UTF-8, and its offset in the text

    def more(self) -> bool:
        """The next block decoded onto what is left of the buffer; False once the text ends."""
        if self.bad is not None:  # the text before it is read: the element being read holds it
            raise NotUtf8(self.path, self.compression, *self.bad, self.index)
        if self.done:
            return False
        data = self.take(self.block)
        self.done = not data
        held = len(self.decoder.getstate()[0])
        try:
            text = self.decoder.decode(data)
        except UnicodeDecodeError as exc:  # its object: the held bytes, then the block
            self.bad = exc.object[exc.start], self.read - held + exc.start
            text = exc.object[:exc.start].decode("utf-8")
        self.read += len(data)
        if self.done:  # an incomplete character left at the end: the file was cut inside it
            text += self.decoder.getstate()[0].decode("utf-8", errors="replace")
        self.buffer = self.buffer[self.pos:] + text
        self.pos = 0
        return bool(data) or bool(self.buffer)

    def skip(self, chars: str = " \t\r\n") -> None:
        while True:
            while self.pos < len(self.buffer) and self.buffer[self.pos] in chars:
                self.pos += 1
            if self.pos < len(self.buffer) or not self.more():
                return

    def at(self, char: str) -> bool:
        return self.buffer.startswith(char, self.pos)

    def rows(self, parse: Parse, cap: int | None) -> Iterator[ReadRow]:
        """The array's elements as rows (json_array_rows)."""
        self.more()
        self.buffer = self.buffer.removeprefix("\ufeff")
        self.skip()
        if self.pos >= len(self.buffer):  # no bytes, or white space alone: no rows, as `[]` (and an empty .jsonl)
            return
        if not self.at("["):
            yield self.whole(parse)
            return
        self.pos += 1
        while True:
            self.skip()
            if self.at("]"):
                self.closed()
                return
            end = self.element_end(cap)
            if end is None:
                yield ReadRow(self.index + 1, None, 0, Dropped(Drop.MALFORMED_JSON, f"array index {self.index} is cut "
                                                               "short: the file ends inside it"),
                              self.buffer[self.pos:self.pos + 200])
                return
            self.index += 1
            text = self.buffer[self.pos:end]
            if cap is not None and len(text) > cap:
                yield ReadRow(self.index, None, len(text), Dropped(Drop.TOO_LARGE, f"array index {self.index - 1} is "
                                                                   f"over input.max_row_bytes {cap:,}; not parsed"))
            else:
                yield parse(text.encode("utf-8"), self.index, len(text))
            self.pos = end
            if not self.next_element():  # the file ends before the array closes: cut short, nothing after is lost
                yield ReadRow(self.index + 1, None, 0, Dropped(Drop.MALFORMED_JSON, "the array is not closed: the "
                                                               f"file ends after array index {self.index - 1}"))
                return

    def whole(self, parse: Parse) -> ReadRow:
        """A file that is not an array: one row, parsed whole."""
        rest = self.buffer[self.pos:] + "".join(self.decoder.decode(chunk)
                                                for chunk in iter(lambda: self.handle.read(self.block), b""))
        rest += self.decoder.getstate()[0].decode("utf-8", errors="replace")
        return parse(rest.encode("utf-8"), 1, len(rest))

    def closed(self) -> None:
        """Past the array's closing ']': only white space may follow."""
        self.pos += 1
        self.skip()
        if self.pos < len(self.buffer):  # more after the array ([...][...] from `cat a.json b.json`)
            last = self.index - 1
            raise _goes_on(self.path, f"not one JSON array: after the array's closing ']' (array index {last} the last)",
                           self.buffer[self.pos:self.pos + 40], "join the arrays into one, or write JSON Lines")

    def element_end(self, cap: int | None) -> int | None:
        """Where the element at pos ends, reading on as far as it takes; None where the file ends inside it."""
        while True:  # a block boundary may cut it (or a number) short
            try:
                end = _element_end(self.finder, self.buffer, self.pos)
            except json.JSONDecodeError as exc:
                if not _ends_early(exc, self.buffer):  # more text cannot mend it, and its end is unknown
                    why = exc.msg.removesuffix(" at")
                    raise _goes_on(self.path, f"array index {self.index} is not valid JSON ({why}, at character "
                                   f"{exc.pos - self.pos} of it)", self.buffer[exc.pos:exc.pos + 40],
                                   "mend that element, or write JSON Lines, where a bad row is dropped alone") from None
                end = None
            if end is not None and (end < len(self.buffer) or self.done):
                return end
            if end is None and cap is not None and len(self.buffer) - self.pos > cap:
                raise _goes_on(self.path, f"array index {self.index} ({self.buffer[self.pos:self.pos + 20]!r}...) does "
                               f"not end within input.max_row_bytes ({cap:,} characters)",
                               self.buffer[self.pos + cap:self.pos + cap + 40],
                               "it is longer: raise the setting; or a string in it is not closed: mend it")
            if not self.more():
                return end

    def next_element(self) -> bool:
        """Past an element: a ',' and the next, or the closing ']' (True); False where the file ends first."""
        self.skip()
        if self.at(","):
            self.pos += 1
            self.skip()
            if self.at("]"):  # as json.load, and a JSON Lines row with such a comma, refuse it
                raise InputError(f"{self.path}: not valid JSON: a ',' after the last element (array index "
                                 f"{self.index - 1}) before the closing ']'; remove it, so the file is read as JSON "
                                 "readers read it")
            return True
        if self.pos >= len(self.buffer):
            return False
        if not self.at("]"):
            raise _goes_on(self.path, f"not one JSON array: after array index {self.index - 1}, with no ',' between",
                           self.buffer[self.pos:self.pos + 40], "add the comma, or write JSON Lines")
        return True


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
