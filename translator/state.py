"""The run state: every fact the translator keeps of one run, in one place.

:class:`RunState` is a plain owner in the manner of h11: the card rules
(:mod:`translator.cards`, :mod:`translator.messages`), the final result
(:mod:`translator.outcome`) and the restore (:mod:`translator.restore`) take it explicitly, and
:class:`~translator.core.Translator` composes them. It also stamps the frames: sequence numbers,
times and the envelope every frame carries are facts of the run, so they are set here and nowhere
else. The records it holds per card and per streamed block are Structs of their own module
(:mod:`translator.records`), and the facts of a tool's name are :mod:`translator.tools`'.
"""

from __future__ import annotations

from typing import Final, Literal

import codelegate.translator.wire as wire
from codelegate.policy.request import AGENT_IO_ID
from codelegate.translator.frames import (
    PROVIDER,
    Diagnostic,
    DiagnosticCode,
    ErrorType,
    FinalResult,
    Frame,
    PermissionDenial,
    ProviderMessage,
    ToolCall,
    ToolResult,
    frame_id_prefix,
)
from codelegate.translator.inputs import NAME_CHARS, Limits, RunContext
from codelegate.translator.records import Card, StreamedText
from codelegate.translator.redact import Redactor
from codelegate.translator.review import Review
from codelegate.translator.tools import Tool

TOOL_PREFIX: Final = "claude:"
UNKNOWN_TOOL: Final = "unknown"  # the name of a card whose tool the CLI did not name
# The most of a path or an id the CLI reports that a frame carries (a tool name: NAME_CHARS).
SAID_CHARS: Final = 1024
# A frame's envelope, as its first fields take it (translator.frames._Frame).
Envelope = tuple[str, str, int, float, Literal["claude_code"], str | None, str | None, str | None]
_TOOLS_KEPT: Final = 256  # tool names whose facts a run remembers


class RunState:
    """Everything one run's translator knows; see the module docstring."""

    # Slotted: these are read on every line, and a slot is the cheapest attribute there is.
    __slots__ = (
        "cards",
        "cli_session",
        "closed",
        "ctx",
        "denials",
        "diag",
        "diag_sent",
        "files",
        "held",
        "held_count",
        "id_prefix",
        "invocation",
        "last_result",
        "limits",
        "messages",
        "now",
        "out",
        "parent",
        "permission",
        "redactor",
        "result",
        "review",
        "revision",
        "run_id",
        "said_cache",
        "seen",
        "seq",
        "sequence",
        "session_id",
        "started",
        "streaming",
        "tasks",
        "tool_ids",
        "tools",
        "tools_completed",
        "tools_failed",
        "tools_started",
    )

    def __init__(self, ctx: RunContext, limits: Limits, redactor: Redactor) -> None:
        self.ctx = ctx
        self.run_id = ctx.run_id
        self.id_prefix = frame_id_prefix(ctx.run_id)  # of every frame id (frames.frame_id)
        self.limits = limits
        # The run's redactor: it knows the credentials the daemon passed to this run's CLI.
        self.redactor = redactor
        self.seq = 0  # the last frame's
        self.now = ctx.started_at  # the time of the input being translated
        self.out: list[Frame] = []  # frames made since the last take()
        self.started = False
        self.closed = False
        self.result: FinalResult | None = None
        # The session frames name, and the one the CLI itself reported (init or result).
        self.session_id: str | None = ctx.session_id
        self.cli_session: str | None = None
        self.last_result: wire.Result | None = None  # several may come: the last one wins
        self.cards: dict[str, Card] = {}  # open cards by the CLI's tool_use id
        self.seen: set[str] = set()  # every tool_use id that opened a card
        self.tool_ids: dict[str, str] = {}  # the CLI's tool_use id -> the frames' tool_id
        self.said_cache: dict[str, str] = {}
        self.tools: dict[str | None, Tool] = {}  # by the name as the model wrote it
        self.tasks: dict[str, str] = {}  # task_id -> tool_use_id
        # Subagent lines waiting for their Task card, by its tool_use id.
        self.held: dict[str, list[wire.Assistant | wire.User]] = {}
        self.held_count = 0
        self.denials: dict[str, PermissionDenial] = {}
        self.files: dict[str, None] = {}  # files changed, in order
        self.review = Review(ctx.cwd)
        self.tools_started = self.tools_completed = self.tools_failed = 0
        self.revision = ctx.revision_base  # the Work Room's, continued across its runs
        self.sequence = ctx.sequence_base  # the last Work Room row number used
        self.messages = 0  # the run's messages so far (the last one's number)
        # The text block streaming now, per agent (None = the main one), until its full line.
        self.streaming: dict[str | None, StreamedText] = {}
        self.diag: dict[DiagnosticCode, int] = {}  # counts so far
        self.diag_sent: dict[DiagnosticCode, int] = {}  # the counts the frames said
        parent = ctx.parent_tool_call_id
        invocation = f"claude_code:{parent}" if parent else None
        ok = invocation is not None and AGENT_IO_ID.fullmatch(invocation) is not None
        self.invocation = invocation if ok else None  # the Work Room's, when a parent was named
        self.parent = parent if ok else None
        self.permission: Literal["manual", "auto_approve"] = (
            "auto_approve" if ctx.mode in ("accept_edits", "auto") else "manual"
        )

    # --- what the CLI chose, as frames carry it -------------------------------------------------

    def said(self, text: str, limit: int = SAID_CHARS) -> str:
        """A short string the CLI or the model chose (a tool name, a path, a session id), as a
        frame may carry it: every such string goes through here."""
        said = self.said_cache.get(text)
        if said is not None:
            return said
        said = self.redactor.clean_chars(text, limit)
        # Tool names repeat on every call: remember the short ones, which no bound cuts (so the
        # answer is the same whatever the limit).
        if len(said) <= NAME_CHARS and len(text) <= NAME_CHARS and len(self.said_cache) < 1024:
            self.said_cache[text] = said
        return said

    def tool(self, raw: str | None) -> Tool:
        """The facts of the tool the model named ``raw`` (its name said, as frames carry it)."""
        tool = self.tools.get(raw)
        if tool is None:
            tool = Tool(self.said(raw or UNKNOWN_TOOL, NAME_CHARS))
            # Bounded: a run calls a handful of tools, but the model may invent names.
            if len(self.tools) < _TOOLS_KEPT:
                self.tools[raw] = tool
        return tool

    def tool_id(self, use_id: str) -> str:
        """The frame id of the CLI's tool call ``use_id``: redacted like any string it chose, and
        still one id per call (two masked ids must not name the same card)."""
        tool_id = self.tool_ids.get(use_id)
        if tool_id is not None:  # a parent, asked for by each line of its subagent
            return tool_id
        if len(use_id) <= NAME_CHARS and not self.redactor.screen(use_id.lower()):
            said = use_id  # the common case: nothing to mask, nothing to cut
        else:
            said = self.redactor.clean_chars(use_id, SAID_CHARS)
            if said != use_id:
                said += f".{len(self.tool_ids) + 1}"
        # Like seen, one entry per tool call of the run.
        self.tool_ids[use_id] = tool_id = TOOL_PREFIX + said
        return tool_id

    # --- diagnostics ----------------------------------------------------------------------------

    def count(self, code: DiagnosticCode) -> None:
        """One more of ``code``: sent at counts 1, 2, 4, 8 …, and the total at the end, so that a
        flood of bad lines costs a few frames, whatever the chunking."""
        count = self.diag.get(code, 0) + 1
        self.diag[code] = count
        if count & (count - 1) == 0:
            self.diagnostic(code, count)

    def diagnostic(self, code: DiagnosticCode, count: int) -> None:
        self.diag_sent[code] = count
        self.frame(Diagnostic, code=code, count=count)

    # --- frames ---------------------------------------------------------------------------------

    def frame(self, frame_type: type[Frame], /, **fields: object) -> None:
        """The run's next frame of ``frame_type`` (the envelope is stamped here)."""
        self.out.append(frame_type(*self.envelope(), **fields))  # type: ignore[arg-type]

    def envelope(self) -> Envelope:
        """The next frame's envelope (its ``seq`` taken), in the order of the frames' fields."""
        self.seq = seq = self.seq + 1
        run_id = self.run_id
        return (
            f"{self.id_prefix}{seq}",  # frame_id(run_id, seq), without a call per frame
            run_id,
            seq,
            self.now,
            PROVIDER,
            self.session_id,
            self.invocation,
            self.parent,
        )

    # The three frames of every card and message are built without frame(): splatting keyword
    # arguments into a Struct costs a microsecond a frame (measured), a sixth of a card's time.

    def tool_call(self, card: Card, summary: str) -> ToolCall:
        """A card's tool_call frame (made and kept in ``out``)."""
        id_, run_id, seq, ts, provider, session, invocation, caller = self.envelope()
        frame = ToolCall(
            id_, run_id, seq, ts, provider, session, invocation, caller,
            tool_id=card.tool_id,
            name=card.facts.name,
            args=card.args,
            status="in_progress",
            parent_tool_id=card.parent_tool_id,
            summary=summary,
        )  # fmt: skip
        self.out.append(frame)
        return frame

    def tool_result(
        self,
        card: Card,
        ok: bool,
        result: str,
        error: str | None,
        error_type: ErrorType | None,
        diff: str | None,
    ) -> ToolResult:
        """A card's tool_result frame (made and kept in ``out``), its texts already clean."""
        id_, run_id, seq, ts, provider, session, invocation, caller = self.envelope()
        frame = ToolResult(
            id_, run_id, seq, ts, provider, session, invocation, caller,
            tool_id=card.tool_id,
            name=card.facts.name,
            status="completed" if ok else "failed",
            result=result,
            timing_ms=max(int((ts - card.started) * 1000), 0),
            error=error,
            error_type=error_type,
            diff=diff,
            parent_tool_id=card.parent_tool_id,
        )  # fmt: skip
        self.out.append(frame)
        return frame

    def message(self, message_id: str, text: str, parent: str | None, partial: bool) -> None:
        """An assistant text frame, its text already clean; ``parent`` is the CLI's id of the
        subagent's Task call."""
        id_, run_id, seq, ts, provider, session, invocation, caller = self.envelope()
        frame = ProviderMessage(
            id_, run_id, seq, ts, provider, session, invocation, caller,
            role="assistant",
            messageId=message_id,
            text=text,
            parent_tool_id=self.tool_id(parent) if parent else None,
            partial=partial,
        )  # fmt: skip
        self.out.append(frame)

    def take(self) -> list[Frame]:
        """The frames made since the last call."""
        out, self.out = self.out, []
        return out
