"""``codelegate run`` asks in the terminal; ``watch`` shows what waits for a person.

A run's ``approval_needed`` frame becomes one question on the terminal: what Claude Code wants
to do, ``[y]es / [n]o`` (and ``[s]ession`` where policy allows it), and the seconds left before
the daemon denies it. The answer is posted to the daemon; an ``approval_resolved`` that comes
first (answered elsewhere, timed out, cancelled) dismisses the question. Without a terminal on
stdin nobody can answer here: the request is shown, and another client (or the timeout)
decides. ``watch`` never answers: it shows each pending request until it is resolved.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from codelegate.translator.frames import ApprovalNeeded, ApprovalResolved, Frame

_SUMMARY_CHARS: Final = 200

# Reads one answer after showing a prompt; None when there is nothing more to read.
Ask = Callable[[str], Awaitable[str | None]]
Note = Callable[[str, str], None]
# Shows a question as plain text: its "[y]es" is no markup, its summary the model's words.
Show = Callable[[str], None]
# POSTs a JSON body to a path of the daemon's API; the HTTP status (0: no answer).
Post = Callable[[str, dict[str, Any]], Awaitable[int]]


def summary(frame: ApprovalNeeded) -> str:
    """What the request would do, in one line: the command, the file, or the tool's words."""
    args = frame.arguments if isinstance(frame.arguments, dict) else {}
    detail = args.get("command") or args.get("file_path") or args.get("notebook_path")
    text = f"{frame.tool}: {detail}" if isinstance(detail, str) else frame.tool
    if frame.description and frame.description != detail:
        text += f" ({frame.description})"
    text = " ".join(text.split())
    return text if len(text) <= _SUMMARY_CHARS else text[: _SUMMARY_CHARS - 1] + "…"


def seconds_left(frame: ApprovalNeeded, now: float) -> int:
    return max(0, round(frame.expires_at - now))


def question(frame: ApprovalNeeded, now: float) -> str:
    """The terminal's question for ``frame``."""
    choices = "[y]es / [n]o" + (" / [s]ession" if frame.providerApproval.allowSession else "")
    where = frame.providerApproval.scope
    return (
        f"Claude Code wants to run {summary(frame)} · {where}\n"
        f"  {choices} — expires in {seconds_left(frame, now)} s: "
    )


def pending_line(frame: ApprovalNeeded, now: float) -> str:
    """What ``watch`` shows of a request waiting for a person."""
    return (
        f"  ⏸ waiting for approval: {summary(frame)} — {seconds_left(frame, now)} s left"
        f" ({frame.request_id})"
    )


def resolved_line(frame: ApprovalResolved) -> str:
    mark = "✓ approved" if frame.decision == "allow" else "✗ denied"
    scope = " for the session" if frame.scope == "session" else ""
    return f"  {mark}{scope} ({frame.by}): {frame.tool}"


def answer_body(reply: str, *, allow_session: bool) -> dict[str, Any] | None:
    """The daemon's body for a typed reply; None when it is no answer (ask again)."""
    word = reply.strip().lower()
    if word in ("y", "yes"):
        return {"approved": True, "scope": "once"}
    if word in ("n", "no"):
        return {"approved": False, "feedback": "The user denied this in the terminal"}
    if word in ("s", "session") and allow_session:
        return {"approved": True, "scope": "session"}
    return None


async def read_reply() -> str | None:
    """One line typed on stdin (read without a thread, so a dismissed question costs nothing)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    fd = sys.stdin.fileno()
    loop.add_reader(fd, lambda: None if ready.done() else ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(fd)
    try:
        line = sys.stdin.readline()
    except OSError:  # EIO: the terminal went away (the client gets SIGHUP and cancels)
        return None
    return line if line else None


def terminal_asker(show: Show) -> Ask | None:
    """How ``run`` asks on this terminal: ``show`` puts the question on the screen, the reply is
    read from stdin; None when stdin is not a terminal (nobody to ask here)."""
    if not sys.stdin.isatty():
        return None

    async def ask(prompt: str) -> str | None:
        show(prompt)
        return await read_reply()

    return ask


class Approvals:
    """A run's requests as a terminal shows them, and (``run`` with an ``ask``) answers them."""

    def __init__(self, post: Post, ask: Ask | None, note: Note) -> None:
        self._post = post
        self._ask = ask
        self._note = note
        self._open: dict[str, asyncio.Task[None]] = {}

    def feed(self, frame: Frame | None) -> None:
        """Look at every frame of the run; approval frames start or end a question."""
        if isinstance(frame, ApprovalNeeded):
            if self._ask is None:
                self._note(pending_line(frame, time.time()), "yellow")
                return
            task = asyncio.ensure_future(self._answer(frame, self._ask))
            self._open[frame.request_id] = task
            task.add_done_callback(lambda _: self._forget(frame.request_id, task))
        elif isinstance(frame, ApprovalResolved):
            waiting = self._open.pop(frame.request_id, None)
            if waiting is not None:
                waiting.cancel()  # answered elsewhere, timed out, or the run ends
            self._note(resolved_line(frame), "green" if frame.decision == "allow" else "red")

    def _forget(self, request_id: str, task: asyncio.Task[None]) -> None:
        if self._open.get(request_id) is task:
            del self._open[request_id]

    def close(self) -> None:
        for task in self._open.values():
            task.cancel()
        self._open.clear()

    async def _answer(self, frame: ApprovalNeeded, ask: Ask) -> None:
        path = f"/v1/runs/{frame.run_id}/approvals/{frame.request_id}"
        allow_session = frame.providerApproval.allowSession
        while True:
            reply = await ask(question(frame, time.time()))
            if reply is None:
                return  # no more input: another client or the timeout decides
            body = answer_body(reply, allow_session=allow_session)
            if body is None:
                continue
            status = await self._post(path, body)
            if status == 403:  # session scope refused: once or not at all
                allow_session = False
                continue
            if status == 409:
                self._note("  (that request was already resolved)", "dim")
            return
