"""A run may not drive the daemon that runs it: its processes are refused on the Unix socket.

A command a run executes has the daemon's uid, so ``SO_PEERCRED`` alone would let it in: it
could start runs in any root with any allowed mode (widening its own policy), cancel or read
every other run. The daemon refuses a peer that is a process of a run (403 ``peer_is_a_run``),
told by ancestry — the daemon is a child subreaper, so whatever a run starts stays its
descendant, ``setsid`` and double forks included — with the run's cgroup and the run marker as
further signals. Every case is the real CLI against the API stub, its Bash tool running a
Python script the operator's ``Bash(python3:*)`` rule allows.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from codelegate.daemon.serving import access
from codelegate.daemon.supervision import cgroups
from codelegate.policy.errors import PolicyError
from tests.daemon.conftest import Daemon
from tests.e2e.conftest import E2E
from tests.fakes.spy import Spy
from tests.security.test_isolation import sandbox
from tests.stub.anthropic import text, tool

# ``itself``: the Bash command's own process calls the API; ``env-i``: a child with an empty
# environment (no run marker) does; ``orphan``: a grandchild in a session of its own, whose
# parent has exited, does so with an empty environment too; ``gone``: the process that connected
# is reaped before the request goes out. Each prints one ``answer`` line.
PROBE = """\
import json, os, shutil, socket, subprocess, sys

how, sock, cwd, task = sys.argv[1:]


def post(client=None):
    body = json.dumps({"task": task, "cwd": cwd, "mode": "accept_edits"}).encode()
    head = (
        "POST /v1/runs HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\n"
        f"Content-Length: {len(body)}\\r\\nConnection: close\\r\\n\\r\\n"
    ).encode()
    if client is None:
        client = socket.socket(socket.AF_UNIX)
        client.connect(sock)
    with client:
        client.sendall(head + body)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    status = answer.split(b"\\r\\n", 1)[0].decode()
    marked = "CODELEGATE_RUN_ID" in os.environ
    body = answer.split(b"\\r\\n\\r\\n", 1)[-1].decode()
    print("answer", f"ppid={os.getppid()}", f"marked={marked}", status, body, flush=True)


scrubbed = [shutil.which("env"), "-i", sys.executable, sys.argv[0], "itself", sock, cwd, task]


# first() in a child, then(its result) in that child's child once the child has exited and
# been reaped (the grandchild is an orphan then); prints what the grandchild printed.
def in_an_orphan(first, then):
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    middle = os.fork()
    if middle == 0:
        state = first()
        if os.fork() == 0:
            os.close(go_w)
            os.read(go_r, 1)  # EOF: the first process has reaped its child and closed its end
            os.dup2(out_w, 1)
            then(state)
            os._exit(0)
        os._exit(0)
    os.waitpid(middle, 0)
    os.close(go_w)
    os.close(out_w)
    with os.fdopen(out_r) as out:
        print(out.read(), end="")


def connect():
    client = socket.socket(socket.AF_UNIX)
    client.connect(sock)
    return client


if how == "itself":
    post()
elif how == "env-i":
    subprocess.run(scrubbed, check=True)
elif how == "orphan":  # in a session of its own, with an empty environment
    in_an_orphan(os.setsid, lambda _: os.execv(scrubbed[0], scrubbed))
else:  # "gone": the process that connected is reaped before the request is sent on its socket
    in_an_orphan(connect, post)
"""


@pytest.fixture
def cgroup_per_run(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Whether runs get a cgroup of their own (``parametrize`` it); off, ancestry alone (and
    the marker, when not scrubbed) tells a run's process."""
    on = bool(request.param)
    if on and cgroups.delegated_base() is None:
        pytest.skip("no delegated, writable cgroup v2 subtree here")
    cgroups.set_enabled(on)
    yield on
    cgroups.set_enabled(True)


async def run_ids(e2e: E2E) -> list[str]:
    status, body = await e2e.get("/v1/runs")
    assert status == 200, body
    return [run["run_id"] for run in body["runs"]]


@pytest.mark.e2e
@pytest.mark.usefixtures("subreaper")
@pytest.mark.parametrize(
    ("how", "cgroup_per_run", "told_by"),
    [
        ("itself", False, "run marker"),
        ("env-i", False, "descendant of the daemon"),
        ("orphan", False, "descendant of the daemon"),
        ("orphan", True, "run cgroup"),
    ],
    indirect=["cgroup_per_run"],
)
async def test_a_runs_command_is_refused_the_daemons_socket_and_starts_no_run(
    e2e: E2E, short_dir: Path, how: str, cgroup_per_run: bool, told_by: str
) -> None:
    (e2e.workspace / "probe.py").write_text(PROBE)
    task = f"widen {secrets.token_hex(16)}"
    command = f"python3 probe.py {how} {short_dir / 'd.sock'} {e2e.workspace} '{task}'"
    e2e.stub.main.turns = [tool("Bash", command=command, description="Probe"), text("ok")]
    status, body = await e2e.post_run("Probe.", mode="safe", wait=True)
    assert (status, body["status"]) == (200, "completed"), body
    told = "\n".join(r.history_text() for r in e2e.stub.model_requests)
    (answer,) = [line for line in told.splitlines() if line.startswith("answer ")]
    assert "HTTP/1.1 403" in answer, answer
    assert '"code":"peer_is_a_run"' in answer, answer
    assert f"({told_by})" in answer, answer
    # The probe was what it claims: scrubbed of the marker, and orphaned to the daemon.
    assert ("marked=True" in answer) is (how == "itself"), answer
    if how == "orphan":
        assert f"ppid={os.getpid()} " in answer, answer
    # Nothing ran: the one run is the probing run, and no model call carried the task.
    assert await run_ids(e2e) == [body["run_id"]]
    assert not any(task in json.dumps(r.messages[:1]) for r in e2e.stub.model_requests)


@pytest.mark.e2e
async def test_a_client_of_the_same_uid_that_is_no_run_still_starts_runs(e2e: E2E) -> None:
    """The same probe, started by the test itself (a child of the daemon's host in its session,
    not of a run): it is let in and its run is started."""
    (e2e.workspace / "probe.py").write_text(PROBE)
    task = f"legit {secrets.token_hex(16)}"
    assert e2e.handle is not None
    assert e2e.handle.socket_path is not None
    argv = ["itself", e2e.handle.socket_path, str(e2e.workspace), task]
    client = await asyncio.create_subprocess_exec(
        sys.executable,
        str(e2e.workspace / "probe.py"),
        *argv,
        stdout=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    out, _ = await client.communicate()
    assert client.returncode == 0
    assert "HTTP/1.1 202" in out.decode(), out
    assert len(await run_ids(e2e)) == 1


async def client(
    d: Daemon, cwd: Path, how: str = "itself", *, env: dict[str, str] | None = None, **kw: Any
) -> tuple[asyncio.subprocess.Process, str]:
    """The probe as a client the test starts (a child of the daemon's host); its answer line."""
    probe = cwd / "probe.py"
    probe.write_text(PROBE)
    assert d.handle.socket_path is not None
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(probe),
        how,
        d.handle.socket_path,
        str(cwd),
        f"task {secrets.token_hex(16)}",
        stdout=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})},
        **kw,
    )
    out, _ = await proc.communicate()
    return proc, out.decode()


async def listed(d: Daemon) -> list[Any]:
    status, body = await d.json("GET", "/v1/runs")
    assert status == 200, body
    runs: list[Any] = body["runs"]
    return runs


async def test_a_descendant_in_a_session_of_its_own_is_refused_without_marker_or_cgroup(
    sdaemon: Daemon, roots: tuple[Path, Path], spy: Spy
) -> None:
    """Ancestry alone: what the daemon's host starts in its own session is no run (a test's
    client); in a new session, as every run is, it is one."""
    _, answer = await client(sdaemon, roots[0], start_new_session=True)
    assert '"code":"peer_is_a_run"' in answer, answer
    assert "(descendant of the daemon)" in answer, answer
    _, answer = await client(sdaemon, roots[0])
    assert "HTTP/1.1 202" in answer, answer
    assert len(await listed(sdaemon)) == 1


async def test_a_process_carrying_a_run_marker_is_refused(
    sdaemon: Daemon, roots: tuple[Path, Path], spy: Spy
) -> None:
    """In the daemon's own session, so only the marker (of any run, this daemon's or another
    one's of the same uid) tells it."""
    marker = {"CODELEGATE_RUN_ID": secrets.token_hex(8)}
    _, answer = await client(sdaemon, roots[0], env=marker)
    assert "(run marker)" in answer, answer
    assert spy.starts == []
    assert await listed(sdaemon) == []


async def test_a_peer_that_is_gone_by_its_first_request_is_refused(
    sdaemon: Daemon, roots: tuple[Path, Path], spy: Spy
) -> None:
    """Fail closed: a peer of the daemon's uid whose process cannot be inspected any more (its
    pid could be another process's by now) is refused, not let in."""
    _, answer = await client(sdaemon, roots[0], "gone")
    assert "HTTP/1.1 403" in answer, answer
    assert '"code":"peer_unknown"' in answer, answer
    assert spy.starts == []
    assert await listed(sdaemon) == []


async def test_a_peer_reaped_before_its_first_request_is_refused_whatever_its_pid_shows(
    sdaemon: Daemon, roots: tuple[Path, Path], spy: Spy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pidfd pin: /proc is read by pid, and a reaped peer's pid may be another process's by
    then. Here /proc "shows" an innocent process (run_signal says no run), and the peer is still
    refused, because its pidfd says the process that connected is gone."""
    left, right = socket.socketpair()
    with left, right:
        pidfd = access._peer_pidfd(left)
    if pidfd is None:
        pytest.skip("no SO_PEERPIDFD on this kernel")
    os.close(pidfd)
    monkeypatch.setattr(access, "run_signal", lambda pid: None)
    _, answer = await client(sdaemon, roots[0], "gone")
    assert '"code":"peer_unknown"' in answer, answer
    _, answer = await client(sdaemon, roots[0], start_new_session=True)
    assert "HTTP/1.1 202" in answer, answer  # the stand-in lets the live peer in


async def test_a_peer_whose_ancestry_is_deeper_than_the_bound_is_refused(
    sdaemon: Daemon, roots: tuple[Path, Path], spy: Spy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``env-i`` connects from a grandchild of this process: two steps up to the daemon.
    monkeypatch.setattr(access, "MAX_ANCESTORS", 1)
    _, answer = await client(sdaemon, roots[0], "env-i")
    assert '"code":"peer_unknown"' in answer, answer
    monkeypatch.setattr(access, "MAX_ANCESTORS", 2)
    _, answer = await client(sdaemon, roots[0], "env-i")
    assert "HTTP/1.1 202" in answer, answer
    assert len(await listed(sdaemon)) == 1


async def test_the_verdict_is_taken_once_per_connection(
    sdaemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept-alive requests do not walk /proc again: it is walked when the connection is
    accepted (a refused peer is never counted against the cap) and at its first request (a
    peer gone by then is refused), never after. The in-process client is the daemon's pid, so
    the check stops early; what is counted is how often it runs."""
    calls: list[int] = []
    real = access.unix_refusal

    def counted(*args: Any) -> PolicyError | None:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(access, "unix_refusal", counted)
    for _ in range(3):
        status, _ = await sdaemon.json("GET", "/healthz")
        assert status == 200
    assert calls == [1, 1]


# -- the TCP listener: a bearer token says nothing about who holds it --------------------------

TCP_PROBE = """\
import socket, sys

token_file, port = sys.argv[1:]
try:
    token = open(token_file).read().strip()
except OSError as exc:
    print("token no", type(exc).__name__)
    raise SystemExit(0)
with socket.create_connection(("127.0.0.1", int(port))) as client:
    client.sendall(
        f"GET /v1/runs HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Bearer {token}\\r\\n"
        "Connection: close\\r\\n\\r\\n".encode()
    )
    answer = b""
    while chunk := client.recv(65536):
        answer += chunk
print("token yes", answer.split(b"\\r\\n", 1)[0].decode())
"""


@pytest.fixture
def token() -> str:
    return secrets.token_hex(24)


@pytest.fixture
def token_file(tmp_path: Path, token: str) -> Path:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)  # the daemon's uid alone: what a run of that uid can still read
    return path


@pytest.fixture
def daemon_server(token_file: Path) -> dict[str, Any]:
    return {"tcp": "127.0.0.1:0", "token_file": str(token_file)}


@pytest.fixture
def token_guard() -> str:
    """How the operator keeps runs from the token file (``parametrize`` it): not at all, a Read
    deny rule, or the sandbox with the file in ``denyRead``."""
    return "none"


@pytest.fixture
def daemon_policy(token_guard: str, token_file: Path) -> dict[str, Any]:
    rules = ["Bash(python3:*)"]
    if token_guard != "deny-rule":
        return {"allowed_tools": rules}
    return {"allowed_tools": rules, "disallowed_tools": [f"Read(/{token_file})"]}


@pytest.fixture
def daemon_claude(
    token_guard: str, token_file: Path, tmp_path: Path, short_dir: Path
) -> dict[str, Any]:
    if token_guard != "sandbox":
        return {}
    if not (shutil.which("bwrap") and shutil.which("socat")):
        pytest.fail("the CLI's sandbox needs bubblewrap and socat (`make sandbox-tools`)")
    recipe = sandbox(tmp_path, short_dir)
    recipe["settings"]["sandbox"]["filesystem"]["denyRead"].append(str(token_file))
    return recipe


async def read_the_token(e2e: E2E, token_file: Path) -> str:
    """A run's Bash command reads the token file and calls the TCP listener with it; what the
    model was told."""
    assert e2e.handle is not None
    (e2e.workspace / "tcp_probe.py").write_text(TCP_PROBE)
    command = f"python3 tcp_probe.py {token_file} {e2e.handle.tcp_port}"
    e2e.stub.main.turns = [tool("Bash", command=command, description="Probe"), text("ok")]
    status, body = await e2e.post_run("Probe.", mode="safe", wait=True)
    assert (status, body["status"]) == (200, "completed"), body
    return "\n".join(r.history_text() for r in e2e.stub.model_requests)


@pytest.mark.e2e
async def test_a_run_that_can_read_the_token_file_gets_in_over_tcp(
    e2e: E2E, token_file: Path
) -> None:
    """What the README says plainly: the peer check is the Unix socket's; over TCP, whoever
    holds the token is a caller."""
    told = await read_the_token(e2e, token_file)
    assert "token yes HTTP/1.1 200" in told, told[-1500:]


@pytest.mark.e2e
@pytest.mark.parametrize("token_guard", ["sandbox"])
async def test_the_sandboxs_deny_read_keeps_commands_from_the_token_file(
    e2e: E2E, token_file: Path
) -> None:
    told = await read_the_token(e2e, token_file)
    assert "token no" in told, told[-1500:]
    assert "token yes" not in told


@pytest.mark.e2e
@pytest.mark.parametrize("token_guard", ["none", "deny-rule"])
async def test_a_read_deny_rule_keeps_the_file_tools_from_the_token_file(
    e2e: E2E, token_file: Path, token: str, token_guard: str
) -> None:
    e2e.stub.main.turns = [tool("Read", file_path=str(token_file)), text("ok")]
    status, body = await e2e.post_run("Read it.", mode="plan", wait=True)
    assert (status, body["status"]) == (200, "completed"), body
    told = "\n".join(r.history_text() for r in e2e.stub.model_requests)
    assert (token in told) is (token_guard == "none"), told[-500:]
    assert ("denied by your permission settings" in told) is (token_guard == "deny-rule")
