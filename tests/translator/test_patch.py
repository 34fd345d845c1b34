"""The diff of a created file: one line of diff per line of content, whatever breaks it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from codelegate.translator.patch import creation_diff

# Every character str.splitlines breaks on, and some that it does not.
CONTENT = st.text(
    st.sampled_from(["a", "+", " ", "é", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028"]),
    max_size=40,
)


@given(CONTENT)
def test_a_created_file_diffs_as_its_lines_each_with_a_plus(content: str) -> None:
    lines = content.splitlines()
    by_definition = "\n".join(
        ["--- /dev/null", "+++ b/src/x.py", f"@@ -0,0 +1,{len(lines)} @@"]
        + ["+" + line for line in lines]
    )
    assert creation_diff("src/x.py", content) == by_definition + "\n"


def test_an_empty_file_diffs_as_its_header_alone() -> None:
    assert creation_diff("a.txt", "") == "--- /dev/null\n+++ b/a.txt\n@@ -0,0 +1,0 @@\n"
