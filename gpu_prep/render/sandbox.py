"""Chat templates rendered in Jinja's sandbox, with the environment transformers gives them (environment.py),
so a template renders here exactly as `apply_chat_template(..., tokenize=False)` renders it. Nothing in a
config is evaluated as code: templates can only reach what the sandbox allows. Every render is held to the
limits of limits.py.

A render that breaks a limit raises TemplateLimit; any other exception a template raises (ZeroDivisionError,
TypeError, RecursionError, MemoryError, ...) becomes a TemplateFailure carrying its message. Both are
TemplateErrors, so every caller that handles a template's refusal (a row drop, the Jinja-free path's probes)
handles them; row.py tells a broken limit (template_limit) from a refusal (template_error).
"""

from __future__ import annotations

from functools import cached_property
from itertools import islice
from typing import TYPE_CHECKING, Any

import jinja2

from gpu_prep.errors import ConfigError
from gpu_prep.render.environment import compile_template
from gpu_prep.render.generation import _message, _Tracker, _tracking, has_generation_markers
from gpu_prep.render.limits import DEFAULT_MAX_CHARS, DEFAULT_TIME_LIMIT, Budget, TemplateLimit, _limits, row_limits

if TYPE_CHECKING:
    from gpu_prep.format import Message

_DETAIL_CHARS = 500  # a template's own message is cut to this many characters in a drop's detail
_CHUNK = 16  # output pieces read at a time before the output is measured again


class TemplateFailure(jinja2.exceptions.TemplateError):
    """Any other exception a template raised while rendering, as a TemplateError with the exception's type
    and message, so that whoever handles a template's refusal handles it too, never a traceback."""


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


# What a template is tried on when it is made: one that cannot render this within the limits cannot render
# any row, and is refused once, up front, rather than on every row and every probe of the Jinja-free path.
_TRIAL = ({"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hello! How can I help?"})
_SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


class ChatTemplate:
    """A compiled template plus the variables it reads besides the conversation: the tokenizer's special
    tokens (bos_token, eos_token, ...) and the config's chat_template_kwargs, which win, as in transformers.

    Renders are held to limits: those of the row being rendered on this thread (row_limits, which render/row.py
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
