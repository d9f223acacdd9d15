"""PipelineConfig: the whole config (format v1), checked across its sections; its hashes; and its validation
errors said as one line per key, with the allowed range or the keys known."""

from __future__ import annotations

import difflib
import hashlib
import json
from typing import Any, Literal

from pydantic import ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from gpu_prep.config.qlora_keys import resolve as resolve_qlora_keys
from gpu_prep.config.foreign import FOREIGN_KEYS
from gpu_prep.config.base import (Action, PAIR_TYPES, TEMPLATE_ROLES, TEXT_TYPES, TOOL_CALL_ROLE, _allowed, _Frozen,
                                   _one_setting)
from gpu_prep.config.input import InputConfig
from gpu_prep.config.templates import check_choice
from gpu_prep.config.sections import (DataprocessorConfig, DatasetConfig, GpuConfig, OutputConfig,
                                       PreprocessingConfig, TokenizerConfig)


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
        return resolve_qlora_keys(data, TEMPLATE_ROLES)

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


