"""The config's `input` section: what the rows look like, which roles and fields count in the loss."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, Field, PrivateAttr, field_validator, model_validator

from gpu_prep.config.base import (ALPACA_FORMAT, ALPACA_NO_INPUT_FORMAT, AXOLOTL_TYPES, SHAREGPT_ROLES,
                                   _NO_ROLE_NAMES, FieldName, _Frozen, _one_setting)


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


