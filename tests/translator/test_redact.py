"""Redaction and bounds: planted secrets never survive, cleaning is idempotent and bounded."""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codelegate.translator.bounds import bound_chars, bound_text
from codelegate.translator.redact import (
    PLAIN,
    Redactor,
    clean_chars,
    clean_text,
    clean_value,
    redact_value,
)
from codelegate.translator.shapes import MASK, is_secret_key, redact_text


@pytest.mark.parametrize(
    "key",
    [
        "Authorization",
        "x-api-key",
        "X_API_KEY",
        "apiKey",
        "api_token",
        "client_secret",
        "Cookie",
        "set-cookie",
        "password",
        "passwd",
        "private_key",
        "credentials",
        "GITHUB_TOKEN",
        "auth",
        "Proxy-Authorization",
    ],
)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)
    assert redact_value({key: "v"}) == {key: MASK}


@pytest.mark.parametrize(
    "key", ["input_tokens", "output_tokens", "cache_read_input_tokens", "total_tokens", "file_path"]
)
def test_counters_and_paths_are_not_secrets(key: str) -> None:
    assert not is_secret_key(key)
    assert redact_value({key: 12}) == {key: 12}


def test_secret_keys_at_any_depth() -> None:
    value = {"a": [{"b": {"Password": "x", "n": 1}}], "headers": ({"Set-Cookie": "c"},)}
    assert redact_value({1: "password=x"}) == {1: "password=[redacted]"}
    assert redact_value(value) == {
        "a": [{"b": {"Password": MASK, "n": 1}}],
        "headers": [{"Set-Cookie": MASK}],
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password=hunter2\n", "password=[redacted]\n"),
        ("export GITHUB_TOKEN=abc123", "export GITHUB_TOKEN=[redacted]"),
        (
            'curl -H "Authorization: Bearer abc.def.ghi"',
            'curl -H "Authorization: Bearer [redacted]"',
        ),
        ('password: "two words" next', 'password: "[redacted]" next'),
        ('password: "open quote', 'password: "[redacted] quote'),
        ('password: ""', 'password: ""'),
        ("Bearer abcdefghij", "Bearer [redacted]"),
        ("key sk-ant-api03-abcdefgh done", "key [redacted] done"),
        ("sk-proj-abcdefghijklmnopqrstuvwx", MASK),
        ("ghp_abcdefghijklmnopqrstuvwxyz0123", MASK),
        ("github_pat_11ABCDEFG0123456789_abcdef", MASK),
        ("xoxb-123456789012-abc", MASK),
        ("id AKIAIOSFODNN7EXAMPLE end", f"id {MASK} end"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig_abc", MASK),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\nok", f"{MASK}\nok"),
        ("-----BEGIN PRIVATE KEY-----\nMIIE cut off", MASK),
        ('{"client_secret": "abc", "n": 1}', '{"client_secret": "[redacted]", "n": 1}'),
        ("DB_PASSWORD: 'x y'", "DB_PASSWORD: '[redacted]'"),
        ("input_tokens: 40", "input_tokens: 40"),
        ("a task-list-with-a-long-enough-name", "a task-list-with-a-long-enough-name"),
        ("İstanbul password=abc", f"İstanbul password={MASK}"),
        ("plain text", "plain text"),
    ],
)
def test_values_inside_strings(text: str, expected: str) -> None:
    assert redact_text(text) == expected
    assert redact_text(expected) == expected


SECRETS = st.one_of(
    st.from_regex(r"sk-ant-api03-[A-Za-z0-9_-]{20,40}", fullmatch=True),
    st.from_regex(r"ghp_[A-Za-z0-9]{36}", fullmatch=True),
    st.from_regex(r"github_pat_[A-Za-z0-9_]{30,60}", fullmatch=True),
    st.from_regex(r"AKIA[A-Z0-9]{16}", fullmatch=True),
    st.from_regex(
        r"eyJ[A-Za-z0-9_-]{10,30}\.[A-Za-z0-9_-]{10,30}\.[A-Za-z0-9_-]{10,30}", fullmatch=True
    ),
    st.from_regex(r"xoxp-[0-9]{10,13}-[A-Za-z0-9]{10,20}", fullmatch=True),
)
NAMED = st.tuples(
    st.sampled_from(
        ["API_KEY", "GH_TOKEN", "db_password", "ClientSecret", "aws_secret_access_key"]
    ),
    st.sampled_from(["=", ": ", " = ", '": "']),
    st.from_regex(r"[A-Za-z0-9_+/]{6,30}", fullmatch=True),
)
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=60)
SEPARATORS = st.sampled_from([" ", "\n", "\t", "'", '"', ",", "(", "=", ";", "<"])


@settings(max_examples=300)
@given(TEXT, SEPARATORS, SECRETS, SEPARATORS, TEXT)
def test_a_planted_token_never_survives(
    before: str, left: str, secret: str, right: str, after: str
) -> None:
    text = before + left + secret + right + after
    assert secret not in redact_text(text)
    assert secret not in clean_text(text, 4096)


@settings(max_examples=200)
@given(TEXT, NAMED, TEXT)
def test_a_planted_name_value_never_survives(
    before: str, named: tuple[str, str, str], after: str
) -> None:
    name, sep, value = named
    text = f"{before}\n{name}{sep}{value}\n{after}"
    assert value not in redact_text(text).split(name, 1)[1].split("\n", 1)[0]


@st.composite
def nested(draw: Any, secret: str) -> Any:
    # A JSON-shaped value with the secret planted somewhere, at any depth.
    depth = draw(st.integers(0, 5))
    value: Any = draw(st.sampled_from([secret, f"x {secret} y", f"token {secret}"]))
    for _ in range(depth):
        if draw(st.booleans()):
            value = [draw(st.integers()), value]
        else:
            value = {draw(st.sampled_from(["a", "data", "env"])): value, "n": 1}
    return value


@settings(max_examples=200)
@given(SECRETS.flatmap(lambda s: st.tuples(st.just(s), nested(s))))
def test_a_planted_secret_never_survives_at_any_depth(case: tuple[str, Any]) -> None:
    secret, value = case
    assert secret not in repr(redact_value(value))
    assert secret not in repr(clean_value(value, string_bytes=4096))


@settings(max_examples=300)
@given(st.text(max_size=300), st.integers(16, 200))
def test_cleaning_is_idempotent_and_bounded(text: str, limit: int) -> None:
    once = clean_text(text, limit)
    assert len(once.encode()) <= limit
    assert clean_text(once, limit) == once
    assert redact_text(redact_text(text)) == redact_text(text)
    chars = clean_chars(text, limit)
    assert len(chars) <= limit
    assert clean_chars(chars, limit) == chars


PIECES = st.sampled_from(
    [
        "password=",
        "Bearer ",
        "token: ",
        "sk-ant-",
        "ghp_",
        "AKIA",
        "-----BEGIN RSA PRIVATE KEY-----",
        "x" * 9,
        "x" * 90,
        "abcdefghij",
        "é",
        " ",
        "[",
        "\n",
        '"',
        "'",
        "=",
    ]
)


@settings(max_examples=400)
@given(st.lists(PIECES, max_size=200), st.integers(1, 300))
def test_cleaning_secretish_text_is_idempotent(parts: list[str], limit: int) -> None:
    # Cuts can leave the start of kept text after a "NAME=": cleaning must settle it anyway.
    text = "".join(parts)
    once = clean_text(text, limit)
    assert len(once.encode()) <= limit
    assert clean_text(once, limit) == once
    chars = clean_chars(text, limit)
    assert len(chars) <= limit
    assert clean_chars(chars, limit) == chars
    value = clean_value({"a": text, "password": text, "l": [text]}, string_bytes=limit)
    assert clean_value(value, string_bytes=limit) == value


def _clean_text_by_definition(redactor: Redactor, text: str, limit: int) -> str:
    # Redact, then cut, then redact what the cut kept (clean_text without its shortcuts).
    redact = redactor.text
    if len(text) <= limit + 512:
        return bound_text(redact(text), limit, settle=redact)
    red = redact(text[: limit + 512])[:-256]
    dropped = len(text.encode("utf-8", "surrogatepass")) - len(red.encode("utf-8", "surrogatepass"))
    return bound_text(red, limit, dropped=dropped, settle=redact)


@settings(max_examples=400)
@given(st.lists(PIECES | st.sampled_from(["Σ", "ς", "σ", "x" * 700]), max_size=60), st.data())
def test_the_shortcuts_of_clean_text_change_no_answer(
    parts: list[str], data: st.DataObject
) -> None:
    # A text with nothing to mask is cut without a second redaction when that cannot change it.
    text = "".join(parts)
    limit = data.draw(st.integers(1, len(text.encode()) + 8))
    for redactor in (PLAIN, Redactor(["abcdefghijΣ", secrets.token_hex(16)])):
        assert redactor.clean_text(text, limit) == _clean_text_by_definition(redactor, text, limit)


def test_bound_text_cuts_on_a_character_boundary_with_a_marker() -> None:
    out = bound_text("é" * 100, 50)
    assert len(out.encode()) <= 50
    assert out.endswith(" bytes cut]")
    assert out.startswith("é")
    cut = int(out.split("[...")[1].split(" ")[0])
    assert len(out.split("[...")[0].encode()) + cut == 200


def test_bound_text_steps_back_to_a_character_start() -> None:
    for limit in range(20, 40):
        out = bound_text("é" * 100, limit)
        assert len(out.encode()) <= limit
        assert out.startswith("é")


def test_bound_text_with_a_tiny_limit_keeps_what_fits() -> None:
    assert bound_text("abcdefghijklmnopqrstuvwxyz" * 2, 4) == ""
    assert bound_chars("abcdefghijklmnopqrstuvwxyz", 4) == "abcd"
    assert bound_text("short", 100) == "short"
    assert bound_text("x" * 30, 30) == "x" * 30


def test_clean_text_precuts_huge_input_and_says_how_much_was_cut() -> None:
    text = "a" * 100_000
    out = clean_text(text, 100)
    assert len(out) <= 100
    kept, marker = out.split("[...")
    assert len(kept) + int(marker.split(" ")[0]) == 100_000


def test_clean_chars_precuts_huge_input() -> None:
    out = clean_chars("b" * 100_000, 240)
    kept, marker = out.split("[...")
    assert len(out) <= 240
    assert len(kept) + int(marker.split(" ")[0]) == 100_000


def test_clean_value_bounds_depth_items_and_strings() -> None:
    deep: Any = "leaf"
    for _ in range(10):
        deep = {"k": deep}
    out = clean_value(deep, string_bytes=100, depth=3)
    assert out == {"k": {"k": {"k": "[...1 keys cut]"}}}
    assert clean_value([[1]], string_bytes=10, depth=1) == ["[...1 items cut]"]
    many = clean_value(list(range(100)), string_bytes=100, items=5)
    assert many == [0, 1, 2, 3, "[...96 items cut]"]
    assert clean_value(many, string_bytes=100, items=5) == many
    keys = clean_value({str(i): i for i in range(10)}, string_bytes=100, items=3)
    assert keys == {"0": 0, "1": 1, "...": "[...8 keys cut]"}
    assert clean_value(keys, string_bytes=100, items=3) == keys
    assert clean_value({"token": "x", 3: "y"}, string_bytes=10) == {"token": MASK, 3: "y"}
    assert clean_value("x" * 50, string_bytes=20).endswith("cut]")
    assert clean_value((1, None, 2.5), string_bytes=10) == [1, None, 2.5]


def test_key_cache_is_bounded() -> None:
    for i in range(5000):
        is_secret_key(f"field_{i}")
    assert is_secret_key("field_4999") is False


def test_key_text_cache_is_bounded() -> None:
    cleaned = clean_value({f"name_{i}": i for i in range(5000)}, string_bytes=100, items=6000)
    assert cleaned["name_4999"] == 4999


def test_a_service_accounts_private_key_read_as_json_is_masked_whole() -> None:
    # `cat key.json` of a cloud service account: the key is the value of "private_key", its
    # line breaks escaped. A value stopped at the header's first space once, and left the body.
    body, key_id = secrets.token_urlsafe(48), secrets.token_hex(20)
    pem = f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n"
    account = {
        "type": "service_account",
        "private_key_id": key_id,
        "private_key": pem,
        "client_email": "bot@project.iam.gserviceaccount.com",
    }
    out = clean_text(json.dumps(account, indent=2), 16_000)
    assert body not in out
    assert key_id not in out
    assert "bot@project.iam.gserviceaccount.com" in out  # the rest stays readable
    for text in (f"private_key={pem}", f'password="{pem}"', f"Authorization: Bearer\n{pem}"):
        assert body not in clean_text(text, 16_000)


def test_a_value_that_starts_like_a_key_id_is_still_masked() -> None:
    # Found by Hypothesis: the AWS-shape check must not apply to a NAME=value's value.
    assert redact_text("password=AKIApassword") == "password=[redacted]"
    assert redact_text("token=sk-abcdefghijklmnopqrstuvwxyz") == "token=[redacted]"
    assert redact_text("akiaabcdefghijklmnopq") == "akiaabcdefghijklmnopq"
    assert redact_text("xsk-abcdefghijklmnopqrstuvwxyz") == "xsk-abcdefghijklmnopqrstuvwxyz"


def test_a_cut_that_never_settles_keeps_nothing_of_the_text() -> None:
    out = bound_text("a" * 100, 30, settle=lambda text: text + "!")
    assert out == "[...100 bytes cut]"


def test_clean_flat_takes_the_fast_path_only_when_nothing_would_change() -> None:
    redactor = Redactor()  # a fresh key cache: another test may have filled the bounded one
    clean_flat, clean_value = redactor.clean_flat, redactor.clean_value
    clean_value({"command": "ls", "description": "list"}, string_bytes=100)  # learn the keys
    args = {"command": "ls -la", "description": "list", "n": 1, "f": 1.5, "b": None}
    clean_value(args, string_bytes=100)
    assert clean_flat(args, 100, 64) is args
    assert clean_flat({"command": "x"}, 100, 0) is None  # too many entries
    assert clean_flat({"never_seen_key": "x"}, 100, 64) is None
    clean_value({"password": "p"}, string_bytes=100)
    assert clean_flat({"password": "p"}, 100, 64) is None
    assert clean_flat({"command": "x" * 100}, 100, 64) is not None  # ASCII, within its bound
    assert clean_flat({"command": "x" * 101}, 100, 64) is None  # needs a cut
    assert clean_flat({"command": "é" * 26}, 100, 64) is None  # may need a cut
    assert clean_flat({"command": ["ls"]}, 100, 64) is None  # nested
    assert clean_flat({"command": "echo token=abc"}, 100, 64) is None  # may hold a secret
    assert clean_flat({1: "x"}, 100, 64) is None
