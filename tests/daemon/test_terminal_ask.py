"""The terminal's question is read from a real terminal (a pty), without a thread."""

from __future__ import annotations

import asyncio
import os
import pty
import sys

import pytest

from codelegate.daemon.clients.terminal_ask import answer_body, terminal_asker


async def test_a_reply_typed_on_a_terminal_is_read_and_a_pty_counts_as_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    master, slave = pty.openpty()
    shown: list[str] = []
    with os.fdopen(slave, "r") as tty:
        monkeypatch.setattr(sys, "stdin", tty)
        ask = terminal_asker(shown.append)
        assert ask is not None
        os.write(master, b"y\n")
        assert await asyncio.wait_for(ask("Allow? "), 10) == "y\n"
        assert shown == ["Allow? "]
    os.close(master)


def test_without_a_terminal_nobody_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    with os.fdopen(read) as pipe:
        monkeypatch.setattr(sys, "stdin", pipe)
        assert terminal_asker(print) is None
    os.close(write)


@pytest.mark.parametrize(
    ("reply", "allow_session", "body"),
    [
        ("y\n", False, {"approved": True, "scope": "once"}),
        (" YES ", True, {"approved": True, "scope": "once"}),
        ("s", True, {"approved": True, "scope": "session"}),
        ("s", False, None),
        ("n", True, {"approved": False, "feedback": "The user denied this in the terminal"}),
        ("maybe", True, None),
    ],
)
def test_a_typed_reply_becomes_an_answer_or_the_question_again(
    reply: str, allow_session: bool, body: object
) -> None:
    assert answer_body(reply, allow_session=allow_session) == body
