"""The builder contract: how every row is built by the builder its input.type names (format.register).

gpu-prep's own builders (the format/ modules) take (record, config), return a Conversation, Segments or Tokens and
raise RowError to drop a row; build_row calls them as they are. A plugin's builder may be a function or a
class (one instance, its build method called), take the run's tokenizer as a third argument (a
BuilderTokenizer), and return:

- a Conversation, Segments or Tokens, as gpu-prep's own do;
- {"ids": [...], "loss_mask": [...], "domain": "..."}: a pre-tokenized row (1 = trained), in that domain
  (missing or None: the usual one, by output.domain_key); a dict that breaks a rule drops the row as
  builder_error naming the rule (ids outside the vocabulary, a mask of another length, ...);
- None: the row is dropped as skipped_by_builder (counted; not bad data, so --strict goes on).

RowError drops the row with its own reason; any other exception drops it as builder_error with the
exception's type and message (bad data: --strict stops there, naming the row).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_prep.errors import Drop
from gpu_prep.format import Conversation, RowError, Segments, Shape, Tokens, registered

if TYPE_CHECKING:
    from gpu_prep.tokenization.tokenizer import Tokenizer

DICT_KEYS = ("ids", "loss_mask", "domain")


def build_row(name: str, record: dict[str, Any], config: Any, tokenizer: BuilderTokenizer | None) -> Shape:
    """The row built by input.type `name`'s builder, in a canonical shape; RowError when it is dropped.
    tokenizer: what a builder that takes one is handed (None only where no builder of the run takes one)."""
    builder = registered(name)
    if builder.builtin:
        return builder.call(record, config)
    if builder.takes_tokenizer and tokenizer is None:
        raise RuntimeError(f"builder {name!r} takes a tokenizer, and none was given")
    try:
        result = builder.call(record, config, tokenizer) if builder.takes_tokenizer else builder.call(record, config)
    except RowError:
        raise
    except Exception as exc:  # noqa: BLE001  a plugin's failure on one row drops that row, named
        raise RowError(Drop.BUILDER_ERROR, f"builder {name!r} raised {type(exc).__name__}: {exc}") from None
    if result is None:
        raise RowError(Drop.SKIPPED_BY_BUILDER, f"builder {name!r} returned None (skip the row)")
    if isinstance(result, (Conversation, Segments, Tokens)):
        return result
    if isinstance(result, dict):
        return tokens_from_dict(name, result, None if tokenizer is None else len(tokenizer))
    raise RowError(Drop.BUILDER_ERROR, f"builder {name!r} returned a {type(result).__name__}; a builder returns a dict "
                                       "(ids, loss_mask, domain), a Conversation, Segments, Tokens, or None to skip")


def tokens_from_dict(name: str, result: dict[str, Any], vocab_size: int | None) -> Tokens:
    """{"ids", "loss_mask", "domain"} as Tokens, checked: ids integers below vocab_size (when known),
    loss_mask as many 0/1 (or false/true), domain a non-empty string or None."""
    said = f"builder {name!r} returned"
    extra = [repr(k) for k in result if k not in DICT_KEYS]
    if extra:
        raise RowError(Drop.BUILDER_ERROR, f"{said} the key(s) {', '.join(extra)}: its dict holds ids, loss_mask and "
                                           "domain only")
    missing = [k for k in DICT_KEYS[:2] if k not in result]
    if missing:
        raise RowError(Drop.BUILDER_ERROR, f"{said} no {' and no '.join(missing)}: its dict holds ids, loss_mask "
                                           "(1 = trained) and optionally domain")
    ids = _as_list(result["ids"], "ids", said)
    mask = _as_list(result["loss_mask"], "loss_mask", said)
    if not ids:
        raise RowError(Drop.EMPTY, f"{said} no ids")
    for i, v in enumerate(ids):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise RowError(Drop.BUILDER_ERROR, f"{said} ids[{i}] = {v!r}: token ids are integers")
        if v < 0 or (vocab_size is not None and v >= vocab_size):
            top = f"0 to {vocab_size - 1}" if vocab_size is not None else "0 or more"
            raise RowError(Drop.BUILDER_ERROR, f"{said} ids[{i}] = {v}, outside the vocabulary ({top})")
    if len(mask) != len(ids):
        raise RowError(Drop.BUILDER_ERROR, f"{said} {len(mask)} loss_mask entries for {len(ids)} ids: one per id")
    for i, m in enumerate(mask):
        if not (isinstance(m, (bool, np.bool_)) or (isinstance(m, (int, np.integer)) and m in (0, 1))):
            raise RowError(Drop.BUILDER_ERROR, f"{said} loss_mask[{i}] = {m!r}: a loss mask holds 0 and 1 (or false "
                                               "and true)")
    domain = result.get("domain")
    if domain is not None and not (isinstance(domain, str) and domain):
        raise RowError(Drop.BUILDER_ERROR, f"{said} domain {domain!r}: a domain is a non-empty string, or None for "
                                           "the usual one")
    return Tokens([int(v) for v in ids], [bool(m) for m in mask], domain)


def _as_list(value: Any, key: str, said: str) -> list[Any]:
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    raise RowError(Drop.BUILDER_ERROR, f"{said} {key} as a {type(value).__name__}; it must be a list")


def _special_token(key: str) -> property:
    return property(lambda self: self._tok.special_tokens.get(f"{key}_token"),
                    doc=f"The {key} token's text (tokenizer_config.json), or None.")


def _special_id(key: str) -> property:
    return property(lambda self: self._tok.special_id(key), doc=f"The {key} token's id, or None.")


class BuilderTokenizer:
    """The run's tokenizer as a builder's third argument: the part of a transformers tokenizer a builder
    uses, run by HF tokenizers over the same tokenizer.json as the run (so its ids are the run's).

    Offered, with transformers' meanings:
    - encode(text, add_special_tokens=True) -> list[int]; add_special_tokens adds what the tokenizer adds
      around a text (Llama-3's BOS, BERT's [CLS] ... [SEP]; nothing for Qwen). Pass False for a piece that
      goes inside a row you assemble.
    - tokenizer(text, add_special_tokens=True) -> {"input_ids": [...], "attention_mask": [...]}; a list of
      texts gives lists of both. No padding, truncation or tensors.
    - decode(ids, skip_special_tokens=False) -> str, batch_decode(list of ids) -> list[str].
    - tokenize(text) -> list[str] (the token strings, no special tokens added); convert_tokens_to_ids(token
      or list) (a token not in the vocabulary: unk_token_id, None without one); convert_ids_to_tokens(id or
      list).
    - bos_token, eos_token, pad_token, unk_token, sep_token, cls_token, mask_token (text or None) and each
      one's *_id; all_special_tokens, all_special_ids.
    - vocab_size (the base vocabulary, without added tokens, as transformers counts it); len(tokenizer)
      (with them: every id below it is valid); get_vocab() (token -> id, added tokens included).
    - chat_template (the tokenizer's own, or None; a data handler is handed the run's, config.chat_template
      where it names one), special_tokens_map, name_or_path, backend_tokenizer (the tokenizers.Tokenizer
      itself).
    Not offered: apply_chat_template (return a Conversation and the run renders it with its template and
    masks), padding, truncation, return_tensors, offsets.
    """

    def __init__(self, tok: Tokenizer, chat_template: str | None = None) -> None:
        self._tok = tok
        self._chat_template = chat_template  # the run's, where it is handed one (data handlers)
        self.backend_tokenizer = tok.engine
        self.name_or_path = tok.source or tok.name

    bos_token, bos_token_id = _special_token("bos"), _special_id("bos")
    eos_token, eos_token_id = _special_token("eos"), _special_id("eos")
    pad_token, pad_token_id = _special_token("pad"), _special_id("pad")
    unk_token, unk_token_id = _special_token("unk"), _special_id("unk")
    sep_token, sep_token_id = _special_token("sep"), _special_id("sep")
    cls_token, cls_token_id = _special_token("cls"), _special_id("cls")
    mask_token, mask_token_id = _special_token("mask"), _special_id("mask")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict[str, list]:
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens)
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        encoded = [e.ids for e in self.backend_tokenizer.encode_batch(list(text), add_special_tokens=add_special_tokens)]
        return {"input_ids": encoded, "attention_mask": [[1] * len(ids) for ids in encoded]}

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return self.backend_tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in sequences]

    def tokenize(self, text: str) -> list[str]:
        return self.backend_tokenizer.encode(text, add_special_tokens=False).tokens

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | None | list[int | None]:
        if isinstance(tokens, str):
            found = self.backend_tokenizer.token_to_id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | list[int]) -> str | None | list[str | None]:
        if isinstance(ids, (int, np.integer)):
            return self.backend_tokenizer.id_to_token(int(ids))
        return [self.convert_ids_to_tokens(i) for i in ids]

    @property
    def vocab_size(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys(text for key, text in self._tok.special_tokens.items() if key.endswith("_token")))

    @property
    def all_special_ids(self) -> list[int]:
        return [i for i in (self.backend_tokenizer.token_to_id(t) for t in self.all_special_tokens) if i is not None]

    @property
    def chat_template(self) -> str | None:
        return self._chat_template if self._chat_template is not None else self._tok.chat_template

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """{"eos_token": "<|im_end|>", ...}: the tokenizer config's special tokens, as transformers names them."""
        return dict(self._tok.special_tokens)

    def __repr__(self) -> str:
        return f"BuilderTokenizer({self.name_or_path!r}, {len(self):,} ids)"
