"""Errors a user can act on, and the reasons a row can be dropped: Drop (the reasons), Dropped (the one shape a
dropped row's why takes, in every stage) and RowError (raised to drop a row)."""

from __future__ import annotations

from typing import NamedTuple


class GpuPrepError(Exception):
    """An error with a message meant for the user; the CLI prints it without a traceback."""

    exit_code = 1


class ConfigError(GpuPrepError):
    """The config, a CLI option, or something they name (tokenizer, inputs, output dir) is unusable."""

    exit_code = 2


class Interrupted(GpuPrepError):
    """The run stopped for a reason outside its data (a cluster that kept losing workers): like Ctrl-C, it
    keeps what --resume needs."""


class WriteError(GpuPrepError):
    """Writing the output failed (disk full, a file-size limit, a vanished disk): names the file and the
    cause, and says what --resume will do once the cause is gone."""

    def __init__(self, error: OSError, rows_saved: int | None) -> None:
        where = f"{error.filename}: " if error.filename else ""
        if rows_saved is None:
            after = "no checkpoint was written yet: --resume (or --overwrite) starts the run again"
        else:
            after = (f"what was done up to the last checkpoint ({rows_saved:,} rows) is kept: once the cause is "
                     "fixed, --resume finishes the run")
        super().__init__(f"{where}{error.strerror or error}; the run stopped, {after}")


class EngineMismatch(GpuPrepError):
    """Under --strict, the fast tokenizer engine was seen to differ from HF tokenizers during the run."""


class InputError(GpuPrepError):
    """A row broke a rule and --strict asked to stop: names file, line, field and rule."""


class Drop:
    """Reasons a row is not written. Every row read is written or counted under exactly one of these."""

    MALFORMED_JSON = "malformed_json"
    MALFORMED_ROW = "malformed_row"  # a CSV or TSV row whose cells do not match the header's columns
    NOT_AN_OBJECT = "not_an_object"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    UNKNOWN_SCHEMA = "unknown_schema"  # input.type "auto": the row matches no known shape
    EMPTY = "empty"
    TEMPLATE_ERROR = "template_error"
    TEMPLATE_LIMIT = "template_limit"  # the chat template ran past input.template_time_limit or template_max_chars
    TOO_SHORT = "too_short"
    TOO_LONG = "too_long"
    TOO_LARGE = "too_large"  # a line over input.max_row_bytes, dropped unparsed
    DUPLICATE = "duplicate"
    NEAR_DUPLICATE = "near_duplicate"  # preprocessing.fuzzy_dedup: shares a MinHash band with a row kept before
    NO_TRAINED_TOKENS = "no_trained_tokens"
    # over max_seq_len, with preprocessing.truncation "drop" (or "structured" whose last cut is "prompt",
    # where no cut it makes fits)
    TOO_MANY_TOKENS = "too_many_tokens"
    TOKENIZER_MISMATCH = "tokenizer_mismatch"
    HANDLER_ERROR = "handler_error"  # a dataset's data handler failed on the row
    SKIPPED_BY_HANDLER = "skipped_by_handler"  # a data handler asked to skip the row
    BUILDER_ERROR = "builder_error"  # a plugin's builder raised, or returned what its contract does not allow
    SKIPPED_BY_BUILDER = "skipped_by_builder"  # a plugin's builder returned None for the row

    # Reasons that mean the row itself is bad data (--strict stops at the first), as opposed to rows that are
    # well formed but filtered out by a rule (length, duplicate, nothing left to train).
    BAD_DATA = frozenset({MALFORMED_JSON, MALFORMED_ROW, NOT_AN_OBJECT, MISSING_FIELD, WRONG_TYPE, UNKNOWN_SCHEMA, EMPTY, TEMPLATE_ERROR,
                          TEMPLATE_LIMIT, TOKENIZER_MISMATCH, BUILDER_ERROR})


class Dropped(NamedTuple):
    """Why a row is not written: its reason (a Drop code) and a detail that names the field and the rule.
    Every stage that drops a row (reading, format, filter, render, mask, commit) says so with one of these."""

    reason: str
    detail: str


class RowError(Exception):
    """One row breaks a rule: raised where a row is built or rendered (a builder, a data handler, the chat
    template), it drops that row, with a Drop reason and a detail naming the field and the rule."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail

    @property
    def dropped(self) -> Dropped:
        return Dropped(self.reason, self.detail)
