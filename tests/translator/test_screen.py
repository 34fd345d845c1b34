"""The screen in front of masking: a shortcut only, never a miss.

``may_hold_a_secret`` says no to most texts without running the masking regex; these
property plants fresh shapes, their literals in any case and the characters its gates look
for, and checks that wherever the screen says no, masking would have found nothing.
"""

from __future__ import annotations

import base64
import secrets
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from codelegate.translator import Translator
from codelegate.translator.frames import ToolCall
from codelegate.translator.redact import Redactor
from codelegate.translator.shapes import mask_shapes, may_hold_a_secret, redact_text, screen_chain
from tests.translator.helpers import assistant, context, tool_use

# Every literal of the screen, and the characters its gates look for.
LITERALS = (
    "token",
    "tokens",
    "secret",
    "pass",
    "passwd",
    "key",
    "api_key",
    "auth",
    "author",
    "credential",
    "cookie",
    "bearer",
    "-----begin",
    "sk-",
    "sk-ant-",
    "gh",
    "ghp_",
    "github_pat_",
    "xox",
    "akia",
    "asia",
    "eyj",
    "aiza",
    "://",
    "@",
)
GLUE = st.sampled_from(
    [" ", "\n", "\t", "=", ":", "-", "_", ".", "@", "/", '"', "'", "\\", "[", ",", ";"]
)
# Characters whose lowercase or case folding is unusual: a dotted capital I lowercases to two
# characters, a Kelvin sign to "k", a long s and a dotless i match "s" and "i" in any case.
ODD = st.sampled_from(["İ", "ı", "ſ", "\u212a", "Σ", "ς", "é", "\u0307"])
# A fresh value of every shape, drawn from these.
SHAPES = st.sampled_from(
    [
        r"(?:API_KEY|db_password|token|Secret|auth|cookie)[=:] ?\w{4,20}",
        r"[Bb]earer [A-Za-z0-9._~+/-]{8,30}",
        r"[a-z]{2,8}://[a-z0-9]{1,8}:[A-Za-z0-9]{4,12}@[a-z]{3,8}",
        r"sk-(?:ant-)?[A-Za-z0-9_-]{20,40}",
        r"gh[pousr]_[A-Za-z0-9]{16,40}",
        r"github_pat_[A-Za-z0-9_]{16,40}",
        r"xox[abprs]-[0-9A-Za-z-]{10,20}",
        r"A[KS]IA[A-Z0-9]{16}",
        r"AIza[A-Za-z0-9_-]{35}",
        r"eyJ[A-Za-z0-9_-]{8,20}\.[A-Za-z0-9_-]{8,20}\.[A-Za-z0-9_-]{0,20}",
        r"-----BEGIN (?:RSA )?PRIVATE KEY-----\n[A-Za-z0-9+/]{8,40}",
    ]
).flatmap(lambda shape: st.from_regex(shape, fullmatch=True))


@st.composite
def any_case(draw: st.DrawFn) -> str:
    word = draw(st.sampled_from(LITERALS))
    return "".join(c.upper() if draw(st.booleans()) else c for c in word)


PIECES = st.one_of(
    any_case(),
    any_case(),
    SHAPES,
    GLUE,
    ODD,
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
    st.sampled_from(["x" * 300, "hello world " * 40]),  # past the chain's length
)
TEXTS = st.lists(PIECES, max_size=24).map("".join)


@settings(max_examples=800)
@given(TEXTS)
def test_redaction_with_the_screen_agrees_with_masking_without_it(text: str) -> None:
    low = text.lower()
    slow = mask_shapes(text, low)  # the slow path: the masking regex on every text
    assert redact_text(text) == slow
    if not may_hold_a_secret(low):
        assert slow == text


@settings(max_examples=800)
@given(TEXTS)
def test_the_chain_alone_misses_nothing_at_any_length(text: str) -> None:
    # What the compiled build's screen answers (_screen.c, checked against this in
    # tests/compiled): the chain, also past the length where the source makes one regex pass.
    low = text.lower()
    if not screen_chain(low):
        assert mask_shapes(text, low) == text


def test_a_keyword_without_its_equals_sign_or_colon_is_not_searched() -> None:
    # The gates pay only if they say no: "tokens" in prose, "pass" in code.
    assert not may_hold_a_secret("count the tokens and pass them on")
    assert may_hold_a_secret("count the tokens: pass them on")
    assert not may_hold_a_secret("akib and asib and aizb and bearr")
    assert not may_hold_a_secret("a gh in text, eyj, xox, with no gate")
    assert redact_text("Bearer abcdefgh12345") == "Bearer [redacted]"  # ungated


def test_a_dotted_capital_i_sends_a_text_to_masking_whatever_it_holds() -> None:
    # Searched in its own case, "İ" stands for "i" and "ſ" for "s": no literal rules it out.
    assert may_hold_a_secret("İstanbul".lower())
    assert redact_text("İ ſecret=hunter2") == "İ ſecret=[redacted]"


@given(st.sampled_from(["ſecret", "paſſword", "prıvate_key", "api_KEY", "ſk-ant-"]))
def test_a_long_s_or_a_dotless_i_in_a_name_hides_no_value(name: str) -> None:
    # Case-blind, "ſ" is an "s" and "ı" an "i", though lowercasing leaves both as they are.
    value = secrets.token_hex(12)
    text = f"{name}={value}" if not name.endswith("-") else f"{name}{value}"
    assert may_hold_a_secret(text.lower())
    assert value not in redact_text(text)
    assert value not in redact_text(f"x {text} y".upper())


def test_a_tool_id_the_screen_passes_with_nothing_to_mask_is_kept_as_it_is() -> None:
    # "bearer" needs no gate, so the screen passes this id; masking finds no token after it.
    assert may_hold_a_secret("toolu_bearer_01")
    translator = Translator(context())
    frames = translator.start(1000.0)
    frames += translator.receive_data(assistant(tool_use("toolu_bearer_01", "Read")), 1001.0)
    calls = [f for f in frames if isinstance(f, ToolCall)]
    assert [c.tool_id for c in calls] == ["claude:toolu_bearer_01"]


def random_form(value: str) -> str:
    # The value as is, as hex or as base64: a form known_forms lists.
    raw = value.encode("utf-8", "surrogatepass")
    return (value, raw.hex(), base64.b64encode(raw).decode())[len(value) % 3]


@settings(max_examples=400)
@given(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=8, max_size=60),
    st.text(string.ascii_letters + string.digits + " \n=:_-+/", max_size=400),
    st.integers(0, 400),
    st.booleans(),
)
def test_the_sampled_look_for_known_values_agrees_with_an_in_for_each_form(
    value: str, filler: str, at: int, plant: bool
) -> None:
    # Fresh values of any length, a form of them planted anywhere in texts shorter and longer
    # than those the sampling reads.
    redactor = Redactor([value])
    form = random_form(value) if plant else ""
    low = (filler[:at] + form + filler[at:]).lower()
    assert redactor._holds_known(low) == any(f in low for f in redactor._lows)


@settings(max_examples=300, deadline=None)
@given(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=8, max_size=60),
    st.text(string.ascii_letters + string.digits + " \n=:_-+/", max_size=200),
    st.lists(st.tuples(st.integers(0, 1000), st.sampled_from(["\n", "\r\n"]))),
    st.integers(0, 200),
)
def test_the_screen_never_misses_a_known_value_split_by_line_breaks(
    value: str, filler: str, gaps: list[tuple[int, str]], at: int
) -> None:
    # A form split anywhere, among text with line breaks of its own: wherever the text without
    # them holds a form, the screen says yes (the forms are compared with one sigma).
    redactor = Redactor([value])
    form = random_form(value)
    for cut, gap in sorted(gaps, reverse=True):
        form = form[: cut % (len(form) + 1)] + gap + form[cut % (len(form) + 1) :]
    text = filler[:at] + "\n" + form + filler[at:]
    unbroken = text.replace("\r", "").replace("\n", "").lower()
    if any(f in unbroken.replace("\u03c2", "\u03c3") for f in redactor._lows):
        assert redactor.screen(text.lower())
