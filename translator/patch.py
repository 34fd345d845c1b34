"""Unified diffs for Edit/Write/MultiEdit cards, built from the CLI's ``structuredPatch``."""

from __future__ import annotations

from collections.abc import Sequence

from codelegate.translator.wire import Hunk


def unified_diff(path: str, hunks: Sequence[Hunk]) -> str:
    """A unified diff of ``path`` (already relative to the run's cwd) from the CLI's hunks."""
    out = [f"--- a/{path}", f"+++ b/{path}"]
    for hunk in hunks:
        out.append(f"@@ -{hunk.oldStart},{hunk.oldLines} +{hunk.newStart},{hunk.newLines} @@")
        out.extend(hunk.lines)
    return "\n".join(out) + "\n"


def creation_diff(path: str, content: str) -> str:
    """The diff of a file created with ``content`` (a Write whose patch is empty)."""
    lines = content.splitlines()
    head = f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n"
    # Each line with its "+", joined in one call rather than one string a line.
    return head + "+" + "\n+".join(lines) + "\n" if lines else head
