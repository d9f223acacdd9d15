"""Where every input row went: written, or dropped for a named reason, per input file.

For each file, rows_read == rows_written + sum(dropped.values()); the manifest records it and a test holds
the pipeline to it.
"""

from __future__ import annotations

import base64
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gpu_prep.run.checkpoint import reopen
from gpu_prep.errors import ConfigError, Drop, Dropped, InputError
from gpu_prep.failpoint import failpoint
from gpu_prep.read.inputs import InputFile
from gpu_prep.read.jsonl import as_read
from gpu_prep.read.columnar import locator
from gpu_prep.read.files import LINE_LAYOUTS
from gpu_prep.durable import create, finish_file, temporary_path, writing

EXAMPLES_PER_REASON = 3
# The parse report's counts (besides unknown roles): rows with tools, and what building chat rows did.
PIECES = "(whole pieces)"  # trained_tokens_by_role's key for rows trained piece by piece, not by message
PARSE_COUNTS = ("rows_with_tools", "tools_parsed_from_string", "messages_parsed_from_string", "moved_reasoning_keys",
                "extracted_think_from_content", "dropped_think_messages", "structured_dropped_turns",
                "structured_dropped_reasoning", "structured_cut_content", "reasoning_not_rendered",
                "think_blocks_not_rendered", "think_blocks_trained", "think_blocks_untouched", "system_from_field",
                "system_field_not_used", "tool_calls_parsed", "tool_schemas_wrapped", "input_field_not_read",
                "tool_calls_not_trained", "tool_call_arguments_parsed", "message_weight_not_read",
                "identical_completions")


@dataclass
class FileCounts:
    rows_read: int = 0
    rows_written: int = 0
    rows_truncated: int = 0
    dropped: Counter = field(default_factory=Counter)


def _check_resumed_rejects(rejects: Path | None, had: bool, began: str | None) -> None:
    """A resumed run writes the rejects file the interrupted one began (at began, where its checkpoint says),
    or none where it wrote none: either way round, the rows dropped before the interruption would be missing
    from it; and another file given instead would be cut to the length of the one begun."""
    if had and rejects is None:
        raise ConfigError("--resume: the interrupted run was writing a rejects file; resume it with the same "
                          "--rejects, or the rows it dropped so far go unrecorded")
    if had and rejects is not None and began is not None and str(rejects.resolve()) != began:
        raise ConfigError(f"--resume: the interrupted run was writing its rejects file at {began}, not "
                          f"{str(rejects)!r}; resume it with that --rejects")
    if had and rejects is not None and not temporary_path(rejects).exists() and not rejects.exists():
        raise ConfigError(f"--resume: no rejects file begun at {rejects}; give the --rejects path the interrupted "
                          "run was given")
    if not had and rejects is not None:
        raise ConfigError("--resume: the interrupted run wrote no rejects file, so one begun now would lack the rows "
                          "it dropped; resume without --rejects, or run again from the start with it")


class Accounting:
    """Counts per file; optionally writes every dropped row to a rejects file (JSON Lines, renamed into
    place when the run ends) and, when strict, stops at the first row that is bad data."""

    def __init__(self, files: list[InputFile], rejects: Path | None = None, strict: bool = False,
                 state: dict[str, Any] | None = None) -> None:
        """state: what state() returned at a checkpoint, to carry on from there (--resume)."""
        self.files = files
        self.counts = [FileCounts() for _ in files]
        self.examples: dict[str, list[dict[str, Any]]] = {}
        self.tokens = 0
        self.trained_tokens = 0
        self.left_out: Counter = Counter()  # messages the chat template did not render, by role
        self.schemas: Counter = Counter()  # rows formatted, by input type (several with input.type "auto")
        self.notes: Counter = Counter()  # the parse report: rows with tools, unknown roles
        self.tokens_by_file = [0] * len(files)  # tokens written from each input file
        self.rows_by_split: Counter = Counter()  # rows written to each split (output.splits)
        self.pairs: Counter = Counter()  # preference pairs: pairs.PAIR_COUNTS
        self.trained_by_role: Counter = Counter()  # trained tokens by the role of their message (PIECES: rows
        # trained as whole pieces)
        self.strict = strict
        self._batches: dict[str, list[int]] = {}  # row groups' / record batches' sizes, by file
        self.rejects_path = rejects
        self.rejects = None
        if state is not None:
            _check_resumed_rejects(rejects, state["rejects_bytes"] is not None, state.get("rejects_path"))
        if rejects is not None:
            rejects.parent.mkdir(parents=True, exist_ok=True)
            tmp = temporary_path(rejects)
            if state is not None:
                reopen(rejects, tmp)
            if state is None or state["rejects_bytes"] is None or not tmp.exists():
                self.rejects = create(tmp)  # closed in close() or abort()
            else:
                self.rejects = open(tmp, "r+b")  # noqa: SIM115
                self.rejects.truncate(state["rejects_bytes"])
                self.rejects.seek(0, 2)
        if state is not None:
            for counts, (read, written, truncated, dropped) in zip(self.counts, state["counts"]):
                counts.rows_read, counts.rows_written, counts.rows_truncated = read, written, truncated
                counts.dropped.update(dropped)
            self.examples, self.tokens, self.trained_tokens = state["examples"], state["tokens"], state["trained_tokens"]
            self.left_out.update(state["left_out"])
            self.schemas.update(state["schemas"])
            self.notes.update(state["notes"])
            self.trained_by_role.update(state["trained_by_role"])
            self.tokens_by_file = list(state["tokens_by_file"])
            self.rows_by_split.update(state.get("rows_by_split", {}))
            self.pairs.update(state.get("pairs", {}))

    def state(self) -> dict[str, Any]:
        """Everything counted so far, and how much of the rejects file is written (flushed to the OS)."""
        if self.rejects is not None:
            with writing(Path(self.rejects.name)):
                self.rejects.flush()
        return {"counts": [[c.rows_read, c.rows_written, c.rows_truncated, dict(c.dropped)] for c in self.counts],
                "examples": self.examples, "tokens": self.tokens, "trained_tokens": self.trained_tokens,
                "left_out": dict(self.left_out), "schemas": dict(self.schemas), "notes": dict(self.notes),
                "trained_by_role": dict(self.trained_by_role), "tokens_by_file": list(self.tokens_by_file),
                "rows_by_split": dict(self.rows_by_split), "pairs": dict(self.pairs),
                "rejects_bytes": None if self.rejects is None else self.rejects.tell(),
                "rejects_path": None if self.rejects_path is None else str(self.rejects_path.resolve())}

    def abort(self, keep: bool = False) -> None:
        """The run failed: no rejects file appears (keep: its temporary file stays, for --resume)."""
        if self.rejects is not None:
            try:
                self.rejects.close()
            except OSError:  # its buffer cannot reach the disk either: the error that stopped the run says why
                pass
            if not keep:
                Path(self.rejects.name).unlink(missing_ok=True)
            self.rejects = None

    def close(self) -> None:
        if self.rejects is not None:
            with writing(Path(self.rejects.name)):
                self.rejects.close()
            finish_file(Path(self.rejects.name), self.rejects_path)
            self.rejects = None

    def read(self, file_indices: list[int]) -> None:
        """Rows read, given the input file of each."""
        for file_index, n in Counter(file_indices).items():
            self.counts[file_index].rows_read += n

    def written(self, file_index: int, truncated: bool) -> None:
        self.counts[file_index].rows_written += 1
        self.counts[file_index].rows_truncated += int(truncated)

    def _where(self, file: InputFile, line: int) -> str | None:
        """Where a row of a file that is not read by lines is (row group and row, record batch and row,
        array element); None for the line-based formats, whose line number says it."""
        if file.layout in LINE_LAYOUTS:
            return None
        return locator(file.path, file.layout, line, self._batches)

    def dropped(self, file_index: int, line: int, why: Dropped, row: Any = None) -> None:
        """Count a dropped row (row: as read, for the rejects file); under --strict, bad data stops the run."""
        file, (reason, detail) = self.files[file_index], why
        where = self._where(file, line)
        if self.strict and reason in Drop.BAD_DATA:
            raise InputError(f"{file.path}:{line}{f' ({where})' if where else ''}: {reason.replace('_', ' ')}: "
                             f"{detail} (--strict stops at the first bad row)")
        self.counts[file_index].dropped[reason] += 1
        if self.rejects is not None:
            entry = {"file": file.path, "line": line, **({"where": where} if where else {}), "reason": reason,
                     "detail": detail, "row": as_read(row)}
            if isinstance(row, bytes):  # a line that is not UTF-8: readable, and its bytes as they were
                entry.update(row=row.decode("utf-8", errors="replace"), row_base64=base64.b64encode(row).decode())
            with writing(Path(self.rejects.name)):
                self.rejects.write(orjson.dumps(entry, default=repr) + b"\n")
            failpoint("rejects", self.rejects.name)
        examples = self.examples.setdefault(reason, [])
        if len(examples) < EXAMPLES_PER_REASON:
            examples.append({"file": self.files[file_index].path, "line": line, "detail": detail})

    def totals(self) -> dict[str, Any]:
        dropped: Counter = Counter()
        for c in self.counts:
            dropped.update(c.dropped)
        return {
            "rows_read": sum(c.rows_read for c in self.counts),
            "rows_written": sum(c.rows_written for c in self.counts),
            "rows_truncated": sum(c.rows_truncated for c in self.counts),
            "rows_dropped": dict(sorted(dropped.items())),
            "tokens": self.tokens,
            "trained_tokens": self.trained_tokens,
            "trained_tokens_by_role": dict(sorted(self.trained_by_role.items())),
            "messages_left_out_by_template": dict(sorted(self.left_out.items())),
            "rows_by_schema": dict(sorted(self.schemas.items())),
            "parse_report": {
                **{k: self.notes.get(k, 0) for k in PARSE_COUNTS},
                "unknown_roles": self._noted("unknown_role:"),
                # Trained messages of these roles that no {% generation %} span of the template marks.
                "trained_roles_not_marked_by_template": self._noted("unmarked_role:"),
            },
        }

    def _noted(self, prefix: str) -> dict[str, int]:
        return {k.split(":", 1)[1]: n for k, n in sorted(self.notes.items()) if k.startswith(prefix)}

    def per_file(self, checksums: list[str]) -> list[dict[str, Any]]:
        return [
            {
                "path": f.path, "size_bytes": f.size_bytes, "sha256": checksum,
                **({"version": f.version} if f.version is not None else {}),  # a hub dataset's
                "rows_read": c.rows_read, "rows_written": c.rows_written, "rows_truncated": c.rows_truncated,
                "rows_dropped": dict(sorted(c.dropped.items())),
            }
            for f, c, checksum in zip(self.files, self.counts, checksums)
        ]
