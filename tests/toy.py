"""A toy tokenizer for unit tests, whose ids can be read off by eye.

Every byte is one token and its id is the byte's value, so `bytes(ids)` reads a sample back and an id
list is its text in ASCII codes: "hi" is [104, 105]. Three special tokens follow the bytes:
<|im_start|> is 256, <|im_end|> 257 (the end of a turn, also EOS) and <|endoftext|> 258 (padding). The chat
template is plain ChatML. It is built with HF tokenizers in a folder (tokenizer.json, tokenizer_config.json)
that gpu-prep loads as it loads any local tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

IM_START, IM_END, ENDOFTEXT = 256, 257, 258
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_stand_ins() -> dict[int, str]:
    """Byte-level BPE's printable stand-in for each byte (the alphabet its vocabularies are written in)."""
    kept = [*range(33, 127), *range(161, 173), *range(174, 256)]
    stand_in = {b: chr(b) for b in kept}
    for n, b in enumerate(b for b in range(256) if b not in stand_in):
        stand_in[b] = chr(256 + n)
    return stand_in


def write_toy_tokenizer(folder: Path, chat_template: str = CHATML) -> Path:
    """The toy tokenizer's files in folder (made if needed); returns the folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {char: byte for byte, char in _byte_stand_ins().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None, "chat_template": chat_template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def ids(text: str) -> list[int]:
    """The toy ids of text with no special tokens in it: its UTF-8 bytes."""
    return list(text.encode("utf-8"))
