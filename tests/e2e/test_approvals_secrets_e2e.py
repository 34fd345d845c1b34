"""Secrets in a permission request: the CLI gets the input exactly as asked (raw, from memory),
while the frames, the approvals list and the store (WAL too) hold only the redacted copy, and
the daemon's log events none of it; a deny's feedback is stored redacted too. Fresh random
secrets, real CLI."""

from __future__ import annotations

import secrets
import string
from pathlib import Path

import pytest
import structlog

from codelegate.daemon.serving.state import CONFIG
from tests.e2e.approvals import ON, asking
from tests.e2e.conftest import E2E, is_run_result
from tests.stub.anthropic import text, tool

pytestmark = pytest.mark.e2e


def _ghp() -> str:
    return "ghp_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(36))


@pytest.mark.parametrize("daemon_approvals", [ON])
async def test_a_requests_secrets_reach_the_cli_raw_and_nothing_else_unredacted(e2e: E2E) -> None:
    # What the daemon logs, as it logs it (before redaction): it must not log them at all.
    with structlog.testing.capture_logs() as events:
        await _ask_allow_and_deny(e2e, events)


async def _ask_allow_and_deny(e2e: E2E, events: list[dict[str, object]]) -> None:
    key = "sk-ant-api03-" + secrets.token_hex(24)
    told = _ghp()
    first = tool("Write", file_path=e2e.path("n.txt"), content=f"api_key = {key}\n")
    second = tool("Write", file_path=e2e.path("m.txt"), content="no\n")
    a = await asking(e2e, [first, second, text("Done.")])
    status, _ = await e2e.post(a.path(), {"approved": True})
    assert status == 200
    frames = await a.until(lambda f: f["type"] == "approval_needed" and f["id"] != a.request["id"])
    denied = frames[-1]
    path = f"/v1/runs/{a.run_id}/approvals/{denied['request_id']}"
    status, _ = await e2e.post(path, {"approved": False, "feedback": f"not with {told}"})
    assert status == 200
    frames = await a.until(is_run_result)
    await a.ws.close()
    _, listed = await e2e.get(f"/v1/runs/{a.run_id}/approvals")
    assert e2e.handle is not None
    store = Path(e2e.handle.app[CONFIG].store.path)
    await e2e.stop()  # the store flushed and closed: every byte of it is on disk

    # The CLI ran the Write with the input exactly as asked.
    assert (e2e.workspace / "n.txt").read_text() == f"api_key = {key}\n"
    core = key.removeprefix("sk-ant-api03-")
    ghp_core = told.removeprefix("ghp_")
    seen = {
        "frames": repr(frames),
        "approvals list": repr(listed),
        "logs": repr(events),
    }
    for name in (store, Path(f"{store}-wal")):
        if name.exists():
            seen[name.name] = name.read_bytes().decode("latin-1")
    for where, what in seen.items():
        assert core not in what, where
        assert ghp_core not in what, where
    assert "approval_asked" in seen["logs"]  # the daemon's log events were looked at
    assert "store.db-wal" in seen or "store.db" in seen
    assert [r["decision"] for r in listed["approvals"]] == ["allow", "deny"]
    assert "[redacted]" in (listed["approvals"][1]["message"] or "")
