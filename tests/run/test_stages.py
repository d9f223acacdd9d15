"""The per-chunk stages (run/stages.py lists them) one by one on hand-made chunks, the run context and decisions they
share (run/context.py), and the one-process driver (run/local.py) in turn and overlapping."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from gpu_prep.backend import CPU
from gpu_prep.config import parse_config
from gpu_prep.errors import Drop
from gpu_prep.filter.dedup import Deduplicator
from gpu_prep.format import Conversation
from gpu_prep.read.inputs import RawChunk
from gpu_prep.read.row import FileRow, ReadRow
from gpu_prep.read.rows import read_chunks
from gpu_prep.run.context import Decisions, Options, build_context
from gpu_prep.run.local import decide, run_here
from gpu_prep.run.overlap import Stopwatch
from gpu_prep.run.masking import mask_chunk
from gpu_prep.run.prepare import filter_reasons, format_rows, prepare
from gpu_prep.run.stages import Done, Rows
from gpu_prep.run.tokenize import prepare_and_tokenize

CHAT = {"input": {"type": "chat"}, "mask": {"assistant": "train"}}


def _chunk(*records: Any) -> RawChunk:
    chunk = RawChunk()
    for line, record in enumerate(records, start=1):
        chunk.add(0, ReadRow(line, record, 0))
    return chunk


def _chat(user: str, answer: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


@pytest.fixture
def run(qwen: Any) -> Any:
    return build_context(parse_config(CHAT), qwen, CPU, [], None, threads=1)


def test_format_gives_shapes_drops_and_counts_without_touching_the_chunk(run: Any) -> None:
    chunk = _chunk(_chat("hi", "hello"), [{"role": "user", "content": "a list of messages"}], "not an object",
                   {"messages": [{"role": "narrator", "content": "x"}]}, {"no_messages": 1})
    before = (list(chunk.records), dict(chunk.errors))
    formatted = format_rows(chunk, run.config)
    assert formatted.rows.index == [0, 1, 3]
    assert all(isinstance(shape, Conversation) for shape in formatted.rows.payload)
    assert [(d.row, d.why.reason) for d in formatted.drops] == [(2, Drop.NOT_AN_OBJECT), (4, Drop.MISSING_FIELD)]
    assert formatted.schemas == Counter({"chat": 3})
    assert formatted.notes == Counter({"unknown_role:narrator": 1})
    assert (chunk.records, chunk.errors) == before


def test_a_message_list_is_refused_by_other_input_types(qwen: Any) -> None:
    text = build_context(parse_config({"input": {"type": "text"}}), qwen, CPU, [], None, None)
    formatted = format_rows(_chunk([{"role": "user", "content": "x"}], {"text": "plain"}), text.config)
    assert formatted.rows.index == [1]
    reason, detail = formatted.drops[0].why
    assert reason == Drop.NOT_AN_OBJECT and "input.type chat, sharegpt or auto" in detail


def test_filter_keeps_first_occurrences_and_rows_keep_hands_on_the_rest(run: Any) -> None:
    chunk = _chunk(_chat("same", "answer"), _chat("other", "answer"), _chat("same", "answer"))
    rows = format_rows(chunk, run.config).rows
    dedup = Deduplicator()
    reasons = filter_reasons(run, rows, dedup)
    assert [r if r is None else r.reason for r in reasons] == [None, None, Drop.DUPLICATE]
    assert len(dedup.take_added()) == 2
    drops: list = []
    kept = rows.keep(reasons, chunk, drops)
    assert kept.index == [0, 1] and [(d.row, d.why.reason, d.record) for d in drops] == [(2, Drop.DUPLICATE, chunk.records[2])]


def test_prepare_and_mask_give_a_sample_per_row_with_the_answer_trained(run: Any, qwen: Any) -> None:
    chunks = iter([_chunk(_chat("What is 2+2?", "Four."), _chat("Name a colour.", "Blue."))])
    decisions = Decisions()
    items = list(prepare_and_tokenize(chunks, run, None, Stopwatch(), decisions, overlap=False))
    assert len(items) == 1
    done = mask_chunk(run, Stopwatch(), items[0])
    masked = done.mask.masked
    offsets, ids, loss_mask = masked.offsets, masked.ids, masked.loss_mask
    assert list(masked.kept_rows) == [0, 1] and done.mask.valid.all()
    trained = [qwen.decode(ids[offsets[k]:offsets[k + 1]][loss_mask[offsets[k]:offsets[k + 1]] == 1]) for k in range(2)]
    assert trained == ["Four.<|im_end|>", "Blue.<|im_end|>"]
    assert decisions.engine is not None  # the first rows chose the tokenizer engine


def test_a_chunk_with_nothing_left_is_not_tokenized(run: Any) -> None:
    prepared = next(prepare(iter([_chunk("bad row")]), run, None, Stopwatch(), Decisions()))
    assert prepared.rows.index == [] and [d.why.reason for d in prepared.drops] == [Drop.NOT_AN_OBJECT]
    item = next(prepare_and_tokenize(iter([_chunk("bad row")]), run, None, Stopwatch(), Decisions(), overlap=False))
    assert item[1] is None and mask_chunk(run, Stopwatch(), item).mask is None


def test_decisions_are_taken_once_and_kept_as_a_checkpoint_keeps_them() -> None:
    decisions = Decisions()
    decisions.settle_affix(True)
    decisions.settle_engine("tiktoken", "matched HF")
    with pytest.raises(RuntimeError, match="decided twice"):
        decisions.settle_engine("hf", "again")
    again = Decisions.from_state(decisions.state())
    assert (again.affix, again.engine) == (True, ("tiktoken", "matched HF"))
    assert Decisions.from_state(None).state() == {"affix": None, "engine": None, "engine_check": None}
    check = {"engine": "fastokens", "share": 0.01, "seed": 1, "pieces_checked": 12, "difference": None}
    again.engine_check = check
    assert Decisions.from_state(again.state()).engine_check == check  # a resumed run counts on from here


def test_options_fall_back_to_the_config() -> None:
    config = parse_config({"tokenizer": "bert-uncased", "device": "cpu"})
    assert (Options().tokenizer_for(config), Options().device_for(config)) == ("bert-uncased", "cpu")
    assert Options(tokenizer="qwen2.5", device="auto").tokenizer_for(config) == "qwen2.5"
    assert Options().tokenizer_for(parse_config({})) == "qwen2.5"


def _commits(run: Any, rows: list, overlap: bool) -> list[tuple]:
    got = []

    def commit(done: Done, clock: Stopwatch) -> None:
        masked = done.mask.masked if done.mask is not None else None
        got.append((len(done.prepared.chunk), [d.why.reason for d in done.prepared.drops],
                    None if masked is None else (masked.ids.tolist(), masked.loss_mask.tolist())))

    chunks = read_chunks([], 3, rows=(FileRow(0, ReadRow(k + 1, row, 10)) for k, row in enumerate(rows)))
    run_here(run, chunks, Deduplicator(), Decisions(), Stopwatch(), commit, overlap=overlap)
    return got


def test_in_turn_and_overlapping_commit_the_same_chunks_in_order(run: Any) -> None:
    rows = [_chat(f"question {k % 4}", f"answer {k % 4}") for k in range(10)] + ["oops"]
    serial = _commits(run, rows, overlap=False)
    assert serial == _commits(run, rows, overlap=True)
    assert [n for n, _, _ in serial] == [3, 3, 3, 2]
    assert sum(reasons.count(Drop.DUPLICATE) for _, reasons, _ in serial) == 6


def test_decide_takes_the_first_rows_decisions_and_writes_nothing(run: Any) -> None:
    decisions = Decisions()
    decide(run, iter([_chunk(_chat("hi", "there"))]), Deduplicator(), decisions)
    assert decisions.engine is not None
    assert decisions.affix is (None if run.render.affix is None else decisions.affix)
    resumed = Decisions.from_state(decisions.state())
    decide(run, iter([]), None, resumed)  # already decided: only the engine is taken again
    assert resumed.state() == decisions.state()


def test_rows_keep_with_nothing_dropped_keeps_everything() -> None:
    rows = Rows([0, 2], ["a", "b"], ["x", "y"])
    drops: list = []
    assert rows.keep([None, None], _chunk({}, {}, {}), drops) == rows and drops == []
    assert np.array_equal(np.asarray(rows.index), [0, 2])
