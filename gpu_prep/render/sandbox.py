"""Chat templates rendered in Jinja's sandbox, with the environment transformers gives them.

Same options (trim_blocks, lstrip_blocks, loop controls, a {% generation %} tag), the same globals
(raise_exception, strftime_now, dict, namespace) and the same tojson filter, so a template renders here
exactly as `apply_chat_template(..., tokenize=False)` renders it. Nothing in a config is evaluated as code:
templates can only reach what the sandbox allows.

The sandbox keeps a template from the interpreter, not from running forever or filling memory, and a template
is code every row runs. So templates are held to limits too: a time budget per row (input.template_time_limit)
and a size cap (input.template_max_chars) on what a template writes and on every value it builds. Rows render
in worker threads, so nothing here uses signals; the deadline is checked from inside the template instead:

- every `{% for %}` iterable is wrapped, in the parsed template before it is compiled, so the deadline is
  checked while it iterates (nested loops over range(100000) end in time), and every call checks it (macros
  included, so a macro that calls itself twice over is caught);
- the operators that multiply sizes (`*`, `**`, `+`, `%`), the str methods and filters that take a width or
  repeat text, and joins are measured *before* they run, so `'x' * 10**9` or `10 ** 10 ** 10` never start;
  the lists, dicts, tuples and `~` strings a template builds, and every filter's and call's result, are
  measured after;
- blocks a template buffers (macros, `{% set %}` blocks, caller()) are measured before they are joined, and
  the output is streamed and stopped as soon as it passes the cap.

A render that breaks a limit raises TemplateLimit; any other exception a template raises (ZeroDivisionError,
TypeError, RecursionError, MemoryError, ...) becomes a TemplateFailure carrying its message. Both are
TemplateErrors, so every caller that handles a template's refusal (a row drop, the Jinja-free path's probes)
handles them; render.py tells a broken limit (template_limit) from a refusal (template_error).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from functools import cached_property, lru_cache, update_wrapper
from itertools import islice
from typing import TYPE_CHECKING, Any, NoReturn

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment
from jinja2.utils import _PassArg
from jinja2.visitor import NodeTransformer

from gpu_prep.errors import ConfigError

if TYPE_CHECKING:
    from gpu_prep.format import Message

GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
_tracking = threading.local()  # the rendering in progress on this thread that records generation spans

DEFAULT_TIME_LIMIT = 2.0  # seconds: input.template_time_limit's default
DEFAULT_MAX_CHARS = 4_000_000  # input.template_max_chars with preprocessing.max_chars at its default
MAX_INT_BITS = 16_384  # numbers a template computes (Python prints no more than 4300 digits, ~14,300 bits)
WRITTEN_FACTOR = 8  # what a render prints, all blocks together, against the cap: a macro's output printed
# again by the macro that calls it counts twice, so there is room for templates that nest macros
_DETAIL_CHARS = 500  # a template's own message is cut to this many characters in a drop's detail
_CHUNK = 16  # output pieces read at a time before the output is measured again


class TemplateLimit(jinja2.exceptions.TemplateError):
    """A render broke a limit: input.template_time_limit or input.template_max_chars."""


class TemplateFailure(jinja2.exceptions.TemplateError):
    """Any other exception a template raised while rendering, as a TemplateError with the exception's type
    and message, so that whoever handles a template's refusal handles it too, never a traceback."""


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
_BOUNDED_OWNERS = frozenset({str, bytes, list, tuple, dict})  # (and _Message, added below)
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
# Filters left as they are: what they return is no larger than what they are given (upper's 'ß' -> 'SS' at
# most triples a string, once), and their work is a pass or a sort over it; so every value they could make is
# bounded by values already measured. Wrapping them would cost every template a call per use of |trim or
# |length. (map, select and the like call other filters and tests through the environment: those are guarded.)
# escape and urlencode are not among them: each use grows a string again (& -> &amp; -> &amp;amp;).
_BOUNDED_FILTERS = frozenset({
    "abs", "attr", "bool", "capitalize", "count", "d", "default", "dictsort", "filesizeformat", "first", "float",
    "groupby", "int", "items", "last", "length", "lower", "map", "max", "min", "random", "reject", "rejectattr",
    "reverse", "round", "safe", "select", "selectattr", "sort", "string", "striptags", "title", "trim", "unique",
    "upper", "wordcount",
})
# Filters whose whole-number arguments are sizes (a width, a count of rows or slices): each must be within the cap.
_SIZE_ARGUMENTS = frozenset({"center", "indent", "batch", "slice", "wordwrap", "tojson", "truncate"})
# Filters that yield lists they build (padded with fill_with): each is measured. The others yield what they
# were given (select, map(attribute=...)), already measured, or values another filter measured (map('upper')).
_BUILDS_ITEMS = frozenset({"batch", "slice"})


def _guard_filter(name: str, function: Any) -> Any:
    """The filter, checking the deadline, measuring its arguments where they set a size and its result
    after (an iterator it returns is checked item by item as it is read)."""
    check = _FILTER_CHECKS.get(name)
    first = 1 if _PassArg.from_obj(function) is not None else 0  # the context or environment Jinja passes first
    sizes = name in _SIZE_ARGUMENTS
    builds = name in _BUILDS_ITEMS
    what = f"the {name} filter's result"

    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = _current()
        budget.check_time()
        if len(args) > first:
            rest = args[first + 1:]
            if sizes:
                for number in (*rest, *kwargs.values()):
                    if type(number) is int and abs(number) > budget.max_chars:
                        budget.check_size(abs(number), f"the {name} filter's argument {number:,}")
            if check is not None:
                args = (*args[:first], check(budget, args[first], rest, kwargs), *rest)
        result = function(*args, **kwargs)
        kind = type(result)
        if kind is str:
            if len(result) > budget.max_chars:
                budget.check_size(len(result), what)
            return result
        if kind is types.GeneratorType or (kind not in _CONTAINERS and hasattr(kind, "__next__")):
            return _checked_items(result, budget, what if builds else None)
        return budget.sized(result, what)

    return update_wrapper(guarded, function)  # keeps the pass_context / pass_environment marks


def _checked_items(items: Iterator[Any], budget: Budget, what: str | None) -> Iterator[Any]:
    """A filter's items as they are read: the deadline checked, and each measured when what names them."""
    for n, item in enumerate(items):
        if not n & 15:
            budget.check_time()
        yield item if what is None else budget.sized(item, what)


class _Looped:
    """A {% for %} loop's iterable, checking the deadline as the loop goes (its length kept, for loop.length)."""

    __slots__ = ("budget", "iterable")

    def __init__(self, iterable: Any, budget: Budget) -> None:
        self.iterable = iterable
        self.budget = budget

    def __len__(self) -> int:
        return len(self.iterable)

    def __iter__(self) -> Iterator[Any]:
        return _checked_items(iter(self.iterable), self.budget, None)


def _guard_loop(iterable: Any) -> Any:
    """A loop's iterable, checked as the loop goes; a short list, tuple or dict (a conversation's messages)
    is checked once as its loop starts: its body runs a few times, and any loop or call inside checks again."""
    budget = _current()
    if type(iterable) in _SHORT_CHECKED and len(iterable) <= 64:
        budget.check_time()
        return iterable
    return _Looped(iterable, budget)


_SHORT_CHECKED = frozenset({list, tuple, dict, range})


def _guard_printed(value: Any) -> str:
    """A {{ }} inside a macro, {% set %} block or call block, counted: what a render buffers so may not pass
    WRITTEN_FACTOR times the cap. Measuring each block only when it is joined would leave a macro free to
    buffer a fresh copy of a long string on every turn of a loop until the time ran out (gigabytes, in two
    seconds). What the template prints outside such blocks is counted as it streams out (_generate)."""
    text = value if type(value) is str else str(value)
    budget = _current()
    budget.written += len(text)
    if budget.written > WRITTEN_FACTOR * budget.max_chars:
        budget.fail(f"input.template_max_chars: the chat template printed over {WRITTEN_FACTOR} times "
                    f"{budget.max_chars:,} characters in its macros and set blocks")
    return text


def _guard_built(value: Any) -> Any:
    return _current().sized(value, "a value the chat template builds (with + or ~, or a list or dict)")


LOOP_FILTER = "gpu_prep_loop"  # filter names templates cannot redefine (filters come from the environment)
BUILT_FILTER = "gpu_prep_built"
PRINTED_FILTER = "gpu_prep_printed"


class _Guards(NodeTransformer):
    """Rewrites a parsed template so the limits are checked where a template could otherwise run on
    unseen: each {% for %} iterates through LOOP_FILTER, each list, tuple, dict or ~ concatenation it builds
    from variables goes through BUILT_FILTER, each {{ }} inside a block that is buffered goes through
    PRINTED_FILTER. The rest is checked in _Environment."""

    def __init__(self) -> None:
        self.buffered = 0  # how deep in macros, call blocks, {% set %} and {% filter %} blocks the visit is

    def _buffer(self, node: nodes.Node) -> nodes.Node:
        self.buffered += 1
        try:
            return self.generic_visit(node)
        finally:
            self.buffered -= 1

    visit_Macro = visit_CallBlock = visit_AssignBlock = visit_FilterBlock = _buffer

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        node = self.generic_visit(node)
        if self.buffered:
            node.nodes = [child if isinstance(child, (nodes.TemplateData, nodes.Const))
                          else nodes.Filter(child, PRINTED_FILTER, [], [], None, None, lineno=child.lineno)
                          for child in node.nodes]
        return node

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, LOOP_FILTER, [], [], None, None, lineno=node.lineno)
        return node

    def _built(self, node: nodes.Expr) -> nodes.Node:
        node = self.generic_visit(node)
        if getattr(node, "ctx", "load") != "load":
            return node  # a tuple assigned to ({% for a, b in ... %}), not built
        return self._measured(node, _parts(node))

    visit_List = visit_Tuple = visit_Dict = visit_Concat = _built

    def visit_Add(self, node: nodes.Add) -> nodes.Node:
        """A chain of + (a + b + c) is measured once, as a whole, like a ~ concatenation: + is the operator
        templates use most, and one check per chain costs a fraction of one per operator."""
        operands: list[nodes.Node] = []
        self._visit_chain(node, operands)
        return self._measured(node, operands)

    def _visit_chain(self, node: nodes.Add, operands: list[nodes.Node]) -> None:
        for side in ("left", "right"):
            child = getattr(node, side)
            if isinstance(child, nodes.Add):
                self._visit_chain(child, operands)
            else:
                setattr(node, side, self.visit(child))
                operands.append(getattr(node, side))

    @staticmethod
    def _measured(node: nodes.Expr, parts: list[nodes.Node]) -> nodes.Node:
        """node, measured when built if two or more of its parts are variables. With one, what it builds is
        that part plus the template's own text, which grows by no more than that text each time (so a loop
        cannot double it); with two, `{% set ns.s = ns.s ~ ns.s %}` doubles a string each turn of a loop, a
        megabyte after twenty turns and all memory after forty."""
        if sum(not isinstance(part, (nodes.Const, nodes.TemplateData)) for part in parts) < 2:
            return node
        return nodes.Filter(node, BUILT_FILTER, [], [], None, None, lineno=node.lineno)


def _parts(node: nodes.Node) -> list[nodes.Node]:
    """The values a list, tuple, dict or ~ concatenation is built from."""
    if isinstance(node, nodes.Dict):
        return [part for pair in node.items for part in (pair.key, pair.value)]
    return list(node.nodes if isinstance(node, nodes.Concat) else node.items)


class _Tracker:
    def __init__(self) -> None:
        self.length = 0  # characters the template has written so far
        self.spans: list[tuple[int, int, int | None]] = []  # start, end, the message it was writing
        self.message: int | None = None  # the message the template last read from


class _Message(dict):
    """A message that tells the tracker when the template reads it (so a generation span is known to be
    that message's, even where the template writes no content for it, as for a tool call)."""

    # Underscored, so the sandbox hides it: a template reads only the message's own keys.
    __slots__ = ("_gpu_prep_index",)


_OPERATOR_RESULTS = {op: f"the {op} operator's result" for op in ("*", "**", "%")}


class _Environment(ImmutableSandboxedEnvironment):
    # Jinja sends these operators to call_binop (and folds none of them while compiling, so `10 ** 10 ** 10`
    # is not computed by the compiler either).
    # (+ is measured by chains instead, by _Guards.visit_Add: a template adds strings far more than it
    # multiplies them, and a call per + would cost more than the rest of the guards together.)
    intercepted_binops = frozenset({"*", "**", "%"})

    def getitem(self, obj: Any, argument: Any) -> Any:
        if type(obj) is _Message:
            _read(obj)
        return super().getitem(obj, argument)

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is _Message:
            _read(obj)
        return super().getattr(obj, attribute)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Every call a template makes (a macro, caller(), a method, a global) checks the deadline, has its
        arguments measured where it pads, repeats or joins text, and its result measured."""
        budget = _limits.budget or _current()
        if time.monotonic() > budget.deadline:
            budget.check_time()
        kind = type(obj)
        if kind is types.BuiltinMethodType and type(obj.__self__) in _BOUNDED_OWNERS:
            # A method of a string, list or dict: what it returns is no larger than the value it is called
            # on, but for the methods that pad, repeat or join, measured before they run.
            if obj.__name__ in _SIZING_METHODS and isinstance(obj.__self__, (str, bytes)):
                args = _str_method_arguments(budget, obj, args, kwargs)
            return SandboxedEnvironment.call(self, context, obj, *args, **kwargs)
        if kind is types.FunctionType and isinstance(getattr(obj, "__wrapped__", None), types.BuiltinMethodType):
            method = obj.__wrapped__  # str.format, as the sandbox wraps it
            if method.__name__ in ("format", "format_map") and isinstance(method.__self__, str):
                if method.__name__ == "format_map" and len(args) == 1 and isinstance(args[0], dict):
                    _check_brace(budget, method.__self__, (), args[0])
                else:
                    _check_brace(budget, method.__self__, args, kwargs)
        result = SandboxedEnvironment.call(self, context, obj, *args, **kwargs)
        kind = type(result)
        if kind is str:
            if len(result) > budget.max_chars:
                budget.check_size(len(result), lambda: f"the result of {getattr(obj, '__name__', 'a call')}()")
            return result
        if kind in _SCALARS or kind is _Namespace:  # namespace(): made of values measured already
            return result
        return budget.sized(result, lambda: f"the result of {getattr(obj, '__name__', 'a call')}()")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "%" and type(left) is int and type(right) is int:  # loop.index % 2: no larger than right
            return left % right
        budget = _current()
        what = _OPERATOR_RESULTS[operator]
        if operator == "*":
            _check_repeat(budget, left, right)
        elif operator == "**":
            _check_power(budget, left, right)
        elif isinstance(left, str):  # % formatting
            _check_percent(budget, left, right)
        return budget.sized(self.binop_table[operator](left, right), what)

    def concat(self, pieces: Iterable[str]) -> str:  # type: ignore[override]
        """Joins a block the template buffered (a macro's output, a {% set %} block, caller()): measured
        before it is joined, since a loop in a macro can buffer a thousand copies of a long string."""
        if type(pieces) is not list:
            pieces = list(pieces)
        budget = _current()
        size = sum(map(len, pieces))
        if size > budget.max_chars:
            budget.check_size(size, "a block the chat template buffers (a macro, a set block)")
        return "".join(pieces)


def _read(message: _Message) -> None:
    tracker = getattr(_tracking, "tracker", None)
    if tracker is not None:
        tracker.message = message._gpu_prep_index


class _GenerationTag(Extension):
    """{% generation %}...{% endgeneration %} renders its body unchanged; while ChatTemplate.render_marked
    runs, it also records where the body lies in the output, as transformers does for
    return_assistant_tokens_mask: from the characters the template has yielded so far."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        body = caller()
        tracker = getattr(_tracking, "tracker", None)
        if tracker is not None:
            tracker.spans.append((tracker.length, tracker.length + len(body), tracker.message))
        return body


class _Namespace(jinja2.utils.Namespace):
    """A namespace that refuses underscore names, so templates cannot reach interpreter internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's own signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"templates may not set underscore attributes ({name!r})")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The template, parsed, rewritten by _Guards, compiled. Raises TemplateSyntaxError."""
    env = _Environment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: f if name in _BOUNDED_FILTERS else _guard_filter(name, f) for name, f in env.filters.items()}
    env.filters.update({LOOP_FILTER: _guard_loop, BUILT_FILTER: _guard_built, PRINTED_FILTER: _guard_printed})
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=dict,
                       namespace=_Namespace)
    tree = _Guards().visit(env.parse(source))
    tree.set_environment(env)
    return env.from_string(tree)


def _syntax_error(origin: str, source: str, exc: Exception) -> ConfigError:
    """A template that does not compile, as a config error naming the template, the line and its text."""
    if isinstance(exc, jinja2.exceptions.TemplateSyntaxError) and exc.lineno:
        lines = source.splitlines()
        text = lines[exc.lineno - 1].strip() if 0 < exc.lineno <= len(lines) else ""
        shown = text if len(text) <= 200 else text[:200] + " ..."
        return ConfigError(f"{origin} has a syntax error at line {exc.lineno}: {exc.message}\n"
                           f"  line {exc.lineno}: {shown}")
    return ConfigError(f"{origin} cannot be compiled: {type(exc).__name__}: {_cut(str(exc))}")


def _cut(text: str) -> str:
    return text if len(text) <= _DETAIL_CHARS else f"{text[:_DETAIL_CHARS]}... ({len(text):,} characters)"


REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' names for a message's reasoning


def _as_transformers_passes(message: Message) -> dict[str, Any]:
    """A message as transformers hands it to a template: keys whose value is None left out, and its
    reasoning under `thinking` and `reasoning_content` both (templates read one or the other)."""
    if any(v is None for v in message.values()):
        message = {k: v for k, v in message.items() if v is not None}
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is not None:
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


def _message(message: dict[str, Any], index: int) -> _Message:
    tracked = _Message(message)
    tracked._gpu_prep_index = index
    return tracked


_BOUNDED_OWNERS = _BOUNDED_OWNERS | {_Message}


def has_generation_markers(source: str) -> bool:
    return GENERATION_TAG.search(source) is not None


# What a template is tried on when it is made: one that cannot render this within the limits cannot render
# any row, and is refused once, up front, rather than on every row and every probe of the Jinja-free path.
_TRIAL = ({"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hello! How can I help?"})
_SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


class ChatTemplate:
    """A compiled template plus the variables it reads besides the conversation: the tokenizer's special
    tokens (bos_token, eos_token, ...) and the config's chat_template_kwargs, which win, as in transformers.

    Renders are held to limits: those of the row being rendered on this thread (row_limits, which render.py
    sets from the config), else the default ones per render. A template that does not compile, or that
    cannot render a two-message conversation within the default limits, is a ConfigError naming origin."""

    def __init__(self, source: str, special_tokens: dict[str, str], kwargs: dict[str, Any] | None = None, *,
                 origin: str = "the chat template") -> None:
        self.source = source
        self.origin = origin
        try:
            self.template = compile_template(source)
        except (jinja2.exceptions.TemplateError, RecursionError, MemoryError, ValueError) as exc:
            raise _syntax_error(origin, source, exc) from None
        self.variables = {**special_tokens, **(kwargs or {})}
        self.marked = has_generation_markers(source)
        self.unusable: str | None = None  # why no row can be rendered (a special token the tokenizer lacks)
        self._try()

    def _try(self) -> None:
        for attempt in (1, 2):  # a render held up once (a machine busy elsewhere) is no template that runs long
            try:
                with row_limits(DEFAULT_TIME_LIMIT, DEFAULT_MAX_CHARS):
                    self._generate(self._arguments(list(_TRIAL), None, None, False), None)
                return
            except TemplateLimit as exc:
                if attempt == 2 or "template_time_limit" not in str(exc):
                    raise ConfigError(f"{self.origin} broke its limits rendering a two-message conversation, as it "
                                      f"would on every row: {exc}") from None
            except jinja2.exceptions.UndefinedError as exc:
                # A special token the tokenizer lacks (Llama-2's template reads bos_token, T5's tokenizer has
                # none): undefined in every row's rendering too. Said where rows need the template
                # (context.render_context): a pretraining run never renders one.
                lacking = next((name for name in _SPECIAL_NAMES if f"'{name}' is undefined" in str(exc)), None)
                if lacking is not None:
                    self.unusable = (f"{self.origin} reads {lacking}, which the tokenizer does not have (as in "
                                     f"transformers, every row would fail: {exc}); give it in chat_template_kwargs "
                                     f"({{{lacking}: ...}}) or name a template made for this tokenizer")
                return
            except jinja2.exceptions.TemplateError:
                return  # it refuses this conversation (it wants a system message, say): rows will say what they make of it

    @cached_property
    def quotes_string_arguments(self) -> bool:
        """Whether the template writes a tool call's arguments given as a string (OpenAI's wire format) quoted,
        as a JSON string (tojson: Qwen2.5, Llama 3.1), rather than as given (Qwen3 tests `is string`)."""
        call = {"type": "function", "function": {"name": "probe", "arguments": '{"probe": 1}'}}
        try:
            with row_limits(DEFAULT_TIME_LIMIT, DEFAULT_MAX_CHARS):
                text = self.render([{"role": "user", "content": "Hello."},
                                    {"role": "assistant", "content": "", "tool_calls": [call]}])
        except Exception:  # noqa: BLE001  a template that refuses the probe writes no such call either
            return False
        return '\\"probe\\"' in text

    def _arguments(self, messages: list[Message], tools: list[Any] | None, documents: list[Any] | None,
                   add_generation_prompt: bool) -> dict[str, Any]:
        return {"messages": [_as_transformers_passes(m) for m in messages], "tools": tools, "documents": documents,
                "add_generation_prompt": add_generation_prompt, **self.variables}

    def render(self, messages: list[Message], tools: list[Any] | None = None,
               documents: list[Any] | None = None, add_generation_prompt: bool = False) -> str:
        return self._generate(self._arguments(messages, tools, documents, add_generation_prompt), None)

    def render_marked(self, messages: list[Message], tools: list[Any] | None = None,
                      documents: list[Any] | None = None) -> tuple[str, list[tuple[int, int, int | None]]]:
        """The rendering and the character spans its {% generation %} blocks wrote, in order, each with the
        index of the message the template last read from when the block ended (None: none)."""
        arguments = self._arguments(messages, tools, documents, False)
        arguments["messages"] = [_message(m, i) for i, m in enumerate(arguments["messages"])]
        tracker = _tracking.tracker = _Tracker()
        try:
            text = self._generate(arguments, tracker)
        finally:
            _tracking.tracker = None
        return text, tracker.spans

    def _generate(self, arguments: dict[str, Any], tracker: _Tracker | None) -> str:
        """The output, streamed and stopped once it passes the cap, under the row's budget on this thread,
        else a default one. Whatever the template raises comes out a TemplateError: TemplateLimit for a
        broken limit, the template's own error, or a TemplateFailure with its message."""
        budget = _limits.row or Budget(DEFAULT_TIME_LIMIT, DEFAULT_MAX_CHARS)
        previous = _limits.budget
        _limits.budget = budget
        budget.begin()
        # The compiled template's root function, not Template.generate: that one rewrites the traceback of
        # any error into template frames first, which takes seconds for a RecursionError, and nothing here
        # shows tracebacks.
        stream = self.template.root_render_func(self.template.new_context(arguments))
        pieces: list[str] = []
        length = 0
        try:
            if tracker is None:  # a few pieces at a time, read and measured by C code
                while chunk := list(islice(stream, _CHUNK)):
                    length += sum(map(len, chunk))
                    if length > budget.max_chars:
                        budget.check_size(length, "the chat template's output")
                    pieces += chunk
            else:  # piece by piece: a {% generation %} block reads tracker.length as it starts
                for piece in stream:
                    length += len(piece)
                    if length > budget.max_chars:
                        budget.check_size(length, "the chat template's output")
                    tracker.length += len(piece)
                    pieces.append(piece)
        except jinja2.exceptions.TemplateError as exc:
            if len(str(exc)) > _DETAIL_CHARS:  # raise_exception with a megabyte of text
                raise TemplateFailure(_cut(str(exc))) from None
            raise
        except Exception as exc:  # noqa: BLE001 - anything a template raises is the row's, never a traceback
            raise self._failure(exc) from None
        finally:
            stream.close()
            budget.end()
            _limits.budget = previous
        return "".join(pieces)

    def _failure(self, exc: Exception) -> TemplateFailure:
        """exc as a TemplateFailure: its type, its message, and the template line it was raised at."""
        line = None
        frame = exc.__traceback__
        while frame is not None:
            if frame.tb_frame.f_code.co_filename == "<template>":
                line = self.template.get_corresponding_lineno(frame.tb_lineno)
            frame = frame.tb_next
        message = _cut(str(exc))
        where = f" (template line {line})" if line else ""
        return TemplateFailure(f"{type(exc).__name__}: {message}{where}" if message else f"{type(exc).__name__}{where}")
