"""Planted credentials never come out: not in a frame (live or replayed), not in an HTTP answer,
not in a log line of the daemon's JSON stdout, not in any byte of the SQLite files.

The daemon is the production entry point (``codelegate serve --config``) with a fake CLI that
plants secrets in tool arguments, tool output, env dumps, stderr, text, denials and the result;
its own environment carries the API key it must pass to the CLI.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.reliability.served import BASE, Served, write_config

LEAKY_CLAUDE = str(Path(__file__).resolve().parent / "leaky_claude.py")


def _alnum(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def plant() -> dict[str, str]:
    """Fresh credential-shaped values; each one's random core is what must never appear."""
    h = secrets.token_hex
    jwt = "eyJhbGciOiJIUzI1NiJ9." + "eyJ" + _alnum(40) + "." + _alnum(43)
    pem_body = "\n".join(_alnum(64) for _ in range(4))
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
    }


def cores(planted: dict[str, str]) -> list[str]:
    """Every 12-character window of every secret's random part (hex windows of 12 do not turn up
    by chance; a partial leak shows up as one of them)."""
    out: list[str] = []
    for value in planted.values():
        core = value.split("-----")[2] if value.startswith("-----") else value
        for prefix in (
            "sk-ant-api03-",
            "ghp_",
            "AKIA",
            "plain-",
            "sid=",
            "pw-",
            "eyJhbGciOiJIUzI1NiJ9.",
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
    env = {"ANTHROPIC_API_KEY": planted["daemon_key"], "SOME_DAEMON_SECRET": planted["keyed2"]}
    s = Served(write_config(short_dir, workspace, claude=LEAKY_CLAUDE), short_dir, home, env)
    try:
        yield s, planted
    finally:
        await s.stop()


async def test_planted_secrets_appear_nowhere(
    leaky: tuple[Served, dict[str, str]], tmp_path: Path, short_dir: Path
) -> None:
    served, planted = leaky
    task = f"leak file={tmp_path / 'home' / 'planted.json'}"
    await served.start()
    assert served.http is not None
    http = served.http
    seen: list[bytes] = []
    async with http.ws_connect(f"{BASE}/v1/ws?run=*") as ws:
        async with http.post(f"{BASE}/v1/runs", json={"task": task, "wait": True}) as resp:
            assert resp.status == 200
            seen.append(await resp.read())
            ok = json.loads(seen[-1])
        async with http.post(
            f"{BASE}/v1/runs", json={"task": task + " exit=1", "wait": True}
        ) as resp:
            assert resp.status == 200
            seen.append(await resp.read())
            failed = json.loads(seen[-1])
        frames: list[bytes] = []
        while sum(b'"type":"run_result"' in f for f in frames) < 2:
            msg = await ws.receive(timeout=30)
            assert msg.type == aiohttp.WSMsgType.TEXT
            frames.append(msg.data.encode())
    assert ok["status"] == "completed"
    assert failed["status"] == "failed"
    for path in (
        f"/v1/runs/{ok['run_id']}",
        f"/v1/runs/{failed['run_id']}",
        f"/v1/runs/{ok['run_id']}/events",
        f"/v1/runs/{failed['run_id']}/events",
        "/v1/runs",
        "/metrics",
        "/healthz",
    ):
        async with http.get(f"{BASE}{path}") as resp:
            assert resp.status == 200
            seen.append(await resp.read())
    await served.stop()

    stored = store_bytes(short_dir)
    logs = served.log.read_bytes()
    assert b"run_finished" in logs  # the log really is the daemon's JSON stdout
    blobs = {"frames": b"\n".join(frames), "http": b"\n".join(seen), "log": logs, "store": stored}
    # The secrets really went through the pipeline (and came out masked).
    assert b"[redacted]" in blobs["frames"]
    assert b"[redacted]" in blobs["store"]
    for where, blob in blobs.items():
        text = blob.decode("utf-8", "replace")
        leaks = [w for w in cores(planted) if w in text]
        assert not leaks, f"planted secret in {where}: {leaks[:3]}"
