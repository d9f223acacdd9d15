"""The sandboxed Jinja environment chat templates compile in, with what transformers gives them (trim_blocks,
lstrip_blocks, loop controls, the {% generation %} tag; the globals raise_exception, strftime_now, dict and
namespace; its tojson filter), guarded so that the limits (limits.py) are checked where a template runs:
filters, calls and operators measured, and the parsed template rewritten (_Guards) before it is compiled."""

from __future__ import annotations

import json
import time
import types
from collections.abc import Iterable, Iterator
from datetime import datetime
from functools import lru_cache, update_wrapper
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment
from jinja2.utils import _PassArg
from jinja2.visitor import NodeTransformer

from gpu_prep.render.generation import _GenerationTag, _Message, _read
from gpu_prep.render.limits import (_CONTAINERS, _FILTER_CHECKS, _SCALARS, _SIZING_METHODS, WRITTEN_FACTOR, Budget,
                                    _check_brace, _check_percent, _check_power, _check_repeat, _current, _limits,
                                    _str_method_arguments)

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


_BOUNDED_OWNERS = frozenset({str, bytes, list, tuple, dict, _Message})  # whose methods return no more than them
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
