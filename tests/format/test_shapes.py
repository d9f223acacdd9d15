"""The canonical row shapes (format/shapes.py) and the missing-field detail every builder gives."""

from __future__ import annotations

from gpu_prep.errors import Drop
from gpu_prep.format.shapes import MISSING_KEYS_SHOWN, Pair, Unpaired, missing, type_name


def test_a_missing_field_names_the_keys_the_row_has_instead() -> None:
    err = missing({"mesages": [], "source": "x"}, "messages")
    assert err.reason == Drop.MISSING_FIELD
    assert err.detail == "field 'messages' is missing; the keys of the row are 'mesages', 'source'"
    inner = missing({}, "content", "messages[2].")
    assert inner.detail == "field messages[2].'content' is missing; messages[2] has no keys"


def test_a_missing_field_shows_the_first_keys_each_cut_short() -> None:
    record = {f"{'k' * 50}{i}": i for i in range(MISSING_KEYS_SHOWN + 3)}
    detail = missing(record, "text").detail
    assert detail.count("'" + "k" * 40 + "'") == MISSING_KEYS_SHOWN and detail.endswith(", ...")


def test_preference_shapes_hold_their_completions_and_json_type_names() -> None:
    pair = Pair(prompt="Q", chosen="good", rejected="bad")
    assert pair.completions == ["good", "bad"] and not pair.conversational and pair.texts() == ["Q", "good", "bad"]
    one = Unpaired(prompt=[{"role": "user", "content": "Q"}], completion=[{"role": "assistant", "content": "A"}],
                   label=True)
    assert one.completions == [[{"role": "assistant", "content": "A"}]] and one.conversational
    assert [type_name(v) for v in (None, 1, "s", [], {})] == ["null", "int", "str", "list", "dict"]
