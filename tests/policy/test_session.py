"""Resume ids: only the exact canonical form; unknown or foreign sessions refused."""

from __future__ import annotations

import pytest

from codelegate.policy.errors import PolicyError
from codelegate.policy.session import check_resume, is_session_id, parse_session_id

GOOD = "0b6f6d52-3b9e-4bb1-9d4c-5a3e2f0c1d2e"


def test_canonical_id_passes_unchanged() -> None:
    assert parse_session_id(GOOD) == GOOD
    assert is_session_id(GOOD)


@pytest.mark.parametrize(
    "value",
    [
        GOOD.upper(),
        "0B6f6d52-3b9e-4bb1-9d4c-5a3e2f0c1d2e",
        "{" + GOOD + "}",
        GOOD.replace("-", ""),
        "urn:uuid:" + GOOD,
        "x" + GOOD,
        GOOD + "x",
        " " + GOOD,
        GOOD + "\n",
        GOOD + "\x00",
        GOOD[:-1],
        GOOD[:8] + GOOD[9:13] + "-" + GOOD[13:],
        "0b6f6d52-3b9e-4bb1-9d4c5a3e-2f0c1d2e",
        "g" + GOOD[1:],
        "０" + GOOD[1:],  # a fullwidth digit: \d would accept it, we do not
        "",
        "latest",
        "../" + GOOD,
    ],
)
def test_anything_else_is_refused(value: str) -> None:
    assert not is_session_id(value)
    with pytest.raises(PolicyError) as caught:
        parse_session_id(value)
    assert (caught.value.status, caught.value.code) == (403, "resume_invalid")


def test_check_resume() -> None:
    check_resume(GOOD, "/srv/ws/a", "/srv/ws/a")
    with pytest.raises(PolicyError) as unknown:
        check_resume(GOOD, None, "/srv/ws/a")
    assert (unknown.value.status, unknown.value.code) == (403, "resume_unknown")
    with pytest.raises(PolicyError) as other:
        check_resume(GOOD, "/srv/ws/b", "/srv/ws/a")
    assert (other.value.status, other.value.code) == (403, "resume_other_workspace")
    assert "/srv/ws/b" not in other.value.message
    with pytest.raises(PolicyError, match="resume_invalid"):
        check_resume(GOOD.upper(), GOOD.upper(), "/srv/ws/a")
