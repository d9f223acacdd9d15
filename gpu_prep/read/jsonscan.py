"""Which JSON Lines a columnar parser reads exactly as the strict one does: a byte scan over whole lines,
written once against the array module `xp` (numpy on the host, CuPy on the device beside cudf.read_json).

cuDF's JSON reader is more lenient than a strict parser (orjson): it may take raw control characters,
invalid UTF-8, NaN, a misspelled literal, a trailing comma, a number with a leading zero or past a
double's range, an unknown escape, content after an object, a number where a string is asked for, a key
spelled with escapes. The scan refuses a block of lines where any of these could occur (and a little more,
where telling them apart would cost more than the line-by-line parser it falls back to): every line it
passes is one JSON object (RFC 8259) that the strict parser reads, so what the columnar parser returns for
it is what the strict parser would. Every check is a whole-array operation: no Python loop over bytes,
lines or values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NEWLINE, SPACE, QUOTE, BACKSLASH, COLON, COMMA, TAB, RETURN = 10, 32, 34, 92, 58, 44, 9, 13
LBRACE, RBRACE, LBRACKET, RBRACKET = 123, 125, 91, 93
ATOM = ord("a")  # a number or a literal, in the stream of tokens
MAX_DEPTH = 1000  # the strict parser refuses nesting past 1024 levels
LONG_DIGITS = 200  # a run of this many digits may pass a double's range, which the strict parser refuses
LITERALS = (b"true", b"false", b"null")
_STRUCTURE = b'{}[],:" \n'
_NUMBER = b"0123456789+-.eE"
_LETTERS = b"trufalsn"  # the letters of true, false and null
_ESCAPED = b'"\\/bfnrtu'  # what may follow a backslash in a string
_HEX = b"0123456789abcdefABCDEF"


def scan(xp: Any, data: bytes, rows: int, values: dict[str, tuple[int, bool]]) -> int | None:
    """The number of object keys in `data` (whole lines, `rows` of them not blank) where a columnar parser
    must read every line exactly as the strict parser does, else None. values: for each key name read, the
    byte its value must open with (a quote for a string, a bracket for a list) and whether it is a row's own
    field (at most `rows` of them) or one of the objects' in a list (any number)."""
    b = xp.asarray(np.frombuffer(data, np.uint8))
    if b.size == 0:
        return 0
    control = b < SPACE
    blank = (b == TAB) | (b == RETURN)
    if _any(control & ~blank & (b != NEWLINE)) or not valid_utf8(xp, b):
        return None  # control characters other than JSON's whitespace
    inside, opens, closes = _strings(xp, b)
    if inside is None or _any(inside & control):
        return None  # a string left open or running past its line, an escape JSON does not have, a raw tab
    if _any(blank):
        b = xp.where(blank, SPACE, b)  # tabs and carriage returns (CRLF lines) between tokens: whitespace
    if _any(~inside & ~_table(xp, _STRUCTURE + _NUMBER + _LETTERS)[b]):
        return None  # NaN, Infinity, a stray backslash or byte order mark: nothing a JSON value holds
    keys = _keys(xp, b, opens, closes, rows, values)
    skeleton = b[~inside]  # every string emptied to ""
    if keys is None or not _grammar(xp, skeleton) or not _atoms_valid(xp, skeleton):
        return None
    return keys


def _table(xp: Any, members: bytes) -> Any:
    """A lookup table of 256 bools, True at these bytes (made on each use: a cached one could belong to
    another GPU than the current one)."""
    table = np.zeros(256, np.bool_)
    table[np.frombuffer(members, np.uint8)] = True
    return xp.asarray(table)


def _shifted(xp: Any, array: Any, by: int, fill: Any) -> Any:
    """array[i + by] at i (by may be negative), fill where that falls outside."""
    pad = xp.full(min(abs(by), array.size), fill, dtype=array.dtype)
    return xp.concatenate([array[by:], pad]) if by > 0 else xp.concatenate([pad, array[:by]])


def _any(mask: Any) -> bool:
    return bool(mask.any())


def _before(xp: Any, flagged: Any, at: Any) -> Any:
    """For each of the sorted positions `at`: the last of the sorted positions `flagged` before it (-1: none)."""
    k = xp.searchsorted(flagged, at)
    return xp.where(k > 0, flagged[xp.maximum(k - 1, 0)], -1) if flagged.size else xp.full(at.size, -1, at.dtype)


def _after(xp: Any, flagged: Any, at: Any, none: int) -> Any:
    """For each of the sorted positions `at`: the first of the sorted positions `flagged` after it (none: none)."""
    k = xp.searchsorted(flagged, at, side="right")
    return xp.where(k < flagged.size, flagged[xp.minimum(k, max(flagged.size - 1, 0))], none)


def valid_utf8(xp: Any, b: Any) -> bool:
    """Whether the bytes are UTF-8 as a strict decoder reads it: no stray or missing continuation byte, no
    overlong form, no surrogate, nothing past U+10FFFF."""
    if not _any(b >= 0x80):
        return True
    cont = (b >= 0x80) & (b < 0xC0)
    n1 = _shifted(xp, b, 1, 0)
    c1, c2, c3 = (_shifted(xp, cont, k, False) for k in (1, 2, 3))
    two = (b >= 0xC2) & (b < 0xE0)
    three = (b >= 0xE0) & (b < 0xF0)
    four = (b >= 0xF0) & (b < 0xF5)
    if _any((b == 0xC0) | (b == 0xC1) | (b >= 0xF5)):
        return False
    if _any(two & ~c1) or _any(three & ~(c1 & c2)) or _any(four & ~(c1 & c2 & c3)):
        return False
    if _any(((b == 0xE0) & (n1 < 0xA0)) | ((b == 0xED) & (n1 > 0x9F))
            | ((b == 0xF0) & (n1 < 0x90)) | ((b == 0xF4) & (n1 > 0x8F))):
        return False
    # Each lead byte's continuation bytes follow it, so leads claim disjoint bytes: every continuation byte
    # is claimed, once, exactly when their numbers agree.
    return int(two.sum()) + 2 * int(three.sum()) + 3 * int(four.sum()) == int(cont.sum())


def _strings(xp: Any, b: Any) -> tuple[Any, Any, Any]:
    """(the bytes inside strings, quotes excluded; each string's opening and closing quote), or Nones where
    a string is left open or holds an escape JSON does not have. A backslash escapes the byte after it where
    an even run of backslashes comes before it."""
    slashes = xp.flatnonzero(b == BACKSLASH)
    plain = xp.flatnonzero(b != BACKSLASH)
    # The backslashes that escape: an even number of backslashes between the last other byte and each.
    escaping = slashes[(slashes - _before(xp, plain, slashes)) % 2 == 1]
    follows = b[xp.minimum(escaping + 1, b.size - 1)]
    if _any(escaping + 1 >= b.size) or _any(~_table(xp, _ESCAPED)[follows]):
        return None, None, None
    unicode = escaping[follows == ord("u")]
    hex_digit = _table(xp, _HEX)
    padded = xp.concatenate([b, xp.zeros(4, b.dtype)])
    if any(_any(~hex_digit[padded[unicode + k]]) for k in range(2, 6)) or not _surrogates_paired(xp, padded, unicode):
        return None, None, None
    quotes = xp.flatnonzero(b == QUOTE)
    quotes = quotes[(quotes - _before(xp, plain, quotes)) % 2 == 1]  # unescaped: an even run before
    if quotes.size % 2:
        return None, None, None
    marks = xp.zeros(b.size, dtype=xp.int8)
    marks[quotes] = 1
    inside = ((xp.cumsum(marks, dtype=xp.int32) & 1) == 1) & (marks == 0)
    return inside, quotes[0::2], quotes[1::2]


def _surrogates_paired(xp: Any, padded: Any, unicode: Any) -> bool:
    """Whether each \\u escape of a high surrogate (D800-DBFF) is followed at once by one of a low surrogate
    (DC00-DFFF) and each low one follows a high one: the strict parser refuses a lone half, and cuDF writes
    it out as bytes that are no UTF-8 (or, in long strings, drops it), while it joins a pair as the strict
    parser does. unicode: where the escapes' backslashes are."""
    surrogate = _table(xp, b"dD")[padded[unicode + 2]]
    high = unicode[surrogate & _table(xp, b"89abAB")[padded[unicode + 3]]]
    low = unicode[surrogate & _table(xp, b"cdefCDEF")[padded[unicode + 3]]]
    if high.size != low.size:
        return False
    return not high.size or bool(xp.all(high + 6 == low))


def _keys(xp: Any, b: Any, opens: Any, closes: Any, rows: int, values: dict[str, tuple[int, bool]]) -> int | None:
    """The number of keys (strings followed by a colon), where each key read is spelled without escapes and
    holds a value of its kind, and a row's own field occurs at most `rows` times; else None."""
    shown = xp.flatnonzero(b != SPACE)
    padded = xp.concatenate([b, xp.asarray([NEWLINE], dtype=b.dtype)])  # a newline past the end
    after = _after(xp, shown, closes, b.size)
    is_key = padded[after] == COLON
    # A key with an escape may spell a name read in other characters: refused. (A string followed by a colon
    # is a key exactly where the line is JSON, which _grammar checks; a line that is not is refused there.)
    slashes = xp.concatenate([xp.zeros(1, xp.int32), xp.cumsum(b == BACKSLASH, dtype=xp.int32)])
    if _any((slashes[closes] - slashes[opens] > 0) & is_key):
        return None
    key_opens, lengths = opens[is_key], (closes - opens - 1)[is_key]
    value = padded[_after(xp, shown, after[is_key], b.size)]  # the first byte after each key's colon
    for name, (opening, once_a_row) in values.items():
        spelled = name.encode("utf-8")
        hit = lengths == len(spelled)
        for i, byte in enumerate(spelled):
            hit &= padded[xp.minimum(key_opens + 1 + i, b.size)] == byte
        if _any(hit & (value != opening)) or (once_a_row and int(hit.sum()) > rows):
            return None
    return int(is_key.sum())


def _grammar(xp: Any, skeleton: Any) -> bool:
    """Whether each line that is not blank is one JSON object by the grammar, its tokens (strings emptied; a
    number or literal is one token) in place: a line opens with a brace and ends where it closes (`{...}}` and
    `{...},{}` are two values), brackets of one kind open and close, a key and a colon before each value of
    an object, a comma between values and none after the last, nesting no deeper than the strict parser
    reads."""
    s = skeleton
    quote = s == QUOTE
    atom = _table(xp, _NUMBER + _LETTERS)[s]
    opening = (s == LBRACE) | (s == LBRACKET)
    closing = (s == RBRACE) | (s == RBRACKET)
    depth = xp.cumsum(opening.astype(xp.int32) - closing.astype(xp.int32), dtype=xp.int32)  # after each byte
    if int(depth.max()) > MAX_DEPTH:
        return False
    starts_token = (quote & ((xp.cumsum(quote, dtype=xp.int32) & 1) == 1)) | (atom & ~_shifted(xp, atom, -1, False)) \
        | _table(xp, b"{}[],:\n")[s]
    places = xp.flatnonzero(starts_token)
    t = xp.where(atom, ATOM, s)[places]
    if t.size == 0:
        return True
    before, after = _shifted(xp, t, -1, NEWLINE), _shifted(xp, t, 1, NEWLINE)
    if _any((t != NEWLINE) & (before == NEWLINE) & (t != LBRACE)):
        return False  # a line that does not open with a brace
    is_open, is_close = opening[places], closing[places]
    order = xp.arange(t.size, dtype=xp.int64)
    openers = xp.flatnonzero(is_open)
    width = t.size + 1
    opener_keys = xp.sort(depth[places][openers].astype(xp.int64) * width + openers)  # by (level, place)

    def enclosing(level: Any) -> Any:
        """The bracket that opened last at each token's `level` before it (NEWLINE at level 0: none)."""
        if not opener_keys.size:
            return xp.full(t.size, NEWLINE, t.dtype)
        found = opener_keys[xp.maximum(xp.searchsorted(opener_keys, level.astype(xp.int64) * width + order) - 1, 0)]
        has = (level > 0) & (found // width == level)
        return xp.where(has, t[found % width], NEWLINE)

    # Each token's container (for a closing bracket, the one it closes), and the container a closing bracket
    # leaves its value in.
    container = enclosing(depth[places] + is_close.astype(xp.int32))
    outer = enclosing(depth[places])
    in_object, in_list = container == LBRACE, container == LBRACKET
    before2 = _shifted(xp, t, -2, NEWLINE)
    starts_value = _table(xp, b'{["a')[after]
    is_key = (t == QUOTE) & in_object & ((before == LBRACE) | (before == COMMA))
    # What may follow a value: a comma or the bracket closing its container (a line's last brace: the end).
    ends_in = xp.where(is_close, outer, container)
    follow_ok = (after == COMMA) | ((ends_in == LBRACE) & (after == RBRACE)) | ((ends_in == LBRACKET) & (after == RBRACKET)) \
        | ((ends_in == NEWLINE) & (after == NEWLINE))
    is_value_end = ((t == QUOTE) & ~is_key) | (t == ATOM) | is_close
    wrong = ((t == LBRACE) & (after != QUOTE) & (after != RBRACE)) \
        | ((t == LBRACKET) & ~starts_value & (after != RBRACKET)) \
        | (is_key & (after != COLON)) \
        | ((t == COLON) & ~(in_object & (before == QUOTE) & ((before2 == LBRACE) | (before2 == COMMA)) & starts_value)) \
        | ((t == COMMA) & ~((in_object & (after == QUOTE)) | (in_list & starts_value))) \
        | (is_value_end & ~follow_ok) \
        | ((t == RBRACE) & (container != LBRACE)) | ((t == RBRACKET) & (container != LBRACKET))
    return not _any(wrong)


def _atoms_valid(xp: Any, skeleton: Any) -> bool:
    """Whether every value outside strings (a run of number and literal bytes) is true, false, null or a
    number as JSON writes it (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?) that a double holds: fewer than
    LONG_DIGITS digits in a row, and an exponent of at most two digits (under both, a number stays below
    1e299)."""
    s = skeleton
    atom = _table(xp, _NUMBER + _LETTERS)[s]
    if not _any(atom):
        return True
    prev, nxt = _shifted(xp, s, -1, SPACE), _shifted(xp, s, 1, SPACE)
    start = atom & ~_shifted(xp, atom, -1, False)
    starts = xp.flatnonzero(start)
    ends = xp.flatnonzero(atom & ~_shifted(xp, atom, 1, False)) + 1
    first = s[starts]
    if _any(~_table(xp, b"-0123456789tfn")[first]):
        return False
    # Literals: the whole run spells one.
    word = _table(xp, b"tfn")[first]
    spelled = xp.zeros(starts.size, dtype=xp.bool_)
    padded = xp.concatenate([s, xp.full(5, SPACE, dtype=s.dtype)])
    for literal in LITERALS:
        same = ends - starts == len(literal)
        for i, byte in enumerate(literal):
            same &= padded[starts + i] == byte
        spelled |= same
    if _any(word & ~spelled):
        return False
    # Numbers: each byte against its neighbours in the run.
    run = xp.maximum(xp.cumsum(start, dtype=xp.int32) - 1, 0)  # the run each byte is in (where atom)
    number = atom & ~word[run]
    digit = _table(xp, b"0123456789")
    is_digit, next_digit, prev_digit = digit[s], digit[nxt], digit[prev]
    exp = (s == ord("e")) | (s == ord("E"))
    after_exp = _shifted(xp, exp, -1, False)
    minus, plus, dot = s == ord("-"), s == ord("+"), s == ord(".")
    sign_next = (nxt == ord("-")) | (nxt == ord("+"))
    wrong = (_table(xp, _LETTERS)[s] & ~exp) \
        | (minus & ~(start | after_exp)) | ((minus | plus) & ~next_digit) | (plus & ~after_exp) \
        | (dot & ~(prev_digit & next_digit)) | (exp & ~(prev_digit & (next_digit | sign_next))) \
        | ((s == ord("0")) & next_digit & (start | (_shifted(xp, start, -1, False) & (prev == ord("-")))))
    if _any(number & wrong):
        return False
    # At most one dot and one exponent in a run, the dot first.
    exps, dots = (xp.cumsum(number & flag, dtype=xp.int32) for flag in (exp, dot))
    for counted in (exps, dots):
        before = xp.where(starts > 0, counted[xp.maximum(starts - 1, 0)], 0)
        if _any(counted[ends - 1] - before > 1):
            return False
    exps_before = xp.where(starts > 0, exps[xp.maximum(starts - 1, 0)], 0)
    if _any(number & dot & (exps - exps_before[run] > 0)):
        return False
    # Digits a double may not hold: a long run, or an exponent of three digits or more.
    run_start = is_digit & ~prev_digit
    lengths = xp.flatnonzero(is_digit & ~next_digit) + 1 - xp.flatnonzero(run_start)
    if lengths.size and int(lengths.max()) >= LONG_DIGITS:
        return False
    digits_from = xp.zeros(s.size + 2, dtype=xp.int64)
    digits_from[xp.flatnonzero(run_start)] = lengths
    exponent = xp.flatnonzero(number & exp)
    return not _any(digits_from[exponent + 1 + sign_next[exponent].astype(xp.int64)] >= 3)
