"""Bad bytes on the TCP listener, and exception text on its way to the log.

A request whose headers carry the bearer token with a stray byte, a control character or too
much of it gets a 4xx in the API's JSON error shape; the token is in no answer, no log line and
no byte of the store. Exception text (a traceback, a repr, an exception passed as a value) is
redacted like every other field, and the secrets the daemon knows are masked whatever their shape.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import secrets
from pathlib import Path

import msgspec
import structlog

from codelegate.daemon import logs
from codelegate.daemon.serving.server import start_server
from tests.daemon.conftest import child_environ, make_config
from tests.reliability.served import Served, write_config
from tests.security.test_secrets import store_bytes


async def exchange(port: int, request: bytes) -> bytes:
    """Send raw bytes on loopback; the whole answer (the daemon closes: Connection: close)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        async with asyncio.timeout(30):
            return await reader.read()
    finally:
        writer.close()


REPEAT = 30


def head(*lines: bytes) -> bytes:
    return b"\r\n".join([b"GET /healthz HTTP/1.1", b"Host: x", *lines, b"Connection: close"]) + (
        b"\r\n\r\n"
    )


async def test_a_token_with_a_stray_byte_gets_a_json_4xx_and_reaches_no_log(
    tmp_path: Path, short_dir: Path, unused_tcp_port: int
) -> None:
    token = secrets.token_hex(24).encode()
    token_file = tmp_path / "token"
    token_file.write_bytes(token)
    token_file.chmod(0o600)
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    server = f'tcp = "127.0.0.1:{unused_tcp_port}"\ntoken_file = "{token_file}"\n'
    served = Served(write_config(short_dir, workspace, server=server), short_dir, home)
    await served.start()
    bad = {
        "stray byte after": head(b"Authorization: Bearer " + token + b"\xff"),
        "stray byte before": head(b"Authorization: Bearer \xfe" + token),
        "control byte": head(b"Authorization: Bearer " + token + b"\x01"),
        "bad header name": head(b"Bad Header: " + token),
        "line too long": head(b"X-Pad: " + token + b"a" * 9000),
        "byte in the path": b"GET /v1/runs/" + token + b"\xff HTTP/1.1\r\nHost: x\r\n\r\n",
    }
    try:
        for what, request in bad.items():
            answer = await exchange(unused_tcp_port, request)
            status_line, _, rest = answer.partition(b"\r\n")
            headers, _, body = rest.partition(b"\r\n\r\n")
            status = int(status_line.split()[1])
            assert 400 <= status < 500, (what, answer[:300])
            assert b"content-type: application/json" in headers.lower(), (what, headers)
            assert set(msgspec.json.decode(body)["error"]) == {"code", "message"}, what
            assert token not in answer, what
        # Any client can repeat them at will: the log gets a line per period, not per request.
        for _ in range(REPEAT):
            await exchange(unused_tcp_port, bad["control byte"])
            await exchange(unused_tcp_port, head(b"Authorization: Bearer wrong-token"))
        # The listener itself is fine: the token as sent by a client that means it.
        answer = await exchange(unused_tcp_port, head(b"Authorization: Bearer " + token))
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    finally:
        assert await served.stop() == 0
    log = served.log.read_bytes()
    assert token not in log
    for event in (b'"bad_requests"', b'"access_refused"'):
        assert 1 <= log.count(event) < REPEAT / 2, event
    assert token not in store_bytes(short_dir)


def test_exception_text_is_redacted_and_known_secrets_masked_in_every_field(
    log_stream: io.StringIO,
) -> None:
    known = secrets.token_hex(20)  # no credential shape: only knowing it masks it
    shaped = "sk-ant-api03-" + secrets.token_urlsafe(32)
    surrogate = "x\udcff" + secrets.token_hex(4)  # as a surrogateescape-decoded header reads
    logs.mask_known(known)
    log = structlog.get_logger("t")
    try:
        raise ValueError(f"bad header {known!r}\x00 and {shaped} {surrogate}")
    except ValueError as exc:
        log.exception("handler_failed", error=repr(exc))  # a traceback and a repr
        log.warning("as_value", error=exc, where=Path("/x") / known)  # objects as values
        logging.getLogger("aiohttp.server").exception("Error handling request")  # stdlib
    lines = log_stream.getvalue().splitlines()
    assert len(lines) == 3
    events = [msgspec.json.decode(line) for line in lines]
    assert "ValueError" in events[0]["exception"]
    assert "ValueError" in events[1]["error"]
    assert "ValueError" in events[2]["exception"]
    for line in lines:
        assert known not in line
        assert shaped not in line


async def test_a_credential_the_daemon_passes_to_runs_is_masked_in_log_lines_of_no_run(
    log_stream: io.StringIO,
    short_dir: Path,
    tmp_path: Path,
) -> None:
    # Registered at start-up from the daemon's own environment, before any run: a line of
    # aiohttp's or a traceback that quotes the key (in any encoding) is masked too.
    key = "sk-" + secrets.token_hex(24)  # no credential shape past the prefix: knowing it masks it
    workspace = tmp_path / "ws"
    workspace.mkdir()
    environ = {**child_environ(tmp_path), "ANTHROPIC_API_KEY": key}
    handle = await start_server(make_config(short_dir, workspace), environ=environ)
    try:
        forms = {
            "bare": key,
            "base64": base64.b64encode(f"user:{key}".encode()).decode(),
            "hex": key.encode().hex(),
        }
        for what, form in forms.items():
            logging.getLogger("aiohttp.server").warning("Error handling request %s", form)
            structlog.get_logger("t").warning("unhandled", what=what, detail=f"x={form};")
    finally:
        await handle.close()
    log = log_stream.getvalue()
    assert log.count('"Error handling request') == 3, log
    for what, form in forms.items():
        middle = form[len(form) // 4 : -len(form) // 4]  # only the key's own characters
        assert middle not in log, what
