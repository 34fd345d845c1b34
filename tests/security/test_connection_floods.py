"""A run cannot keep the callers out by filling a listener with its own connections.

A run's commands can always connect to the daemon's Unix socket (and to a loopback TCP port):
every request they send is refused, but a connection that merely stays open used to count
against ``unix_max_connections`` / ``tcp_max_connections``, so a run could hold them all and
turn away everyone else, the cancel of that very run included (503 ``too_many_connections``).
The Unix peer is now checked at accept (a run's connection is answered 403 and closed at once,
never counted); a TCP listener that is full closes its oldest connection that has not yet
passed the token check (tests/reliability/test_serving.py floods it from outside).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from codelegate.daemon.serving.listeners import LINGER_MAX
from tests.e2e.conftest import BASE, E2E
from tests.stub.anthropic import text, tool

CAP = 4
# More than the cap, and more than the refused peers whose answer may linger: past those, the
# run's connections are closed at once.
FLOOD = LINGER_MAX + 3 * CAP

# Opens ``count`` connections to the socket and holds them, sending nothing (so nothing of
# them is refused on main: only their count), says so on the stub, then waits to be cancelled.
HOG = """\
import socket, sys, time, urllib.request

path, count, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]
held = []
for _ in range(count):
    client = socket.socket(socket.AF_UNIX)
    client.connect(path)
    held.append(client)
urllib.request.urlopen(ready)
time.sleep(120)
"""


@pytest.fixture
def daemon_server() -> dict[str, Any]:
    return {"unix_max_connections": CAP}


async def counted(http: aiohttp.ClientSession, name: str) -> int:
    async with http.get(f"{BASE}/metrics") as resp:
        body = await resp.text()
    found = re.search(rf"^{re.escape(name)} (\d+)$", body, re.MULTILINE)
    return int(found.group(1)) if found else 0


@pytest.mark.e2e
async def test_a_run_holding_more_connections_than_the_cap_cannot_keep_its_cancel_out(
    e2e: E2E, short_dir: Path
) -> None:
    (e2e.workspace / "hog.py").write_text(HOG)
    ready = e2e.stub.signal_url("flooded")
    command = f"python3 hog.py {short_dir / 'd.sock'} {FLOOD} {ready}"
    e2e.stub.main.turns = [tool("Bash", command=command, description="Hold"), text("ok")]
    status, started = await e2e.post_run("Flood.", mode="safe")
    assert status == 202, started
    run_id = started["run_id"]
    await e2e.stub.wait_for_signal("flooded")

    # A caller that connects only now, behind the run's connections (the accept queue is in
    # order): it is let in, and its cancel stops the run.
    assert e2e.handle is not None
    assert e2e.handle.socket_path is not None
    connector = aiohttp.UnixConnector(path=e2e.handle.socket_path)
    async with aiohttp.ClientSession(connector=connector) as fresh:
        async with fresh.get(f"{BASE}/healthz") as resp:
            assert resp.status == 200, await resp.text()
        async with fresh.post(f"{BASE}/v1/runs/{run_id}/cancel") as resp:
            assert resp.status == 202, await resp.text()
        # Each of the run's connections was refused as it came (403, counted like a refused
        # request), and none of them is open.
        refused = await counted(fresh, 'codelegate_http_errors_total{status="403"}')
        assert refused == FLOOD
        assert await counted(fresh, 'codelegate_connections{listener="unix"}') <= 2
    await e2e.settled(run_id)
    status, state = await e2e.get(f"/v1/runs/{run_id}")
    assert (status, state["status"]) == (200, "cancelled"), state
