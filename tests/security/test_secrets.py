"""Planted credentials never come out: not in a frame (live or replayed), not in an HTTP answer,
not in a log line of the daemon's JSON stdout, not in any byte of the SQLite files (WAL too).

The daemon is the production entry point (``codelegate serve --config``). A fake CLI plants
exact bytes: secrets in tool arguments, tool output, env dumps, stderr (a PEM key over lines, a
line cut through a token), text, denials, the result, and in what it chooses (a tool name, a
written path, a session id); its environment carries the credentials the daemon passes, which
it prints bare and encoded. The real CLI, scripted by the stub model, plants what a model can:
a Write to a path holding a token with a JSON-escaped secret in it, ``cat`` of that file, and
``printenv`` of the credential the daemon passed, bare, base64 and hex, and piped through
``base64`` and ``od -An -tx1``, which break it over lines (and space the hex).
"""

from __future__ import annotations

import base64
import json
import secrets
import string
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fakes import LEAKY_CLAUDE
from tests.reliability.served import BASE, Served, write_config
from tests.stub.anthropic import Stub, serve_stub, text, tool
from tests.translator.helpers import encode

MASK = "[redacted]"
_TOKEN = "ANTHROPIC_AUTH_TOKEN"


def _alnum(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def plant() -> dict[str, str]:
    """Fresh credential-shaped values; each one's random core is what must never appear."""
    h = secrets.token_hex
    jwt = "eyJhbGciOiJIUzI1NiJ9." + "eyJ" + _alnum(40) + "." + _alnum(43)
    pem_body = "\n".join(_alnum(64) for _ in range(4))
    pgp_body = "\n".join(_alnum(64) for _ in range(3))
    stderr_body = "\n".join(_alnum(64) for _ in range(4))
    account_body = "\n".join(_alnum(64) for _ in range(4))
    return {
        "ant": "sk-ant-api03-" + h(24),
        "ant2": "sk-ant-api03-" + h(24),
        "daemon_key": "sk-ant-api03-" + h(24),
        "ghp": "ghp_" + _alnum(36),
        "bearer": h(20),
        "keyed": "plain-" + h(16),  # not shaped: only its key (api_key) says it is a secret
        "keyed2": h(16),
        "cookie": "sid=" + h(16),
        "password": "pw-" + h(16),
        "password2": "pw-" + h(16),
        "akia": "AKIA" + _alnum(16, string.ascii_uppercase + string.digits),
        "aws_secret": _alnum(40),
        "pem": f"-----BEGIN RSA PRIVATE KEY-----\n{pem_body}\n-----END RSA PRIVATE KEY-----",
        "jwt": jwt,
        "token": h(16),
        "client_secret": h(16),
        "denied": h(16),
        "denied2": h(16),
        "malformed": "sk-ant-api03-" + h(24),
        "unknown": h(16),
        # Chosen by the model or the CLI.
        "path_ghp": "ghp_" + _alnum(36),
        "tool_name": "sk-ant-api03-" + h(24),
        "last_tool": "sk-ant-api03-" + h(24),
        "session": "ghp_" + _alnum(36),
        # On stderr.
        "pem_stderr": f"-----BEGIN PRIVATE KEY-----\n{stderr_body}\n-----END PRIVATE KEY-----",
        "cut_ghp": "ghp_" + _alnum(36),
        # Passed by the daemon, of no recognisable shape.
        "auth_plain": h(20),
        "oauth_plain": f"o {h(12)} '{h(12)}",
        # Shapes once missed.
        "escaped": h(16),
        "url_pw": h(16),
        "git_tok": h(16),
        "aiza": "AIza" + _alnum(35),
        "docker": h(24),
        "pgp": "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n"
        + pgp_body
        + "\n=ab12\n-----END PGP PRIVATE KEY BLOCK-----",
        "account_key": base64.b64encode(secrets.token_bytes(48)).decode(),
        "account_pem": f"-----BEGIN PRIVATE KEY-----\n{account_body}\n-----END PRIVATE KEY-----\n",
    }


def encoded(planted: dict[str, str]) -> list[str]:
    """The credentials the daemon passes as the leaky CLI prints them encoded."""
    auth, oauth = planted["auth_plain"], planted["oauth_plain"]
    return [
        encode(auth, "base64", b"user:", b"")[1],
        encode(auth, "hex", b"", b"")[1],
        encode(oauth, "urlsafe_base64", b"", b"")[1],
        encode(oauth, "url", b"", b"")[1],
    ]


def cores(planted: dict[str, str], *more: str) -> list[str]:
    """Every 12-character window of every secret's random part (hex windows of 12 do not turn up
    by chance; a partial leak shows up as one of them), and of every string in ``more``."""
    out: list[str] = []
    for value in [*planted.values(), *more]:
        core = value.split("-----")[2] if value.startswith("-----") else value
        for prefix in (
            "sk-ant-api03-",
            "ghp_",
            "AKIA",
            "plain-",
            "sid=",
            "pw-",
            "eyJhbGciOiJIUzI1NiJ9.",
            "AIza",
        ):
            core = core.removeprefix(prefix)
        core = core.replace("\n", "")
        out.extend(core[i : i + 12] for i in range(0, max(1, len(core) - 11)))
    return out


def store_bytes(folder: Path) -> bytes:
    """Every byte of the SQLite database, its WAL and shared-memory files."""
    return b"".join(p.read_bytes() for p in folder.iterdir() if p.name.startswith("store.db"))


@pytest.fixture
async def leaky(tmp_path: Path, short_dir: Path) -> AsyncIterator[tuple[Served, dict[str, str]]]:
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    planted = plant()
    (home / "planted.json").write_text(json.dumps(planted))
    env = {
        "ANTHROPIC_API_KEY": planted["daemon_key"],
        "ANTHROPIC_AUTH_TOKEN": planted["auth_plain"],
        "CLAUDE_CODE_OAUTH_TOKEN": planted["oauth_plain"],
        "SOME_DAEMON_SECRET": planted["keyed2"],
    }
    s = Served(write_config(short_dir, workspace, claude=LEAKY_CLAUDE), short_dir, home, env)
    try:
        yield s, planted
    finally:
        await s.stop()


async def collect(
    served: Served, bodies: list[dict[str, Any]]
) -> tuple[list[Any], dict[str, bytes]]:
    """Run each request to its end; every frame, HTTP answer, log line and byte of the store.

    Stops the daemon (so that the store is flushed and the log complete) before reading them.
    """
    await served.start()
    assert served.http is not None
    http = served.http
    seen: list[bytes] = []
    answers: list[Any] = []
    frames: list[bytes] = []
    async with http.ws_connect(f"{BASE}/v1/ws?run=*") as ws:
        for body in bodies:
            async with http.post(f"{BASE}/v1/runs", json={**body, "wait": True}) as resp:
                assert resp.status == 200
                seen.append(await resp.read())
                answers.append(json.loads(seen[-1]))
        while sum(b'"type":"run_result"' in f for f in frames) < len(bodies):
            msg = await ws.receive(timeout=30)
            assert msg.type == aiohttp.WSMsgType.TEXT
            frames.append(msg.data.encode())
    paths = ["/v1/runs", "/metrics", "/healthz"]
    for answer in answers:
        paths += [f"/v1/runs/{answer['run_id']}", f"/v1/runs/{answer['run_id']}/events"]
    for path in paths:
        async with http.get(f"{BASE}{path}") as resp:
            assert resp.status == 200
            seen.append(await resp.read())
    await served.stop()
    logs = served.log.read_bytes()
    assert b"run_finished" in logs  # the log really is the daemon's JSON stdout
    blobs = {
        "frames": b"\n".join(frames),
        "http": b"\n".join(seen),
        "log": logs,
        "store": store_bytes(served.state),
    }
    return answers, blobs


def assert_nowhere(
    blobs: dict[str, bytes], needles: list[str], spread: tuple[str, ...] = ()
) -> None:
    """No needle in any blob; no ``spread`` needle either once the blob's spaces and line breaks
    (raw or JSON-escaped) are taken out, where an encoding command wrapped or spaced it."""
    # The secrets really went through the pipeline (and came out masked).
    assert MASK.encode() in blobs["frames"]
    assert MASK.encode() in blobs["store"]
    for where, blob in blobs.items():
        found = blob.decode("utf-8", "replace")
        leaks = [w for w in needles if w in found]
        assert not leaks, f"planted secret in {where}: {leaks[:3]}"
        for gap in (" ", "\\r", "\\n", "\r", "\n"):
            found = found.replace(gap, "")
        leaks = [w for w in spread if w in found]
        assert not leaks, f"planted secret, wrapped, in {where}: {leaks[:3]}"


async def test_planted_secrets_appear_nowhere(
    leaky: tuple[Served, dict[str, str]], tmp_path: Path
) -> None:
    served, planted = leaky
    task = f"leak file={tmp_path / 'home' / 'planted.json'}"
    (ok, failed), blobs = await collect(served, [{"task": task}, {"task": task + " exit=1"}])
    assert ok["status"] == "completed"
    assert failed["status"] == "failed"
    # The path was kept, with its token masked; the stderr tail was kept, masked as one text.
    assert ok["files_changed"] == [f"tokens/{MASK}/notes.txt"]
    assert "loaded key:\n" + MASK in failed["stderr"]
    assert " …[cut]\nthe token was " + MASK in failed["stderr"]
    assert_nowhere(blobs, cores(planted, *encoded(planted)))


@pytest.mark.e2e
async def test_what_the_real_cli_plants_appears_nowhere(
    claude_bin: str, tmp_path: Path, short_dir: Path
) -> None:
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    # The token is long enough (65 bytes with printenv's newline) that `base64` wraps it.
    ghp, token, escaped = "ghp_" + _alnum(36), secrets.token_hex(32), secrets.token_hex(16)
    notes = f"tokens/{ghp}/notes.txt"
    # A JSON string inside JSON: the file holds {\"api_key\": \"…\"}, escaped.
    content = json.dumps({"config": json.dumps({"api_key": escaped})}) + "\n"
    encodings = (
        "import base64, os; t = os.environ['ANTHROPIC_AUTH_TOKEN'].encode(); "
        "print(base64.b64encode(b'user:' + t).decode()); print(t.hex())"
    )
    stub = Stub(
        [
            tool("Write", file_path=str(workspace / notes), content=content),
            tool("Bash", command=f"cat {notes}", description="Show the notes"),
            tool("Bash", command="printenv ANTHROPIC_AUTH_TOKEN", description="Show the token"),
            tool("Bash", command=f'python3 -c "{encodings}"', description="Encode the token"),
            tool("Bash", command=f"printenv {_TOKEN} | base64", description="Wrap the token"),
            tool("Bash", command=f"printenv {_TOKEN} | od -An -tx1", description="Dump it"),
            text("Done."),
        ]
    )
    rules = (
        'allowed_tools = ["Bash(cat:*)", "Bash(printenv:*)", "Bash(python3:*)",'
        ' "Bash(base64:*)", "Bash(od:*)"]\n'
    )
    async with serve_stub(stub):
        env = {"ANTHROPIC_BASE_URL": stub.url, "ANTHROPIC_AUTH_TOKEN": token, "LANG": "C.UTF-8"}
        config = write_config(short_dir, workspace, claude=claude_bin, policy=rules)
        served = Served(config, short_dir, home, env)
        try:
            (answer,), blobs = await collect(
                served, [{"task": "Take notes.", "mode": "accept_edits"}]
            )
        finally:
            await served.stop()
    assert answer["status"] == "completed", answer
    assert answer["files_changed"] == [f"tokens/{MASK}/notes.txt"]
    assert (workspace / notes).read_text() == content  # the CLI really wrote it there
    results = [json.loads(f) for f in blobs["frames"].split(b"\n") if b'"tool_result"' in f]
    assert [r["status"] for r in results] == ["completed"] * 6, results
    assert results[2]["result"].strip() == MASK  # printenv's output, of no known shape
    # Masked whole over its lines; what is left is what encodes printenv's newline.
    assert results[4]["result"].startswith(MASK)
    assert results[4]["result"].strip().endswith("=")
    assert results[5]["result"].strip() == MASK + "\n 0a", results[5]
    wrapped = (encode(token, "base64", b"", b"\n")[1], encode(token, "hex", b"", b"")[1])
    needles = cores(
        {"ghp": ghp, "token": token, "escaped": escaped},
        encode(token, "base64", b"user:", b"")[1],
        *wrapped,
    )
    assert_nowhere(blobs, needles, spread=tuple(cores({}, *wrapped)))
