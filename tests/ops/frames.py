"""Frame builders for the terminal tests: a small run told frame by frame."""

from __future__ import annotations

import base64
import re
import secrets
from typing import Any

from codelegate.translator.frames import (
    Diagnostic,
    FinalResult,
    Frame,
    PermissionDenial,
    ProviderMessage,
    RunResult,
    ToolCall,
    ToolCounts,
    ToolProgress,
    ToolResult,
    frame_id,
)

RUN = "run-1"
SESSION = "3f1c2a54-8d5e-4b7a-9c61-0a2b3c4d5e6f"
T0 = 1_800_000_000.0


class Script:
    """Hands out seq, ids and timestamps so tests only say what happens."""

    def __init__(self, run_id: str = RUN) -> None:
        self.run_id = run_id
        self.seq = 0

    def _common(self, at: float) -> dict[str, Any]:
        self.seq += 1
        return {
            "id": frame_id(self.run_id, self.seq),
            "run_id": self.run_id,
            "seq": self.seq,
            "ts": T0 + at,
            "provider": "claude_code",
        }

    def call(
        self, tool: str, name: str, summary: str, at: float, parent: str | None = None
    ) -> Frame:
        return ToolCall(
            **self._common(at),
            tool_id=tool,
            name=f"Claude Code › {name}",
            args={},
            status="in_progress",
            summary=summary,
            parent_tool_id=parent,
        )

    def progress(self, tool: str, name: str, at: float, **extra: Any) -> Frame:
        return ToolProgress(**self._common(at), tool_id=tool, name=f"Claude Code › {name}", **extra)

    def done(self, tool: str, name: str, at: float, ms: int, **extra: Any) -> Frame:
        status = "failed" if "error_type" in extra else "completed"
        extra.setdefault("result", "")
        return ToolResult(
            **self._common(at),
            tool_id=tool,
            name=f"Claude Code › {name}",
            status=status,
            timing_ms=ms,
            **extra,
        )

    def say(self, text: str, at: float, parent: str | None = None) -> Frame:
        return ProviderMessage(
            **self._common(at), role="assistant", text=text, parent_tool_id=parent
        )

    def diagnostic(self, code: str, count: int, at: float) -> Frame:
        return Diagnostic(**self._common(at), code=code, count=count)  # type: ignore[arg-type]

    def result(self, at: float, status: str = "completed", **extra: Any) -> Frame:
        final = FinalResult(
            run_id=self.run_id,
            status=status,  # type: ignore[arg-type]
            session_id=SESSION,
            **extra,
        )
        return RunResult(**self._common(at), result=final)


def subagent_run() -> list[Frame]:
    """A Task whose subagent reads and greps, a failed Bash, text, and the result."""
    s = Script()
    return [
        s.say("I'll look around first.", 0.1),
        s.call("claude:t1", "Task", "Explore the parser", 0.2),
        s.call("claude:r1", "Read", "Read src/parser.py", 0.5, parent="claude:t1"),
        s.progress("claude:t1", "Task", 0.9, elapsed_ms=700, tool_uses=1, summary="reading"),
        s.say("The parser is small.", 1.0, parent="claude:t1"),
        s.done("claude:r1", "Read", 1.1, 600, result="..."),
        s.call("claude:g1", "Grep", "Grep TODO", 1.2, parent="claude:t1"),
        s.done("claude:g1", "Grep", 1.4, 200),
        s.done("claude:t1", "Task", 3.0, 2800, result="found it"),
        s.call("claude:b1", "Bash", "Run: pytest -q", 3.1),
        s.done(
            "claude:b1",
            "Bash",
            3.3,
            150,
            error="Claude requested permissions to use Bash, but you haven't granted it yet.",
            error_type="permission_denied",
        ),
        s.diagnostic("unknown_type", 2, 3.4),
        s.say("Done: the parser has one TODO.", 3.5),
        s.result(
            3.6,
            result="The parser has one TODO in src/parser.py.",
            duration_ms=3600,
            total_cost_usd=0.0123,
            tools=ToolCounts(started=4, completed=3, failed=1),
            files_changed=["src/parser.py"],
            permission_denials=[PermissionDenial(tool_id="claude:b1", name="Bash")],
        ),
    ]


class Hostile:
    """Fresh escape-sequence payloads a model or a workspace could put into any text.

    ``payload(word)`` wraps a visible ``word`` in a clipboard write (OSC 52, BEL- and
    ST-terminated), a screen clear with cursor home (CSI 2J/H), a window title (OSC 0, also in
    its 8-bit C1 form), a DCS string, a bidi override and stray C0 controls. Every hidden part
    is random per instance, so no fixed string can make a test pass.
    """

    def __init__(self) -> None:
        self.clip = base64.b64encode(secrets.token_bytes(18)).decode()
        self.title = f"title-{secrets.token_hex(6)}"
        self.dcs = f"dcs-{secrets.token_hex(6)}"

    def payload(self, word: str) -> str:
        return (
            f"\x1b]52;c;{self.clip}\x07{word}\x1b[2J\x1b[H\x1b]0;{self.title}\x1b\\"
            f"\x9d2;{self.title}\x9c\x1bP{self.dcs}\x1b\\\u202e\x08\x07\x9b31m!"
        )

    def leaks(self, out: str) -> list[str]:
        """What of the hidden parts reached ``out`` (empty when nothing did).

        Rich's own codes are taken out first: colours (SGR) and what Live redraws with (erase
        line, cursor up, hide/show cursor); any escape left after that is one the text brought.
        """
        bare = re.sub(r"\x1b\[(?:[0-9;]*m|2K|[0-9]*A|\?25[hl])", "", out)
        hidden = [self.clip, self.title, self.dcs, "\x1b", "\x07", "\x08", "\u202e", "\x9b", "\x9d"]
        return [part for part in hidden if part in bare]
