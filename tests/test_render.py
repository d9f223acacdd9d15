"""The render stage on its own (render.py): a conversation becomes one string and the byte spans of what
is trained; text pieces keep their labels; pre-tokenized ids are checked against the vocabulary."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_prep.backend import CPU
from gpu_prep.config import parse_config
from gpu_prep.errors import Drop
from gpu_prep.format import Conversation, RowError, Segments, Tokens
from gpu_prep.render import affix_disagreement, render_row
from gpu_prep.run.context import build_context

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ü"},
        {"role": "assistant", "content": "Hello ü!"}, {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Bye."}]


def _ctx(qwen: Any, **config: Any) -> Any:
    return build_context(parse_config(config), qwen, CPU, [], None, None).render


def _trained_text(row: Any) -> list[str]:
    data = row.pieces[0].encode("utf-8")
    return [data[a:b].decode("utf-8") for a, b in row.spans]


def test_a_conversation_trains_the_assistant_turns_with_their_end_of_turn_token(qwen: Any) -> None:
    row = render_row(Conversation(CHAT), _ctx(qwen, mask={"assistant": "train"}))
    assert len(row.pieces) == 1 and row.num_bytes == len(row.pieces[0].encode("utf-8"))
    assert row.pieces[0].startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert _trained_text(row) == ["Hello ü!<|im_end|>", "Bye.<|im_end|>"]  # spans are bytes: ü is two
    assert row.span_roles == ["assistant", "assistant"]


def test_masking_every_role_leaves_no_span_and_the_last_turn_option_keeps_one(qwen: Any) -> None:
    assert render_row(Conversation(CHAT), _ctx(qwen)).spans == []
    last = render_row(Conversation(CHAT), _ctx(qwen, mask={"assistant": "train"}, input={"train_last_turn_only": True}))
    assert _trained_text(last) == ["Bye.<|im_end|>"]


def test_text_pieces_keep_their_labels_and_eos_closes_the_response(qwen: Any) -> None:
    ctx = _ctx(qwen, input={"type": "instruction"}, mask={"response": "train"})
    row = render_row(Segments([("Q?\n", "prompt"), ("A.", "response")], add_eos=True), ctx)
    assert row.pieces == ["Q?\n", "A.", qwen.eos_text] and row.piece_trained == [False, True, True]
    assert row.spans == []


def test_pretokenized_ids_outside_the_vocabulary_are_refused(qwen: Any) -> None:
    ctx = _ctx(qwen, input={"type": "pretokenized"})
    assert render_row(Tokens([1, 2, 3], [False, True, True]), ctx).given[1].tolist() == [0, 1, 1]
    with pytest.raises(RowError) as err:
        render_row(Tokens([1, 10**9], [True, True]), ctx)
    assert err.value.reason == Drop.WRONG_TYPE and "outside the vocabulary" in err.value.detail


def test_the_jinja_free_rendering_agrees_with_jinja(qwen: Any) -> None:
    ctx = _ctx(qwen, mask={"assistant": "train"})
    assert ctx.affix is not None  # Qwen2.5's template is plain concatenation for these rows
    assert affix_disagreement([Conversation(CHAT), Conversation(CHAT[1:3])], ctx) is None


def test_contents_are_located_out_of_order_but_not_when_written_twice() -> None:
    from gpu_prep.chat_template import ChatTemplate
    from gpu_prep.locate import locate_contents

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
