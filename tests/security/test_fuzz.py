"""Hypothesis against the daemon's surface: generated HTTP bodies, query strings, path segments
and WebSocket client messages never produce a 500, an unhandled exception or a dead daemon.

Hypothesis drives synchronous test functions, so the daemon (``start_server``, the real app on a
Unix socket) runs on an event loop in a background thread, and each example submits its client
coroutine to that loop. The CLI is ``true``: any request that passes policy ends at once.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import msgspec
import pytest
import structlog
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from codelegate.daemon.serving.server import ServerHandle, start_server
from tests.daemon.conftest import BASE, child_environ, make_config
from tests.fixtures import short_folder

T = TypeVar("T")
ANSWERS = {200, 202, 400, 403, 404, 405, 409, 413, 429}
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Background:
    """A daemon on its own loop in a thread, and an HTTP client on that loop."""

    def __init__(self, home: Path, state: Path, workspace: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-daemon")
        self.thread.start()
        config = make_config(
            state,
            workspace,
            claude={"path": shutil.which("true") or "/bin/true"},
            policy={"max_concurrent_runs": 64, "run_timeout_s": 5.0},
            limits={"task_bytes": 4096},
        )
        self.handle: ServerHandle = self.run(start_server(config, environ=child_environ(home)))
        self.http: aiohttp.ClientSession = self.run(self._session())
        self.run_id = self.run(self._finished_run())

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _session(self) -> aiohttp.ClientSession:
        assert self.handle.socket_path is not None
        return aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self.handle.socket_path, limit=0),
            timeout=aiohttp.ClientTimeout(total=30),
        )

    async def _finished_run(self) -> str:
        async with self.http.post(f"{BASE}/v1/runs", json={"task": "x", "wait": True}) as resp:
            assert resp.status == 200
            return str((await resp.json())["run_id"])

    def close(self) -> None:
        async def down() -> None:
            await self.http.close()
            await self.handle.close()

        try:
            self.run(down())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture(scope="module")
def bg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Background]:
    base = tmp_path_factory.mktemp("fuzz")
    (base / "ws" / "sub").mkdir(parents=True)
    (base / "home").mkdir()
    with short_folder("clfz-") as short, structlog.testing.capture_logs() as logs:
        daemon = Background(base / "home", short, base / "ws")
        try:
            yield daemon
            # The daemon is still well after everything the examples threw at it.
            status, health = daemon.run(_get_json(daemon, "/healthz"))
            assert status == 200
            assert health["status"] == "ok"
            metrics = daemon.run(_get_text(daemon, "/metrics"))
            assert 'codelegate_http_errors_total{status="500"}' not in metrics
        finally:
            daemon.close()
    # The capture saw the daemon's own lines (its first run's), so no crash could hide from it.
    assert "run_finished" in [e["event"] for e in logs]
    crashes = [e for e in logs if e["event"] in ("handler_failed", "background_task_failed")]
    assert not crashes, crashes[:3]


async def _get_json(bg: Background, path: str) -> tuple[int, Any]:
    async with bg.http.get(f"{BASE}{path}") as resp:
        return resp.status, await resp.json()


async def _get_text(bg: Background, path: str) -> str:
    async with bg.http.get(f"{BASE}{path}") as resp:
        return await resp.text()


def check_answer(status: int, body: bytes, what: object) -> None:
    event(f"HTTP {status}")
    assert status in ANSWERS, (status, body[:300], what)
    if status >= 400:
        error = json.loads(body)["error"]
        assert isinstance(error["code"], str)
        assert error["code"] != "internal_error"
        assert isinstance(error["message"], str)


# -- strategies ------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
paths = st.sampled_from(
    [".", "sub", "..", "/", "/etc", "/proc/self/cwd", "sub/../..", "sub\x00", "", "~"]
) | st.text(max_size=60)
modes = st.sampled_from(
    ["safe", "accept_edits", "auto", "plan", "bypassPermissions", ""]
) | st.text(max_size=20)
request_bodies = st.fixed_dictionaries(
    {},
    optional={
        "task": st.text(max_size=300) | json_values,
        "cwd": paths | json_values,
        "mode": modes | json_values,
        "resume": st.uuids().map(str) | st.text(max_size=60) | json_values,
        "model": st.text(max_size=30) | json_values,
        "max_budget_usd": st.floats() | json_values,
        "parent": st.fixed_dictionaries(
            {}, optional={"tool_call_id": st.text(max_size=40), "session_id": json_values}
        )
        | json_values,
        "wait": st.booleans() | json_values,
        "extra": json_values,
    },
)


# Well-typed requests, so that examples get past decoding into policy and the run manager.
typed_bodies = st.fixed_dictionaries(
    {"task": st.text(min_size=1, max_size=300)},
    optional={
        "cwd": paths,
        "mode": modes,
        "resume": st.uuids().map(str) | st.text(max_size=40),
        "model": st.text(max_size=30),
        "max_budget_usd": st.floats(min_value=0.01, max_value=1e7),
        "parent": st.fixed_dictionaries(
            {"tool_call_id": st.from_regex(r"[A-Za-z0-9._:-]{1,40}", fullmatch=True) | st.text()},
            optional={"session_id": st.text(max_size=40)},
        ),
        "wait": st.booleans(),
    },
)


def _encode(body: Any) -> bytes:
    return json.dumps(body, allow_nan=True).encode()


bodies = (
    typed_bodies.map(_encode)
    | typed_bodies.map(_encode)
    | request_bodies.map(_encode)
    | json_values.map(_encode)
    | st.binary(max_size=600)
    | st.text(max_size=300).map(str.encode)
)


async def _post_runs(bg: Background, body: bytes, content_type: str) -> tuple[int, bytes]:
    headers = {"Content-Type": content_type}
    async with bg.http.post(f"{BASE}/v1/runs", data=body, headers=headers) as resp:
        return resp.status, await resp.read()


@FUZZ
@given(
    body=bodies,
    content_type=st.sampled_from(
        ["application/json", "text/plain", "application/x-www-form-urlencoded", ""]
    ),
)
def test_generated_request_bodies_never_500(bg: Background, body: bytes, content_type: str) -> None:
    status, answer = bg.run(_post_runs(bg, body, content_type))
    check_answer(status, answer, body[:200])


texts = (
    st.text(max_size=40)
    | st.integers().map(str)
    | st.sampled_from(["-1", "1e3", "0x10", " 5", "∞"])
)


async def _request(bg: Background, method: str, url: str) -> tuple[int, bytes]:
    async with bg.http.request(method, url) as resp:
        return resp.status, await resp.read()


@FUZZ
@given(
    route=st.sampled_from(["runs", "run", "events", "cancel", "ws", "list"]),
    run=st.none() | texts,
    value=texts,
    key=st.sampled_from(["limit", "after", "run"]) | st.text(max_size=10),
)
def test_generated_paths_and_query_strings_never_500(
    bg: Background, route: str, run: str | None, value: str, key: str
) -> None:
    rid = quote(bg.run_id if run is None else run, safe="") or "x"
    query = f"?{quote(key, safe='')}={quote(value, safe='')}"
    method, path = {
        "runs": ("GET", "/v1/runs"),
        "list": ("GET", "/v1/runs"),
        "run": ("GET", f"/v1/runs/{rid}"),
        "events": ("GET", f"/v1/runs/{rid}/events"),
        "cancel": ("POST", f"/v1/runs/{rid}/cancel"),
        "ws": ("GET", "/v1/ws"),  # without an upgrade
    }[route]
    status, answer = bg.run(_request(bg, method, BASE + path + query))
    if route == "events" and status == 200:
        for line in answer.splitlines():
            msgspec.json.decode(line)
        return
    check_answer(status, answer, (method, path, query))


ws_messages = (
    st.text(max_size=400)
    | st.fixed_dictionaries(
        {"type": st.sampled_from(["subscribe", "unsubscribe", "hello", ""]) | json_values},
        optional={"run": st.sampled_from(["*", "RUN"]) | json_values, "after": json_values},
    ).map(json.dumps)
    | json_values.map(json.dumps)
    | st.binary(max_size=200)
)


async def _ws_session(bg: Background, query: str, messages: list[str | bytes]) -> list[Any]:
    """Send ``messages``, then a known subscribe; every answer until its ack (decoded)."""
    answers: list[Any] = []
    async with bg.http.ws_connect(f"{BASE}/v1/ws{query}") as ws:
        for message in messages:
            if isinstance(message, bytes):
                await ws.send_bytes(message)
            else:
                await ws.send_str(message.replace('"RUN"', json.dumps(bg.run_id)))
        await ws.send_str(json.dumps({"type": "subscribe", "run": bg.run_id, "after": 10**9}))
        while True:
            msg = await ws.receive(timeout=20)
            assert msg.type == aiohttp.WSMsgType.TEXT, (msg, messages)
            answer = json.loads(msg.data)
            answers.append(answer)
            if answer.get("type") == "subscribed" and answer.get("run") == bg.run_id:
                return answers


@FUZZ
@given(
    query=st.sampled_from(["", "?run=*", "?run=RUN", "?run=RUN&after=3"]),
    messages=st.lists(ws_messages, min_size=1, max_size=5),
)
def test_generated_websocket_messages_never_break_the_connection(
    bg: Background, query: str, messages: list[str | bytes]
) -> None:
    answers = bg.run(_ws_session(bg, query.replace("RUN", bg.run_id), messages))
    for answer in answers:
        if answer.get("type") == "error":
            assert answer["error"]["code"] != "internal_error"


def test_an_oversized_websocket_message_closes_only_that_connection(bg: Background) -> None:
    async def go() -> int | None:
        async with bg.http.ws_connect(f"{BASE}/v1/ws") as ws:
            await ws.send_str("x" * (64 * 1024 + 1))  # one byte over the limit
            msg = await ws.receive(timeout=20)
            assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            return ws.close_code

    assert bg.run(go()) == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
    status, health = bg.run(_get_json(bg, "/healthz"))
    assert (status, health["status"]) == (200, "ok")
