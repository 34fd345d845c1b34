"""The API's error codes: one list (``policy/codes.py``), the README's table says the same."""

from __future__ import annotations

import re
from pathlib import Path

from codelegate.policy import codes
from codelegate.policy.codes import STATUS

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_error_table() -> dict[str, int | None]:
    """code → status as README's "Errors" table lists them ("other": None)."""
    text = README.read_text()
    start = text.index("| status | codes |", text.index("Errors are always"))
    block = text[start : text.index("\n\n", start)]
    table: dict[str, int | None] = {}
    for row in re.finditer(r"^\| (\d{3}|other) \| (.*) \|$", block, re.MULTILINE):
        status = None if row[1] == "other" else int(row[1])
        said = re.sub(r"\([^)]*\)", "", row[2])  # what a code means is said in parentheses
        for code in re.findall(r"`([a-z_]+)`", said):
            assert code not in table, f"README lists {code} twice"
            table[code] = status
    return table


def test_the_readme_error_table_and_the_code_list_agree_both_ways() -> None:
    listed = readme_error_table()
    assert listed, "the README's error table was not found"
    assert {c: s for c, s in listed.items() if c not in STATUS} == {}, "README-only codes"
    assert {c: s for c, s in STATUS.items() if c not in listed} == {}, "codes missing in README"
    assert listed == dict(STATUS)


def test_every_code_constant_is_in_the_status_table_and_none_twice() -> None:
    constants = {
        name: value
        for name, value in vars(codes).items()
        if name.isupper() and isinstance(value, str)
    }
    assert sorted(constants.values()) == sorted([*STATUS, *codes.WEBSOCKET_ONLY])
    assert not codes.WEBSOCKET_ONLY & STATUS.keys()
    assert all(name.lower() == value for name, value in constants.items())
