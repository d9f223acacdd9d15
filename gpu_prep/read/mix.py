"""Several datasets in one run (the config's `datasets`): each dataset's files read in order and its data
handlers applied to every row, then the datasets concatenated in order or, with sampling ratios,
interleaved by weight.

Interleaving follows the seed's data_config (Hugging Face `interleave_datasets` with probabilities):
numpy's default_rng(seed) picks the dataset of each next row, drawn in blocks of 1000 with the ratios as
probabilities; a dataset whose rows run out starts again from its first row; the run stops right after
the draw that takes one dataset (first_exhausted) or the last dataset (all_exhausted) through all of its
rows. The order is computed as the rows are read, so memory does not grow with the output.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_prep.errors import ConfigError, Drop, Dropped, RowError
from gpu_prep.read.inputs import InputFile
from gpu_prep.read.jsonl import Columnar
from gpu_prep.read.row import FileRow, ReadRow
from gpu_prep.read.rows import file_rows

DRAW_BLOCK = 1000  # datasets drawn at a time, as the seed's interleaving does (it fixes the order for a seed)

Handler = Callable[..., Any]  # (record, **fn_kwargs) -> record, or None to skip the row
# Data handlers by name: the built-in ones (run/handlers.py, registered as it loads) and a plugin's.
HANDLERS: dict[str, Handler] = {}


def register_handler(name: str, fn: Handler) -> None:
    """Make fn usable as a data handler by name (plugins loaded with --plugin call this)."""
    HANDLERS[name] = fn


def dataset_order(lengths: list[int], ratios: list[float] | None, seed: int, strategy: str) -> Iterator[int]:
    """Which dataset each row of the mixed stream comes from, in order (lengths: rows per dataset)."""
    if ratios is None:
        for k, n in enumerate(lengths):
            yield from [k] * n
        return
    p = np.asarray(ratios, dtype=np.float64)
    drawable = p > 0
    empty = [k for k, n in enumerate(lengths) if n == 0 and drawable[k]]
    if empty:
        raise ConfigError(f"datasets {empty} have a sampling ratio above 0 but no rows")
    if strategy == "all_exhausted" and not drawable.all():
        raise ConfigError("sampling_stopping_strategy all_exhausted cannot exhaust a dataset with ratio 0")
    counts = np.zeros(len(lengths), dtype=np.int64)
    left = int(drawable.sum())  # drawable datasets not yet taken through all their rows
    rng = np.random.default_rng(seed)
    while True:
        for k in rng.choice(len(lengths), size=DRAW_BLOCK, p=p).tolist():
            yield k
            counts[k] += 1
            if counts[k] == lengths[k]:
                left -= 1
                if strategy == "first_exhausted" or left == 0:
                    return




@dataclass
class Dataset:
    """One dataset of the run: its files (indices into the run's file list) and its handlers."""

    name: str
    files: list[InputFile]
    handlers: list[tuple[Handler, dict[str, Any], str, Any]]  # function, fn_kwargs, name, remove_columns
    # About how many times a weighted mix reads it through (its draws over its rows), once the mix has
    # counted the rows: what the run's progress takes as its share of the input.
    passes: float = 1.0
    rows_counted: int | None = None  # its rows, where a weighted mix counted them (set_passes)

    def count(self, max_row_bytes: int) -> int:
        """Its rows, handlers not run (a handler drops a row as a whole, so the count is the same)."""
        return sum(1 for file in self.files for _ in file_rows(file, None, max_row_bytes))

    def rows(self, columnar: Columnar | None, max_row_bytes: int) -> Iterator[FileRow]:
        for file in self.files:
            for row in file_rows(file, columnar, max_row_bytes):
                yield FileRow(file.index, self.handled(row))

    def handled(self, row: ReadRow) -> ReadRow:
        """The row through the dataset's handlers: their record, or dropped where one drops it (the row as
        read kept)."""
        if row.dropped is not None or row.record is None:
            return row
        record, dropped = self.handle(row.record)
        if dropped is not None:
            return ReadRow(row.line, None, row.nbytes, dropped, row.record)
        return row._replace(record=record)

    def handle(self, record: Any) -> tuple[Any, Dropped | None]:
        if self.handlers and not isinstance(record, dict):  # handlers take rows that are objects
            return None, Dropped(Drop.NOT_AN_OBJECT, f"a row must be a JSON object, got {type(record).__name__}")
        for fn, kwargs, name, remove in self.handlers:
            before = set(record) if remove == "all" and isinstance(record, dict) else set()
            try:
                record = fn(record, **kwargs)
            except RowError as err:
                return None, Dropped(err.reason, f"data handler {name}: {err.detail}")
            except Exception as exc:  # a handler's own failure drops the row, naming the handler
                return None, Dropped(Drop.HANDLER_ERROR, f"data handler {name} failed: {type(exc).__name__}: {exc}")
            if record is None:
                return None, Dropped(Drop.SKIPPED_BY_HANDLER, f"data handler {name} skipped the row")
            if remove and isinstance(record, dict):  # the handler's remove_columns ("all": the row's own)
                gone = before if remove == "all" else set(columns(remove))
                record = {k: v for k, v in record.items() if k not in gone}
        return record, None


def columns(value: Any) -> list[str]:
    """A handler's column argument: one name or several."""
    return [value] if isinstance(value, str) else list(value)


def set_passes(datasets: list[Dataset], lengths: list[int], ratios: list[float], strategy: str) -> None:
    """Each dataset's passes, from its rows and the draws expected: until the last (all_exhausted) or the
    first (first_exhausted) dataset is through."""
    drawn = [n / r for n, r in zip(lengths, ratios) if r > 0 and n]
    total = (max if strategy == "all_exhausted" else min)(drawn) if drawn else 0
    for dataset, n, r in zip(datasets, lengths, ratios):
        dataset.passes, dataset.rows_counted = (total * r / n if n else 1.0), n


def config_rows(config: Any, datasets: list[Dataset] | None, columnar: Columnar | None = None
                ) -> Iterator[FileRow] | None:
    """Every row of a config's datasets, mixed as it says; None without datasets (the inputs in order)."""
    return None if datasets is None else _mixed_rows(config, datasets, columnar)


def _mixed_rows(config: Any, datasets: list[Dataset], columnar: Columnar | None) -> Iterator[FileRow]:
    ratios, process, max_row_bytes = config.sampling_ratios(), config.dataprocessor, config.input.max_row_bytes
    if ratios is None:
        for dataset in datasets:
            yield from dataset.rows(columnar, max_row_bytes)
        return
    lengths = [d.count(max_row_bytes) for d in datasets]
    set_passes(datasets, lengths, ratios, process.sampling_stopping_strategy)
    streams = [d.rows(columnar, max_row_bytes) for d in datasets]
    for k in dataset_order(lengths, ratios, process.seed, process.sampling_stopping_strategy):
        row = next(streams[k], None)
        if row is None:  # this dataset ran out: it starts again from its first row
            streams[k] = datasets[k].rows(columnar, max_row_bytes)
            row = next(streams[k])
        yield row


def with_tokenizer(datasets: list[Dataset], tokenizer: Any) -> None:
    """Hand the run's tokenizer to the handlers that take one (a builders.BuilderTokenizer: the part of a
    transformers tokenizer a handler uses, with the run's chat template)."""
    for dataset in datasets:
        dataset.handlers = [(fn, {**kwargs, "tokenizer": tokenizer} if "tokenizer" in inspect.signature(fn).parameters
                             else kwargs, name, remove) for fn, kwargs, name, remove in dataset.handlers]
