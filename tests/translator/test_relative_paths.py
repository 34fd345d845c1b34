"""relative_path's shortcut for a plain path under the cwd agrees with normpath's answer."""

from __future__ import annotations

import posixpath

from hypothesis import given, settings
from hypothesis import strategies as st

from codelegate.translator.summary import relative_path

PARTS = st.lists(st.sampled_from(["src", "a.py", ".", "..", "", ".git", "x", "/"]), max_size=6)
CWDS = st.sampled_from(["/srv/work", "/srv/work/", "/", "", "/srv/work/src"])


@settings(max_examples=500)
@given(PARTS, CWDS)
def test_a_path_under_the_cwd_is_what_normpath_makes_of_it(parts: list[str], cwd: str) -> None:
    path = "/srv/work/" + "/".join(parts)
    norm = posixpath.normpath(path)
    base = posixpath.normpath(cwd) if cwd else "/"
    prefix = base if base.endswith("/") else base + "/"
    expected = (
        "." if norm == base else norm.removeprefix(prefix) if norm.startswith(prefix) else norm
    )
    assert relative_path(path, cwd) == expected
