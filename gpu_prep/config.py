"""The pipeline config (format v1): typed, frozen, loaded from JSON or YAML.

Every key and default of the seed's v1 schema is here; keys the seed lacks are marked as gpu-prep's own.
Unknown keys are errors (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from annotated_types import Ge, Gt, Le, Lt
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from gpu_prep.errors import ConfigError
from gpu_prep import qlora_keys
from gpu_prep.foreign import FOREIGN_KEYS

Action = Literal["mask", "train"]


E_NOTATION = re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$")  # 5e-1, 1.5E3
# Every integer setting is at most a 64-bit one, whatever bounds of its own it has: counts, lengths and
# sizes are computed in numpy's int64 (and Python's index-sized ints), so a larger one would pass here
# and end the run in an OverflowError far from the config.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# Token lengths are stored as int32 (Megatron's index, Parquet's seq_lengths) and cuDF's string positions
# are 32-bit.
INT32_MAX = (1 << 31) - 1


def _number_kinds(field: FieldInfo) -> tuple[set[type], list[Any]]:
    """The number types a field takes (int, float), through `| None` and Annotated[...], and the bounds
    (annotated_types' Ge, Gt, Le, Lt) put on them."""
    kinds, bounds = set(), list(field.metadata)
    for kind in typing.get_args(field.annotation) or (field.annotation,):
        if typing.get_origin(kind) is Annotated:
            kind, *extra = typing.get_args(kind)
            bounds += [b for e in extra for b in (e.metadata if isinstance(e, FieldInfo) else [e])]
        if kind in (int, float):
            kinds.add(kind)
    return kinds, [b for b in bounds if isinstance(b, (Ge, Gt, Le, Lt))]


def _int_range(bounds: list[Any]) -> tuple[int, int]:
    """The least and greatest integer the bounds allow, within int64."""
    low = max([INT64_MIN] + [b.ge for b in bounds if isinstance(b, Ge)] + [b.gt + 1 for b in bounds if isinstance(b, Gt)])
    high = min([INT64_MAX] + [b.le for b in bounds if isinstance(b, Le)] + [b.lt - 1 for b in bounds if isinstance(b, Lt)])
    return low, high


def _allowed(field: FieldInfo) -> str | None:
    """The values a number field allows, in words (None: not a number field)."""
    kinds, bounds = _number_kinds(field)
    if kinds == {int}:
        return "integers from {} to {}".format(*_int_range(bounds))
    if not kinds:
        return None
    ends = {type(b): getattr(b, type(b).__name__.lower()) for b in bounds}  # Ge(ge=0) -> {Ge: 0}
    ends = {kind: str(int(end)) if end == int(end) else str(end) for kind, end in ends.items()}
    if ends.keys() == {Ge, Le}:
        return f"finite numbers from {ends[Ge]} to {ends[Le]}"
    words = {Ge: "at least", Gt: "above", Le: "at most", Lt: "below"}
    return ("finite numbers " + " and ".join(f"{words[kind]} {end}" for kind, end in ends.items())).rstrip()


class _Frozen(BaseModel):
    # No inf or nan in a float setting: no limit, size or share is infinite (null says "none" where
    # a setting has no limit), and nan compares false with any bound.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _whole_number(cls, value: Any, info: ValidationInfo) -> Any:
        """For a number field, what its author wrote as a number: 5e-1 or 1e3 in YAML (PyYAML reads them as
        strings, YAML 1.2 as numbers), and for an int field a float that is a whole number (1e8, 2048.0).
        Strictly typed, the field would refuse either. An integer is then held to the field's bounds within
        int64 (INT64_MAX), the field's own or not."""
        if info.field_name is None:
            return value
        kinds, bounds = _number_kinds(cls.model_fields[info.field_name])
        if isinstance(value, str) and kinds and E_NOTATION.match(value):
            value = float(value)
        if isinstance(value, float) and value.is_integer() and kinds == {int}:
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and int in kinds:
            low, high = _int_range(bounds)
            if value < low:
                raise PydanticCustomError("greater_than_equal", "Input should be greater than or equal to {ge}",
                                          {"ge": low})
            if value > high:
                raise PydanticCustomError("less_than_equal", "Input should be less than or equal to {le}",
                                          {"le": high})
        return value


ALPACA_FORMAT = ("Below is an instruction that describes a task, paired with an input that provides further "
                 "context. Write a response that appropriately completes the request.\n\n"
                 "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_NO_INPUT_FORMAT = ("Below is an instruction that describes a task. Write a response that appropriately "
                          "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")
# The input types whose rows are TRL's preference pairs or unpaired rows, and those of pretraining text.
PAIR_TYPES = frozenset({"preference", "kto"})
TEXT_TYPES = frozenset({"text", "pretokenized"})
# The roles chat templates know.
TEMPLATE_ROLES = ("system", "user", "assistant", "tool")
# Not a template role: a row role listed under it is the assistant's tool call, its content JSON of
# {"name", "arguments"} (or a list of them) made into the assistant message's tool_calls
# (format._tool_calls), so the chat template writes the call in its own syntax.
TOOL_CALL_ROLE = "tool_call"
# The roles of ShareGPT-style data ("from") and the template roles they stand for. LLaMA-Factory's tags
# included: a function_call turn is the assistant's tool call (as LLaMA-Factory reads it), an observation
# the tool's result. (Listing function_call under assistant instead keeps its JSON as the reply's text.)
SHAREGPT_ROLES = {"user": ["human", "user"], "assistant": ["gpt", "model", "assistant"],
                  TOOL_CALL_ROLE: ["function_call"], "system": ["system"], "tool": ["tool", "function", "observation"]}
_NO_ROLE_NAMES: dict[str, str] = {}


def _one_setting(data: Any, alias: str, key: str, section: str) -> Any:
    """The config section with `alias` (another tool's name of `key`) moved to `key`; the two given and
    disagreeing is an error: two spellings of one setting must never disagree silently."""
    if not isinstance(data, dict) or alias not in data:
        return data
    data = dict(data)
    value = data.pop(alias)
    if data.setdefault(key, value) != value:
        raise ValueError(f"{section}{alias} and {section}{key} disagree (they name one setting)")
    return data


def _field_name(value: str) -> str:
    """A setting that names a row's field: an empty name would only have every row dropped as missing it."""
    if value == "":
        raise ValueError("is empty; it names a field of the rows (no row has a field named '')")
    return value


# A setting that names a row's field (input.*_key, output.domain_key, ...).
FieldName = Annotated[str, AfterValidator(_field_name)]


# Axolotl's dataset types and the input.type each is here.
AXOLOTL_TYPES = {"completion": "text", "input_output": "segments", "chat_template": "chat", "": "pretokenized"}


class InputConfig(_Frozen):
    # A registered input type (format.register; plugins add more): checked by plugins.check_registered once
    # plugins have loaded, not here.
    type: str = "chat"
    # field_messages is the name other trainers give it.
    messages_key: FieldName = Field("messages", validation_alias=AliasChoices("messages_key", "field_messages"))
    # {template key: row key} inside a message, e.g. {"role": "from", "content": "value"}; "role" and
    # "content" set role_key and content_key, other keys are renamed as given.
    message_property_mappings: dict[str, str] = {}
    # {template role: [row roles]}: roles renamed before rendering, e.g. {"assistant": ["gpt", "model"]};
    # tool_call (TOOL_CALL_ROLE) is the assistant's tool call. Empty: none (chat), or SHAREGPT_ROLES for
    # sharegpt rows.
    roles: dict[str, list[str]] = {}
    # Roles trained where `mask` names no rule for them (then mask_default applies).
    roles_to_train: list[str] = []
    prompt_key: FieldName | None = "prompt"
    response_key: FieldName = "response"
    # input.type preference (TRL's formats): the completions' keys; prompt_key names the prompt, and a row
    # without one has the prompt chosen and rejected share at their start (prompt_key null: every row, its
    # prompt column left alone, as for UltraFeedback's rows whose chosen and rejected hold the prompt).
    chosen_key: FieldName = "chosen"
    rejected_key: FieldName = "rejected"
    # input.type kto (TRL's unpaired preference rows): the completion, and its label (true: desirable).
    completion_key: FieldName = "completion"
    label_key: FieldName = "label"
    # The input type auto gives a row with prompt_key and response_key: instruction (the two tokenized as
    # they are, no chat template) or prompt_response (a user turn and an assistant turn through the chat
    # template, as the QLoRA seed's dataset_schema auto reads them).
    auto_prompt_type: Literal["instruction", "prompt_response"] = "instruction"
    text_key: FieldName = "text"
    # gpu-prep's own: a .txt input is one row (file) or a row per non-blank line (line), under text_key.
    text_rows: Literal["file", "line"] = "file"
    # gpu-prep's own: the split a DatasetDict folder (datasets' save_to_disk) is read from (null: train,
    # or its only split).
    split: str | None = None
    # gpu-prep's own: the keys inside one chat message.
    role_key: FieldName = "role"
    content_key: FieldName = "content"
    # gpu-prep's own: "content" trains a trained role's content and the end-of-turn token that closes it
    # (what trainers expect); "turn" labels the whole rendered turn, header included, as the seed's
    # per-message rendering did.
    mask_scope: Literal["content", "turn"] = "content"
    # gpu-prep's own: what says which text of a conversation is trained. auto: the chat template's
    # {% generation %} markers when it has them (as transformers' return_assistant_tokens_mask reads them,
    # narrowed by the mask rules' roles), else role spans; generation: the markers (a template without them
    # is an error); roles: role spans, with mask_scope, train_on_eos and think_loss, whatever the template.
    mask_method: Literal["auto", "generation", "roles"] = "auto"
    train_end_of_turn: bool = True
    # Which end-of-turn tokens are trained (content scope): those closing trained turns, every turn's, the
    # last trained turn's, or none (train_end_of_turn false means none too).
    train_on_eos: Literal["turn", "all", "last", "none"] = "turn"
    # The texts that close a turn (null: found for you: the tokenizer's end-of-turn tokens such as
    # <|im_end|>, <|eot_id|> or Gemma's <end_of_turn>, its eos token, and a named template's own).
    # train_on_eot is accepted as another name for train_on_eos: both rule these tokens.
    end_of_turn_tokens: list[str] | None = None
    # A message key whose true / false trains or masks that message whatever its role's rule (null: none).
    message_training_key: FieldName | None = "training"
    # A message key holding character ranges of its content trained or masked whatever the message's own
    # rule: [{"begin_offset": 0, "end_offset": 8, "train": false}, ...], end_offset included (null: none).
    message_training_detail_key: FieldName | None = "train_detail"
    # Only the last trained message of a conversation is trained.
    train_last_turn_only: bool = False
    # A message's reasoning under any of these keys becomes its reasoning_content (what templates such as
    # Qwen3's render); extract_think_tags also moves a leading <think>...</think> out of an assistant's
    # content into it. The template renders reasoning as it sees fit (Qwen3 only after the last user turn).
    reasoning_keys: list[str] = ["reasoning", "reasoning_content", "thinking", "reason"]
    extract_think_tags: bool = False
    # keep: reasoning goes to the template; drop: every message's reasoning is removed before rendering
    # (counted as dropped_think_messages).
    think_mode: Literal["keep", "drop"] = "keep"
    # Each reasoning is cut to its first this many tokens before rendering (null: as it is).
    think_max_tokens: int | None = Field(None, ge=0)
    # The rendered reasoning of a trained turn (from its <think> tag, where the template writes one) is
    # trained with the turn; false: masked, only the answer and its end-of-turn token are trained.
    think_loss: bool = False
    # Text rows (pretraining documents): each ends with the end-of-document token, trained, as Megatron's
    # --append-eod does, so documents packed or concatenated stay apart. eod_token: that token's text (a
    # single token of the vocabulary); null: the tokenizer's eos token (or, for tokenizers without one that
    # close every text themselves, as BERT's [SEP], that closing token, and nothing is added).
    # add_eos is accepted as another name for append_eod.
    append_eod: bool = True
    eod_token: str | None = None
    # Alpaca-style instruction rows (input.type "alpaca"): the fields, and how the prompt is written from
    # them ({instruction}, {input}, {system} are replaced; no_input_format when the input is absent or empty).
    field_instruction: FieldName = "instruction"
    field_input: str | None = "input"
    field_output: FieldName = "output"
    field_system: str | None = "system"
    system_prompt: str = ""
    format: str = ALPACA_FORMAT
    no_input_format: str = ALPACA_NO_INPUT_FORMAT
    # How an alpaca row is written: format (the prompt above, template-free, as Axolotl's alpaca) or
    # chat_template (as LLaMA-Factory renders it: the history's pairs as user and assistant turns, then the
    # instruction and input joined by a newline as the user's turn and the output as the assistant's).
    alpaca_render: Literal["format", "chat_template"] = "format"
    # An alpaca row's earlier turns, [[question, answer], ...] (LLaMA-Factory's history column); null: none.
    field_history: str | None = "history"
    # gpu-prep's own: a JSON Lines row longer than this many bytes is dropped (too_large) without being
    # parsed, and never held in memory whole. At most 1 TiB: a row under the cap is parsed in memory, so a
    # larger cap is no cap.
    max_row_bytes: int = Field(64 << 20, ge=2, le=1 << 40)
    # gpu-prep's own: the limits a chat template is held to on each row (a template is code every row runs):
    # the seconds it may spend rendering the row (all its renders of the row together), and the characters
    # its output, and any one value it builds, may have (null: twice preprocessing.max_chars, and at least
    # 1,000,000, so every row the length filter lets through has room). A row that breaks one is dropped
    # (template_limit), naming the limit.
    template_time_limit: float = Field(2.0, gt=0)
    template_max_chars: int | None = Field(None, ge=1)

    _role_of: dict[str, str] = PrivateAttr(default_factory=dict)

    @field_validator("roles")
    @classmethod
    def _one_role_each(cls, roles: dict[str, list[str]]) -> dict[str, list[str]]:
        seen: dict[str, str] = {}
        for target, sources in roles.items():
            for source in sources:
                if seen.setdefault(source, target) != target:
                    raise ValueError(f"the row role {source!r} is listed under both {seen[source]!r} and {target!r}; "
                                     "a row role stands for one template role")
        return roles

    def model_post_init(self, context: Any) -> None:
        roles = self.roles or (SHAREGPT_ROLES if self.type in ("sharegpt", "auto") else {})
        self._role_of = {source: target for target, sources in roles.items() for source in sources}

    @property
    def role_names(self) -> dict[str, str]:
        """Row role -> the template role it stands for (input.roles); roles not in it stand for themselves.
        Read it once per row: a private attribute costs pydantic a __getattr__ call (1.6 us) each time, so
        the fields it comes from are looked at first."""
        if not self.roles and self.type not in ("sharegpt", "auto"):
            return _NO_ROLE_NAMES
        return self._role_of

    @model_validator(mode="before")
    @classmethod
    def _type_names(cls, data: Any) -> Any:
        """Axolotl's names of the input types: an empty type (`type:` in YAML, or "") is pre-tokenized rows."""
        if isinstance(data, dict) and "type" in data:
            name = "" if data["type"] is None else data["type"]
            if isinstance(name, str) and name in AXOLOTL_TYPES:
                data = {**data, "type": AXOLOTL_TYPES[name]}
        return data

    @model_validator(mode="after")
    def _implicit_prompt(self) -> InputConfig:
        if self.prompt_key is None and self.type != "preference":
            raise ValueError(f"prompt_key: null (the prompt that chosen and rejected share) is for input.type "
                             f"preference; input.type {self.type} reads a prompt column")
        return self

    @model_validator(mode="after")
    def _end_of_turn_agrees(self) -> InputConfig:
        """train_end_of_turn and train_on_eos both set, disagreeing: one would be overruled without a word."""
        both = {"train_end_of_turn", "train_on_eos"} <= self.model_fields_set
        if both and self.train_end_of_turn != (self.train_on_eos != "none"):
            raise ValueError(f"train_end_of_turn {str(self.train_end_of_turn).lower()} and train_on_eos "
                             f"{self.train_on_eos} disagree (train_end_of_turn false is train_on_eos none): set one of them")
        return self

    @model_validator(mode="before")
    @classmethod
    def _eot_alias(cls, data: Any) -> Any:
        for alias, key in (("train_on_eot", "train_on_eos"), ("add_eos", "append_eod")):
            data = _one_setting(data, alias, key, "input.")
        return data

    @model_validator(mode="before")
    @classmethod
    def _mappings(cls, data: Any) -> Any:
        """message_property_mappings' role and content entries are role_key and content_key."""
        if isinstance(data, dict) and isinstance(data.get("message_property_mappings"), dict):
            mappings = data["message_property_mappings"]
            for name in ("role", "content"):
                if name in mappings and f"{name}_key" in data and data[f"{name}_key"] != mappings[name]:
                    raise ValueError(f"input.message_property_mappings.{name} and input.{name}_key disagree")
            data = {**data, **{f"{n}_key": mappings[n] for n in ("role", "content") if n in mappings},
                    "message_property_mappings": {k: v for k, v in mappings.items() if k not in ("role", "content")}}
        return data


class FuzzyDedupConfig(_Frozen):
    """gpu-prep's own: near-duplicate removal by MinHash + LSH over word n-grams (gpu_prep/filter/fuzzy.py)."""

    threshold: float = Field(0.8, gt=0.0, lt=1.0)  # the Jaccard similarity the bands are tuned to
    ngram: int = Field(5, ge=1, le=1024)  # words per shingle (each shingle is hashed word by word)
    num_perm: int = Field(128, ge=2, le=1024)  # MinHash permutations
    bands: int | None = Field(None, ge=1)  # LSH bands of num_perm // bands rows; null: chosen for threshold
    seed: int = Field(42, ge=0)

    @model_validator(mode="after")
    def _bands_fit(self) -> FuzzyDedupConfig:
        if self.bands is not None and self.bands > self.num_perm:
            raise ValueError(f"fuzzy_dedup.bands ({self.bands}) cannot exceed num_perm ({self.num_perm})")
        return self


class PreprocessingConfig(_Frozen):
    # At most INT32_MAX: sequence lengths are stored as int32, and the offsets of a chunk's tokens (int64)
    # are computed with max_seq_len added to them.
    max_seq_len: int = Field(2048, ge=1, le=INT32_MAX)
    # gpu-prep's own: a run that drops more than this share of the rows it read ends with exit code 3 (its
    # output is written all the same), as does one that writes no rows, or a dataset of a mix that writes none.
    max_drop_share: float = Field(0.5, ge=0.0, le=1.0)
    # gpu-prep's own: what happens to a row of more than max_seq_len tokens. right: its first tokens are
    # kept; left: its last; drop: it is dropped (too_many_tokens); raise: the run stops, naming it; split:
    # it is cut into samples of max_seq_len tokens (pretraining text), none lost; structured (chat rows):
    # the system messages and the latest turns are kept, the oldest turns between them dropped, then the
    # kept turns' reasoning removed, oldest first, and only then the last cut (structured_last_cut).
    truncation: Literal["right", "left", "drop", "raise", "split", "structured"] = "right"
    # structured's last cut, for a row its turns and reasoning cannot bring under max_seq_len. left: the first
    # tokens go, the seed's fallback; prompt: the longest untrained content keeps its first tokens, as many
    # as fit (as LLaMA-Factory keeps a prompt's start), the system messages, headers and trained text whole,
    # and a row that fits only by cutting those is dropped (too_many_tokens).
    structured_last_cut: Literal["left", "prompt"] = "left"
    min_chars: int = Field(50, ge=0)
    max_chars: int = Field(2_000_000, ge=1)
    deduplicate: bool = True
    # gpu-prep's own: how many of a row's first characters dedup hashes (the seed's 200); null: the whole text.
    # At most INT32_MAX: the GPU backend slices the texts in cuDF, whose positions are 32-bit.
    dedup_prefix_chars: int | None = Field(200, ge=1, le=INT32_MAX)
    # gpu-prep's own: the memory the dedup seen-set may hold (16 bytes a row kept); past it, its digests go
    # to sorted files in the output directory, memory-mapped, and are removed when the run ends. null: no cap.
    # At most 1 PiB (a larger budget is no cap; its bytes are counted as an int).
    dedup_memory_mb: float | None = Field(1024, gt=0, le=1 << 30)
    # gpu-prep's own: drop rows that share a MinHash band with a row written earlier (near_duplicate);
    # {} or true takes the defaults, null or false (the default) turns it off. Its band keys take
    # dedup_memory_mb too.
    fuzzy_dedup: FuzzyDedupConfig | None = None

    @field_validator("fuzzy_dedup", mode="before")
    @classmethod
    def _fuzzy_switch(cls, value: Any) -> Any:
        return {} if value is True else None if value is False else value
    max_items: int | None = Field(None, ge=1)
    # gpu-prep's own: how samples are put together into sequences of at most max_seq_len tokens, within a
    # shard. none: one sample per sequence. wrapped: the samples concatenated in order and cut every
    # max_seq_len tokens (pretraining; a sample may go on in the next sequence). bfd: whole samples packed
    # best-fit-decreasing (never split). Packed output records each sample's boundaries.
    packing: Literal["none", "wrapped", "bfd"] = "none"
    # Preference pairs (input.type preference), as TRL names the limits: a prompt longer than
    # max_prompt_length tokens keeps its first (truncation_mode keep_start) or last (keep_end) tokens; a
    # completion longer than max_completion_length keeps its first; then prompt + completion is cut to
    # max_seq_len (TRL's max_length) at the completion's end. A pair whose prompt leaves no completion token
    # within max_seq_len is dropped (too_many_tokens). null: no limit.
    max_prompt_length: int | None = Field(None, ge=1)
    max_completion_length: int | None = Field(None, ge=1)
    truncation_mode: Literal["keep_start", "keep_end"] = "keep_end"


SPLIT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


class OutputConfig(_Frozen):
    domain_key: FieldName | None = None
    # bin: the seed's raw arrays with meta.json; h5: one HDF5 file per shard; megatron: Megatron's
    # indexed dataset (.bin/.idx) and a .loss_mask.bin sidecar; parquet: rows of input_ids, attention_mask
    # (not when packed) and labels (-100 where the loss mask is 0), as Hugging Face trainers take
    # pre-tokenized data.
    storage_format: Literal["bin", "h5", "megatron", "parquet"] = "bin"
    max_tokens_per_shard: int = Field(100_000_000, ge=1)
    # gpu-prep's own: the type token ids are stored as; auto: uint16 for a vocabulary of fewer than 65500
    # ids, else int32 (Megatron's rule). Unset: int64 (the seed's), or auto for megatron.
    token_dtype: Literal["int64", "int32", "uint32", "uint16", "auto"] | None = None
    # gpu-prep's own: the type of bin and h5 loss masks (megatron's sidecar is uint8; parquet has labels).
    # Unset: int64 (the seed's), except uint8 when every row is pretraining text (a mask of ones: eight
    # bytes a token would be spent on nothing).
    loss_mask_dtype: Literal["int64", "uint8"] | None = None
    # gpu-prep's own: {name: share} (train: 0.98, validation: 0.02; any names, shares summing to 1). Each row
    # goes to a split by a hash of its own text (what filters see) and split_seed, so a row keeps its split
    # when the input grows or is reordered, and equal rows share one; output under OUT/<split>/<domain>/.
    splits: dict[str, float] | None = None
    split_seed: int = 0
    # gpu-prep's own: write each domain's samples in a seeded order across the whole run (not only within a
    # chunk), in bounded memory; the same order on a cluster and on resume.
    shuffle: bool = False
    shuffle_seed: int = 0
    # gpu-prep's own: the Parquet columns of preference pairs. dpo: prompt_ids, chosen_ids and rejected_ids,
    # the completions without the prompt (TRL's DPO collator); reward: chosen_ids and rejected_ids, each the
    # whole sequence (what TRL's RewardTrainer takes without tokenizing again); dpo_legacy: prompt_input_ids,
    # chosen_input_ids, rejected_input_ids (TRL before 1.0).
    preference_columns: Literal["dpo", "reward", "dpo_legacy"] = "dpo"

    @field_validator("splits")
    @classmethod
    def _split_shares(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("splits: name at least one split, e.g. {train: 0.98, validation: 0.02}")
        for name, share in value.items():
            if not SPLIT_NAME.fullmatch(name) or name == "tokenizer":
                raise ValueError(f"splits: {name!r} cannot name a split folder (letters, digits, _ and -, starting "
                                 "with a letter; not 'tokenizer', the folder the tokenizer is copied to)")
            if not share > 0:
                raise ValueError(f"splits: {name}'s share must be above 0, got {share}")
        if abs(sum(value.values()) - 1) > 1e-6:
            raise ValueError(f"splits: the shares must sum to 1, got {sum(value.values()):g}")
        return value

    @model_validator(mode="after")
    def _fits_format(self) -> OutputConfig:
        if self.storage_format == "megatron" and self.token_dtype == "uint32":
            raise ValueError("storage_format megatron: Megatron's index has no uint32 token type; use uint16, "
                             "int32, int64 or auto")
        if self.storage_format in ("megatron", "parquet") and self.loss_mask_dtype is not None:
            raise ValueError(f"loss_mask_dtype applies to bin and h5; {self.storage_format} stores the mask its own way")
        return self

    def token_type(self, vocab_size: int) -> str:
        """The token type this output stores ids of a vocabulary of vocab_size as."""
        chosen = self.token_dtype or ("auto" if self.storage_format == "megatron" else "int64")
        if chosen == "auto":
            return "uint16" if vocab_size < 65500 else "int32"
        return chosen


class TokenizerConfig(_Frozen):
    """gpu-prep's own: which tokenizer, and which engine runs it."""

    # A directory, a bundled name, or a model id on the Hugging Face hub ("Qwen/Qwen2.5-7B-Instruct"),
    # found in the hub cache (HF_HOME, HF_HUB_CACHE; needs the hub extra).
    name: str | None = None
    revision: str | None = None  # a model id's branch, tag or commit (null: main)
    # auto: the first fast engine (fastokens, then tiktoken) that reproduces HF exactly on a sample of the
    # input, else HF tokenizers; a share of every chunk is checked against HF all the way through.
    engine: Literal["auto", "hf", "fastokens", "tiktoken"] = "auto"


class GpuConfig(_Frozen):
    """gpu-prep's own: device memory for the GPU backend (ignored on the CPU)."""

    # An RMM pool of this many bytes (or a size such as "8GiB"); null keeps RMM's default allocator.
    # (Tag: its errors name the int choice "int", as they do unconstrained.)
    rmm_pool_size: Annotated[int, Field(ge=0), Tag("int")] | str | None = None
    # Let cuDF spill device memory to host when the device is full.
    spill: bool = False
    # How JSON Lines are parsed on the GPU backend: "cudf", byte ranges with cudf.read_json for text,
    # instruction and chat rows, wherever a scan of the bytes on the device (gpu_prep.read.jsonscan) shows every
    # line is one the strict parser reads (other ranges: line by line on the host); or "exact", line by line
    # with the strict parser as on the CPU. Without cuDF (and on the CPU backend) lines are read on the host.
    reader: Literal["exact", "cudf"] = "cudf"


class DataHandlerConfig(_Frozen):
    """One data handler of a dataset (seed data_config): a registered name (checked with the input types by
    plugins.check_registered) and its arguments."""

    name: str
    arguments: dict[str, Any] = {}

    def fn_kwargs(self) -> dict[str, Any]:
        """The handler's keyword arguments (arguments.fn_kwargs); remove_columns is applied after it runs."""
        return dict(self.arguments.get("fn_kwargs") or {})


class HubDatasetConfig(_Frozen):
    """A dataset read through the datasets library, streamed (datasets.load_dataset(..., streaming=True)):
    a hub id ("org/name") or a folder datasets can load; needs the hub extra and datasets."""

    name: str
    config: str | None = None
    split: str = "train"
    revision: str | None = None
    data_files: str | list[str] | dict[str, Any] | None = None


class DatasetConfig(_Frozen):
    """One dataset of a multi-dataset run (seed data_config's `datasets` entries)."""

    name: str
    # Files, folders, globs or URLs (s3://, gs://, https://, hf://, ...), read in order; or `hub` instead.
    data_paths: list[str] = []
    hub: HubDatasetConfig | None = None
    # The format of files without a known extension (a file with one must hold what it says).
    builder: Literal["jsonl", "json", "csv", "tsv", "txt", "parquet", "arrow", "feather"] | None = None

    @field_validator("builder", mode="before")
    @classmethod
    def _text_builder(cls, value: Any) -> Any:
        return "txt" if value == "text" else value  # the datasets library's name for it
    sampling: float | None = Field(None, ge=0.0, le=1.0)
    data_handlers: list[DataHandlerConfig] = []
    domain: str | None = None  # the domain of its rows when output.domain_key gives none (null: its name)
    # Its own input and mask settings, over the config's (input keys replace those given, mask replaces
    # the whole rule set).
    input: dict[str, Any] | None = None
    mask: dict[str, Action] | None = None
    mask_default: Action | None = None


class DataprocessorConfig(_Frozen):
    type: Literal["default"] = "default"
    sampling_stopping_strategy: Literal["all_exhausted", "first_exhausted"] = "all_exhausted"
    seed: int = Field(42, ge=0)  # numpy's random generators take no negative seed

    @model_validator(mode="before")
    @classmethod
    def _seed_alias(cls, data: Any) -> Any:
        return _one_setting(data, "sampling_seed", "seed", "dataprocessor.")


class PipelineConfig(_Frozen):
    version: Literal[1] = 1
    # gpu-prep's own: a tokenizer directory (tokenizer.json + tokenizer_config.json) or a bundled name.
    tokenizer: TokenizerConfig = TokenizerConfig()
    # gpu-prep's own: which backend runs the array stages.
    device: Literal["auto", "cpu", "gpu"] = "auto"
    gpu: GpuConfig = GpuConfig()
    # gpu-prep's own: the chat template (gpu_prep/render/templates.py): tokenizer_default, tokenizer_default_fallback_chatml,
    # a name written here (chatml, qwen3, llama3, gemma, mistral, deepseek), a .jinja file or a Jinja string.
    chat_template: str = "tokenizer_default"
    # gpu-prep's own: which of a tokenizer's named templates (tokenizer_config.json's list of {name,
    # template}, or additional_chat_templates/<name>.jinja) to use, e.g. "tool_use" (null: "default").
    chat_template_name: str | None = None
    # Extra variables handed to the chat template, as transformers' apply_chat_template(**kwargs) does:
    # enable_thinking, reasoning_effort, a custom date string, ...
    chat_template_kwargs: dict[str, Any] = {}
    input: InputConfig = InputConfig()
    mask: dict[str, Action] = {}
    mask_default: Action = "mask"
    preprocessing: PreprocessingConfig = PreprocessingConfig()
    output: OutputConfig = OutputConfig()
    # Several datasets in one run (the seed's data_config): read in order and concatenated, or mixed by
    # their sampling ratios as `dataprocessor` says. Without `datasets`, the inputs given on the command
    # line are one dataset.
    datasets: list[DatasetConfig] | None = None
    dataprocessor: DataprocessorConfig = DataprocessorConfig()

    @model_validator(mode="before")
    @classmethod
    def _qlora_keys(cls, data: Any) -> Any:
        """The QLoRA seed's flat keys (dataset_schema, max_length, ...) are other names of keys here."""
        return qlora_keys.resolve(data, TEMPLATE_ROLES)

    @model_validator(mode="before")
    @classmethod
    def _reward_drops(cls, data: Any) -> Any:
        """Reward pairs drop what is over max_seq_len unless truncation is set: a reward model scores a
        sequence at its last token, so a cut completion would be scored as if whole (TRL's RewardTrainer
        drops such pairs too)."""
        if not isinstance(data, dict) or not isinstance(data.get("output"), dict) or "truncate_side" in data:
            return data
        preprocessing = data.get("preprocessing") or {}
        if data["output"].get("preference_columns") != "reward" or not isinstance(preprocessing, dict) \
                or "truncation" in preprocessing:
            return data
        return {**data, "preprocessing": {**preprocessing, "truncation": "drop"}}

    @model_validator(mode="before")
    @classmethod
    def _template_jinja(cls, data: Any) -> Any:
        """Axolotl's chat_template_jinja (with chat_template absent or `jinja`) is the template chat_template
        names: a Jinja string or a .jinja file."""
        if isinstance(data, dict) and "chat_template_jinja" in data and data.get("chat_template") == "jinja":
            data = {k: v for k, v in data.items() if k != "chat_template"}  # `jinja`: the other key says which
        return _one_setting(data, "chat_template_jinja", "chat_template", "")

    @model_validator(mode="after")
    def _ratios(self) -> PipelineConfig:
        if not self.datasets:
            return self
        for d in self.datasets:
            if bool(d.data_paths) == (d.hub is not None):
                raise ValueError(f"datasets: {d.name!r} needs data_paths or hub (one of them)")
        names = [d.name for d in self.datasets]
        if len(set(names)) < len(names):
            raise ValueError(f"datasets: names must be unique, got {names}")
        ratios = [d.sampling for d in self.datasets]
        if any(r is not None for r in ratios):
            if any(r is None for r in ratios):
                raise ValueError("datasets: give every dataset a sampling ratio, or none (concatenation)")
            if abs(sum(ratios) - 1.0) > 1e-6:
                raise ValueError(f"datasets: the sampling ratios must sum to 1, they sum to {sum(ratios):g}")
        for k in range(len(self.datasets)):
            self.dataset_config(k)  # its own settings must make a valid config too
        return self

    @model_validator(mode="after")
    def _preference(self) -> PipelineConfig:
        kinds = self.input_types() & PAIR_TYPES
        if not kinds:
            return self
        kind = kinds.pop()
        if self.input_types() != {kind}:
            raise ValueError(f"input.type {kind}: every dataset of the run must be {kind} rows (the output holds "
                             "prompts and completions, not single samples)")
        if self.output.storage_format not in ("bin", "parquet"):
            raise ValueError(f"input.type {kind}: written as bin (samples with the loss mask on the completion) or "
                             f"parquet (TRL's columns), not {self.output.storage_format}")
        if self.preprocessing.packing != "none" or self.preprocessing.truncation not in ("right", "drop", "raise"):
            raise ValueError(f"input.type {kind}: pairs are neither packed nor split; set preprocessing.packing "
                             "none and truncation right (cut by max_prompt_length, max_completion_length and "
                             "max_seq_len), drop or raise")
        return self

    @model_validator(mode="after")
    def _alpaca_turn_masks(self) -> PipelineConfig:
        """Alpaca rows through the chat template are turns, masked by role: prompt and response rules alone
        would train nothing."""
        inp = self.input
        if inp.type == "alpaca" and inp.alpaca_render == "chat_template" and {"prompt", "response"} & set(self.mask) \
                and "assistant" not in self.mask and "assistant" not in inp.roles_to_train:
            raise ValueError("input.alpaca_render chat_template writes alpaca rows as user and assistant turns, masked "
                             "by role: write mask.user / mask.assistant (or input.roles_to_train: [assistant]) "
                             "instead of mask.prompt / mask.response")
        return self

    @model_validator(mode="after")
    def _rules_name_mapped_roles(self) -> PipelineConfig:
        """A mask rule or roles_to_train entry naming a row role that input.roles maps to another role would
        never apply (the rules see messages as mapped: ShareGPT's gpt is assistant): refused, saying which to
        write."""
        names = self.input.role_names
        named = [(f"mask.{role}", role) for role in self.mask] + \
            [(f"input.roles_to_train: {role}", role) for role in self.input.roles_to_train]
        for key, role in named:
            mapped = names.get(role, role)
            if mapped == role:
                continue
            mapping = "input.roles" if self.input.roles else "input.roles (here the default ShareGPT mapping)"
            if mapped == TOOL_CALL_ROLE:
                raise ValueError(f"{key}: {mapping} lists {role!r} under tool_call: such a turn becomes the tool calls "
                                 "of an assistant message, the assistant's output, trained by the assistant's rule (a "
                                 f"message's own {self.input.message_training_key or 'training'!r} flag can leave one "
                                 "out); no rule names them apart")
            raise ValueError(f"{key}: the rules name roles as input.roles maps them, and {mapping} maps the row role "
                             f"{role!r} to {mapped!r}: write {mapped!r}")
        return self

    @model_validator(mode="after")
    def _split_text_only(self) -> PipelineConfig:
        others = self.input_types() - TEXT_TYPES
        if self.preprocessing.truncation == "split" and others:
            raise ValueError(f"preprocessing.truncation split cuts rows into windows of max_seq_len tokens wherever "
                             f"they fall, for pretraining text (input.type text or pretokenized); input.type "
                             f"{', '.join(sorted(others))} is not: its rows would be cut inside turns, and windows "
                             "with no trained token written. Use right, left, drop or structured")
        return self

    @model_validator(mode="after")
    def _packing_format(self) -> PipelineConfig:
        if self.preprocessing.packing != "none" and self.output.storage_format == "megatron":
            raise ValueError("preprocessing.packing: Megatron builds its own sequences from the documents of an "
                             "indexed dataset; pack for bin, h5 or parquet")
        return self

    def dataset_config(self, k: int) -> PipelineConfig:
        """The config dataset k's rows are formatted and masked with: this one with its own input and
        mask settings over it."""
        spec = (self.datasets or [])[k]
        own = spec.input or {}
        if any(h.name == "tokenize_and_apply_input_masking" for h in spec.data_handlers) and "type" not in own:
            own = {**own, "type": "pretokenized"}  # the handler's rows are ids and labels
        if not own and spec.mask is None and spec.mask_default is None:
            return self
        # Only the keys the file set, as it set them: a default written out would count as set, and the
        # defaults that depend on the input type (sharegpt's conversations / from / value) would lose.
        data = self.model_dump(exclude={"datasets"}, exclude_unset=True)
        inherited = data.get("input", {})
        if {"train_end_of_turn", "train_on_eos", "train_on_eot"} & set(own):  # one of the pair set: the other not inherited
            inherited = {k: v for k, v in inherited.items() if k not in ("train_end_of_turn", "train_on_eos")}
        data["input"] = {**inherited, **own}
        if spec.mask is not None:
            data["mask"] = spec.mask
        if spec.mask_default is not None:
            data["mask_default"] = spec.mask_default
        try:
            return PipelineConfig.model_validate(data)
        except ValidationError as exc:  # the dataset's own input or mask settings, named as the file has them
            found = [_describe({**e, "loc": e["loc"] or ("input",)}) for e in exc.errors(include_url=False)]
            raise ValueError("\n  ".join(f"datasets.{k}.{line}" for line in found)) from None

    def all_configs(self) -> list[PipelineConfig]:
        """The configs the run's rows are formatted with: this one, or each dataset's own."""
        return [self.dataset_config(k) for k in range(len(self.datasets))] if self.datasets else [self]

    @property
    def split_windows(self) -> int | None:
        """The length of the windows truncation split cuts rows into (max_seq_len), or None where no row is cut:
        for Megatron, which makes its own samples of --seq-length across documents and samples an indexed
        dataset by sequence, shuffled (windows written as sequences of their own would meet other documents'
        windows with no end-of-document token between them; its preprocess_data.py never cuts a document),
        and under packing wrapped, which cuts the stream of whole samples every max_seq_len itself (windows
        cut first would be samples of their own, whose positions restart mid-document)."""
        rules = self.preprocessing
        cut = rules.truncation == "split" and self.output.storage_format != "megatron" and rules.packing != "wrapped"
        return rules.max_seq_len if cut else None

    def input_types(self) -> set[str]:
        """The input types of the run's rows."""
        return {c.input.type for c in self.all_configs()}

    def mask_dtype(self) -> str:
        """output.loss_mask_dtype, or when unset: uint8 if every row is pretraining text, else int64."""
        return self.output.loss_mask_dtype or ("uint8" if self.input_types() == {"text"} else "int64")

    def sampling_ratios(self) -> list[float] | None:
        ratios = [d.sampling for d in self.datasets or []]
        return ratios if ratios and None not in ratios else None

    def warnings(self) -> list[str]:
        """What this config does that its author may not mean (printed before a run and by validate)."""
        rules, found = self.preprocessing, []
        pairs = self.input_types() & PAIR_TYPES
        if pairs and any(c.mask for c in self.all_configs()):
            found.append(f"mask has no effect on input.type {pairs.pop()}: each completion is trained, the prompt "
                         "never (TRL trains them so); remove mask")
        dedup = [name for name, on in (("deduplicate", rules.deduplicate), ("fuzzy_dedup", rules.fuzzy_dedup)) if on]
        ratios = self.sampling_ratios()
        if ratios is not None and self.dataprocessor.sampling_stopping_strategy == "all_exhausted" and dedup \
                and sum(r > 0 for r in ratios) >= 2:
            found.append(f"the mix (all_exhausted) draws again the rows of the datasets that run out first, and "
                         f"preprocessing.{' and '.join(dedup)} drops each row drawn again as a duplicate, so no dataset "
                         "comes out larger than it is: to oversample, turn dedup off (the mix's repeats are then kept), "
                         "or set sampling_stopping_strategy first_exhausted to draw no row twice")
        turns = self.input_types() - TEXT_TYPES
        if rules.packing == "wrapped" and turns:
            found.append(f"preprocessing.packing wrapped cuts the stream every max_seq_len tokens, for pretraining "
                         f"text; input.type {', '.join(sorted(turns))} rows would be cut inside turns, and a sequence "
                         "would train answers whose prompt is in the one before: pack them with bfd (whole samples)")
        if self.output.storage_format == "megatron" and "truncation" not in rules.model_fields_set \
                and self.input_types() & TEXT_TYPES:
            found.append(f"output.storage_format megatron: documents over preprocessing.max_seq_len ({rules.max_seq_len} "
                         "tokens) are cut there (truncation 'right', the default), and Megatron makes its own samples "
                         "across documents: set preprocessing.truncation to split to keep every token, or to right to "
                         "say the cut is meant")
        return found

    @field_validator("chat_template")
    @classmethod
    def _known_template(cls, value: str) -> str:
        from gpu_prep.render.templates import check_choice

        return check_choice(value)

    @field_validator("tokenizer", mode="before")
    @classmethod
    def _tokenizer_shorthand(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) or value is None else value

    def action(self, label: str) -> Action:
        """The mask rule for a role (chat) or field (instruction): `mask` first, then roles_to_train, then
        mask_default."""
        if label in self.mask:
            return self.mask[label]
        return "train" if label in self.input.roles_to_train else self.mask_default

    def canonical_json(self) -> str:
        return _canonical(self.model_dump(mode="json"))

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def output_sha256(self) -> str:
        """The sha256 of what in the config can change the output: all of it but the device, the GPU's
        settings and the dedup memory budget (the backends write the same bytes, a budget only spills
        sooner). A run resumes where this is unchanged."""
        return output_sha256(self.model_dump(mode="json"))


def output_sha256(dumped: dict[str, Any]) -> str:
    """PipelineConfig.output_sha256 of a config as model_dump(mode="json") gives it (a manifest's "config")."""
    kept = {k: v for k, v in dumped.items() if k not in ("device", "gpu")}
    kept["preprocessing"] = {k: v for k, v in kept.get("preprocessing", {}).items() if k != "dedup_memory_mb"}
    return hashlib.sha256(_canonical(kept).encode()).hexdigest()


def _canonical(dumped: dict[str, Any]) -> str:
    """A config's JSON with sorted keys and no spaces: the same config gives the same text."""
    return json.dumps(dumped, sort_keys=True, separators=(",", ":"))


def _known_keys(loc: tuple) -> list[str]:
    """The keys allowed in the section that holds loc's last key (through lists and optional sections)."""
    model: Any = PipelineConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # an element of a list: the list's item type, found below
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = _section(field.annotation)
    return list(getattr(model, "model_fields", {}))


def _field_at(loc: tuple) -> FieldInfo | None:
    """The field loc names (through lists and optional sections); None where it names none."""
    model: Any = PipelineConfig
    field = None
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        model = _section(field.annotation)
    return field


def _section(annotation: Any) -> Any:
    """The model a field holds, through list[...] and ... | None."""
    import typing

    for arg in (*typing.get_args(annotation), annotation):
        if hasattr(arg, "model_fields"):
            return arg
        inner = [a for a in typing.get_args(arg) if hasattr(a, "model_fields")]
        if inner:
            return inner[0]
    return annotation




def _describe(error: dict[str, Any]) -> str:
    path = ".".join(str(p) for p in error["loc"]) or "(top level)"
    value = error.get("input")
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "value_error" and not error["loc"]:  # a rule across sections: its message names its keys
        return str(ctx.get("error", error["msg"]))
    if kind == "extra_forbidden":
        known = _known_keys(error["loc"])
        key = str(error["loc"][-1])
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        if key in FOREIGN_KEYS:
            hint = f"other tools' {key!r} is gpu-prep's {FOREIGN_KEYS[key]}; "
        return f"{path}: unknown key; {hint}allowed keys here: {', '.join(known) or '(none)'}"
    if kind == "literal_error":
        return f"{path}: {value!r} is not allowed; allowed: {ctx.get('expected')}"
    if kind == "value_error":
        return f"{path}: {ctx.get('error', error['msg'])}"
    field = _field_at(error["loc"])
    allowed = _allowed(field) if field is not None else None
    return f"{path}: {value!r} is invalid: {error['msg']}" + (f"; allowed: {allowed}" if allowed else "")


def parse_config(data: Any, source: str = "<config>") -> PipelineConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the config must be a mapping of keys, got {type(data).__name__}")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(e) for e in exc.errors(include_url=False)]
        raise ConfigError(f"{source}: invalid config\n  " + "\n  ".join(lines)) from None


class _TwiceError(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused where it names a key twice (the parser would keep the last silently)."""
    data = dict(pairs)
    if len(data) < len(pairs):
        twice = next(k for k in data if sum(key == k for key, _ in pairs) > 1)
        raise _TwiceError(f"key {twice!r} is given twice in one object; only one can hold")
    return data


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that names a key twice (it would keep the last silently)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:  # as written (a merge key << brings keys that may be overridden)
            if key_node.tag != "tag:yaml.org,2002:str":
                continue
            if key_node.value in seen:
                raise _TwiceError(f"line {key_node.start_mark.line + 1}: key {key_node.value!r} is given twice in one "
                                  "mapping; only one can hold")
            seen.add(key_node.value)
        return super().construct_mapping(node, deep)




def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> PipelineConfig:
    """The config file, with `key.path=value` overrides (values read as YAML) applied before it is checked."""
    path = Path(path)
    is_yaml = path.suffix.lower() in (".yaml", ".yml")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: the config is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeys) if is_yaml else json.loads(text, object_pairs_hook=_unique_keys)  # noqa: S506  a SafeLoader
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {'YAML' if is_yaml else 'JSON'}: {exc}") from None
    except _TwiceError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    data = _from_folder(data, path.parent)  # the file's paths are its folder's; --set values are the command line's
    for override in overrides:
        data = _override(data, override, path)
    return parse_config(data, str(path))


def _override(data: Any, override: str, path: Path) -> Any:
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {override!r}: write it as key.path=value, e.g. preprocessing.max_seq_len=4096")
    try:
        value = yaml.load(raw, Loader=_UniqueKeys) if raw.strip() else ""  # noqa: S506  a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {override!r}: the value is not YAML: {exc}") from None
    data = dict(data) if isinstance(data, dict) else {}
    node: Any = data
    names = key.strip().split(".")
    for depth, name in enumerate(names[:-1]):
        slot = _slot(node, name, override, names[:depth])
        child = node[slot] if isinstance(node, list) else node.get(slot)
        if isinstance(child, (dict, list)):
            child = type(child)(child)  # a copy: the parsed file is not changed in place
        elif names[depth + 1].isdigit():
            where = ".".join(names[:depth + 1])
            raise ConfigError(f"--set {override!r}: the config has no list {where} to index; give it whole, "
                              f"e.g. --set '{where}=[...]'")
        else:
            child = {"name": child} if name == "tokenizer" and child else {}
        node[slot] = child
        node = child
    node[_slot(node, names[-1], override, names[:-1])] = value
    return data


def _slot(node: Any, name: str, override: str, above: list[str]) -> Any:
    """Where `name` points in node: a key of a mapping; in a list (datasets), an index from 0 or the name of
    the entry whose `name` it is."""
    if not isinstance(node, list):
        return name
    if name.isdigit() and int(name) < len(node):
        return int(name)
    named = [k for k, entry in enumerate(node) if isinstance(entry, dict) and entry.get("name") == name]
    if named:
        return named[0]
    where = ".".join(above)
    if not node:
        raise ConfigError(f"--set {override!r}: {where} is an empty list; give it whole, e.g. --set '{where}=[...]'")
    names = [entry["name"] for entry in node if isinstance(entry, dict) and isinstance(entry.get("name"), str)
             and "." not in entry["name"]]  # a name with a dot in it is reached by its index
    raise ConfigError(f"--set {override!r}: {where} is a list of {len(node)}; give an index from 0 to {len(node) - 1}"
                      + (f" or a name ({', '.join(names)})" if names else ""))


def _from_folder(data: Any, folder: Path) -> Any:
    """Paths written in a config file are the config file's: its datasets' data_paths and a chat template
    file always, a tokenizer folder when one is there (else it is a bundled name or a model id)."""
    if not isinstance(data, dict):
        return data

    def here(value: Any) -> Any:
        local = isinstance(value, str) and value and not os.path.isabs(value) and "://" not in value
        return os.path.normpath(folder / value) if local else value

    data = dict(data)
    if isinstance(data.get("datasets"), list):
        data["datasets"] = [{**d, "data_paths": [here(p) for p in d["data_paths"]]}
                            if isinstance(d, dict) and isinstance(d.get("data_paths"), list) else d
                            for d in data["datasets"]]
    for key in ("chat_template", "chat_template_jinja"):
        template = data.get(key)
        if isinstance(template, str) and template.endswith((".jinja", ".j2")) and "{" not in template:
            data[key] = here(template)
    tokenizer = data.get("tokenizer")
    name = tokenizer.get("name") if isinstance(tokenizer, dict) else tokenizer
    if isinstance(name, str) and not os.path.isabs(name) and (folder / name).is_dir():
        data["tokenizer"] = {**tokenizer, "name": here(name)} if isinstance(tokenizer, dict) else here(name)
    elif isinstance(name, str) and not os.path.isabs(name) and os.path.isdir(name) and folder.resolve() != Path.cwd():
        # Read from here it would depend on where the command runs, not on where the config is.
        seen = os.path.relpath(os.path.abspath(name), folder.resolve())
        raise ConfigError(f"tokenizer {name!r}: a config's paths are its folder's, and {folder / name} is no folder "
                          f"(./{name} from here is one): write it as the config's folder sees it, {seen!r}")
    return data
