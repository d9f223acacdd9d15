"""Which chat template renders a run's conversations (the config's `chat_template`).

- "tokenizer_default": the tokenizer's own (tokenizer_config.json);
- "tokenizer_default_fallback_chatml": the tokenizer's own, or ChatML when it has none;
- a name below: a template written here, in the layout of that model family;
- a file ending in .jinja or .j2, or a Jinja string (anything containing "{{" or "{%").
"""

from __future__ import annotations

from pathlib import Path

from gpu_prep.errors import ConfigError

# Written for transformers' Jinja settings (trim_blocks, lstrip_blocks). Each renders the conversation as
# the family's chat format lays it out; the special tokens are those of that family's tokenizers.
NAMED = {
    "chatml": (
        "{%- for message in messages %}"
        "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
        "{% endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    ),
    "llama3": (
        "{{- bos_token }}"
        "{%- for message in messages %}"
        "<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n{{ message.content | trim }}<|eot_id|>"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}"
    ),
    # Gemma has no system turn: a system message opens the first user turn.
    "gemma": (
        "{{- bos_token }}{%- set ns = namespace(system='') %}"
        "{%- for message in messages %}"
        "{%- if message.role == 'system' %}{%- set ns.system = message.content + '\n\n' %}"
        "{%- else %}"
        "{%- set role = 'model' if message.role == 'assistant' else message.role %}"
        "<start_of_turn>{{ role }}\n{{ ns.system }}{{ message.content | trim }}<end_of_turn>\n"
        "{% set ns.system = '' %}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}<start_of_turn>model\n{%- endif %}"
    ),
    # Mistral's [INST] format: a system message is put before the first user message's text.
    "mistral": (
        "{{- bos_token }}{%- set ns = namespace(system='') %}"
        "{%- for message in messages %}"
        "{%- if message.role == 'system' %}{%- set ns.system = message.content + '\n\n' %}"
        "{%- elif message.role == 'user' %}[INST] {{ ns.system }}{{ message.content }} [/INST]"
        "{%- set ns.system = '' %}"
        "{%- elif message.role == 'assistant' %}{{ message.content }}{{ eos_token }}"
        "{%- else %}{{ raise_exception('this template has no role ' + message.role) }}"
        "{%- endif %}"
        "{%- endfor %}"
    ),
    # DeepSeek (V3 / R1) layout: the system text first, then each turn after its role marker.
    "deepseek": (
        "{{- bos_token }}"
        "{%- for message in messages %}"
        "{%- if message.role == 'system' %}{{ message.content }}"
        "{%- elif message.role == 'user' %}<\uff5cUser\uff5c>{{ message.content }}"
        "{%- elif message.role == 'assistant' %}<\uff5cAssistant\uff5c>{{ message.content }}"
        "<\uff5cend\u2581of\u2581sentence\uff5c>"
        "{%- else %}{{ raise_exception('this template has no role ' + message.role) }}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}<\uff5cAssistant\uff5c>{%- endif %}"
    ),
    # Qwen3 layout: ChatML; tools listed in the system turn; an assistant turn after the last user message
    # shows its reasoning_content in a <think> block (earlier turns' reasoning is left out, as Qwen3's own
    # template does); tool calls follow the content in <tool_call> blocks, and tool results go back in a
    # user turn, each in a <tool_response> block.
    "qwen3": (
        "{%- set nl = '\\n' %}{%- set ns = namespace(last_query=-1) %}"
        "{%- for message in messages %}"
        "{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}"
        "{%- endfor %}"
        "{%- set system_first = messages and messages[0].role == 'system' %}"
        "{%- if tools %}{{ '<|im_start|>system' + nl }}"
        "{%- if system_first %}{{ messages[0].content + nl + nl }}{%- endif %}"
        "{{ '# Tools' + nl + nl + '<tools>' }}{%- for tool in tools %}{{ nl + tool | tojson }}{%- endfor %}"
        "{{ nl + '</tools><|im_end|>' + nl }}"
        "{%- endif %}"
        "{%- for message in messages %}"
        "{%- if tools and system_first and loop.first %}"
        "{%- elif message.role == 'tool' %}"
        "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{%- endif %}"
        "{{ nl + '<tool_response>' + nl + message.content + nl + '</tool_response>' }}"
        "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>' + nl }}{%- endif %}"
        "{%- else %}"
        "{{ '<|im_start|>' + message.role + nl }}"
        "{%- if message.role == 'assistant' and loop.index0 > ns.last_query and message.reasoning_content %}"
        "{{ '<think>' + nl + message.reasoning_content.strip(nl) + nl + '</think>' + nl + nl }}"
        "{%- endif %}"
        "{{ message.content }}"
        "{%- for call in message.tool_calls or [] %}"
        "{%- set call = call.function or call %}"
        "{%- if message.content or not loop.first %}{{ nl }}{%- endif %}"
        "{{ '<tool_call>' + nl + '{\"name\": \"' + call.name + '\", \"arguments\": ' }}"
        "{{- call.arguments if call.arguments is string else call.arguments | tojson }}"
        "{{ '}' + nl + '</tool_call>' }}"
        "{%- endfor %}"
        "{{ '<|im_end|>' + nl }}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant' + nl }}{%- endif %}"
    ),
}
# What closes a turn in each named template (Mistral's turns end with eos, which the tokenizer names).
END_OF_TURN = {"chatml": ("<|im_end|>",), "qwen3": ("<|im_end|>",), "llama3": ("<|eot_id|>",),
               "gemma": ("<end_of_turn>",), "deepseek": ("<\uff5cend\u2581of\u2581sentence\uff5c>",)}
CHOICES = ("tokenizer_default", "tokenizer_default_fallback_chatml", *NAMED)


def check_choice(choice: str) -> str:
    """For the config: a known name, a template file's path, or a Jinja string."""
    if choice in CHOICES or _is_jinja(choice) or choice.endswith((".jinja", ".j2")):
        return choice
    raise ValueError(f"chat_template {choice!r} is not known; allowed: {', '.join(CHOICES)}, "
                     "a .jinja file or a Jinja string")


def _is_jinja(text: str) -> bool:
    return "{{" in text or "{%" in text


def resolve_template(choice: str, tokenizer_template: str | None) -> tuple[str | None, tuple[str, ...]]:
    """The template text a run uses (None: the tokenizer has none and none was named), and the
    end-of-turn strings it writes beyond the tokenizer's own (those of a named template)."""
    if choice == "tokenizer_default" or (choice == "tokenizer_default_fallback_chatml" and tokenizer_template):
        return tokenizer_template, ()
    name = "chatml" if choice == "tokenizer_default_fallback_chatml" else choice
    if name in NAMED:
        return NAMED[name], END_OF_TURN.get(name, ())
    if _is_jinja(choice):
        return choice, ()
    try:
        return Path(choice).read_text(encoding="utf-8"), ()
    except OSError as exc:
        raise ConfigError(f"chat_template {choice!r}: cannot read it: {exc.strerror}") from None
