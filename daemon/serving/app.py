"""The aiohttp application: routes, JSON errors, access checks, and the daemon's lifecycle.

``create_app(config)`` is everything a listener needs; ``serving/server.py`` puts it on the Unix
socket (and the optional TCP listener). Every error answer is ``{"error": {"code", "message"}}``;
a bug in a handler becomes a logged 500 in the same shape, never a crashed daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import msgspec
import structlog
from aiohttp import web

import codelegate
from codelegate.daemon import logs
from codelegate.daemon.approvals import Answer, QuestionAnswer, decode_body
from codelegate.daemon.hub import Hub
from codelegate.daemon.metrics import Metrics, render_fanout
from codelegate.daemon.runs import RunManager
from codelegate.daemon.serving.access import check_access
from codelegate.daemon.serving.state import (
    CONFIG,
    HUB,
    METRICS,
    STATE,
    DaemonState,
    int_query,
    manager_of,
)
from codelegate.daemon.serving.streams import run_events, websocket
from codelegate.daemon.steering import decode_input
from codelegate.daemon.store.store import RunStore, StoreError
from codelegate.daemon.subscriber import CLOSE_GOING_AWAY
from codelegate.daemon.supervision.procs import reap_orphans_forever
from codelegate.daemon.supervision.version import cli_version
from codelegate.daemon.tasks import spawn
from codelegate.policy.codes import (
    HTTP_ERROR,
    HTTP_STATUS_CODES,
    INTERNAL_ERROR,
    RUN_FINISHED,
    RUN_NOT_FOUND,
    SHUTTING_DOWN,
)
from codelegate.policy.config import Config
from codelegate.policy.errors import PolicyError
from codelegate.policy.request import decode_run_request, request_body_limit

if TYPE_CHECKING:
    from codelegate.daemon.fanout import Publisher

_log = structlog.get_logger("codelegate.app")

# How far past policy's body bound aiohttp still reads a body: one a little too large gets
# policy's precise 413 (task_too_large, with the task limit) rather than aiohttp's.
_PAST_THE_BODY_BOUND: Final = 64 * 1024
_LIST_LIMIT_MAX: Final = 1000
PRUNE_INTERVAL_S: Final = 3600.0


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
        client_max_size=request_body_limit(config.limits.task_bytes) + _PAST_THE_BODY_BOUND,
        # A waiting caller that hangs up must cancel its run: that needs the handler cancelled.
        handler_args={"handler_cancellation": True},
    )
    app[CONFIG] = config
    app[HUB] = Hub()
    app[METRICS] = Metrics()
    app[STATE] = DaemonState(
        environ=dict(os.environ if environ is None else environ), tcp_token=tcp_token
    )
    run = "/v1/runs/{run_id}"  # one run, and what is below it (README "HTTP API")
    app.add_routes(
        [
            web.post("/v1/runs", post_run),
            web.get("/v1/runs", list_runs),
            web.get(run, get_run),
            web.post(run + "/cancel", cancel_run),
            web.get(run + "/approvals", list_approvals),
            web.post(run + "/approvals/{request_id}", answer_approval),
            web.post(run + "/questions/{request_id}", answer_question),
            web.post(run + "/input", post_input),
            web.get(run + "/events", run_events),
            web.get("/v1/ws", websocket),
            web.get("/healthz", healthz),
            web.get("/metrics", metrics),
        ]
    )
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_close_subscribers)
    return app


# -- lifecycle ---------------------------------------------------------------------------------


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    """Open the store, close runs a previous daemon left running, and undo it all at the end."""
    config, state = app[CONFIG], app[STATE]
    store = await RunStore.open(
        config.store.path,
        max_frames=config.limits.max_stored_frames,
        max_bytes=config.limits.max_stored_bytes,
    )
    reaper = spawn(reap_orphans_forever(), name="orphan-reaper")
    pruner = spawn(_prune_forever(store, config), name="store-pruner")
    try:
        manager = RunManager(config, store, app[HUB], app[METRICS], environ=state.environ)
        interrupted = await manager.recover()
        if interrupted:
            _log.info("runs_interrupted_closed", count=interrupted)
        state.store, state.manager = store, manager
        state.fanout = _start_fanout(config, store, app[HUB])
        state.cli_version = await cli_version(config.claude.path, state.environ)
        yield
        state.stopping = True
        await manager.drain(0)
    finally:
        if state.fanout is not None:  # before the store closes: Redis is filled from there
            await state.fanout.close()
        for task in (reaper, pruner):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await store.close()  # never raises: what a full disk kept it from writing is logged


def _start_fanout(config: Config, store: RunStore, hub: Hub) -> Publisher | None:
    if config.fanout is None:
        return None
    from codelegate.daemon.fanout import (
        start_publisher,  # redis-py only when [fanout] is configured
    )

    return start_publisher(config.fanout, store, hub)


async def _prune_forever(store: RunStore, config: Config) -> None:
    """Apply the retention policy at start-up and then hourly."""
    while True:
        try:
            pruned = await store.prune(config.store.retention_days, config.store.max_runs)
        except StoreError as exc:
            _log.error("store_prune_failed", error=str(exc))
        else:
            if pruned:
                _log.info("store_pruned", runs=pruned)
        await asyncio.sleep(PRUNE_INTERVAL_S)


async def _close_subscribers(app: web.Application) -> None:
    """Stop intake and close every subscriber with GOING_AWAY."""
    app[STATE].stopping = True
    app[HUB].close_all(CLOSE_GOING_AWAY, "daemon shutting down")


# -- middlewares -------------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(refusal: PolicyError) -> web.Response:
    """The one error shape of the API: ``{"error": {"code", "message"}}`` with its status."""
    body = msgspec.json.encode(refusal.to_json())
    return web.Response(status=refusal.status, body=body, content_type="application/json")


def http_refusal(status: int, message: str) -> PolicyError:
    """An error aiohttp answers with ``status`` (routing, body size, an unparsable request)."""
    return PolicyError(HTTP_STATUS_CODES.get(status, HTTP_ERROR), message, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = request.app[METRICS]
    try:
        return await handler(request)
    except PolicyError as exc:
        metrics.http_errors[exc.status] += 1
        if request.method == "POST" and request.path == "/v1/runs":
            metrics.runs_refused[exc.code] += 1  # a run asked for, not a listing refused
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        metrics.http_errors[exc.status] += 1
        return error_response(http_refusal(exc.status, exc.reason))
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as exc:
        metrics.http_errors[500] += 1
        _log.exception("handler_failed", path=request.path, error=repr(exc))
        return error_response(PolicyError(INTERNAL_ERROR, "internal error; see the daemon's log"))


# Any client that reaches a listener can be refused at will: a line per period, with a count.
_refusals = logs.Throttle()


@web.middleware
async def _access(request: web.Request, handler: Handler) -> web.StreamResponse:
    refusal = check_access(request, request.app[CONFIG].server, request.app[STATE].tcp_token)
    if refusal is not None:
        request.app[METRICS].http_errors[refusal.status] += 1
        if count := _refusals.due():
            _log.warning("access_refused", code=refusal.code, path=request.path, count=count)
        return error_response(refusal)
    return await handler(request)


# -- handlers ----------------------------------------------------------------------------------


RUN_ID_HEADER: Final = "X-Codelegate-Run-Id"


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=msgspec.json.encode(obj), content_type="application/json"
    )


async def post_run(request: web.Request) -> web.StreamResponse:
    """``POST /v1/runs``: start a run; 202 at once, or 200 with the result when ``wait``."""
    state = request.app[STATE]
    if state.stopping:
        raise PolicyError(SHUTTING_DOWN, "the daemon is shutting down")
    manager = manager_of(request.app)
    body = await request.read()
    run_request = decode_run_request(body, max_task_bytes=request.app[CONFIG].limits.task_bytes)
    run = await manager.start(run_request)
    if not run_request.wait:
        return _json({"run_id": run.run_id, "status": "running"}, status=202)
    # The status line and the run id go out at once, the body when the run ends: a waiting
    # caller that wants to stop can then cancel by name and still get the cancelled result
    # (with its session id) instead of only hanging up.
    response = web.StreamResponse(headers={RUN_ID_HEADER: run.run_id})
    response.content_type = "application/json"
    try:
        await response.prepare(request)
        await run.done.wait()
    except (asyncio.CancelledError, ConnectionResetError):
        # The caller hung up (or the daemon is stopping): nobody will read this result.
        manager.cancel(run.run_id)
        raise
    await response.write(msgspec.json.encode(run.result))
    await response.write_eof()
    return response


async def get_run(request: web.Request) -> web.Response:
    """``GET /v1/runs/{id}``: state, with the final result once done."""
    manager = manager_of(request.app)
    state = await manager.state(request.match_info["run_id"])
    if state is None:
        raise PolicyError(RUN_NOT_FOUND, "no run with that id")
    return _json(manager.shown(state))


async def list_runs(request: web.Request) -> web.Response:
    """``GET /v1/runs?limit=&before=``: recent runs, newest first, a page bounded in bytes."""
    limit = int_query(request, "limit", 50, 1, _LIST_LIMIT_MAX)
    page = await manager_of(request.app).listing.page(limit, request.query.get("before"))
    return web.Response(body=page, content_type="application/json")


async def cancel_run(request: web.Request) -> web.Response:
    """``POST /v1/runs/{id}/cancel``: 202; the run ends cancelled (409 once already finished)."""
    manager = manager_of(request.app)
    run_id = request.match_info["run_id"]
    if manager.cancel(run_id):
        run = manager.get(run_id)
        # last_seq: every frame after it is one of the closing frames (no late output).
        last_seq = run.record.last_seq if run is not None else 0
        return _json({"run_id": run_id, "status": "cancelling", "last_seq": last_seq}, status=202)
    state = await manager.state(run_id)
    if state is None:
        raise PolicyError(RUN_NOT_FOUND, "no run with that id")
    raise PolicyError(RUN_FINISHED, f"the run already ended: {state.status}")


async def _known(manager: RunManager, run_id: str) -> None:
    if manager.get(run_id) is None and await manager.state(run_id) is None:
        raise PolicyError(RUN_NOT_FOUND, "no run with that id")


async def list_approvals(request: web.Request) -> web.Response:
    """``GET /v1/runs/{id}/approvals``: every request the run asked, and its answer."""
    manager = manager_of(request.app)
    run_id = request.match_info["run_id"]
    await _known(manager, run_id)
    return _json({"run_id": run_id, "approvals": await manager.approvals.listing(run_id)})


async def answer_approval(request: web.Request) -> web.Response:
    """``POST /v1/runs/{id}/approvals/{request_id}``: a person's answer to a permission request."""
    manager = manager_of(request.app)
    run_id, request_id = request.match_info["run_id"], request.match_info["request_id"]
    body = decode_body(await request.read(), Answer)
    await _known(manager, run_id)
    answer = await manager.approvals.answer(run_id, manager.get(run_id), request_id, body)
    return _json(answer)


async def answer_question(request: web.Request) -> web.Response:
    """``POST /v1/runs/{id}/questions/{request_id}``: a person's answer to AskUserQuestion."""
    manager = manager_of(request.app)
    run_id, request_id = request.match_info["run_id"], request.match_info["request_id"]
    body = decode_body(await request.read(), QuestionAnswer)
    await _known(manager, run_id)
    run = manager.get(run_id)
    return _json(await manager.approvals.answer_question(run_id, run, request_id, body))


async def post_input(request: web.Request) -> web.Response:
    """``POST /v1/runs/{id}/input``: a user message for the running CLI (steering); 202."""
    manager = manager_of(request.app)
    run_id = request.match_info["run_id"]
    text = decode_input(await request.read(), max_bytes=request.app[CONFIG].limits.task_bytes)
    await _known(manager, run_id)
    return _json(manager.send_input(run_id, text), status=202)


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: liveness, versions, runs active."""
    state = request.app[STATE]
    manager = state.manager
    return _json(
        {
            "status": "stopping" if state.stopping else "ok",
            "version": codelegate.__version__,
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
        log_lines_dropped=logs.lines_dropped(),
    )
    if state.fanout is not None:
        text += render_fanout(state.fanout.stats, behind=state.fanout.runs_behind)
    return web.Response(
        text=text,
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Prometheus-Format": "0.0.4"},
    )
