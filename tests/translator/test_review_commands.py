"""The review's commands come from card args the run's redactor cleaned already.

Cleaned text is a fixed point of redaction: the evidence keeps a command as its card showed
it (cut to the command's bound), so cleaning it again changed nothing but cost a redaction per
Bash call. These properties check that against cleaning it again, over the screen's planted
shapes, fresh known values and texts past the args' bound.
"""

from __future__ import annotations

import secrets

from hypothesis import given, settings
from hypothesis import strategies as st

from codelegate.translator.args import clean_args
from codelegate.translator.frames import ToolResult
from codelegate.translator.inputs import Limits
from codelegate.translator.redact import PLAIN, Redactor
from codelegate.translator.review import _COMMAND_CHARS, _command
from tests.translator.test_screen import PIECES

KNOWN = st.binary(min_size=8, max_size=20).map(bytes.hex)
COMMANDS = st.lists(PIECES | KNOWN | st.just("x" * 900), max_size=24).map("".join)


@settings(max_examples=600)
@given(COMMANDS, st.lists(KNOWN, max_size=2), st.sampled_from([200, 4096, 16384]))
def test_a_cleaned_command_cleaned_again_is_the_same_command(
    text: str, known: list[str], arg_bytes: int
) -> None:
    value = secrets.token_hex(12)
    redactor = Redactor([value, *known])
    limits = Limits(arg_bytes=arg_bytes)
    args, _ = clean_args(redactor, limits, {"command": text + value}, "toolu_01")
    assert isinstance(args, dict)
    command = args["command"]
    assert isinstance(command, str)
    frame = _result()
    assert _command(command, frame).command == PLAIN.clean_chars(command, _COMMAND_CHARS)
    assert value not in _command(command, frame).command


def _result() -> ToolResult:
    return ToolResult(
        "r:1", "r", 1, 0.0, "claude_code", None, None, None,
        tool_id="claude:toolu_01", name="Claude Code › Bash", status="completed", result="",
        timing_ms=0,
    )  # fmt: skip
