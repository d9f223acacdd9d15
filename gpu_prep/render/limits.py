"""The limits a chat template's renders are held to, and the checks made before a value is built.

Jinja's sandbox keeps a template from the interpreter, not from running forever or filling memory, and a
template is code every row runs. So templates are held to limits too: a time budget per row
(input.template_time_limit) and a size cap (input.template_max_chars) on what a template writes and on every
value it builds. Rows render in worker threads, so nothing here uses signals; the deadline is checked from
inside the template instead (environment.py puts the checks there):

- every `{% for %}` iterable is wrapped, in the parsed template before it is compiled, so the deadline is
  checked while it iterates (nested loops over range(100000) end in time), and every call checks it (macros
  included, so a macro that calls itself twice over is caught);
- the operators that multiply sizes (`*`, `**`, `+`, `%`), the str methods and filters that take a width or
  repeat text, and joins are measured *before* they run (the checks below), so `'x' * 10**9` or
  `10 ** 10 ** 10` never start; the lists, dicts, tuples and `~` strings a template builds, and every
  filter's and call's result, are measured after (Budget.sized);
- blocks a template buffers (macros, `{% set %}` blocks, caller()) are measured before they are joined, and
  the output is streamed and stopped as soon as it passes the cap (sandbox.py).

A render that breaks a limit raises TemplateLimit, a TemplateError, so every caller that handles a
template's refusal handles it; row.py tells a broken limit (template_limit) from a refusal (template_error).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import jinja2

from gpu_prep.render.generation import _Message

DEFAULT_TIME_LIMIT = 2.0  # seconds: input.template_time_limit's default
DEFAULT_MAX_CHARS = 4_000_000  # input.template_max_chars with preprocessing.max_chars at its default
MAX_INT_BITS = 16_384  # numbers a template computes (Python prints no more than 4300 digits, ~14,300 bits)
WRITTEN_FACTOR = 8  # what a render prints, all blocks together, against the cap: a macro's output printed
# again by the macro that calls it counts twice, so there is room for templates that nest macros


class TemplateLimit(jinja2.exceptions.TemplateError):
    """A render broke a limit: input.template_time_limit or input.template_max_chars."""


class Budget:
    """The limits a row's renders are held to: the time the template may spend on the row, all its renders
    together (the real one, the placeholder renders that locate contents, structured truncation's), and the
    characters any one value or output may have. One per row, held per thread: no deadline is shared between
    the threads that render."""

    __slots__ = ("deadline", "exceeded", "left", "max_chars", "time_limit", "written")

    def __init__(self, time_limit: float, max_chars: int) -> None:
        self.time_limit = time_limit
        self.max_chars = max_chars
        self.left = time_limit  # seconds the template has not spent yet
        self.deadline = math.inf  # while a render runs: when its time is up
        self.written = 0  # characters the render in progress printed with {{ }} in macros and set blocks
        self.exceeded: str | None = None  # the first limit broken, worded for a drop's detail

    def begin(self) -> None:
        """A render starts: only time spent inside the template counts (not tokenizing between renders)."""
        self.deadline = time.monotonic() + self.left
        self.written = 0

    def end(self) -> None:
        self.left = self.deadline - time.monotonic()
        self.deadline = math.inf

    def fail(self, detail: str) -> NoReturn:
        if self.exceeded is None:
            self.exceeded = detail
        raise TemplateLimit(detail)

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            self.fail(f"input.template_time_limit: the chat template ran past {self.time_limit:g} s on this row")

    def check_size(self, size: int, what: str | Callable[[], str]) -> None:
        """what: the value measured, in words (or a function that words it, so a check that passes costs no
        formatting)."""
        if size > self.max_chars:
            what = what if isinstance(what, str) else what()
            self.fail(f"input.template_max_chars: {what} would be over {self.max_chars:,} characters")

    def too_many_bits(self, what_is: str) -> None:
        self.fail(f"input.template_max_chars: {what_is} a number of over {MAX_INT_BITS:,} bits, more than a chat "
                  "template needs")

    def sized(self, value: Any, what: str | Callable[[], str]) -> Any:
        """value, once it is known to be within the cap (strings by length; lists, dicts and the like by the
        characters they would print as; numbers by their bits)."""
        kind = type(value)
        if kind is str:
            if len(value) > self.max_chars:
                self.check_size(len(value), what)
        elif kind is int:
            if value.bit_length() > MAX_INT_BITS:
                self.too_many_bits(f"{what if isinstance(what, str) else what()} is")
        elif kind in _SCALARS:
            pass
        elif kind in _CONTAINERS or issubclass(kind, _MEASURED):
            self.check_size(printed_size(value, self.max_chars), what)
        return value


_MEASURED = (str, bytes, list, tuple, dict, set, frozenset, jinja2.utils.Namespace)
_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})
_SEQUENCES = frozenset({list, tuple, set, frozenset})
_SCALARS = frozenset({bool, float, type(None)})


class _Limits(threading.local):
    """Per thread: the Budget of the row being rendered (row_limits; None: each render has its own) and that
    of the render in progress, which the guards read."""

    row: Budget | None = None
    budget: Budget | None = None


_limits = _Limits()


def _current() -> Budget:
    """The budget of the render running on this thread; outside one (Jinja folding constants while it
    compiles), no time limit and the default cap."""
    budget = _limits.budget
    return budget if budget is not None else Budget(math.inf, DEFAULT_MAX_CHARS)


@contextmanager
def row_limits(time_limit: float, max_chars: int) -> Iterator[Budget]:
    """Every render of one row on this thread, inside the block, shares one Budget; after the block,
    budget.exceeded says whether (and which) limit the row broke."""
    previous = _limits.row
    budget = _limits.row = Budget(time_limit, max_chars)
    try:
        yield budget
    finally:
        _limits.row = previous


def printed_size(value: Any, limit: int, indent: int = 0, separator: int = 2) -> int:
    """About how many characters str() or json.dumps would write for value, counted only until the count
    passes limit (so measuring a huge value costs no more than the limit). A part that appears twice counts
    twice, as it would be written twice: [x, x] nested twenty deep is one list in memory and a million x's
    on paper. indent and separator: json.dumps' indentation and the length of its separators."""
    total = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        kind = type(item)  # by type first: isinstance on a namespace goes through its __getattribute__
        if kind is str or kind is bytes:
            total += len(item) + 2
        elif kind in _SCALARS:
            total += 24
        elif kind is int:
            total += item.bit_length() * 3 // 10 + 2
        elif kind is dict or kind is _Message or (kind not in _SEQUENCES and issubclass(kind, dict)):
            total += 2 + len(item) * (2 * separator + indent * (depth + 1) + 1)
            if total > limit:
                return total
            for key, inner in item.items():
                push((key, depth + 1))
                push((inner, depth + 1))
        elif kind in _SEQUENCES or issubclass(kind, (list, tuple, set, frozenset)):
            total += 2 + len(item) * (separator + indent * (depth + 1) + 1)
            if total > limit:
                return total
            for inner in item:
                push((inner, depth + 1))
        elif issubclass(kind, (str, bytes)):
            total += len(item) + 2
        elif issubclass(kind, int):
            total += item.bit_length() * 3 // 10 + 2
        elif issubclass(kind, jinja2.utils.Namespace):
            push((object.__getattribute__(item, "_Namespace__attrs"), depth))
            total += 14
        else:  # an undefined value, a macro, a loop: a short repr
            total += 16
        if total > limit:
            return total
    return total


# ---------------------------------------------------------------- checks made before a value is built


def _arg(args: tuple, kwargs: dict, position: int, name: str, default: Any) -> Any:
    return args[position] if len(args) > position else kwargs.get(name, default)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _check_repeat(budget: Budget, left: Any, right: Any) -> None:
    """`*`: a string or list times a number, or two numbers, measured before they are multiplied."""
    if type(left) is int and type(right) is int:
        if left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
            budget.too_many_bits("the * operator's result would be")
        return
    for seq, times in ((left, right), (right, left)):
        if isinstance(times, int) and times > 1:
            if isinstance(seq, str):
                budget.check_size(len(seq) * times, "the * operator's result")
            elif isinstance(seq, (list, tuple)):
                budget.check_size(printed_size(seq, budget.max_chars // times + 1) * times,
                                  "the * operator's result")


def _check_power(budget: Budget, base: Any, exponent: Any) -> None:
    """`**` on whole numbers: refused before Python spends minutes (or all memory) computing the power."""
    if (isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1
            and (abs(base).bit_length() - 1) * exponent > MAX_INT_BITS):
        budget.too_many_bits("the ** operator's result would be")


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*?:([^{}]*)\}")


def _check_widths(budget: Budget, numbers: Iterable[str], starred: bool, values: Any, what: str) -> None:
    """Widths and precisions written in a format string, and (where it takes them from its arguments) the
    numbers passed, must be within the cap: '%0999999999d' would otherwise build a gigabyte."""
    for number in numbers:
        if number.isdigit() and (len(number) > 9 or int(number) > budget.max_chars):  # (a width of 10 digits:
            budget.check_size(int(number) if len(number) <= 9 else budget.max_chars + 1, what)  # over any cap)
    if starred:
        items = values.values() if isinstance(values, dict) else values if isinstance(values, tuple) else (values,)
        for item in items:
            if isinstance(item, int) and abs(item) > budget.max_chars:
                budget.check_size(abs(item), what)


def _check_percent(budget: Budget, fmt: str, values: Any, what: str = "the % operator's result") -> None:
    if "%" not in fmt:
        return
    specs = _PERCENT_SPEC.findall(fmt)
    numbers = [n for spec in specs for n in spec if n]
    _check_widths(budget, numbers, "*" in numbers, values, what)


def _check_brace(budget: Budget, fmt: str, args: tuple, kwargs: dict) -> None:
    if "{" not in fmt:
        return
    specs = _BRACE_SPEC.findall(fmt)
    numbers = re.findall(r"\d+", " ".join(specs))
    nested = re.search(r"\{[^{}]*:[^{}]*\{", fmt) is not None  # a width taken from the arguments
    _check_widths(budget, numbers, nested, (*args, *kwargs.values()), "str.format's result")


def _check_replace(budget: Budget, text: str, old: Any, new: Any, count: Any, what: str) -> None:
    old, new = _text(old), _text(new)
    if old and len(new) <= len(old):
        return  # it cannot grow
    found = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    budget.check_size(len(text) + found * max(len(new) - len(old), 0), what)


def _check_join(budget: Budget, items: Any, glue: Any, what: str) -> Any:
    """The joined length, from the items (made a list first, so a generator is not consumed twice)."""
    if isinstance(items, str):
        budget.check_size(len(items) * (1 + len(_text(glue))), what)
        return items
    items = items if isinstance(items, (list, tuple)) else list(items)
    budget.check_size(printed_size(items, budget.max_chars) + len(items) * len(_text(glue)), what)
    return items


_SIZING_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "replace", "join", "translate"})
_METHOD_RESULTS = {name: f"str.{name}'s result" for name in _SIZING_METHODS}


def _str_method_arguments(budget: Budget, method: Any, args: tuple, kwargs: dict) -> tuple:
    """A str method that pads, repeats or joins, measured before it runs (the arguments it is called with:
    join's iterable made a list)."""
    name, text = method.__name__, method.__self__
    what = _METHOD_RESULTS[name]
    if name in ("center", "ljust", "rjust", "zfill"):
        width = _arg(args, kwargs, 0, "width", 0)
        if isinstance(width, int):
            budget.check_size(width, what)
    elif name == "expandtabs":
        size = _arg(args, kwargs, 0, "tabsize", 8)
        if isinstance(size, int):
            budget.check_size(len(text) + text.count("\t") * size, what)
    elif name == "replace" and len(args) >= 2:
        _check_replace(budget, text, args[0], args[1], _arg(args, kwargs, 2, "count", -1), what)
    elif name == "join" and args:
        args = (_check_join(budget, args[0], text, what), *args[1:])
    elif name == "translate" and args and isinstance(args[0], dict):  # each character may become a string
        longest = max((len(v) for v in args[0].values() if isinstance(v, (str, bytes))), default=1)
        budget.check_size(len(text) * longest, what)
    return args


# Per filter: a check of its value and arguments made before it runs; it returns the value to run on.
def _filter_indent(budget: Budget, value: Any, args: tuple, kwargs: dict) -> Any:
    text, width = _text(value), _arg(args, kwargs, 0, "width", 4)
    per_line = width if isinstance(width, int) else len(_text(width))
    budget.check_size(len(text) + (text.count("\n") + 1) * max(per_line, 0), "the indent filter's result")
    return text


def _filter_wordwrap(budget: Budget, value: Any, args: tuple, kwargs: dict) -> Any:
    text, width = _text(value), _arg(args, kwargs, 0, "width", 79)
    wrap = _arg(args, kwargs, 2, "wrapstring", None)
    lines = len(text) // max(width, 1) + text.count("\n") + 1 if isinstance(width, int) else len(text)
    budget.check_size(len(text) + lines * len(_text(wrap) if wrap is not None else "\n"), "the wordwrap filter's result")
    return text


def _filter_replace(budget: Budget, value: Any, args: tuple, kwargs: dict) -> Any:
    text = _text(value)
    if len(args) >= 2:
        _check_replace(budget, text, args[0], args[1], _arg(args, kwargs, 2, "count", None), "the replace filter's result")
    return text


def _filter_join(budget: Budget, value: Any, args: tuple, kwargs: dict) -> Any:
    return _check_join(budget, value, _arg(args, kwargs, 0, "d", ""), "the join filter's result")


def _filter_format(budget: Budget, value: Any, args: tuple, kwargs: dict) -> Any:
    text = _text(value)
    _check_percent(budget, text, kwargs or tuple(args), "the format filter's result")
    return text


def _filter_tojson(budget: Budget, value: Any, args: tuple, kwargs: dict) -> Any:
    indent = _arg(args, kwargs, 1, "indent", None)
    width = indent if isinstance(indent, int) else len(indent) if isinstance(indent, str) else 0
    separators = _arg(args, kwargs, 2, "separators", None)
    separator = sum(len(_text(s)) for s in separators) if isinstance(separators, (list, tuple)) else 2
    budget.check_size(printed_size(value, budget.max_chars, max(width, 0), separator), "the tojson filter's result")
    return value


def _filter_sum(budget: Budget, value: Any, args: tuple, kwargs: dict) -> Any:
    """sum(start=[]) adds lists: their total, measured before sum builds it."""
    items = value if isinstance(value, (list, tuple)) else list(value)
    budget.check_size(printed_size(items, budget.max_chars), "the sum filter's result")
    return items


def _filter_pprint(budget: Budget, value: Any, args: tuple, kwargs: dict) -> Any:
    budget.check_size(printed_size(value, budget.max_chars, indent=1), "the pprint filter's result")
    return value


_FILTER_CHECKS = {"indent": _filter_indent, "wordwrap": _filter_wordwrap, "replace": _filter_replace,
                  "join": _filter_join, "format": _filter_format, "tojson": _filter_tojson, "sum": _filter_sum,
                  "pprint": _filter_pprint}
