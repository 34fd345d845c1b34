"""The fast path for tool arguments keeps a long ASCII string within its bound as it is.

A Write's file content is often longer than a quarter of the argument bound (a character may
be four bytes) but ASCII, one byte a character: clean_flat passes it whole when the screen
finds nothing, and leaves a text it must mask, or one that may be too long, to the full walk.
"""

from __future__ import annotations

import secrets

from codelegate.translator.args import clean_args
from codelegate.translator.inputs import Limits
from codelegate.translator.redact import Redactor

LIMITS = Limits()


def warmed() -> Redactor:
    redactor = Redactor()
    redactor.clean_value({"file_path": "", "content": ""}, string_bytes=LIMITS.arg_bytes)
    return redactor


def test_a_long_ascii_content_within_the_bound_is_kept_as_the_same_object() -> None:
    content = "def f(x):\n    return x\n\n" * (LIMITS.arg_bytes // 40)
    args = {"file_path": "/w/a.py", "content": content}
    assert len(content) * 4 > LIMITS.arg_bytes
    assert warmed().clean_flat(args, LIMITS.arg_bytes, LIMITS.items) is args
    cleaned, screened = clean_args(warmed(), LIMITS, args, "toolu_01")
    assert cleaned is args
    assert screened


def test_a_long_content_holding_a_fresh_secret_is_masked() -> None:
    secret = secrets.token_hex(16)
    content = "x = 1\n" * 200 + f"API_KEY={secret}\n"
    args = {"file_path": "/w/a.py", "content": content}
    redactor = warmed()
    assert redactor.clean_flat(args, LIMITS.arg_bytes, LIMITS.items) is None
    cleaned, _ = clean_args(redactor, LIMITS, args, "toolu_01")
    assert secret not in str(cleaned)


def test_a_long_non_ascii_or_over_long_content_takes_the_full_walk() -> None:
    redactor = warmed()
    wide = {"file_path": "/w/a.py", "content": "é" * (LIMITS.arg_bytes // 2)}
    assert redactor.clean_flat(wide, LIMITS.arg_bytes, LIMITS.items) is None
    cleaned, _ = clean_args(redactor, LIMITS, wide, "toolu_01")
    assert isinstance(cleaned, dict)
    assert cleaned["content"].endswith("bytes cut]")
    long = {"file_path": "/w/a.py", "content": "a" * (LIMITS.arg_bytes + 1)}
    assert redactor.clean_flat(long, LIMITS.arg_bytes, LIMITS.items) is None
