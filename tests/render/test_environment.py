"""The environment every chat template compiles in (render/environment.py): the globals transformers gives
templates, JSON as transformers writes it, and no reach into Python's internals."""

from __future__ import annotations

import jinja2
import pytest

from gpu_prep.render.environment import compile_template


def test_templates_get_the_globals_transformers_gives_them() -> None:
    template = compile_template("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                                "{% endfor %}{{ ns.n }} {{ dict(a=1)['a'] }} {{ strftime_now('%Y') | length }}")
    assert template.render(messages=[1, 2, 3]) == "3 1 4"
    with pytest.raises(jinja2.exceptions.TemplateError, match="no system role"):
        compile_template("{{ raise_exception('no system role') }}").render()


def test_tojson_keeps_non_ascii_text_and_the_given_order() -> None:
    assert compile_template("{{ x | tojson }}").render(x={"b": "é", "a": 1}) == '{"b": "é", "a": 1}'
    assert compile_template("{{ x | tojson(indent=2) }}").render(x=[1]) == "[\n  1\n]"


def test_underscore_attributes_are_out_of_reach() -> None:
    with pytest.raises(jinja2.exceptions.SecurityError):
        compile_template("{{ x.__class__.__mro__ }}").render(x="")
    with pytest.raises(jinja2.exceptions.SecurityError, match="underscore attributes"):
        compile_template("{% set ns = namespace() %}{% set ns._private = 1 %}").render()


def test_a_compiled_template_is_kept_for_the_next_use() -> None:
    assert compile_template("{{ 1 }}") is compile_template("{{ 1 }}")
