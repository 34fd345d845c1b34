"""Bounds in UTF-16 code units: what O Chat counts before it drops a summary or a message."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from codelegate.translator import Limits
from codelegate.translator.units import bound_units, clean_units, utf16_units
from tests.translator.helpers import assistant, of_type, run, tool_use

EMOJI = "\N{GRINNING FACE}"  # two UTF-16 units


def test_a_summary_of_emoji_is_cut_to_what_o_chat_keeps() -> None:
    # 240 characters of emoji are 480 units: O Chat would drop the whole summary.
    frames = run([assistant(tool_use("t1", "Bash", command=EMOJI * 300))])
    (call,) = of_type(frames, "tool_call")
    assert utf16_units(call["summary"]) <= 240
    assert call["summary"].startswith("Run: " + EMOJI * 50)
    assert "chars cut]" in call["summary"]


def test_a_message_of_emoji_is_cut_to_what_o_chat_keeps() -> None:
    frames = run([assistant({"type": "text", "text": EMOJI * 9000})], limits=Limits())
    (message,) = of_type(frames, "provider_message")
    assert 15_000 <= utf16_units(message["text"]) <= 16_000


def test_short_and_plain_texts_are_kept_as_they_are() -> None:
    assert bound_units("abc", 240) == "abc"
    assert bound_units("a" * 240, 240) == "a" * 240
    assert clean_units(EMOJI * 120, 240) == EMOJI * 120


@given(
    st.text(alphabet=st.sampled_from(["a", "é", EMOJI, "\n"]), max_size=600), st.integers(0, 300)
)
def test_any_text_fits_in_its_bound_in_units(text: str, limit: int) -> None:
    for bound in (bound_units, clean_units):
        cut = bound(text, limit)
        assert utf16_units(cut) <= limit
        if utf16_units(text) <= limit:
            assert cut == text
