"""Refused requests spawn nothing: workspace escapes, resume forgeries, modes outside policy,
models and budgets outside policy, oversized or malformed requests.

The daemon's CLI is a spy that writes a line for every start, so "spawns nothing" is checked
directly, not inferred from the answer.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from codelegate.daemon.supervision.supervisor import ChildProcess
from tests.daemon.conftest import Daemon
from tests.fakes.spy import Spy
from tests.polling import until

REFUSED = {400, 403, 404, 409, 413, 429}


async def refused(d: Daemon, spy: Spy, body: dict[str, Any] | bytes) -> dict[str, Any]:
    """POST ``body``; assert a JSON error answer and that the spy did not start."""
    before = len(spy.starts)
    if isinstance(body, bytes):
        resp = await d.http.post("http://codelegate/v1/runs", data=body)
    else:
        resp = await d.http.post("http://codelegate/v1/runs", json=body)
    answer = await resp.json()
    assert resp.status in REFUSED, (resp.status, answer, body if isinstance(body, dict) else "")
    assert set(answer) == {"error"}
    assert answer["error"]["code"]
    assert answer["error"]["message"]
    assert len(spy.starts) == before, f"a refused request spawned the CLI: {body!r:.200}"
    return dict(answer["error"])


async def started(d: Daemon, spy: Spy, body: dict[str, Any]) -> dict[str, Any]:
    before = len(spy.starts)
    resp = await d.http.post("http://codelegate/v1/runs", json={"wait": True, **body})
    answer = await resp.json()
    assert resp.status == 200, answer
    assert len(spy.starts) == before + 1
    return dict(answer)


def escapes(ws: Path, tmp: Path) -> list[str]:
    """cwd values that must never become a run's working directory."""
    outside = tmp / "outside"
    outside.mkdir(exist_ok=True)
    sibling = Path(str(ws) + "evil")  # shares the root's prefix, is not inside it
    sibling.mkdir(exist_ok=True)
    (ws / "link-out").symlink_to(outside)
    (ws / "sub" / "link-up").symlink_to("../..")
    (ws / "file.txt").write_text("not a directory\n")
    return [
        "..",
        "../..",
        "sub/../..",
        "./../ws",  # the parent then back in: only the textual form differs, still ".." first
        str(ws) + "/..",
        str(sibling),
        str(ws) + "/../" + sibling.name,
        "link-out",
        str(ws / "link-out"),
        "sub/link-up",
        "sub/link-up/outside",
        "/proc/self/cwd",
        "/proc/self/cwd/..",
        f"/proc/{os.getpid()}/root/etc",
        "/proc/self/root" + str(outside),
        "/etc",
        "//etc",
        "/",
        "sub\x00",
        "sub\x00/../..",
        "\x00",
        "~",
        "~root",
        "file.txt",
        "does-not-exist",
        "sub/" + "a" * 5000,
    ]


async def test_workspace_escapes_are_refused_and_spawn_nothing(
    sdaemon: Daemon, spy: Spy, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    ws = roots[0]
    for cwd in escapes(ws, tmp_path):
        await refused(sdaemon, spy, {"task": "look around", "cwd": cwd})
    # The spy itself works: a request inside the roots starts it exactly once.
    result = await started(sdaemon, spy, {"task": "fine", "cwd": "sub"})
    assert result["status"] == "completed"
    assert spy.starts[-1].split(" ", 1)[1] == str(ws / "sub")


async def test_a_workspace_swapped_for_a_symlink_after_the_check_spawns_nothing(
    sdaemon: Daemon,
    spy: Spy,
    roots: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ws = roots[0]
    outside = tmp_path / "outside"
    outside.mkdir()
    real_spawn = ChildProcess.spawn

    async def swap_then_spawn(*args: Any, **kwargs: Any) -> ChildProcess:
        # Policy has resolved and checked <ws>/sub; now it becomes a link to a folder outside.
        (ws / "sub").rename(ws / "sub.was")
        (ws / "sub").symlink_to(outside)
        return await real_spawn(*args, **kwargs)

    monkeypatch.setattr(ChildProcess, "spawn", swap_then_spawn)
    resp = await sdaemon.http.post(
        "http://codelegate/v1/runs", json={"task": "look", "cwd": "sub", "wait": True}
    )
    answer = await resp.json()
    assert answer["status"] == "failed", answer
    assert "changed since it was checked" in answer["stderr"], answer
    assert spy.starts == []


async def test_resume_forgeries_are_refused_and_spawn_nothing(
    sdaemon: Daemon, spy: Spy, roots: tuple[Path, Path]
) -> None:
    ws, other = roots
    issued = (await started(sdaemon, spy, {"task": "first", "cwd": str(ws)}))["session_id"]
    assert str(uuid.UUID(issued)) == issued
    forgeries = [
        str(uuid.uuid4()),  # well-formed, never issued
        issued.upper(),
        "{" + issued + "}",
        "urn:uuid:" + issued,
        issued.replace("-", ""),
        " " + issued,
        issued + "\n",
        issued[:-1],
        issued[:8],
        issued + "0",
        "' OR 1=1 --",
        "../" + issued,
        "",
    ]
    for forged in forgeries:
        await refused(sdaemon, spy, {"task": "again", "cwd": str(ws), "resume": forged})
    # The real id, but from another workspace root: refused too.
    error = await refused(sdaemon, spy, {"task": "again", "cwd": str(other), "resume": issued})
    assert error["code"].startswith("resume")
    # And the real one in its own workspace is accepted (the refusals were not blanket).
    again = await started(sdaemon, spy, {"task": "again", "cwd": str(ws), "resume": issued})
    assert again["session_id"] == issued
    assert again["resumed"] is True


async def test_a_running_session_cannot_be_resumed_twice(sdaemon: Daemon, spy: Spy) -> None:
    issued = (await started(sdaemon, spy, {"task": "first"}))["session_id"]
    resp = await sdaemon.post_run("fake: hang", resume=issued)
    assert resp.status == 202
    run_id = (await resp.json())["run_id"]
    await until(lambda: len(spy.starts) == 2, what="the resumed run started")
    error = await refused(sdaemon, spy, {"task": "second", "resume": issued})
    assert error["code"] == "session_busy"
    status, _ = await sdaemon.json("POST", f"/v1/runs/{run_id}/cancel")
    assert status == 202


@pytest.mark.parametrize(
    "mode",
    [
        "auto",  # valid, but not enabled by the operator
        "bypassPermissions",
        "bypass_permissions",
        "dangerously-skip-permissions",
        "--dangerously-skip-permissions",
        "full_access",
        "acceptEdits",  # the CLI's vocabulary, not the request's
        "manual",
        "SAFE",
        "safe ",
        "",
        "plan\x00bypassPermissions",
    ],
)
async def test_modes_outside_policy_are_refused(sdaemon: Daemon, spy: Spy, mode: str) -> None:
    await refused(sdaemon, spy, {"task": "do it", "mode": mode})


@pytest.mark.parametrize(
    "body",
    [
        {"task": "x" * 1025},  # over [limits] task_bytes = 1024
        {"task": "é" * 600},  # 1200 bytes of UTF-8, 600 characters
        {"task": "x", "model": "claude-anything"},  # no models allowed by this config
        {"task": "x", "max_budget_usd": -1},
        {"task": "x", "max_budget_usd": 0},
        {"task": "x", "max_budget_usd": 1e308},
        {"task": "x", "parent": {"tool_call_id": "bad id with spaces"}},
        {"task": "x", "parent": {"tool_call_id": "../../etc/passwd"}},
        {"task": "x", "parent": {"tool_call_id": "a" * 513}},
        {"task": "x", "parent": {"tool_call_id": ""}},
        {"task": "x", "dangerously_skip_permissions": True},  # unknown fields are errors
        {"task": "x", "permission_mode": "bypassPermissions"},
        {"task": "x", "env": {"LD_PRELOAD": "/tmp/evil.so"}},
        {"task": "x", "argv": ["--dangerously-skip-permissions"]},
        {"task": 1},
        {"task": None},
        {"task": ["x"]},
        {"cwd": "."},
        {},
    ],
    ids=lambda b: repr(b)[:60],
)
async def test_malformed_and_outside_policy_requests_spawn_nothing(
    sdaemon: Daemon, spy: Spy, body: dict[str, Any]
) -> None:
    await refused(sdaemon, spy, body)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"null",
        b"[]",
        b'"task"',
        b"{",
        b'{"task": "x"',
        b'{"task": "x"}{"task": "y"}',
        b'{"task": "x", "task": "y", "mode": "auto"}',
        b"\xff\xfe{\x00",
        b'{"task": "\\ud800"}',
        b'{"task": "x", "cwd": "\\u0000"}',
        b" " * 200_000,  # over the body bound: aiohttp's own 413, still JSON
        b'{"task": "' + b"x" * 300_000 + b'"}',
    ],
    ids=lambda r: repr(r)[:40],
)
async def test_garbage_bodies_are_refused_and_spawn_nothing(
    sdaemon: Daemon, spy: Spy, raw: bytes
) -> None:
    await refused(sdaemon, spy, raw)
