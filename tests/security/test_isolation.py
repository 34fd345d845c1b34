"""What a run can reach besides its workspace, with and without the CLI's sandbox.

A run executes as the daemon's uid. Without a sandbox, a command the operator allows can read
the run store, signal the daemon and read the CLI's transcripts under ``$HOME/.claude/projects``
(every tool output of every earlier run, unredacted); it can also write outside the workspace.
It cannot call the daemon's API: the socket refuses a run's processes (``peer_is_a_run``).
With the CLI's own sandbox, passed as ``[claude.settings.sandbox]``, Bash commands run under
bubblewrap: they cannot write outside the workspace, read what ``denyRead`` names, or see the
daemon's process. The sandbox does not cover the CLI's file tools: Read reads the transcripts of
the same workspace in every mode, and any file in plan mode, unless an operator deny rule says
otherwise. The README's security model states exactly what these tests show.

Every case is the real CLI against the API stub; the probe is a Python script the operator's
``Bash(python3:*)`` rule allows, and what it found comes back in the tool result the model sees.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import E2E
from tests.stub.anthropic import ToolUse, text, tool, tools

pytestmark = pytest.mark.e2e

PROBE = """\
import glob, os, socket, sys

store, sock, home, pid, outside = sys.argv[1:]
needle = open("needle.txt").read().strip()


def api():
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(sock)
        client.sendall(b"GET /v1/runs HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    if b"peer_is_a_run" in answer:
        raise PermissionError("the daemon refuses a run's processes")
    if not answer.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(answer[:200])  # no OSError: the probe stops, and the test says so


def transcripts():
    paths = glob.glob(os.path.join(home, ".claude", "projects", "*", "*.jsonl"))
    if not any(needle in open(p).read() for p in paths):
        raise FileNotFoundError("no transcript with the needle")


for label, attempt in [
    ("store-read", lambda: open(store, "rb").read(1)),
    ("daemon-api", api),
    ("transcript-read", transcripts),
    ("daemon-signal", lambda: os.kill(int(pid), 0)),
    ("outside-write", lambda: open(outside, "w").write("x")),
]:
    try:
        attempt()
        print(label, "yes")
    except OSError as exc:
        print(label, "no", type(exc).__name__)
"""
REACH = ("store-read", "daemon-api", "transcript-read", "daemon-signal", "outside-write")


def sandbox(tmp_path: Path, short_dir: Path, **extra: Any) -> dict[str, Any]:
    """The sandbox recipe of the README, with this test's store folder and HOME (the e2e
    fixture's layout: the store in ``short_dir``, HOME in ``tmp_path/home``)."""
    deny = [str(short_dir), str(tmp_path / "home" / ".claude")]
    return {
        "settings": {
            "sandbox": {
                "enabled": True,
                "failIfUnavailable": True,
                "allowUnsandboxedCommands": False,
                "filesystem": {"denyRead": deny},
            }
            | extra
        }
    }


@pytest.fixture
def isolation() -> str:
    """Which [claude] settings the daemon gets; a test picks one with ``parametrize``."""
    return "none"


@pytest.fixture
def daemon_claude(
    isolation: str, tmp_path: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """The e2e fixture's [claude] settings (it starts the daemon after this fixture)."""
    if isolation == "none":
        return {}
    if isolation.endswith("-without-bwrap"):
        # A machine without bubblewrap: the daemon (and so the CLI) gets a PATH with every
        # program of the real one except bwrap and socat.
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for folder in os.environ.get("PATH", "").split(os.pathsep):
            for entry in Path(folder).glob("*") if folder else ():
                link = bin_dir / entry.name
                if entry.name not in ("bwrap", "socat") and not os.path.lexists(link):
                    link.symlink_to(entry)
        assert shutil.which("python3", path=str(bin_dir))
        assert not shutil.which("bwrap", path=str(bin_dir))
        monkeypatch.setenv("PATH", str(bin_dir))
        fail_closed = isolation == "sandbox-without-bwrap"
        return sandbox(tmp_path, short_dir, failIfUnavailable=fail_closed)
    if not (shutil.which("bwrap") and shutil.which("socat")):
        pytest.fail("the CLI's sandbox needs bubblewrap and socat (`make sandbox-tools`)")
    if isolation == "sandbox":
        return sandbox(tmp_path, short_dir)
    assert isolation == "sandbox-escapable"
    return sandbox(tmp_path, short_dir, allowUnsandboxedCommands=True)


async def probe(e2e: E2E, tmp_path: Path, short_dir: Path, **bash: Any) -> dict[str, bool]:
    """An earlier run leaves a tool output in its transcript; then a run probes what it reaches.
    Returns what the probe reached, as the model was told."""
    needle = secrets.token_hex(16)
    (e2e.workspace / "needle.txt").write_text(needle + "\n")
    (e2e.workspace / "probe.py").write_text(PROBE)
    e2e.stub.main.turns = [tool("Bash", command="cat needle.txt", description="Read"), text("ok")]
    status, body = await e2e.post_run("Read needle.txt.", mode="safe", wait=True)
    assert (status, body["status"]) == (200, "completed"), body
    outside = tmp_path / f"outside-{secrets.token_hex(8)}"
    store, sock = short_dir / "store.db", short_dir / "d.sock"
    args = [str(store), str(sock), str(e2e.home), str(os.getpid()), str(outside)]
    command = "python3 probe.py " + " ".join(args)
    use = ToolUse("Bash", {"command": command, "description": "Probe", **bash})
    e2e.stub.main.turns = [tools(use), text("ok")]
    before = len(e2e.stub.model_requests)
    status, body = await e2e.post_run("Probe.", mode="safe", wait=True)
    assert (status, body["status"]) == (200, "completed"), body
    told = "\n".join(r.history_text() for r in e2e.stub.model_requests[before:])
    reached = {label: f"{label} yes" in told for label in REACH}
    for label in REACH:  # each line is there, one way or the other: the probe ran to its end
        assert reached[label] or f"{label} no" in told, told[-2000:]
    assert reached["outside-write"] == outside.exists()
    return reached


# Without the sandbox a run reaches all of it but the daemon's API, which refuses its processes
# whatever the sandbox (tests/security/test_peer_runs.py).
UNSANDBOXED = dict.fromkeys(REACH, True) | {"daemon-api": False}


async def test_without_a_sandbox_a_run_reaches_the_store_the_daemon_and_the_transcripts(
    e2e: E2E, tmp_path: Path, short_dir: Path
) -> None:
    assert await probe(e2e, tmp_path, short_dir) == UNSANDBOXED


@pytest.mark.parametrize("isolation", ["sandbox"])
async def test_the_clis_sandbox_from_the_settings_keeps_a_run_from_all_of_them(
    e2e: E2E, tmp_path: Path, short_dir: Path
) -> None:
    assert await probe(e2e, tmp_path, short_dir) == dict.fromkeys(REACH, False)


@pytest.mark.parametrize("isolation", ["sandbox"])
async def test_the_model_cannot_ask_its_way_out_of_the_sandbox(
    e2e: E2E, tmp_path: Path, short_dir: Path
) -> None:
    reached = await probe(e2e, tmp_path, short_dir, dangerouslyDisableSandbox=True)
    assert reached == dict.fromkeys(REACH, False)


@pytest.mark.parametrize("isolation", ["sandbox-escapable"])
async def test_unless_unsandboxed_commands_are_allowed(
    e2e: E2E, tmp_path: Path, short_dir: Path
) -> None:
    """Why the recipe sets ``allowUnsandboxedCommands = false``: the CLI's default lets the model
    ask for a command outside the sandbox, and an operator rule that allows it lets it run."""
    reached = await probe(e2e, tmp_path, short_dir, dangerouslyDisableSandbox=True)
    assert reached == UNSANDBOXED


def write_outside(tmp_path: Path) -> tuple[Path, str]:
    outside = tmp_path / f"outside-{secrets.token_hex(8)}"
    return outside, f"python3 -c \"open('{outside}', 'w').write('x')\""


@pytest.mark.parametrize("isolation", ["sandbox-without-bwrap"])
async def test_a_sandbox_that_cannot_start_fails_the_run_before_the_model_is_asked(
    e2e: E2E, tmp_path: Path
) -> None:
    outside, command = write_outside(tmp_path)
    e2e.stub.main.turns = [tool("Bash", command=command, description="Write"), text("ok")]
    status, body = await e2e.post_run("Write outside.", mode="safe", wait=True)
    assert (status, body["status"]) == (200, "failed"), body
    assert "sandbox" in body["stderr"]
    assert e2e.stub.model_requests == []
    assert not outside.exists()


@pytest.mark.parametrize("isolation", ["sandbox-fail-open-without-bwrap"])
async def test_without_fail_if_unavailable_a_missing_sandbox_runs_commands_unsandboxed(
    e2e: E2E, tmp_path: Path
) -> None:
    """Why the recipe sets ``failIfUnavailable = true``: the CLI's default is to warn on stderr
    and run every command without the sandbox."""
    outside, command = write_outside(tmp_path)
    e2e.stub.main.turns = [tool("Bash", command=command, description="Write"), text("ok")]
    status, body = await e2e.post_run("Write outside.", mode="safe", wait=True)
    assert (status, body["status"]) == (200, "completed"), body
    told = "\n".join(r.history_text() for r in e2e.stub.model_requests)
    assert outside.exists(), told[-1500:]


@pytest.fixture
def deny_state() -> bool:
    """Whether the operator denies reads of the CLI's state; ``parametrize`` to turn it on."""
    return False


@pytest.fixture
def daemon_policy(deny_state: bool, tmp_path: Path, short_dir: Path) -> dict[str, Any]:
    """The e2e fixture's [policy] settings: its usual operator rules, and with ``deny_state``
    the README's deny rules for the transcripts and the store (``//`` starts an absolute path)."""
    rules = ["Bash(python3:*)", "Bash(env:*)"]
    if not deny_state:
        return {"allowed_tools": rules}
    deny = [f"Read(/{tmp_path}/home/.claude/projects/**)", f"Read(/{short_dir}/store.db*)"]
    return {"allowed_tools": rules, "disallowed_tools": deny}


async def read_an_earlier_transcript(e2e: E2E, mode: str = "plan", where: str = ".") -> str:
    """A safe run in ``where`` (relative to the workspace) leaves a tool output in its
    transcript; a run in ``mode`` in the workspace Reads that file. "found", or what the model
    was told from the second run."""
    needle = secrets.token_hex(16)
    first = (e2e.workspace / where).resolve()
    first.mkdir(exist_ok=True)
    (first / "needle.txt").write_text(needle + "\n")
    e2e.stub.main.turns = [tool("Bash", command="cat needle.txt", description="Read"), text("ok")]
    status, body = await e2e.post_run("Read needle.txt.", mode="safe", cwd=str(first), wait=True)
    assert (status, body["status"]) == (200, "completed"), body
    (first / "needle.txt").unlink()
    (transcript,) = (e2e.home / ".claude" / "projects").glob(f"*/{body['session_id']}.jsonl")
    lines = transcript.read_text().splitlines()
    at = next(n for n, line in enumerate(lines, 1) if needle in line and "tool_result" in line)
    # The transcript is long: the model reads the page holding the tool output.
    read = tool("Read", file_path=str(transcript), offset=at, limit=1)
    e2e.stub.main.turns = [read, text("ok")]
    before = len(e2e.stub.model_requests)
    status, body = await e2e.post_run("Read it.", mode=mode, wait=True)
    assert (status, body["status"]) == (200, "completed"), body
    told = "\n".join(r.history_text() for r in e2e.stub.model_requests[before:])
    return "found" if needle in told else told[-300:]


@pytest.mark.parametrize("mode", ["safe", "accept_edits", "plan"])
async def test_any_run_reads_the_transcripts_of_earlier_runs_in_its_workspace(
    e2e: E2E, mode: str
) -> None:
    """The CLI lets its file tools read its own folder for the working directory, which holds
    every earlier session's transcript there; no operator rule is needed for it."""
    assert await read_an_earlier_transcript(e2e, mode) == "found"


async def test_a_plan_run_reads_the_transcripts_of_other_workspaces(e2e: E2E) -> None:
    """In plan mode the Read tool reads any path the daemon's uid can read."""
    assert await read_an_earlier_transcript(e2e, "plan", "../other") == "found"


@pytest.mark.parametrize("mode", ["safe", "accept_edits"])
async def test_safe_and_accept_edits_runs_are_refused_other_workspaces_transcripts(
    e2e: E2E, mode: str
) -> None:
    told = await read_an_earlier_transcript(e2e, mode, "../other")
    assert "outside allowed working directories" in told


@pytest.mark.parametrize("deny_state", [True])
@pytest.mark.parametrize("mode", ["safe", "plan"])
async def test_an_operator_read_deny_rule_keeps_runs_out_of_the_clis_state(
    e2e: E2E, mode: str
) -> None:
    told = await read_an_earlier_transcript(e2e, mode)
    assert "denied by your permission settings" in told


@pytest.mark.parametrize("deny_state", [False, True])
async def test_a_plan_run_reads_the_stores_log_unless_a_deny_rule_covers_it(
    e2e: E2E, short_dir: Path, deny_state: bool
) -> None:
    """The Read tool refuses ``store.db`` as a binary file, not its write-ahead log, which holds
    the latest frames (redacted) of every run."""
    needle = secrets.token_hex(16)
    e2e.stub.main.turns = [text(f"Noted {needle}.")]
    status, body = await e2e.post_run("Say something.", mode="safe", wait=True)
    assert (status, body["status"]) == (200, "completed"), body
    wal = (short_dir / "store.db-wal").read_bytes().split(b"\n")
    at = next(n for n, line in enumerate(wal, 1) if needle.encode() in line)
    read = tool("Read", file_path=str(short_dir / "store.db-wal"), offset=at, limit=1)
    e2e.stub.main.turns = [read, text("ok")]
    before = len(e2e.stub.model_requests)
    status, body = await e2e.post_run("Read the store.", mode="plan", wait=True)
    assert (status, body["status"]) == (200, "completed"), body
    told = "\n".join(r.history_text() for r in e2e.stub.model_requests[before:])
    assert (needle in told) is not deny_state, told[-500:]
    assert ("denied by your permission settings" in told) is deny_state


@pytest.mark.parametrize("isolation", ["sandbox"])
async def test_the_sandbox_does_not_widen_what_a_safe_run_may_do(e2e: E2E) -> None:
    """The CLI's sandbox may auto-allow sandboxed commands (autoAllowBashIfSandboxed is on by
    default): a safe run still has ``touch`` denied, as without the sandbox."""
    target = e2e.workspace / f"made-{secrets.token_hex(8)}"
    e2e.stub.main.turns = [tool("Bash", command=f"touch {target}", description="t"), text("ok")]
    status, body = await e2e.post_run("Create a file.", mode="safe", wait=True)
    assert (status, body["status"]) == (200, "completed"), body
    assert [d["name"] for d in body["permission_denials"]] == ["Bash"]
    assert not target.exists()
