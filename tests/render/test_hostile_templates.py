"""A chat template is code every row runs: one that loops, recurses or builds huge values must cost one row
(dropped as template_limit, naming the limit) and never the run, and one that raises must drop its row as
template_error with the template's own message, never end in a traceback.

The template below renders a plain conversation, except for rows whose first message names a payload: those
run it. Each test puts one such row between two good ones and checks, through the real pipeline, that exactly
that row is dropped, for the reason and with the detail expected, and that the good rows are written.
Runs go in a forked process (_isolated) that is killed after HANG_SECONDS, so a test that would hang
without the limits fails instead: `10 ** (10 ** 10)` runs inside CPython, where no signal reaches it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import gpu_prep_cli, run_rows, write_jsonl

from gpu_prep.render.limits import DEFAULT_MAX_CHARS, DEFAULT_TIME_LIMIT, TemplateLimit, row_limits
from gpu_prep.render.sandbox import ChatTemplate
from gpu_prep.config import InputConfig, PreprocessingConfig, parse_config
from gpu_prep.errors import ConfigError, Drop, InputError
from gpu_prep.pipeline import Options, run
from gpu_prep.render.context import template_limits

HANG_SECONDS = 60
TIME_LIMIT = 0.2  # the tests' input.template_time_limit
MAX_CHARS = 200_000  # the tests' input.template_max_chars

PAYLOADS = {
    "nested_loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "doubling_macro": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "repeat_string": "{{ 'x' * 10**9 }}",
    "repeat_list": "{{ [1] * 10**9 }}",
    "huge_power": "{{ 10 ** (10 ** 10) }}",
    "long_output": "{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}",
    "doubling_string": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "buffered_copies": "{% macro m() %}{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}{% endmacro %}{{ m() }}",
    "wide_center": "{{ 'x'.center(10**9) }}",
    "wide_format": "{{ '%0999999999d' % 1 }}",
    "endless_recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "raise_exception": "{{ raise_exception('this row is not welcome') }}",
    "divide_by_zero": "{{ 1 / 0 }}",
    "class_attribute": "{{ ''.__class__ }}",
    "class_mro": "{{ ''.__class__.__mro__ }}",
    "missing_method": "{{ messages[0].content.foo() }}",
    "type_error": "{{ messages|length + 'a' }}",
    "value_error": "{{ [1, 2].index(5) }}",
    "overflow": "{{ 1.5 ** 100000 }}",
}

# Each payload's fate: (reason, the start of its detail); None: the row is written.
TIME = f"input.template_time_limit: the chat template ran past {TIME_LIMIT:g} s on this row"
SIZE = "input.template_max_chars: "
REFUSED = "the chat template refused the row: "
FATES: dict[str, tuple[str, str] | None] = {
    "nested_loops": (Drop.TEMPLATE_LIMIT, TIME),
    "doubling_macro": (Drop.TEMPLATE_LIMIT, TIME),
    "repeat_string": (Drop.TEMPLATE_LIMIT, f"{SIZE}the * operator's result would be over {MAX_CHARS:,} characters"),
    "repeat_list": (Drop.TEMPLATE_LIMIT, f"{SIZE}the * operator's result would be over {MAX_CHARS:,} characters"),
    "huge_power": (Drop.TEMPLATE_LIMIT, f"{SIZE}the ** operator's result would be a number of over 16,384 bits"),
    "long_output": (Drop.TEMPLATE_LIMIT, f"{SIZE}the chat template's output would be over {MAX_CHARS:,} characters"),
    "doubling_string": (Drop.TEMPLATE_LIMIT, f"{SIZE}a value the chat template builds"),
    "buffered_copies": (Drop.TEMPLATE_LIMIT, f"{SIZE}the chat template printed over 8 times {MAX_CHARS:,} characters"),
    "wide_center": (Drop.TEMPLATE_LIMIT, f"{SIZE}str.center's result would be over {MAX_CHARS:,} characters"),
    "wide_format": (Drop.TEMPLATE_LIMIT, f"{SIZE}the % operator's result would be over {MAX_CHARS:,} characters"),
    "endless_recursion": (Drop.TEMPLATE_ERROR, f"{REFUSED}RecursionError: maximum recursion depth exceeded"),
    "raise_exception": (Drop.TEMPLATE_ERROR, f"{REFUSED}this row is not welcome"),
    "divide_by_zero": (Drop.TEMPLATE_ERROR, f"{REFUSED}ZeroDivisionError: division by zero (template line "),
    "class_attribute": None,  # the sandbox hands back an undefined value, which prints as nothing
    "class_mro": (Drop.TEMPLATE_ERROR, f"{REFUSED}access to attribute '__class__' of 'str' object is unsafe."),
    "missing_method": (Drop.TEMPLATE_ERROR, f"{REFUSED}'str object' has no attribute 'foo'"),
    "type_error": (Drop.TEMPLATE_ERROR, f"{REFUSED}TypeError: unsupported operand type(s) for +: 'int' and 'str'"),
    "value_error": (Drop.TEMPLATE_ERROR, f"{REFUSED}ValueError: 5 is not in list"),
    "overflow": (Drop.TEMPLATE_ERROR, f"{REFUSED}OverflowError: "),
}

PLAIN = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
# Every payload behind its name; any other row renders as PLAIN does.
HOSTILE = "{% set c = messages[0].content %}" + "".join(
    f"{'{% if' if n == 0 else '{% elif'} c == {name!r} %}}{body}" for n, (name, body) in enumerate(PAYLOADS.items())
) + "{% endif %}" + PLAIN


def _isolated(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) in a thread: its result, or its exception raised here; the test fails when fn
    runs past HANG_SECONDS, as it would without the limits. (A thread, not a forked process: forking a test
    process whose earlier tests started thread pools can deadlock the child.)"""
    outcome: list[tuple[bool, Any]] = []

    def child() -> None:
        try:
            outcome.append((True, fn(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - handed to the test, which raises it
            outcome.append((False, exc))

    worker = threading.Thread(target=child, daemon=True)
    worker.start()
    worker.join(HANG_SECONDS)
    if worker.is_alive():
        pytest.fail(f"still running after {HANG_SECONDS} s: the template limits did not stop it")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _conversation(first: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": first},
                         {"role": "assistant", "content": "An answer long enough to train on, and a bit more."}]}


def _config(template: str = HOSTILE, **input_keys: Any) -> dict[str, Any]:
    return {"chat_template": template, "mask": {"assistant": "train"},
            "input": {"type": "chat", "template_time_limit": TIME_LIMIT, "template_max_chars": MAX_CHARS,
                      **input_keys}}


def _run(tmp_path: Path, rows: list[Any], config: dict[str, Any] | None = None, **options: Any
         ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The manifest and the rejects of a run of rows."""
    rejects = tmp_path / "rejects.jsonl"
    out = _isolated(run_rows, tmp_path, config or _config(), rows, rejects=rejects, **options)
    manifest = json.loads((out / "manifest.json").read_text())
    return manifest, [json.loads(line) for line in rejects.read_text().splitlines()]


@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_a_hostile_row_costs_its_own_row_and_no_more(tmp_path: Path, payload: str) -> None:
    rows = [_conversation("Hello there, how are you?"), _conversation(payload), _conversation("Thanks, bye.")]
    started = time.monotonic()
    manifest, rejects = _run(tmp_path, rows)
    elapsed = time.monotonic() - started
    totals = manifest["totals"]
    fate = FATES[payload]
    if fate is None:
        assert (totals["rows_written"], totals["rows_dropped"], rejects) == (3, {}, [])
        return
    reason, detail = fate
    assert totals["rows_written"] == 2
    assert totals["rows_dropped"] == {reason: 1}
    [reject] = rejects
    assert (reject["line"], reject["reason"]) == (2, reason)
    assert reject["detail"].startswith(detail), reject["detail"]
    assert "Traceback" not in reject["detail"] and len(reject["detail"]) < 700
    # The row is rendered at most twice (the Jinja-free path's check of the first rows, then the row itself),
    # each held to the time limit: nothing runs on for long.
    assert elapsed < 20, f"{payload} took {elapsed:.1f} s"


def test_rows_rendered_in_worker_threads_keep_their_own_deadlines(tmp_path: Path) -> None:
    """The stages overlap in threads (the default): every hostile row is stopped, every good one written."""
    rows = [_conversation(p) for p in ("nested_loops", "Hello", "doubling_macro", "Hi", "repeat_string", "Hey",
                                       "divide_by_zero", "Yo")]
    manifest, rejects = _run(tmp_path, rows, overlap=True, chunk_rows=2)
    assert manifest["totals"]["rows_written"] == 4
    assert manifest["totals"]["rows_dropped"] == {Drop.TEMPLATE_LIMIT: 3, Drop.TEMPLATE_ERROR: 1}
    assert [r["line"] for r in rejects] == [1, 3, 5, 7]


def test_a_rows_renders_share_one_time_budget() -> None:
    """A row's renders (the real one, the placeholder renders that locate its contents, structured
    truncation's) draw on one budget: once a row has spent it, its next render stops at once."""
    template = ChatTemplate(HOSTILE, {})
    with row_limits(0.3, MAX_CHARS) as budget:
        with pytest.raises(TemplateLimit):
            template.render(_conversation("nested_loops")["messages"])
        started = time.monotonic()
        with pytest.raises(TemplateLimit):
            template.render(_conversation("Hello")["messages"])
        assert time.monotonic() - started < 0.1
    assert budget.exceeded is not None and budget.exceeded.startswith("input.template_time_limit: ")
    with row_limits(0.3, MAX_CHARS) as budget:  # good rows leave it nearly whole
        for _ in range(3):
            template.render(_conversation("Hello")["messages"])
    assert budget.exceeded is None and budget.left > 0.2


def test_generation_marked_templates_are_held_to_the_limits_too(tmp_path: Path) -> None:
    """{% generation %} templates render through their own path (spans recorded as the output streams)."""
    marked = ("{% set c = messages[0].content %}{% if c == 'nested_loops' %}" + PAYLOADS["nested_loops"]
              + "{% elif c == 'long_output' %}" + PAYLOADS["long_output"] + "{% endif %}"
              "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}"
              "{{ m.content }}<|im_end|>{% endgeneration %}{% else %}{{ m.content }}<|im_end|>{% endif %}\n"
              "{% endfor %}")
    rows = [_conversation("Hello"), _conversation("nested_loops"), _conversation("long_output"), _conversation("Hi")]
    manifest, rejects = _run(tmp_path, rows, _config(marked))
    assert manifest["chat_template"]["mask_method"] == "generation"
    assert manifest["totals"]["rows_written"] == 2
    assert manifest["totals"]["rows_dropped"] == {Drop.TEMPLATE_LIMIT: 2}
    assert [r["detail"].split(":")[0] for r in rejects] == ["input.template_time_limit", "input.template_max_chars"]


def test_structured_truncation_renders_are_held_to_the_limits(tmp_path: Path) -> None:
    rows = [_conversation("Hello"), _conversation("nested_loops"), _conversation("Hi")]
    manifest, _ = _run(tmp_path, rows, {**_config(), "preprocessing": {"truncation": "structured", "max_seq_len": 16}})
    assert manifest["totals"]["rows_dropped"] == {Drop.TEMPLATE_LIMIT: 1}


def test_strict_stops_at_the_hostile_row_naming_file_and_line(tmp_path: Path) -> None:
    rows = [_conversation("Hello"), _conversation("nested_loops"), _conversation("Hi")]
    with pytest.raises(InputError, match=r"run\.jsonl:2: template limit: input\.template_time_limit: .*"
                                         r"\(--strict stops at the first bad row\)"):
        _run(tmp_path, rows, strict=True)


def test_the_cli_drops_the_rows_and_prints_no_traceback(tmp_path: Path) -> None:
    rows = [_conversation(p) for p in ("Hello", "nested_loops", "repeat_string", "divide_by_zero", "Hi", "Hey", "Yo")]
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_config()))
    result = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", "-q", timeout=HANG_SECONDS)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    totals = json.loads((tmp_path / "out" / "manifest.json").read_text())["totals"]
    assert totals["rows_dropped"] == {Drop.TEMPLATE_LIMIT: 2, Drop.TEMPLATE_ERROR: 1}
    strict = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "strict", "-q", "--strict", timeout=HANG_SECONDS)
    assert strict.returncode == 1 and "Traceback" not in strict.stderr
    assert f"{data}:2: template limit: input.template_time_limit" in " ".join(strict.stderr.split())


def test_a_template_with_a_syntax_error_is_a_config_error_naming_it_and_its_line(tmp_path: Path) -> None:
    broken = "{% for m in messages %}\n{{ m.content }}\n{% endfor %}\n{% for m in %}{% endfor %}"
    data = write_jsonl(tmp_path / "data.jsonl", [_conversation("Hello")])
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_config(broken)))
    result = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", timeout=HANG_SECONDS)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert "the chat template (config string) has a syntax error at line 4: Expected an expression" in message
    assert "line 4: {% for m in %}{% endfor %}" in message
    with pytest.raises(ConfigError, match=r"the chat template \(config string\) has a syntax error at line 4"):
        _isolated(run_rows, tmp_path, _config(broken), [_conversation("Hello")], name="in-process")


def test_a_template_that_breaks_its_limits_on_every_row_is_refused_up_front(tmp_path: Path) -> None:
    """Not a run that spends the time limit on every row (and on each of the Jinja-free path's probes)."""
    data = write_jsonl(tmp_path / "data.jsonl", [_conversation("Hello")])
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_config(PAYLOADS["nested_loops"] + PLAIN)))
    started = time.monotonic()
    result = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", timeout=HANG_SECONDS)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "the chat template (config string) broke its limits rendering a two-message conversation" in " ".join(result.stderr.split())
    assert time.monotonic() - started < 30


def test_a_template_reading_a_special_token_the_tokenizer_lacks_is_refused_up_front(tmp_path: Path) -> None:
    # Llama-2's template adds bos_token to each user turn; the bundled qwen2.5 has none: every row would
    # fail (as in transformers), so the run stops before it starts, saying which token and how to give it.
    llama2 = ("{% for m in messages %}{% if m.role == 'user' %}{{ bos_token + '[INST] ' + m.content + ' [/INST]' }}"
              "{% else %}{{ ' ' + m.content + eos_token }}{% endif %}{% endfor %}")
    data = write_jsonl(tmp_path / "data.jsonl", [_conversation("Hello")])
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_config(llama2)))
    result = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", timeout=HANG_SECONDS)
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "reads bos_token, which the tokenizer does not have" in said, result.stderr
    assert not (tmp_path / "out").exists()
    given = json.loads(config.read_text())
    config.write_text(json.dumps({**given, "chat_template_kwargs": {"bos_token": "<|endoftext|>"}}))
    assert gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", timeout=HANG_SECONDS).returncode == 0
    # A pretraining run renders no conversation: the same template is no reason to stop it.
    text = write_jsonl(tmp_path / "text.jsonl", [{"text": "A document long enough to be kept. " * 4}])
    config.write_text(json.dumps({**_config(llama2), "input": {"type": "text"}}))
    ran = gpu_prep_cli("run", "-c", config, text, "-o", tmp_path / "text-out", timeout=HANG_SECONDS)
    assert ran.returncode == 0, ran.stderr


def test_a_trial_render_held_up_once_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # The up-front trial is timed by the clock: on a machine busy elsewhere one render of two messages ran
    # past 2 s and a good template was refused. Held up once, it is tried again; every time, it is refused.
    from gpu_prep.render.limits import TemplateLimit
    from gpu_prep.render.sandbox import ChatTemplate

    real, calls = ChatTemplate._generate, []

    def held_up(times: int) -> Any:
        def generate(self: Any, *args: Any) -> Any:
            calls.append(1)
            if len(calls) <= times:
                raise TemplateLimit("input.template_time_limit: the chat template ran past 2 s on this row")
            return real(self, *args)
        return generate

    monkeypatch.setattr(ChatTemplate, "_generate", held_up(1))
    ChatTemplate(PLAIN, {})
    assert len(calls) == 2
    calls.clear()
    monkeypatch.setattr(ChatTemplate, "_generate", held_up(2))
    with pytest.raises(ConfigError, match="broke its limits rendering a two-message conversation"):
        ChatTemplate(PLAIN, {})


def test_the_limits_are_config_keys_with_defaults_that_fit_the_length_filter() -> None:
    assert (InputConfig().template_time_limit, InputConfig().template_max_chars) == (DEFAULT_TIME_LIMIT, None)
    assert template_limits(parse_config({})) == (DEFAULT_TIME_LIMIT, DEFAULT_MAX_CHARS)
    assert DEFAULT_MAX_CHARS == 2 * PreprocessingConfig().max_chars  # a row of max_chars has room, twice over
    assert template_limits(parse_config({"preprocessing": {"max_chars": 10_000_000}}))[1] == 20_000_000
    assert template_limits(parse_config({"preprocessing": {"max_chars": 100}}))[1] == 1_000_000
    assert template_limits(parse_config({"input": {"template_time_limit": 0.5, "template_max_chars": 123}})) == (0.5, 123)
    for bad in ({"template_time_limit": 0}, {"template_max_chars": 0}):
        with pytest.raises(ConfigError, match="input.template_"):
            parse_config({"input": bad})


def test_a_datasets_own_input_settings_set_its_limits(tmp_path: Path) -> None:
    """input.template_max_chars in a dataset's own input settings: its rows are held to its cap."""
    padded = PLAIN + "{% if messages|length == 3 %}{{ 'x' * 300000 }}{% endif %}"  # 300,000 characters of padding
    rows = [_conversation("Hello"), {"messages": [*_conversation("Hi")["messages"], {"role": "user", "content": "Ok"}]}]
    a, b = write_jsonl(tmp_path / "a.jsonl", rows), write_jsonl(tmp_path / "b.jsonl", rows)
    config = {**_config(padded), "preprocessing": {"deduplicate": False}, "datasets": [
        {"name": "a", "data_paths": [str(a)]},
        {"name": "b", "data_paths": [str(b)], "input": {"template_max_chars": 1_000_000}}]}
    out = tmp_path / "out"
    _isolated(run, parse_config(config), [], out, Options())
    files = {Path(f["path"]).name: f for f in json.loads((out / "manifest.json").read_text())["inputs"]}
    assert (files["a.jsonl"]["rows_written"], files["a.jsonl"]["rows_dropped"]) == (1, {Drop.TEMPLATE_LIMIT: 1})
    assert (files["b.jsonl"]["rows_written"], files["b.jsonl"]["rows_dropped"]) == (2, {})
