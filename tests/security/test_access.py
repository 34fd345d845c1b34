"""Who may talk to the daemon: a real process of another uid on the Unix socket, and requests on
the TCP listener without the token or from a foreign browser Origin. Refused requests start
nothing, whatever endpoint they aim at."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from codelegate.daemon.serving.server import start_server
from tests.daemon.conftest import child_environ, tcp_listener
from tests.fakes.spy import Spy
from tests.security.conftest import spy_config

NOBODY = 65534
PROBE_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
ALLOWED_ORIGIN = "https://chat.example.com"

_PROBE = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print("connect-refused", exc.errno)
    raise SystemExit(0)
s.sendall(sys.argv[2].encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: 15\r\nConnection: close\r\n\r\n{\"task\": \"hi\"}\n")
data = b""
while chunk := s.recv(65536):
    data += chunk
print(data.split(b"\r\n", 1)[0].decode(), data.rsplit(b"\r\n\r\n", 1)[-1].decode())
"""


def probe_as(uid: int, socket_path: str, request: str) -> str:
    """Connect to the daemon's socket from a process running as ``uid``; its first answer line."""
    try:
        done = subprocess.run(
            [PROBE_PYTHON, "-c", _PROBE, socket_path, request],
            user=uid,
            group=uid,
            extra_groups=[],
            capture_output=True,
            timeout=30,
            check=True,
            env={"PATH": "/usr/bin:/bin"},
        )
    except PermissionError:
        pytest.skip(f"uid {uid} cannot execute {PROBE_PYTHON}")
    return done.stdout.decode().strip()


async def probe(uid: int, socket_path: str, request: str) -> str:
    """:func:`probe_as` off the event loop (the daemon answering it runs on this loop)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, probe_as, uid, socket_path, request)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to start a process of another uid")
@pytest.mark.parametrize("mode", ["0666", "0660"])
async def test_another_uid_is_refused_on_the_socket(
    short_dir: Path, roots: tuple[Path, Path], spy: Spy, tmp_path: Path, mode: str
) -> None:
    # Let the other uid reach the socket file; its mode decides the rest.
    os.chmod(short_dir, 0o755)  # noqa: S103
    config = spy_config(short_dir, roots, spy, server={"socket_mode": mode})
    handle = await start_server(config, environ=child_environ(tmp_path))
    try:
        assert handle.socket_path is not None
        for request in ("GET /healthz", "POST /v1/runs", "GET /v1/runs", "GET /metrics"):
            answer = await probe(NOBODY, handle.socket_path, request)
            if mode == "0660":  # the file mode already keeps it out
                assert answer.startswith("connect-refused"), answer
            else:  # the file lets it connect; SO_PEERCRED does not let it in
                assert answer.startswith("HTTP/1.1 403"), answer
                assert "peer_not_allowed" in answer
        # The daemon's own uid still gets in.
        own = await probe(os.getuid(), handle.socket_path, "GET /healthz")
        assert own.startswith("HTTP/1.1 200"), own
    finally:
        await handle.close()
    assert spy.starts == []


async def test_tcp_refuses_missing_and_wrong_tokens_and_foreign_origins(
    short_dir: Path, roots: tuple[Path, Path], spy: Spy, tmp_path: Path
) -> None:
    token = secrets.token_hex(24)  # fresh: nothing may know it in advance
    server = tcp_listener(tmp_path, token, allowed_origins=[ALLOWED_ORIGIN])
    config = spy_config(short_dir, roots, spy, server=server)
    handle = await start_server(config, environ=child_environ(tmp_path))
    good = f"Bearer {token}"
    bad_auth: list[dict[str, str]] = [
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {token[:-1]}"},
        {"Authorization": f"Bearer {token}x"},
        {"Authorization": f"Bearer {token.upper()}"},
        {"Authorization": f"Basic {token}"},
        {"Authorization": token},
        {"Authorization": f"Token {token}"},
        {"X-Api-Key": token},
        {"Cookie": f"token={token}"},
    ]
    foreign = [
        "https://evil.example",
        "null",
        ALLOWED_ORIGIN + ".evil.example",
        ALLOWED_ORIGIN + ":8443",
        "http://chat.example.com",
        "https://CHAT.example.com.evil",
        "file://",
    ]
    try:
        assert handle.tcp_port
        base = f"http://127.0.0.1:{handle.tcp_port}"
        targets = [
            ("POST", "/v1/runs"),
            ("GET", "/v1/runs"),
            ("GET", "/healthz"),
            ("GET", "/metrics"),
            ("GET", "/v1/ws?run=*"),
            ("GET", "/v1/runs/x/events"),
            ("POST", "/v1/runs/x/cancel"),
        ]
        async with aiohttp.ClientSession() as http:
            for method, path in targets:
                for headers in bad_auth:
                    async with http.request(
                        method, base + path, headers=headers, json={"task": "hi"}
                    ) as resp:
                        assert resp.status == 401, (method, path, headers)
                        assert (await resp.json())["error"]["code"] == "unauthorized"
                for origin in foreign:
                    headers = {"Authorization": good, "Origin": origin}
                    async with http.request(
                        method, base + path, headers=headers, json={"task": "hi"}
                    ) as resp:
                        assert resp.status == 403, (method, path, origin)
                        assert (await resp.json())["error"]["code"] == "origin_not_allowed"
            # A WebSocket upgrade without the token never becomes a WebSocket.
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(base + "/v1/ws?run=*")
            assert refused.value.status == 401
            assert spy.starts == []
            # The right token (with or without an allowed Origin) gets in.
            for headers in (
                {"Authorization": good},
                {"Authorization": good, "Origin": ALLOWED_ORIGIN},
            ):
                async with http.get(base + "/healthz", headers=headers) as resp:
                    assert resp.status == 200
    finally:
        await handle.close()
