"""The config's other sections: preprocessing (with fuzzy_dedup), output, tokenizer, gpu, and datasets with
their data handlers and hub sources, and the dataprocessor."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, Tag, field_validator, model_validator

from gpu_prep.config.base import Action, INT32_MAX, FieldName, _Frozen, _one_setting


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


