"""The chat_template values a config may hold (config/templates.py): a bundled name, a file, a Jinja string."""

from __future__ import annotations

import pytest

from gpu_prep.config.templates import CHOICES, NAMED, check_choice, is_jinja


def test_names_files_and_written_templates_pass_and_anything_else_names_the_choices() -> None:
    for choice in ("qwen2.5", "tokenizer_default", "my/template.jinja", "t.j2", "{{ messages }}", "{% if x %}{% endif %}"):
        assert check_choice(choice) == choice
    with pytest.raises(ValueError, match=r"chat_template 'qwen9' is not known; allowed: tokenizer_default, .*qwen2\.5"):
        check_choice("qwen9")
    with pytest.raises(ValueError, match="takes its template from chat_template_jinja"):
        check_choice("jinja")
    assert set(NAMED) < set(CHOICES) and not is_jinja("chatml") and is_jinja("{{ bos_token }}")
