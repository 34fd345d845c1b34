"""The aiohttp application: routes, JSON errors, access checks, and the daemon's lifecycle.

``create_app(config)`` is everything a listener needs; ``daemon/server.py`` puts it on the Unix
socket (and the optional TCP listener). Every error answer is ``{"error": {"code", "message"}}``;
a bug in a handler becomes a logged 500 in the same shape, never a crashed daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import structlog
from aiohttp import WSMsgType, web

import daemon
from daemon.access import check_access
from daemon.hub import CLOSE_GOING_AWAY, Delivery, Hub, Subscriber
from daemon.metrics import Metrics
from daemon.runs import Refused, RunManager
from daemon.store import RunStore
from daemon.supervisor import reap_orphans_forever
from daemon.tasks import spawn
from policy.config import Config
from policy.errors import PolicyError
from policy.request import decode_run_request

_log = structlog.get_logger("codelegate.app")

# Above policy's own body bound (task limit x JSON escaping + room), so that policy, not aiohttp,
# answers an oversized task with its precise 413.
_BODY_OVERHEAD: Final = 128 * 1024
_BODY_FACTOR: Final = 6
_WS_MAX_MESSAGE: Final = 64 * 1024
_LIST_LIMIT_MAX: Final = 1000


@dataclass
class DaemonState:
    """Mutable state the app shares across handlers (the app itself is frozen once started)."""

    environ: Mapping[str, str]
    tcp_token: bytes | None = None
    stopping: bool = False
    cli_version: str | None = None
    manager: RunManager | None = None
    store: RunStore | None = None
    websockets: set[web.WebSocketResponse] = field(default_factory=set)


CONFIG: Final = web.AppKey("config", Config)
HUB: Final = web.AppKey("hub", Hub)
METRICS: Final = web.AppKey("metrics", Metrics)
STATE: Final = web.AppKey("state", DaemonState)


def create_app(
    config: Config,
    *,
    environ: Mapping[str, str] | None = None,
    tcp_token: bytes | None = None,
) -> web.Application:
    """The daemon's web application; the store opens and runs recover when it starts.

    ``environ`` is what child environments are built from (default: the daemon's own);
    ``tcp_token`` is the bearer token TCP requests must present (None refuses TCP requests).
    """
    app = web.Application(
        middlewares=[_errors, _access],
        client_max_size=config.limits.task_bytes * _BODY_FACTOR + _BODY_OVERHEAD,
        # A waiting caller that hangs up must cancel its run: that needs the handler cancelled.
        handler_args={"handler_cancellation": True},
    )
    app[CONFIG] = config
    app[HUB] = Hub()
    app[METRICS] = Metrics()
    app[STATE] = DaemonState(
        environ=dict(os.environ if environ is None else environ), tcp_token=tcp_token
    )
    app.add_routes(
        [
            web.post("/v1/runs", post_run),
            web.get("/v1/runs", list_runs),
            web.get("/v1/runs/{run_id}", get_run),
            web.post("/v1/runs/{run_id}/cancel", cancel_run),
            web.get("/v1/runs/{run_id}/events", run_events),
            web.get("/v1/ws", websocket),
            web.get("/healthz", healthz),
            web.get("/metrics", metrics),
        ]
    )
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_close_subscribers)
    return app


def manager_of(app: web.Application) -> RunManager:
    """The app's run manager (available while the app runs)."""
    manager = app[STATE].manager
    if manager is None:
        raise web.HTTPServiceUnavailable(reason="the daemon is starting")
    return manager


# -- lifecycle ---------------------------------------------------------------------------------


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    """Open the store, close runs a previous daemon left running, and undo it all at the end."""
    config, state = app[CONFIG], app[STATE]
    store_dir = os.path.dirname(config.store.path)
    if store_dir:
        os.makedirs(store_dir, exist_ok=True)
    store = await RunStore.open(config.store.path)
    reaper = spawn(reap_orphans_forever(), name="orphan-reaper")
    try:
        await store.prune(config.store.retention_days, config.store.max_runs)
        manager = RunManager(config, store, app[HUB], app[METRICS], environ=state.environ)
        interrupted = await manager.recover()
        if interrupted:
            _log.info("runs_interrupted_closed", count=interrupted)
        state.store, state.manager = store, manager
        state.cli_version = await _cli_version(config.claude.path, state.environ)
        yield
        state.stopping = True
        await manager.drain(0)
    finally:
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper
        await store.flush()
        await store.close()


async def _cli_version(path: str, environ: Mapping[str, str]) -> str | None:
    """``claude --version``, for /healthz and the logs; None when the CLI does not answer."""
    env = {k: v for k, v in environ.items() if k in ("PATH", "HOME", "LANG")}
    try:
        proc = await asyncio.create_subprocess_exec(
            path,
            "--version",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=env,
        )
    except OSError:
        return None
    try:
        async with asyncio.timeout(15):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None
    text = out.decode("utf-8", "replace").strip()
    return text.split()[0] if proc.returncode == 0 and text else None


async def _close_subscribers(app: web.Application) -> None:
    """Stop intake and close every subscriber with GOING_AWAY."""
    app[STATE].stopping = True
    app[HUB].close_all(CLOSE_GOING_AWAY, "daemon shutting down")


# -- middlewares -------------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, code: str, message: str) -> web.Response:
    """The one error shape of the API."""
    body = msgspec.json.encode({"error": {"code": code, "message": message}})
    return web.Response(status=status, body=body, content_type="application/json")


_HTTP_CODES: Final = {
    400: "bad_request",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    503: "unavailable",
}


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = request.app[METRICS]
    try:
        return await handler(request)
    except (PolicyError, Refused) as exc:
        metrics.http_errors[exc.status] += 1
        if request.path == "/v1/runs":
            metrics.runs_refused[exc.code] += 1
        return error_response(exc.status, exc.code, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        metrics.http_errors[exc.status] += 1
        code = _HTTP_CODES.get(exc.status, "http_error")
        return error_response(exc.status, code, exc.reason)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as exc:
        metrics.http_errors[500] += 1
        _log.exception("handler_failed", path=request.path, error=repr(exc))
        return error_response(500, "internal_error", "internal error; see the daemon's log")


@web.middleware
async def _access(request: web.Request, handler: Handler) -> web.StreamResponse:
    refusal = check_access(request, request.app[CONFIG].server, request.app[STATE].tcp_token)
    if refusal is not None:
        request.app[METRICS].http_errors[refusal[0]] += 1
        return error_response(*refusal)
    return await handler(request)


# -- handlers ----------------------------------------------------------------------------------


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=msgspec.json.encode(obj), content_type="application/json"
    )


def _int_query(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise PolicyError(400, "bad_request", f"{name} must be an integer") from None
    if not lo <= value <= hi:
        raise PolicyError(400, "bad_request", f"{name} must be between {lo} and {hi}")
    return value


async def post_run(request: web.Request) -> web.Response:
    """``POST /v1/runs``: start a run; 202 at once, or 200 with the result when ``wait``."""
    state = request.app[STATE]
    if state.stopping:
        raise PolicyError(503, "shutting_down", "the daemon is shutting down")
    manager = manager_of(request.app)
    body = await request.read()
    run_request = decode_run_request(body, max_task_bytes=request.app[CONFIG].limits.task_bytes)
    run = await manager.start(run_request)
    if not run_request.wait:
        return _json({"run_id": run.run_id, "status": "running"}, status=202)
    try:
        await run.done.wait()
    except asyncio.CancelledError:
        # The caller hung up (or the daemon is stopping): nobody will read this result.
        manager.cancel(run.run_id)
        raise
    return web.Response(body=msgspec.json.encode(run.result), content_type="application/json")


async def get_run(request: web.Request) -> web.Response:
    """``GET /v1/runs/{id}``: state, with the final result once done."""
    state = await manager_of(request.app).state(request.match_info["run_id"])
    if state is None:
        raise PolicyError(404, "run_not_found", "no run with that id")
    return _json(state)


async def list_runs(request: web.Request) -> web.Response:
    """``GET /v1/runs?limit=``: recent runs, newest first."""
    limit = _int_query(request, "limit", 50, 1, _LIST_LIMIT_MAX)
    return _json({"runs": await manager_of(request.app).recent(limit)})


async def cancel_run(request: web.Request) -> web.Response:
    """``POST /v1/runs/{id}/cancel``: 202; the run ends cancelled (409 once already finished)."""
    manager = manager_of(request.app)
    run_id = request.match_info["run_id"]
    if manager.cancel(run_id):
        run = manager.get(run_id)
        # last_seq: every frame after it is one of the closing frames (no late output).
        last_seq = run.last_seq if run is not None else 0
        return _json({"run_id": run_id, "status": "cancelling", "last_seq": last_seq}, status=202)
    state = await manager.state(run_id)
    if state is None:
        raise PolicyError(404, "run_not_found", "no run with that id")
    raise PolicyError(409, "run_finished", f"the run already ended: {state['status']}")


async def run_events(request: web.Request) -> web.StreamResponse:
    """``GET /v1/runs/{id}/events?after=``: NDJSON replay, then live, ending after run_result."""
    manager = manager_of(request.app)
    config = request.app[CONFIG]
    run_id = request.match_info["run_id"]
    after = _int_query(request, "after", 0, 0, 2**53)
    sub = Subscriber(max_queue=config.limits.subscriber_queue, name=f"ndjson:{run_id}")
    hub = request.app[HUB]
    hub.attach(sub)
    try:
        kind = await manager.subscribe(sub, run_id, after)
        if kind == "unknown":
            raise PolicyError(404, "run_not_found", "no run with that id")
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionResetError):
            await _stream_ndjson(response, sub, finished=kind == "finished")
            await response.write_eof()
        return response
    finally:
        hub.detach(sub)


async def _stream_ndjson(response: web.StreamResponse, sub: Subscriber, *, finished: bool) -> None:
    if finished:  # the whole replay is queued already and nothing live will follow
        items = sub.take()
        await response.write(b"".join(i.data + b"\n" for i in items if isinstance(i, Delivery)))
        return
    while items := await sub.get():
        frames = [item for item in items if isinstance(item, Delivery)]
        await response.write(b"".join(d.data + b"\n" for d in frames))
        if finished or any(d.last for d in frames):
            return
    # Closed: lagging or shutting down. The stream just ends; the client resumes with after=.


class _Subscribe(msgspec.Struct, tag="subscribe", forbid_unknown_fields=True):
    run: str
    after: int = 0


class _Unsubscribe(msgspec.Struct, tag="unsubscribe", forbid_unknown_fields=True):
    run: str


_control_decoder: Final = msgspec.json.Decoder(_Subscribe | _Unsubscribe)


def _control_error(code: str, message: str) -> bytes:
    return msgspec.json.encode({"type": "error", "error": {"code": code, "message": message}})


async def websocket(request: web.Request) -> web.StreamResponse:
    """``GET /v1/ws?run=<id|*>&after=``: frames over WebSocket; subscribe/unsubscribe messages."""
    manager = manager_of(request.app)
    hub, state = request.app[HUB], request.app[STATE]
    config = request.app[CONFIG]
    if state.stopping:
        raise PolicyError(503, "shutting_down", "the daemon is shutting down")
    after = _int_query(request, "after", 0, 0, 2**53)
    sub = Subscriber(max_queue=config.limits.subscriber_queue, name="ws")
    hub.attach(sub)
    try:
        # Subscribe before the handshake answers: a client that connects and then starts a run
        # cannot miss its first frames, and an unknown run is still a plain 404.
        run_id = request.query.get("run")
        if run_id == "*":
            manager.follow_all(sub, after)
        elif run_id and await manager.subscribe(sub, run_id, after) == "unknown":
            raise PolicyError(404, "run_not_found", "no run with that id")
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=_WS_MAX_MESSAGE)
        await ws.prepare(request)
    except BaseException:
        hub.detach(sub)
        raise
    request.app[METRICS].ws_connections += 1
    state.websockets.add(ws)
    writer = spawn(_ws_writer(ws, sub), name="ws-writer")
    try:
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await _ws_control(manager, hub, sub, msg.data)
            elif msg.type == WSMsgType.BINARY:
                sub.control(_control_error("bad_message", "send JSON text messages"))
    finally:
        hub.detach(sub)
        state.websockets.discard(ws)
        if not sub.closed:
            sub.close(1000, "")
        with contextlib.suppress(asyncio.CancelledError, ConnectionResetError):
            await asyncio.wait_for(writer, 5.0)
    return ws


async def _ws_control(manager: RunManager, hub: Hub, sub: Subscriber, data: str) -> None:
    try:
        message = _control_decoder.decode(data)
    except msgspec.DecodeError as exc:
        sub.control(_control_error("bad_message", str(exc)[:200]))
        return
    if isinstance(message, _Unsubscribe):
        hub.unsubscribe(sub, message.run)
        return
    if message.after < 0:
        sub.control(_control_error("bad_message", "after must be >= 0"))
        return
    if message.run == "*":
        hub.unsubscribe(sub, "*")
        manager.follow_all(sub, message.after)
    else:
        hub.unsubscribe(sub, message.run)
        if await manager.subscribe(sub, message.run, message.after) == "unknown":
            sub.control(_control_error("run_not_found", "no run with that id"))
            return
    sub.control(msgspec.json.encode({"type": "subscribed", "run": message.run}))


async def _ws_writer(ws: web.WebSocketResponse, sub: Subscriber) -> None:
    """This client's own writer: a slow client only ever waits here, never in the run."""
    try:
        while items := await sub.get():
            for item in items:
                await ws.send_frame(item if isinstance(item, bytes) else item.data, WSMsgType.TEXT)
    except ConnectionResetError:
        return
    if sub.close_code and sub.close_code != 1000 and not ws.closed:
        await ws.close(code=sub.close_code, message=sub.close_reason.encode())


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: liveness, versions, runs active."""
    state = request.app[STATE]
    manager = state.manager
    return _json(
        {
            "status": "stopping" if state.stopping else "ok",
            "version": daemon.__version__,
            "cli_version": state.cli_version,
            "runs_active": manager.active_count if manager is not None else 0,
            "subscribers": request.app[HUB].subscriber_count,
        }
    )


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text format."""
    hub, state = request.app[HUB], request.app[STATE]
    text = request.app[METRICS].render(
        runs_active=state.manager.active_count if state.manager is not None else 0,
        subscribers=hub.subscriber_count,
        frames_published=hub.stats.frames_published,
        frames_queued=hub.stats.frames_queued,
        subscribers_dropped=hub.stats.subscribers_dropped,
    )
    return web.Response(
        text=text,
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Prometheus-Format": "0.0.4"},
    )
