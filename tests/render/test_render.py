"""The render stage on its own (render/row.py): a conversation becomes one string and the byte spans of what
is trained; text pieces keep their labels; pre-tokenized ids are checked against the vocabulary. On the toy
tokenizer (tests/toy.py: ChatML, one id per byte); the real templates are tests/e2e's."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from gpu_prep.backend import CPU
from gpu_prep.config import parse_config
from gpu_prep.errors import Drop
from gpu_prep.format import Conversation, RowError, Segments, Tokens
from gpu_prep.render.row import affix_disagreement, render_row
from gpu_prep.run.context import build_context

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ü"},
        {"role": "assistant", "content": "Hello ü!"}, {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Bye."}]


def _ctx(toy: Any, **config: Any) -> Any:
    return build_context(parse_config(config), toy, CPU, [], None, None).render


def _trained_text(row: Any) -> list[str]:
    data = row.pieces[0].encode("utf-8")
    return [data[a:b].decode("utf-8") for a, b in row.spans]


def test_a_conversation_trains_the_assistant_turns_with_their_end_of_turn_token(toy: Any) -> None:
    row = render_row(Conversation(CHAT), _ctx(toy, mask={"assistant": "train"}))
    assert len(row.pieces) == 1 and row.num_bytes == len(row.pieces[0].encode("utf-8"))
    assert row.pieces[0].startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert _trained_text(row) == ["Hello ü!<|im_end|>", "Bye.<|im_end|>"]  # spans are bytes: ü is two
    assert row.span_roles == ["assistant", "assistant"]


def test_masking_every_role_leaves_no_span_and_the_last_turn_option_keeps_one(toy: Any) -> None:
    assert render_row(Conversation(CHAT), _ctx(toy)).spans == []
    last = render_row(Conversation(CHAT), _ctx(toy, mask={"assistant": "train"}, input={"train_last_turn_only": True}))
    assert _trained_text(last) == ["Bye.<|im_end|>"]


def test_text_pieces_keep_their_labels_and_eos_closes_the_response(toy: Any) -> None:
    ctx = _ctx(toy, input={"type": "instruction"}, mask={"response": "train"})
    row = render_row(Segments([("Q?\n", "prompt"), ("A.", "response")], add_eos=True), ctx)
    assert row.pieces == ["Q?\n", "A.", toy.eos_text] and row.piece_trained == [False, True, True]
    assert row.spans == []


def test_pretokenized_ids_outside_the_vocabulary_are_refused(toy: Any) -> None:
    ctx = _ctx(toy, input={"type": "pretokenized"})
    assert render_row(Tokens([1, 2, 258], [False, True, True]), ctx).given[1].tolist() == [0, 1, 1]
    with pytest.raises(RowError) as err:  # the toy's ids are 0 to 258
        render_row(Tokens([1, 259], [True, True]), ctx)
    assert err.value.reason == Drop.WRONG_TYPE and "outside the vocabulary" in err.value.detail


def test_the_jinja_free_rendering_agrees_with_jinja(toy: Any) -> None:
    ctx = _ctx(toy, mask={"assistant": "train"})
    assert ctx.affix is not None  # ChatML is plain concatenation for these rows
    assert affix_disagreement([Conversation(CHAT), Conversation(CHAT[1:3])], ctx) is None


def test_contents_are_located_out_of_order_but_not_when_written_twice() -> None:
    from gpu_prep.render.sandbox import ChatTemplate
    from gpu_prep.render.locate import locate_contents

    # The system prompt written inside the last user turn, after the turns that follow it.
    moving = ChatTemplate("{% for m in messages[1:] %}[{{ m.role }}]{% if loop.last %}{{ messages[0].content }}|"
                          "{% endif %}{{ m.content }}{% endfor %}", {})
    conv = Conversation([{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                         {"role": "assistant", "content": "A"}, {"role": "user", "content": "V"}])
    real = moving.render(conv.messages)
    assert real == "[user]U[assistant]A[user]S|V"
    regions = locate_contents(real, conv, moving)
    assert [(i, real[a:b]) for i, a, b in regions] == [(1, "U"), (2, "A"), (0, "S"), (3, "V")]
    twice = ChatTemplate("{% for m in messages %}{{ m.content }}{{ m.content }}{% endfor %}", {})
    with pytest.raises(RowError, match="more than once"):
        locate_contents(twice.render(conv.messages), conv, twice)


def _long_chat(n: int, message: Callable[[int], dict]) -> Conversation:
    return Conversation([message(i) for i in range(n)])


def _chat(i: int, content: str = "hi") -> dict:
    return {"role": ("user", "assistant")[i % 2], "content": content}


def _trajectory(i: int) -> dict:
    """An agent's: a user turn, a call (no content beside it), the tool's answer, a reply; over and over."""
    if i % 4 == 1:
        return {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": f"f{i}", "arguments": {"x": i}}}]}
    return {"role": ("user", "", "tool", "assistant")[i % 4], "content": "ok"}


def _calls(render: Callable[[], Any]) -> int:
    """Python and C function calls one render makes: a step repeated per message over a growing prefix
    (rendering each prefix, a helper per earlier message, a generator over every region) makes n messages
    cost n^2 of them."""
    count = 0

    def tally(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(tally)
    try:
        render()
    finally:
        sys.setprofile(None)
    return count


@pytest.mark.parametrize("options, message", [
    ({}, _chat),  # the Jinja-free path
    ({}, lambda i: _chat(i, "" if i == 1 else "hi")),  # an empty content: through Jinja, contents located
    ({"input": {"train_on_eos": "all"}}, _chat),
    ({"input": {"mask_scope": "turn"}}, _chat),
    ({}, lambda i: _chat(i, f"<think>step {i}</think>ok" if i % 2 else "hi")),  # notes per think block
    ({"chat_template": "llama3.1"}, _trajectory),  # calls written alone: placed without a content
], ids=["affix", "jinja", "eos-all", "turn-scope", "think-blocks", "llama3.1-calls"])
def test_a_long_conversation_renders_with_calls_linear_in_its_messages(toy: Any, options: dict, message: Any) -> None:
    # One row of 100,000 messages took two minutes: every message searched a list of the trained ones, the
    # whole rendering, or every region placed. Four times the messages must cost about four times the calls
    # (counted: exact, whatever the machine's load). Steps that make no call per message (a list searched with
    # `in`) are measured by benchmarks/RESULTS.md's long-row runs instead: a timed test fails on a busy machine.
    rows = {"template_time_limit": 60, **options.get("input", {})}  # Jinja's renders are timed here, not limited
    ctx = _ctx(toy, **{**options, "mask": {"assistant": "train"}, "input": rows})
    assert render_row(_long_chat(4, message), ctx).spans  # it renders, and trains something
    calls = [_calls(lambda: render_row(_long_chat(n, message), ctx)) for n in (250, 1000)]
    assert calls[1] < 4.5 * calls[0]


def test_empty_contents_are_placed_with_a_search_per_content_not_a_pass() -> None:
    from gpu_prep.render.affix import SENTINEL
    from gpu_prep.render.locate import _place_empty
    from gpu_prep.render.ranges import Region

    class Start(int):  # a content's start that counts the comparisons made with it
        compared = 0

        def __lt__(self, other: Any) -> bool:
            Start.compared += 1
            return int(self) < other

        def __ge__(self, other: Any) -> bool:
            Start.compared += 1
            return int(self) >= other

    def comparisons(n: int) -> int:
        # Every other content empty, and the template writes an empty one without its usual header.
        skeleton = "".join(f"<h>{SENTINEL.format(i)}</h>" for i in range(n))
        real = "".join("<h>x</h>" if i % 2 == 0 else "<h></h>" for i in range(n))
        located = [Region(i, Start(8 * (i // 2) + 7 * (i // 2) + 3), 8 * (i // 2) + 7 * (i // 2) + 4)
                   for i in range(0, n, 2)]
        Start.compared = 0
        placed = _place_empty(real, skeleton, located)
        assert [(i, a, b) for i, a, b in placed][:2] == [(0, 3, 4), (1, 11, 11)] and len(placed) == n
        return Start.compared

    # n log n: about 5 times the comparisons for 4 times the contents (a pass per content: 16 times).
    assert comparisons(800) < 7 * comparisons(200)
