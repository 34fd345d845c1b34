"""The terminal client's card board: frames in, rich renderables out, no I/O.

``Board.feed(frame)`` updates the cards of one run and returns what is settled and may be
printed for good (a finished top-level card with its subagent cards, assistant text, the final
result); ``Board.live(now)`` renders what is still moving (open cards with a spinner and their
elapsed time). Keeping time an argument makes every rendering reproducible in tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.spinner import Spinner
from rich.text import Text

from translator.frames import (
    Diagnostic,
    FinalResult,
    Frame,
    ProviderMessage,
    RunResult,
    ToolCall,
    ToolProgress,
    ToolResult,
)

NAME_PREFIX: Final = "Claude Code › "
_SPINNER: Final = Spinner("dots")
_NOTE_CHARS: Final = 100
_ERROR_CHARS: Final = 160


@dataclass
class Card:
    """One tool call of the run, as the terminal shows it."""

    tool_id: str
    name: str
    label: str
    parent: str | None
    opened: float
    status: str = "open"  # open | completed | failed
    elapsed_ms: int = 0
    timing_ms: int | None = None
    closed: float | None = None
    error: str | None = None
    tool_uses: int | None = None
    total_tokens: int | None = None
    note: str = ""  # latest subagent text or progress summary, shown while open
    children: list[str] = field(default_factory=list)


def _label(name: str, summary: str | None) -> str:
    return summary or name.removeprefix(NAME_PREFIX)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s"


def _one_line(text: str, limit: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def spinner_frame(now: float) -> str:
    """The spinner glyph shown at ``now``."""
    # Chosen from the clock rather than a Spinner's own start time, so that two renders at the
    # same `now` look the same.
    frames = _SPINNER.frames
    return frames[int(now * 1000 / _SPINNER.interval) % len(frames)]


class Board:
    """Cards of one run, keyed by ``tool_id``; subagent cards hang under their Task card."""

    def __init__(self, run_id: str = "") -> None:
        self.run_id = run_id
        self.cards: dict[str, Card] = {}
        self.roots: list[str] = []  # unsettled top-level cards, in the order they opened
        self.result: FinalResult | None = None
        self.started: float | None = None

    # -- input -----------------------------------------------------------------------------
    def feed(self, frame: Frame) -> list[RenderableType]:
        """Take one frame; return the renderables that are now final (print them once)."""
        if self.started is None:
            self.started = frame.ts
        if isinstance(frame, ToolCall):
            return self._open(frame)
        if isinstance(frame, ToolProgress):
            card = self.cards.get(frame.tool_id)
            if card is not None:
                card.elapsed_ms = max(card.elapsed_ms, frame.elapsed_ms)
                card.tool_uses = frame.tool_uses if frame.tool_uses is not None else card.tool_uses
                card.total_tokens = frame.total_tokens or card.total_tokens
                if frame.summary:
                    card.note = _one_line(frame.summary, _NOTE_CHARS)
            return []
        if isinstance(frame, ToolResult):
            return self._close(frame)
        if isinstance(frame, ProviderMessage):
            return self._message(frame)
        if isinstance(frame, RunResult):
            return self._finish(frame.result)
        if isinstance(frame, Diagnostic):
            text = f"! {frame.count} × {frame.code.replace('_', ' ')}"
            return [Text(text, style="yellow dim")]
        return []  # provider_invocation / provider_activity mirror the cards for O Chat

    def _open(self, frame: ToolCall) -> list[RenderableType]:
        card = self.cards.get(frame.tool_id)
        if card is not None:  # a repeated tool_call updates the open card in place
            card.label = _label(frame.name, frame.summary) if frame.summary else card.label
            return []
        parent = frame.parent_tool_id if frame.parent_tool_id in self.cards else None
        card = Card(
            tool_id=frame.tool_id,
            name=frame.name,
            label=_label(frame.name, frame.summary),
            parent=parent,
            opened=frame.ts,
        )
        self.cards[frame.tool_id] = card
        if parent is None:
            self.roots.append(frame.tool_id)
        else:
            self.cards[parent].children.append(frame.tool_id)
        return []

    def _close(self, frame: ToolResult) -> list[RenderableType]:
        card = self.cards.get(frame.tool_id)
        if card is None:  # the daemon never sends an orphan result; render it anyway
            card = Card(
                tool_id=frame.tool_id,
                name=frame.name,
                label=_label(frame.name, None),
                parent=None,
                opened=frame.ts,
            )
            self.cards[frame.tool_id] = card
            self.roots.append(frame.tool_id)
        card.status = frame.status
        card.timing_ms = frame.timing_ms
        card.closed = frame.ts
        if frame.status == "failed":
            reason = frame.error or frame.result
            kind = frame.error_type or "error"
            card.error = f"{kind}: {_one_line(reason, _ERROR_CHARS)}" if reason else kind
        return self._settle(self._root_of(card))

    def _message(self, frame: ProviderMessage) -> list[RenderableType]:
        if frame.parent_tool_id and frame.parent_tool_id in self.cards:
            self.cards[frame.parent_tool_id].note = _one_line(frame.text, _NOTE_CHARS)
            return []
        if frame.partial:
            return []  # still streaming: printed once, whole, by its last frame
        return [Text(frame.text.strip())]

    def _finish(self, result: FinalResult) -> list[RenderableType]:
        self.result = result
        out: list[RenderableType] = []
        for root in list(self.roots):  # the daemon closes every card first; be safe anyway
            out.append(self._tree(root, now=None))
        self.roots.clear()
        out.append(render_result(result))
        return out

    def _root_of(self, card: Card) -> str:
        while card.parent is not None:
            card = self.cards[card.parent]
        return card.tool_id

    def _all_closed(self, tool_id: str) -> bool:
        card = self.cards[tool_id]
        return card.status != "open" and all(self._all_closed(c) for c in card.children)

    def _settle(self, root: str) -> list[RenderableType]:
        if root not in self.roots or not self._all_closed(root):
            return []
        self.roots.remove(root)
        return [self._tree(root, now=None)]

    # -- output ----------------------------------------------------------------------------
    def live(self, now: float) -> RenderableType:
        """What is still moving: open top-level cards with their subagent cards."""
        lines: list[RenderableType] = [self._tree(root, now) for root in self.roots]
        if self.result is None:
            since = now - self.started if self.started is not None else 0.0
            lines.append(
                Text.assemble(
                    (f"{spinner_frame(now)} ", "cyan"),
                    ("Claude Code is working", "dim"),
                    (f"  {_duration(max(since, 0.0))}", "dim"),
                )
            )
        return Group(*lines)

    def _tree(self, tool_id: str, now: float | None, depth: int = 0) -> RenderableType:
        card = self.cards[tool_id]
        rows: list[RenderableType] = [self._line(card, now, depth)]
        if card.note and card.status == "open":
            rows.append(Text("  " * (depth + 1) + "  " + card.note, style="dim italic"))
        rows.extend(self._tree(child, now, depth + 1) for child in card.children)
        return Group(*rows)

    def _line(self, card: Card, now: float | None, depth: int) -> Text:
        indent = "  " * depth
        if card.status == "open":
            icon, style = (spinner_frame(now), "cyan") if now is not None else ("…", "yellow")
            seconds = max(card.elapsed_ms / 1000, (now or card.opened) - card.opened)
        else:
            icon, style = ("✓", "green") if card.status == "completed" else ("✗", "red")
            if card.timing_ms is not None:
                seconds = card.timing_ms / 1000
            else:
                seconds = max((card.closed or card.opened) - card.opened, 0.0)
        text = Text(indent)
        text.append(icon, style=style)
        text.append(" ")
        text.append(card.label, style="bold" if depth == 0 else "")
        text.append(f"  {_duration(seconds)}", style="dim")
        if card.tool_uses is not None:
            text.append(f"  · {card.tool_uses} tools", style="dim")
        if card.error:
            text.append(f"  {card.error}", style="red")
        return text


def render_result(result: FinalResult) -> RenderableType:
    """The end of a run: status, Claude Code's answer, what changed, how to resume."""
    ok = result.status == "completed"
    head = Text()
    head.append("✓ " if ok else "✗ ", style="green bold" if ok else "red bold")
    head.append(result.status, style="bold")
    facts = []
    if result.duration_ms is not None:
        facts.append(_duration(result.duration_ms / 1000))
    tools = result.tools
    if tools.started:
        failed = f", {tools.failed} failed" if tools.failed else ""
        facts.append(f"{tools.started} tools{failed}")
    if result.total_cost_usd is not None:
        facts.append(f"${result.total_cost_usd:.4f}")
    if result.exit_code not in (None, 0):
        facts.append(f"exit {result.exit_code}")
    if facts:
        head.append("  " + " · ".join(facts), style="dim")
    rows: list[RenderableType] = [Rule(style="dim"), head]
    if result.error:
        rows.append(Text(result.error, style="red"))
    if result.result:
        rows.append(Text(result.result.strip()))
    if result.files_changed:
        rows.append(Text("files changed: " + ", ".join(result.files_changed), style="cyan"))
    for denial in result.permission_denials:
        rows.append(Text(f"permission denied: {denial.name} ({denial.tool_id})", style="yellow"))
    if result.session_id:
        session = Text("session ", style="dim")
        session.append(result.session_id, style="bold")
        rows.append(session)
        rows.append(Text(f"resume: codelegate run --resume {result.session_id} TASK", style="dim"))
    return Group(*rows)


class MultiBoard:
    """Boards for several runs at once (``codelegate watch --all``), each under a header."""

    def __init__(self) -> None:
        self.boards: dict[str, Board] = {}
        self._last_printed: str | None = None

    def feed(self, frame: Frame) -> list[RenderableType]:
        board = self.boards.get(frame.run_id)
        if board is None:
            board = self.boards[frame.run_id] = Board(frame.run_id)
        out = board.feed(frame)
        if out and self._last_printed != frame.run_id:
            self._last_printed = frame.run_id
            out.insert(0, Rule(f"run {frame.run_id}", style="blue", align="left"))
        if board.result is not None:
            del self.boards[frame.run_id]  # finished: nothing of it stays live
        return out

    def live(self, now: float) -> RenderableType:
        parts: list[RenderableType] = []
        for run_id, board in self.boards.items():
            parts.append(Text(f"run {run_id}", style="blue"))
            parts.append(board.live(now))
        return Group(*parts)
