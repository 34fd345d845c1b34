"""Helpers of the approval tests: a run that waits for a person, and what its frames say."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.e2e.conftest import E2E, frames_until
from tests.stub.anthropic import Turn

ON = {"enabled": True}  # [approvals] on, with the defaults


def is_asking(frame: dict[str, Any]) -> bool:
    return frame["type"] in ("approval_needed", "ask_user")


def of_type(frames: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == kind]


def card_result(frames: list[dict[str, Any]], tool_id: str) -> dict[str, Any]:
    (result,) = [f for f in frames if f["type"] == "tool_result" and f["tool_id"] == tool_id]
    return result


@dataclass
class Asking:
    """A run waiting for a person: its id, its WebSocket, its frames so far, the request."""

    run_id: str
    ws: aiohttp.ClientWebSocketResponse
    frames: list[dict[str, Any]]
    request: dict[str, Any]

    def path(self, kind: str = "approvals") -> str:
        return f"/v1/runs/{self.run_id}/{kind}/{self.request['request_id']}"

    async def until(self, done: Any) -> list[dict[str, Any]]:
        return await frames_until(self.ws, done, self.frames)


async def asking(e2e: E2E, turns: list[Turn], *, mode: str = "safe") -> Asking:
    """Start a run scripted with ``turns`` in ``mode`` and wait for its first request."""
    e2e.stub.main.turns = turns
    status, started = await e2e.post_run("Do it.", mode=mode)
    assert status == 202, started
    ws = await e2e.ws(started["run_id"])
    frames = await frames_until(ws, is_asking)
    return Asking(started["run_id"], ws, frames, frames[-1])
