"""The approval routes' refusals: bad bodies, unknown runs and requests, finished runs; over HTTP
and over the WebSocket (no prompt needed: the fake CLI asks nothing)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.daemon.conftest import Daemon, frames_until_result, next_frame


async def finished_run(daemon: Daemon) -> str:
    async with await daemon.post_run("fake: normal", wait=False) as resp:
        run_id = str((await resp.json())["run_id"])
    await daemon.events(run_id)  # to its end
    return run_id


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"approved": "yes"},
        {"approved": True, "scope": "forever"},
        {"approved": False, "mode": "reject_loudly"},
        {"approved": True, "extra": 1},
        {"approved": False, "feedback": "x" * 4001},
    ],
)
async def test_an_answer_body_that_is_not_one_is_refused_400(daemon: Daemon, body: Any) -> None:
    run_id = await finished_run(daemon)
    status, answer = await daemon.json("POST", f"/v1/runs/{run_id}/approvals/{run_id}:1", json=body)
    assert (status, answer["error"]["code"]) == (400, "bad_request")


async def test_unknown_runs_and_requests_are_404_and_a_runs_list_starts_empty(
    daemon: Daemon,
) -> None:
    status, answer = await daemon.json("POST", "/v1/runs/nope/approvals/nope:1", json={})
    assert (status, answer["error"]["code"]) == (400, "bad_request")  # the body is read first
    for route, body in (("approvals", {"approved": True}), ("questions", {"answer": "x"})):
        status, answer = await daemon.json("POST", f"/v1/runs/nope/{route}/nope:1", json=body)
        assert (status, answer["error"]["code"]) == (404, "run_not_found")
    status, answer = await daemon.json("GET", "/v1/runs/nope/approvals")
    assert (status, answer["error"]["code"]) == (404, "run_not_found")

    run_id = await finished_run(daemon)
    for route, body in (("approvals", {"approved": True}), ("questions", {"answer": "x"})):
        status, answer = await daemon.json("POST", f"/v1/runs/{run_id}/{route}/x", json=body)
        assert (status, answer["error"]["code"]) == (404, "approval_not_found")
    status, listed = await daemon.json("GET", f"/v1/runs/{run_id}/approvals")
    assert (status, listed) == (200, {"run_id": run_id, "approvals": []})
    status, state = await daemon.json("GET", f"/v1/runs/{run_id}")
    assert state["pending_approvals"] == []


async def test_input_for_a_finished_run_is_409_and_a_bad_input_body_400(daemon: Daemon) -> None:
    run_id = await finished_run(daemon)
    status, answer = await daemon.json("POST", f"/v1/runs/{run_id}/input", json={"text": "hi"})
    assert (status, answer["error"]["code"]) == (409, "run_finished")
    status, answer = await daemon.json("POST", f"/v1/runs/{run_id}/input", data=b"not json")
    assert (status, answer["error"]["code"]) == (400, "bad_request")


async def test_websocket_answers_are_refused_with_the_http_codes(daemon: Daemon) -> None:
    run_id = await finished_run(daemon)
    async with daemon.ws(f"?run={run_id}") as ws:
        await frames_until_result(ws)
        await ws.send_json({"type": "APPROVAL_RESPONSE", "request_id": "nope:3", "approved": True})
        assert (await next_frame(ws))["error"]["code"] == "run_not_found"
        await ws.send_json({"type": "ASK_USER_RESPONSE", "request_id": f"{run_id}:2"})
        assert (await next_frame(ws))["error"]["code"] == "approval_not_found"
        await ws.send_json({"type": "APPROVAL_RESPONSE", "request_id": f"{run_id}:2"})
        assert (await next_frame(ws))["error"]["code"] == "bad_message"  # approved is required
        # The connection stays usable.
        await ws.send_json({"type": "subscribe", "run": run_id, "after": 0})
        frames = await frames_until_result(ws)
        assert frames[-1]["type"] == "run_result"
