"""Listening: socket mode and stale sockets, SO_PEERCRED, the TCP token and Origin checks."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import aiohttp
import pytest

from codelegate.daemon.serving.binding import ServerError, bind_unix_socket
from codelegate.daemon.serving.server import start_server
from tests.daemon.conftest import BASE, child_environ, make_config, running_daemon, tcp_listener

TOKEN = "t0k3n-for-tests-0123456789abcdef"


async def test_socket_has_the_configured_mode(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    config = make_config(short_dir, workspace, server={"socket_mode": "0600"})
    async with running_daemon(config, tmp_path):
        st = os.stat(short_dir / "d.sock")
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
    assert not (short_dir / "d.sock").exists()  # removed on shutdown


def test_stale_socket_is_replaced_live_one_and_files_refused(short_dir: Path) -> None:
    path = str(short_dir / "s.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # the file stays: a daemon that died
    sock = bind_unix_socket(path, 0o660)
    try:
        sock.listen(1)
        with pytest.raises(ServerError, match="another daemon"):
            bind_unix_socket(path, 0o660)
    finally:
        sock.close()
    regular = short_dir / "file"
    regular.write_text("not a socket")
    with pytest.raises(ServerError, match="not a socket"):
        bind_unix_socket(str(regular), 0o660)
    assert regular.read_text() == "not a socket"


async def test_peer_with_another_uid_is_refused(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    config = make_config(short_dir, workspace, server={"allowed_uids": [os.getuid() + 1]})
    async with running_daemon(config, tmp_path) as d:
        status, body = await d.json("GET", "/healthz")
        assert (status, body["error"]["code"]) == (403, "peer_not_allowed")
        status, body = await d.json("POST", "/v1/runs", json={"task": "x"})
        assert status == 403


async def test_peer_allowed_by_group(short_dir: Path, workspace: Path, tmp_path: Path) -> None:
    config = make_config(
        short_dir,
        workspace,
        server={"allowed_uids": [os.getuid() + 1], "allowed_gids": [os.getgid()]},
    )
    async with running_daemon(config, tmp_path) as d:
        status, _ = await d.json("GET", "/healthz")
        assert status == 200


async def test_tcp_needs_the_token_and_an_allowed_origin(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    server = tcp_listener(tmp_path, TOKEN, allowed_origins=["https://chat.example.com"])
    config = make_config(short_dir, workspace, server=server)
    handle = await start_server(config, environ=child_environ(tmp_path))
    try:
        assert handle.tcp_port
        url = f"http://127.0.0.1:{handle.tcp_port}/healthz"
        good = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as http:
            for headers, status, code in [
                ({}, 401, "unauthorized"),
                ({"Authorization": "Bearer wrong"}, 401, "unauthorized"),
                ({"Authorization": f"Basic {TOKEN}"}, 401, "unauthorized"),
                ({**good, "Origin": "https://evil.example"}, 403, "origin_not_allowed"),
            ]:
                async with http.get(url, headers=headers) as resp:
                    assert resp.status == status
                    assert (await resp.json())["error"]["code"] == code
            for headers in (good, {**good, "Origin": "https://chat.example.com"}):
                async with http.get(url, headers=headers) as resp:
                    assert resp.status == 200
        # the Unix socket needs no token
        connector = aiohttp.UnixConnector(path=str(handle.socket_path))
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.get(f"{BASE}/healthz") as resp,
        ):
            assert resp.status == 200
    finally:
        await handle.close()


async def test_tcp_listens_on_an_ipv6_loopback_literal(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    server = {**tcp_listener(tmp_path, TOKEN), "tcp": "[::1]:0"}
    handle = await start_server(make_config(short_dir, workspace, server=server))
    try:
        assert handle.tcp_port
        url = f"http://[::1]:{handle.tcp_port}/healthz"
        async with aiohttp.ClientSession() as http:
            async with http.get(url) as resp:
                assert resp.status == 401
            async with http.get(url, headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                assert resp.status == 200
    finally:
        await handle.close()


@pytest.mark.parametrize(("token", "refusal"), [(None, "token_file"), ("abc", "at least 16")])
async def test_tcp_without_a_readable_token_of_16_bytes_does_not_start(
    short_dir: Path, workspace: Path, tmp_path: Path, token: str | None, refusal: str
) -> None:
    server = tcp_listener(tmp_path, token or "")
    if token is None:
        (tmp_path / "token").unlink()
    config = make_config(short_dir, workspace, server=server)
    with pytest.raises(ServerError, match=refusal):
        await start_server(config)
    assert not (short_dir / "d.sock").exists()


def test_sd_notify_sends_to_path_and_abstract_sockets(short_dir: Path) -> None:
    from codelegate.daemon.serving.server import sd_notify

    assert sd_notify("READY=1", {}) is False
    path = short_dir / "n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(path))
        assert sd_notify("READY=1", {"NOTIFY_SOCKET": str(path)}) is True
        assert listener.recv(64) == b"READY=1"
    name = f"codelegate-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind("\0" + name)
        assert sd_notify("WATCHDOG=1", {"NOTIFY_SOCKET": "@" + name}) is True
        assert listener.recv(64) == b"WATCHDOG=1"
    assert sd_notify("READY=1", {"NOTIFY_SOCKET": str(short_dir / "gone")}) is False


def test_watchdog_interval_is_half_the_period_for_this_pid() -> None:
    from codelegate.daemon.serving.server import watchdog_interval

    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "4000000"}) == 2.0
    assert watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}) == 2.0
    assert watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}) is None


def test_socket_activation_only_for_this_pid() -> None:
    from codelegate.daemon.serving.binding import inherited_socket

    assert inherited_socket({}) is None
    assert inherited_socket({"LISTEN_PID": "1", "LISTEN_FDS": "1"}) is None
    assert inherited_socket({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "0"}) is None


def test_a_socket_path_too_long_for_af_unix_is_named_before_its_folder_is_made(
    tmp_path: Path,
) -> None:
    # Was "cannot bind …: AF_UNIX path too long", after the folder had been made for it.
    path = tmp_path / ("x" * 120) / "d.sock"
    with pytest.raises(ServerError) as caught:
        bind_unix_socket(str(path), 0o660)
    size = len(str(path).encode())
    assert str(caught.value) == (
        f"server.socket: {path} is {size} bytes long, over the 107 a Unix socket path may have;"
        " choose a shorter [server] socket"
    )
    assert not path.parent.exists()
