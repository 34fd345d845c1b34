"""The terminal client's card board: frames in, rich renderables out, no I/O.

``Board.feed(frame)`` updates the cards of one run and returns what is settled and may be
printed for good (a finished top-level card with its subagent cards, assistant text, the final
result); ``Board.live(now)`` renders what is still moving (open cards with a spinner and their
elapsed time). Keeping time an argument makes every rendering reproducible in tests.

Everything drawn here carries text the model, the CLI or a workspace chose (titles, errors,
answers, file names), and a terminal obeys the escape sequences in it (clipboard writes, screen
clears, window titles). Two doors keep them out, each for everything that comes through it:
``Board.feed`` strips every string of a frame before anything is built from it, and
``CleanConsole`` (the only console the terminal client prints through) strips the strings it is
given and, as a last guard, every text segment it writes.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.rule import Rule
from rich.segment import Segment
from rich.spinner import Spinner
from rich.text import Text

from codelegate.translator.frames import (
    Diagnostic,
    FinalResult,
    Frame,
    ProviderMessage,
    RunResult,
    ToolCall,
    ToolProgress,
    ToolResult,
)
from codelegate.translator.summary import one_line
from codelegate.translator.tools import NAME_PREFIX

_SPINNER: Final = Spinner("dots")
_NOTE_CHARS: Final = 100
_ERROR_CHARS: Final = 160
# What a terminal acts on instead of showing: ESC sequences (CSI, OSC, DCS/SOS/PM/APC up to
# their terminator, and the short ones), their 8-bit C1 forms, every other C0 and C1 control but
# newline and tab, DEL, and the bidi embeddings/overrides/isolates that make text read other than
# it is stored ("Trojan Source"). An unterminated string runs to the end, as a terminal takes it.
_CONTROLS: Final = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d-\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]"
)


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


def spinner_frame(now: float) -> str:
    """The spinner glyph shown at ``now``."""
    # Chosen from the clock rather than a Spinner's own start time, so that two renders at the
    # same `now` look the same.
    frames = _SPINNER.frames
    return frames[int(now * 1000 / _SPINNER.interval) % len(frames)]


def strip_controls(text: str) -> str:
    """``text`` without anything a terminal would interpret rather than print."""
    return _CONTROLS.sub("", text)


def _stripped(value: Any) -> Any:
    if isinstance(value, str):
        return strip_controls(value)
    if isinstance(value, list):
        return [_stripped(item) for item in value]
    if isinstance(value, dict):
        return {_stripped(key): _stripped(item) for key, item in value.items()}
    return value


def clean_frame(frame: Frame) -> Frame:
    """``frame`` with the control sequences stripped from every string in it (itself if none)."""
    # Field by field would miss the next field someone adds; the builtins walk covers them all.
    plain = msgspec.to_builtins(frame)
    stripped = _stripped(plain)
    if stripped == plain:
        return frame
    try:
        return msgspec.convert(stripped, type(frame))
    except msgspec.ValidationError:  # a field emptied below its bound: CleanConsole still guards
        return frame


class CleanConsole(Console):
    """A rich Console that writes no control sequence it did not make itself.

    Strings are stripped before rich makes Text of them: rich drops a BEL itself, which would
    leave an OSC unterminated and swallow the words after it. Rich keeps its own cursor moves,
    colours and Live redraws in control segments (and styles); every other segment is text from a
    renderable and loses any control sequence here, whatever it was built from.
    """

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(strip_controls(text), **kwargs)

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            # Nested renderables come through here once per level; cleaned text is left as is.
            if segment.control is None and _CONTROLS.search(segment.text):
                segment = segment._replace(text=strip_controls(segment.text))
            yield segment


class Board:
    """Cards of one run, keyed by ``tool_id``; subagent cards hang under their Task card."""

    def __init__(
        self, run_id: str = "", *, cwd: str | None = None, started: float | None = None
    ) -> None:
        self.run_id = run_id
        # The run's workspace, when the client knows it: the resume hint must name it (the
        # daemon refuses a resume from another workspace).
        self.cwd = cwd
        # When the run started (the client's POST, the daemon's created_at); else the first
        # frame's time. The CLI's first line comes seconds after the start.
        self.started = started
        self.cards: dict[str, Card] = {}
        self.roots: list[str] = []  # unsettled top-level cards, in the order they opened
        self.result: FinalResult | None = None
        self.ended: float | None = None
        # Whether the CLI ever got going (it spoke or used a tool): only then is there a
        # session to resume.
        self.cli_spoke = False

    # -- input -----------------------------------------------------------------------------
    def feed(self, frame: Frame) -> list[RenderableType]:
        """Take one frame; return the renderables that are now final (print them once)."""
        frame = clean_frame(frame)
        if self.started is None:
            self.started = frame.ts
        if isinstance(frame, ToolCall | ToolProgress | ToolResult | ProviderMessage):
            self.cli_spoke = True
        if isinstance(frame, ToolCall):
            return self._open(frame)
        if isinstance(frame, ToolProgress):
            card = self.cards.get(frame.tool_id)
            if card is not None:
                card.elapsed_ms = max(card.elapsed_ms, frame.elapsed_ms)
                card.tool_uses = frame.tool_uses if frame.tool_uses is not None else card.tool_uses
                card.total_tokens = frame.total_tokens or card.total_tokens
                if frame.summary:
                    card.note = one_line(frame.summary, _NOTE_CHARS)
            return []
        if isinstance(frame, ToolResult):
            return self._close(frame)
        if isinstance(frame, ProviderMessage):
            return self._message(frame)
        if isinstance(frame, RunResult):
            self.ended = frame.ts
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
            card.error = f"{kind}: {one_line(reason, _ERROR_CHARS)}" if reason else kind
        return self._settle(self._root_of(card))

    def _message(self, frame: ProviderMessage) -> list[RenderableType]:
        if frame.parent_tool_id and frame.parent_tool_id in self.cards:
            self.cards[frame.parent_tool_id].note = one_line(frame.text, _NOTE_CHARS)
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
        # The CLI's duration_ms ends with its main loop; background subagents may go on for long
        # after, and the run lasts until the last of them. Show the longer of the two.
        wall = (self.ended or 0.0) - (self.started or self.ended or 0.0)
        resumable = self.cli_spoke or result.num_turns is not None
        out.append(render_result(result, cwd=self.cwd, wall_s=wall, resumable=resumable))
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
            if self.started is None:
                self.started = now  # nothing known yet: count from when the client first drew
            since = now - self.started
            lines.append(
                Text.assemble(
                    (f"{spinner_frame(now)} ", "cyan"),
                    ("Claude Code is working", "dim"),
                    (f"  {_duration(max(since, 0.0))}", "dim"),
                )
            )
        return Group(*lines)

    def open_cards(self) -> RenderableType | None:
        """The cards still open, as they stand: what a client leaving early keeps on screen."""
        if not self.roots:
            return None
        return Group(*(self._tree(root, now=None) for root in self.roots))

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


def render_result(
    result: FinalResult,
    *,
    cwd: str | None = None,
    wall_s: float = 0.0,
    resumable: bool = True,
) -> RenderableType:
    """The end of a run: status, Claude Code's answer, what changed, how to resume.

    ``wall_s`` is the run's own length as the client saw it; ``resumable`` is False when the CLI
    never started a session; ``cwd`` goes into the resume hint (without it there is no hint:
    pasted elsewhere, it would be refused).
    """
    ok = result.status == "completed"
    head = Text()
    head.append("✓ " if ok else "✗ ", style="green bold" if ok else "red bold")
    head.append(result.status, style="bold")
    facts = []
    seconds = max((result.duration_ms or 0) / 1000, wall_s)
    if result.duration_ms is not None or wall_s > 0:
        facts.append(_duration(seconds))
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
    if result.session_id and resumable:
        session = Text("session ", style="dim")
        session.append(result.session_id, style="bold")
        rows.append(session)
        if cwd is not None:
            hint = f"codelegate run --cwd {shlex.quote(cwd)} --resume {result.session_id} TASK"
            rows.append(Text(f"resume: {hint}", style="dim"))
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
            # A Text, not a str: a Rule reads a str title as markup.
            out.insert(0, Rule(Text(f"run {frame.run_id}"), style="blue", align="left"))
        if board.result is not None:
            del self.boards[frame.run_id]  # finished: nothing of it stays live
        return out

    def live(self, now: float) -> RenderableType:
        parts: list[RenderableType] = []
        for run_id, board in self.boards.items():
            parts.append(Text(f"run {run_id}", style="blue"))
            parts.append(board.live(now))
        return Group(*parts)
