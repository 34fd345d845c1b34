"""A ConnectOnion on which the tool cannot close a request: the one private name it uses
(``InterruptibleIO``'s ``__io``) is missing, or the ``answer_request`` found there will not take
the closing answer. The tool must still work, as ConnectOnion's own tools wait, and say why."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

from codelegate.daemon.clients import tool_wait
from tests.connectonion.conftest import Loop
from tests.connectonion.test_approvals import (
    asking,
    decisions,
    ended,
    envelope_of,
    is_approval,
    late_answer,
    script,
)
from tests.e2e.approvals import ON
from tests.polling import polled

pytestmark = pytest.mark.e2e


def stricter_io() -> Any:
    """ConnectOnion's WebSocketIO as a later version might have it: an ``answer_request`` that
    wants a keyword the tool does not pass."""
    from connectonion.network.io import WebSocketIO

    class StricterIO(WebSocketIO):  # type: ignore[misc]
        def answer_request(
            self, response: dict[str, Any], *, viewer: str, sole_viewer: bool = True
        ) -> str | None:
            refused: str | None = super().answer_request(response, sole_viewer=sole_viewer)
            return refused

    return StricterIO()


@pytest.mark.parametrize("daemon_approvals", [{**ON, "timeout_s": 1}])
@pytest.mark.parametrize("missing", ["the lease's inner IO", "a usable answer_request"])
async def test_an_io_the_tool_cannot_close_requests_on_is_waited_on_and_said(
    loop: Loop, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, missing: str
) -> None:
    caplog.set_level(logging.WARNING, logger=tool_wait.__name__)
    if missing == "the lease's inner IO":
        # The real Agent wraps its WebSocketIO in ConnectOnion's lease, as the Host does; here
        # the lease keeps it under a name the tool does not know.
        monkeypatch.setattr(tool_wait, "_LEASE_INNER", "_InterruptibleIO__renamed")
        said = "has no answer_request, nor a ConnectOnion lease around one"
    else:
        loop.agent.io = loop.io = stricter_io()
        said = "refused to close request .* \\(TypeError: "
    script(loop)
    async with asking(loop) as turn:
        event = await loop.until(is_approval)
        run_id = event["id"].rpartition(":")[0]

        async def timed_out() -> bool | None:
            return await decisions(loop, run_id) == [("deny", "timeout")] or None

        # The daemon's timeout denies it; the tool cannot end its wait on the IO, so the
        # request stays open there and the person's late answer is still delivered.
        await polled(timed_out, what="the daemon's timeout")
        if missing == "the lease's inner IO":
            assert late_answer(loop, event, approved=True) is None
        else:
            answer = {"type": "APPROVAL_RESPONSE", "request_id": event["id"], "approved": True}
            assert loop.io.answer_request(answer, viewer="test") is None
        # Posted too late (the daemon refuses it): the run had gone on, and the tool follows it
        # to its end.
        assert await ended(turn) == "completed"
    assert await decisions(loop, run_id) == [("deny", "timeout")]
    assert not (loop.e2e.workspace.parent / "outside.txt").exists()
    assert envelope_of(loop.model.requests[-1])["result"] == "Ok."
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w for w in warned if re.search(said, w)], warned
    assert all("until the person answers it or a Stop comes" in w for w in warned)


def test_the_tool_closes_requests_on_the_connectonion_it_runs_with() -> None:
    """The private name is where this ConnectOnion keeps the IO its lease wraps (the test
    above would pass for the wrong reason, were the lookup already missing here)."""
    from connectonion.core.interrupt import InterruptibleIO
    from connectonion.network.io import WebSocketIO

    inner = WebSocketIO()
    close = tool_wait.closer_of(InterruptibleIO(inner))
    assert close is not None
    inner.send({"type": "approval_needed", "id": "r1", "tool": "t", "arguments": {}})
    assert close({"type": "APPROVAL_RESPONSE", "request_id": "r1", "approved": False}) is None
    assert inner.receive() == {"approved": False, "scope": "once", "mode": "reject_hard"}
