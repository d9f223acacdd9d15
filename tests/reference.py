"""The independent reference for chat masks and real tokenizers built for it, shared by the tests and benchmarks.

transformers marks what `{% generation %}` encloses when asked for `return_assistant_tokens_mask`; this
ChatML template encloses exactly what gpu-prep's default policy trains (an assistant turn's content and its
end-of-turn token), over the bundled Qwen2.5 tokenizer.json, so ids and masks compare token for token.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

# Every piece is an explicit `{{- }}`, so no Jinja whitespace control can surprise.
CHATML_WITH_GENERATION = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
)


def write_tokenizer_dir(target: Path, chat_template: str = CHATML_WITH_GENERATION, source: Path | None = None) -> Path:
    """A tokenizer directory: source's tokenizer.json (the bundled Qwen2.5 one by default) and its
    tokenizer_config.json with another chat template."""
    from gpu_prep.tokenization.bundled import bundled_tokenizer_dir

    source = source or bundled_tokenizer_dir("qwen2.5")
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / "tokenizer.json", target / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = chat_template
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return target


def hf_tokenizer(directory: Path) -> Any:
    """transformers' fast tokenizer over exactly this tokenizer.json, with the directory's chat template."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no advisory about PyTorch: we only tokenize
    from transformers import PreTrainedTokenizerFast

    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    return PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"),
                                   chat_template=config["chat_template"], eos_token=config["eos_token"],
                                   pad_token=config["pad_token"])


def convert_sentencepiece(model_file: str, work: Path) -> Path:
    """A SentencePiece model shipped in mistral-common (tokenizer.model.v1 is Mistral 7B v0.1's), converted
    to a tokenizer.json folder as transformers converts it (Metaspace, byte fallback); needs the
    sentencepiece and protobuf packages."""
    import mistral_common

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    source = work / f"{model_file}-spm"
    source.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(mistral_common.__file__).parent / "data" / model_file, source / "tokenizer.model")
    (source / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "legacy": False, "bos_token": "<s>", "eos_token": "</s>",
         "unk_token": "<unk>"}))
    target = work / f"{model_file}-converted"
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(target))
    return target


def train_unigram(work: Path, chats: list[dict[str, Any]]) -> Path:
    """A SentencePiece Unigram tokenizer (T5's kind: Precompiled normalizer, whitespace dropped, Metaspace)
    trained here on these conversations, converted to a tokenizer.json as transformers converts T5's. No
    package on the index ships a Unigram vocabulary, so this one is made; needs sentencepiece and protobuf."""
    import sentencepiece

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    work.mkdir(parents=True, exist_ok=True)
    text = "\n".join(m["content"].replace("\n", " ") for chat in chats for m in chat["messages"])
    (work / "corpus.txt").write_text(text, encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(work / "corpus.txt"), model_prefix=str(work / "unigram"), vocab_size=8000, model_type="unigram",
        character_coverage=0.9995, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, shuffle_input_sentence=False,
        minloglevel=2)
    source = work / "spm"
    source.mkdir(exist_ok=True)
    shutil.copyfile(work / "unigram.model", source / "spiece.model")
    (source / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "eos_token": "</s>", "unk_token": "<unk>",
         "pad_token": "<pad>"}))
    target = work / "converted"
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(target))
    return target
