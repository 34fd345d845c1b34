"""The HTTP API over the Unix socket: shapes, status codes, refusals that spawn nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from codelegate.daemon import listing as listing_module
from codelegate.daemon.supervision.supervisor import ChildProcess
from codelegate.policy.request import request_body_limit
from tests.daemon.conftest import BASE, Daemon, make_config, running_daemon


class Spawns(list[tuple[str, ...]]):
    """Every argv the daemon spawned; ``changed`` is set at each spawn."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()


@pytest.fixture
def spawns(monkeypatch: pytest.MonkeyPatch) -> Spawns:
    """Every argv the daemon spawns, recorded (the spawn itself still happens)."""
    seen = Spawns()
    real = ChildProcess.spawn

    async def recording(argv: Any, **kw: Any) -> ChildProcess:
        seen.append(tuple(argv))
        seen.changed.set()
        return await real(argv, **kw)

    monkeypatch.setattr(ChildProcess, "spawn", recording)
    return seen


async def spawned(spawns: Spawns, n: int) -> None:
    """Wait (bounded) until ``n`` spawns happened, then check there are exactly ``n``.

    A run spawns from its own task just after POST answers."""
    async with asyncio.timeout(10):
        while len(spawns) < n:
            spawns.changed.clear()
            await spawns.changed.wait()
    assert len(spawns) == n


async def test_healthz(daemon: Daemon) -> None:
    status, body = await daemon.json("GET", "/healthz")
    assert status == 200
    assert body["status"] == "ok"
    assert body["version"]
    assert body["cli_version"] == "2.1.332"
    assert body["runs_active"] == 0


async def test_wait_true_returns_the_final_result(daemon: Daemon, spawns: Spawns) -> None:
    resp = await daemon.post_run("fix the bug", wait=True)
    assert resp.status == 200
    result = await resp.json()
    assert result["provider"] == "claude_code"
    assert result["status"] == "completed"
    # Announced up front, so that a waiting caller can cancel its run by name.
    assert resp.headers["X-Codelegate-Run-Id"] == result["run_id"]
    assert str(uuid.UUID(result["session_id"])) == result["session_id"]
    assert result["resumed"] is False
    assert len(spawns) == 1
    argv = spawns[0]
    assert "--session-id" in argv
    assert argv[argv.index("--session-id") + 1] == result["session_id"]
    assert not any("dangerously" in a or "bypass" in a.lower() for a in argv)
    assert "fix the bug" not in " ".join(argv)  # the prompt goes on stdin

    status, state = await daemon.json("GET", f"/v1/runs/{result['run_id']}")
    assert status == 200
    assert state["status"] == "completed"
    assert state["result"] == result
    assert state["last_seq"] >= 1


async def test_wait_false_answers_202_and_streams_ndjson(daemon: Daemon) -> None:
    resp = await daemon.post_run("fake: normal")
    assert resp.status == 202
    body = await resp.json()
    assert body["status"] == "running"
    frames = await daemon.events(body["run_id"])
    assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
    assert frames[-1]["type"] == "run_result"
    assert {f["run_id"] for f in frames} == {body["run_id"]}
    assert len({f["id"] for f in frames}) == len(frames)
    # after= replays only what follows, and a finished run's stream ends by itself
    tail = await daemon.events(body["run_id"], after=2)
    assert tail == frames[2:]
    assert await daemon.events(body["run_id"], after=len(frames)) == []


async def test_list_runs_newest_first(daemon: Daemon) -> None:
    ids = []
    for _ in range(3):
        resp = await daemon.post_run("hello", wait=True)
        ids.append((await resp.json())["run_id"])
    status, body = await daemon.json("GET", "/v1/runs?limit=2")
    assert status == 200
    assert [r["run_id"] for r in body["runs"]] == ids[::-1][:2]
    status, body = await daemon.json("GET", "/v1/runs?limit=zero")
    assert status == 400
    assert body["error"]["code"] == "bad_request"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "bad_request"),
        (b'{"task": "x", "surprise": 1}', 400, "bad_request"),
        (b'{"task": 5}', 400, "bad_request"),
        (b'{"task": "   "}', 400, "empty_task"),
        (b'{"task": "x", "mode": "auto"}', 403, "mode_not_allowed"),
        (b'{"task": "x", "mode": "bypassPermissions"}', 403, "mode_not_allowed"),
        (b'{"task": "x", "cwd": "/etc"}', 403, "workspace_outside_roots"),
        (b'{"task": "x", "cwd": "../x"}', 403, "workspace_invalid"),
        (b'{"task": "x", "cwd": "missing"}', 403, "workspace_not_directory"),
        (b'{"task": "x", "resume": "not-a-uuid"}', 403, "resume_invalid"),
        (
            b'{"task": "x", "resume": "4f6c1d2e-8a3b-4c5d-9e7f-0a1b2c3d4e5f"}',
            403,
            "resume_unknown",
        ),
        (b'{"task": "x", "model": "opus"}', 403, "model_not_allowed"),
    ],
)
async def test_refusals_spawn_nothing(
    daemon: Daemon, spawns: Spawns, body: bytes, status: int, code: str
) -> None:
    got, answer = await daemon.json("POST", "/v1/runs", data=body)
    assert (got, answer["error"]["code"]) == (status, code)
    assert answer["error"]["message"]
    assert spawns == []
    _, runs = await daemon.json("GET", "/v1/runs")
    assert runs["runs"] == []


async def test_task_too_large_is_413(
    short_dir: Path, workspace: Path, tmp_path: Path, spawns: Spawns
) -> None:
    async with running_daemon(
        make_config(short_dir, workspace, limits={"task_bytes": 1024}), tmp_path
    ) as d:
        status, body = await d.json("POST", "/v1/runs", json={"task": "x" * 2000})
        assert (status, body["error"]["code"]) == (413, "task_too_large")
        # A body just past policy's bound is still read, and refused by policy with the limit;
        # aiohttp stops reading one far past it.
        just_past = b" " * (request_body_limit(1024) + 1)
        status, body = await d.json("POST", "/v1/runs", data=just_past)
        assert (status, body["error"]["code"]) == (413, "task_too_large")
        assert "1024 bytes" in body["error"]["message"]
        status, body = await d.json("POST", "/v1/runs", data=b"x" * (1024 * 1024))
        assert (status, body["error"]["code"]) == (413, "body_too_large")
    assert spawns == []


async def test_capacity_429_and_busy_session_409(
    short_dir: Path, workspace: Path, tmp_path: Path, spawns: Spawns
) -> None:
    config = make_config(short_dir, workspace, policy={"max_concurrent_runs": 1})
    async with running_daemon(config, tmp_path) as d:
        first = await (await d.post_run("hello", wait=True)).json()
        resp = await d.post_run("fake: hang after=init", resume=first["session_id"])
        assert resp.status == 202
        hanging = (await resp.json())["run_id"]
        status, body = await d.json("POST", "/v1/runs", json={"task": "another"})
        assert (status, body["error"]["code"]) == (429, "too_many_runs")
        await spawned(spawns, 2)
        status, _ = await d.json("POST", f"/v1/runs/{hanging}/cancel")
        assert status == 202
        await d.events(hanging)

    config = make_config(short_dir, workspace, policy={"max_concurrent_runs": 2})
    async with running_daemon(config, tmp_path) as d:
        resp = await d.post_run("fake: hang after=init", resume=first["session_id"])
        assert resp.status == 202
        status, body = await d.json(
            "POST", "/v1/runs", json={"task": "x", "resume": first["session_id"]}
        )
        assert (status, body["error"]["code"]) == (409, "session_busy")
        await spawned(spawns, 3)


async def test_resume_passes_resume_and_other_workspace_is_refused(
    daemon: Daemon, spawns: Spawns
) -> None:
    first = await (await daemon.post_run("hello", wait=True)).json()
    resp = await daemon.post_run("again", resume=first["session_id"], wait=True)
    second = await resp.json()
    assert resp.status == 200, second
    assert second["resumed"] is True
    assert second["session_id"] == first["session_id"]
    argv = spawns[-1]
    assert argv[argv.index("--resume") + 1] == first["session_id"]
    assert "--session-id" not in argv
    status, body = await daemon.json(
        "POST", "/v1/runs", json={"task": "x", "cwd": "sub", "resume": first["session_id"]}
    )
    assert (status, body["error"]["code"]) == (403, "resume_other_workspace")
    assert len(spawns) == 2


async def test_unknown_run_and_route_are_json_404(daemon: Daemon) -> None:
    for method, path in [
        ("GET", "/v1/runs/nope"),
        ("POST", "/v1/runs/nope/cancel"),
        ("GET", "/v1/runs/nope/events"),
        ("GET", "/v1/ws?run=nope"),
        ("GET", "/nothing-here"),
    ]:
        status, body = await daemon.json(method, path)
        assert status == 404, (method, path)
        assert body["error"]["code"] in ("run_not_found", "not_found")
    status, body = await daemon.json("DELETE", "/v1/runs")
    assert (status, body["error"]["code"]) == (405, "method_not_allowed")


async def test_cancel_of_a_finished_run_is_409(daemon: Daemon) -> None:
    result = await (await daemon.post_run("hello", wait=True)).json()
    status, body = await daemon.json("POST", f"/v1/runs/{result['run_id']}/cancel")
    assert (status, body["error"]["code"]) == (409, "run_finished")


async def test_a_handler_bug_is_a_json_500(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(self: Any, limit: int, before: str | None) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(listing_module.Listing, "page", broken)
    status, body = await daemon.json("GET", "/v1/runs")
    assert (status, body["error"]["code"]) == (500, "internal_error")
    status, _ = await daemon.json("GET", "/healthz")
    assert status == 200


async def test_metrics_text(daemon: Daemon) -> None:
    await (await daemon.post_run("hello", wait=True)).read()
    async with daemon.http.get(f"{BASE}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    assert 'codelegate_runs_total{status="completed"} 1' in text
    assert "codelegate_run_duration_seconds_count 1" in text
    assert "codelegate_subscribers " in text
    assert "codelegate_subscribers_dropped_total 0" in text


async def test_a_refused_listing_is_not_counted_as_a_refused_run(daemon: Daemon) -> None:
    status, _ = await daemon.json("GET", "/v1/runs?limit=0")
    assert status == 400
    async with await daemon.post_run("x", mode="no-such-mode") as resp:
        code = (await resp.json())["error"]["code"]  # a run refused: counted
    async with daemon.http.get(f"{BASE}/metrics") as resp:
        refused = [line for line in (await resp.text()).splitlines() if "runs_refused" in line]
    assert [line.split("{")[1].split("}")[0] for line in refused if "{" in line] == [
        f'code="{code}"'
    ]


async def test_metrics_count_every_frame_of_every_run_by_type_and_diagnostics_by_code(
    daemon: Daemon,
) -> None:
    produced: Counter[str] = Counter()
    diagnosed: Counter[str] = Counter()
    for task in ("fake: tools n=40", "fake: stderr lines=3", "hello"):
        result = await (await daemon.post_run(task, wait=True)).json()
        for frame in await daemon.events(result["run_id"]):
            produced[frame["type"]] += 1
            if frame["type"] == "diagnostic":
                diagnosed[frame["code"]] += frame.get("count", 1)
    assert diagnosed, "a run said a diagnostic"
    async with daemon.http.get(f"{BASE}/metrics") as resp:
        text = await resp.text()
    counted = {
        name: Counter(
            {
                line.split('"')[1]: int(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(f"codelegate_{name}_total{{")
            }
        )
        for name in ("frames", "diagnostics")
    }
    assert counted == {"frames": produced, "diagnostics": diagnosed}


async def test_concurrent_requests_do_not_exceed_capacity(
    short_dir: Path, workspace: Path, tmp_path: Path, spawns: Spawns
) -> None:
    config = make_config(short_dir, workspace, policy={"max_concurrent_runs": 2})
    async with running_daemon(config, tmp_path) as d:
        answers = await asyncio.gather(
            *(d.json("POST", "/v1/runs", json={"task": "fake: hang"}) for _ in range(6))
        )
        assert sorted(status for status, _ in answers) == [202, 202, 429, 429, 429, 429]
        _, listed = await d.json("GET", "/v1/runs")
        assert [r["status"] for r in listed["runs"]] == ["running", "running"]
        await spawned(spawns, 2)  # the two accepted runs spawn, and only they


async def test_a_cli_that_cannot_start_fails_the_run(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    config = make_config(short_dir, workspace, claude={"path": str(tmp_path / "no-claude")})
    async with running_daemon(config, tmp_path) as d:
        resp = await d.post_run("hello", wait=True)
        assert resp.status == 200
        result = await resp.json()
        assert result["status"] == "failed"
        frames = await d.events(result["run_id"])
        assert frames[-1]["type"] == "run_result"
        _, health = await d.json("GET", "/healthz")
        assert health["runs_active"] == 0
        assert health["cli_version"] is None
