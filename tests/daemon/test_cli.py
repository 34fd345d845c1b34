"""The console script: translate, doctor, config loading; and the log redaction."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import secrets
import socket
from pathlib import Path

import pytest
import structlog

from codelegate.daemon.cli import doctor, load_config, main, translate_stream
from codelegate.daemon.clients.tool import socket_path, state_dir
from codelegate.daemon.pinned import CLAUDE_CODE_VERSION
from codelegate.translator import RunContext, translate_transcript
from tests.conftest import REFERENCE
from tests.daemon.conftest import Daemon, running_daemon
from tests.fakes import FAKE_CLAUDE, PLANTED_SECRET
from tests.fixtures import log_lines


def test_translate_matches_the_translator(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    transcript = REFERENCE / "basic.jsonl"
    assert main(["translate", str(transcript)]) == 0
    out = capsysbinary.readouterr().out
    ctx = RunContext(run_id="translate", cwd="/srv/workspaces/demo", started_at=0.0)
    assert out == b"".join(translate_transcript(transcript.read_bytes(), ctx))
    frames = [json.loads(line) for line in out.splitlines()]
    assert frames[-1]["type"] == "run_result"
    assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))


def test_translate_reads_chunks_from_a_stream() -> None:
    data = (REFERENCE / "multi.jsonl").read_bytes()
    out = io.BytesIO()
    translate_stream(io.BytesIO(data), out, cwd="/srv/workspaces/demo", run_id="r")
    ctx = RunContext(run_id="r", cwd="/srv/workspaces/demo", started_at=0.0)
    assert out.getvalue() == b"".join(translate_transcript(data, ctx))


def test_translate_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["translate", str(tmp_path / "nope.jsonl")]) == 1
    assert "nope.jsonl" in capsys.readouterr().err


def test_doctor_development_defaults(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"CODELEGATE_CLAUDE": FAKE_CLAUDE, "ANTHROPIC_API_KEY": PLANTED_SECRET, "PATH": ""}
    assert doctor(None, env) == 0
    out = capsys.readouterr().out
    assert f"workspace roots: {tmp_path}" in out
    assert "claude version: 2.1.332" in out
    # The suite runs on the source (tests/conftest.py): doctor says so, and how to do better.
    assert "translator: pure Python (a compiled build translates faster: make wheel)" in out
    assert "ANTHROPIC_API_KEY" in out
    assert PLANTED_SECRET not in out
    assert "PROBLEM" not in out


def test_doctor_reports_problems(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        f'[claude]\npath = "{tmp_path / "no-claude"}"\n'
        f'[policy]\nworkspaces = ["{tmp_path / "gone"}"]\n'
    )
    assert doctor(str(config), {}) == 1
    out = capsys.readouterr().out
    assert "PROBLEM claude.path" in out
    assert "PROBLEM policy.workspaces[0]" in out
    config.write_text("[policy]\nworkspace = []\n")
    assert doctor(str(config), {}) == 2
    assert "policy.workspace" in capsys.readouterr().out
    assert doctor(str(tmp_path / "missing.toml"), {}) == 2


def test_serve_refuses_a_bad_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[server]\nsockett = 'x'\n")
    assert main(["serve", "--config", str(config)]) == 2
    assert "server.sockett" in capsys.readouterr().err


def test_an_explicit_config_whose_store_lands_in_the_workspace_is_refused_by_serve_and_doctor(
    capsys: pytest.CaptureFixture[str], workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # README: every key is optional. Started from the root, the default var/ paths land in it.
    config = workspace.parent / "c.toml"
    config.write_text(f"[policy]\nworkspaces = [{json.dumps(str(workspace))}]\n")
    monkeypatch.chdir(workspace)
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"codelegate: {config}: server.socket: the workspace {workspace} holds")
    assert len(err.splitlines()) == 1
    assert not (workspace / "var").exists()  # refused before anything was made
    assert doctor(str(config), {}) == 2
    assert "holds the daemon's state" in capsys.readouterr().out
    # A link from outside into the root is followed: the store would still be in the workspace.
    (workspace.parent / "state").symlink_to(workspace / "sub")
    store = workspace.parent / "state" / "c.db"
    config.write_text(
        f"[server]\nsocket = {json.dumps(str(workspace.parent / 'c.sock'))}\n"
        f"[policy]\nworkspaces = [{json.dumps(str(workspace))}]\n"
        f"[store]\npath = {json.dumps(str(store))}\n"
    )
    monkeypatch.chdir(workspace.parent)
    assert doctor(str(config), {}) == 2
    assert f"store.path: the workspace {workspace} holds" in capsys.readouterr().out


def test_load_config_defaults_use_the_env_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(None, {"CODELEGATE_CLAUDE": "/opt/claude"})
    assert config.claude.path == "/opt/claude"
    assert config.policy.workspaces == (str(tmp_path),)
    assert config.server.socket == os.path.join(state_dir(), "codelegate.sock")
    assert not config.server.socket.startswith(str(tmp_path))


def test_make_runs_dev_config_is_what_doctor_and_the_clients_find_from_anywhere(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    assert main(["dev-config", "--workspace", str(project), "--claude", FAKE_CLAUDE]) == 0
    written = capsys.readouterr().out.strip()
    assert written == os.path.join(state_dir(), "config.toml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("CODELEGATE_SOCKET", raising=False)
    config = load_config(None, {"PATH": ""})  # no CLI on PATH, nothing in the environment
    assert config.policy.workspaces == (str(project),)
    assert config.claude.path == FAKE_CLAUDE
    assert config.server.socket == socket_path()  # what run, watch and the agent tool dial
    assert doctor(None, {"PATH": ""}) == 0
    out = capsys.readouterr().out
    assert f"config: {written}" in out
    assert "PROBLEM" not in out


def test_dev_config_refuses_a_workspace_that_holds_the_daemons_state(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / ".local" / "state"))
    assert main(["dev-config", "--workspace", str(tmp_path), "--claude", FAKE_CLAUDE]) == 2
    assert "holds the daemon's state" in capsys.readouterr().err
    assert main(["dev-config", "--workspace", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(state_dir(), "config.toml"))


async def test_a_refused_second_make_run_leaves_the_served_dev_config_as_it_is(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    first, other = tmp_path / "proj", tmp_path / "other"
    first.mkdir()
    other.mkdir()
    assert main(["dev-config", "--workspace", str(first), "--claude", FAKE_CLAUDE]) == 0
    written = Path(capsys.readouterr().out.strip())
    before = await asyncio.to_thread(written.read_bytes)
    async with running_daemon(load_config(None), tmp_path):
        # `make run WORKSPACE=other` in a second terminal: dev-config, then serve.
        assert main(["dev-config", "--workspace", str(other), "--claude", FAKE_CLAUDE]) == 1
        err = capsys.readouterr().err
        assert f"another daemon (pid {os.getpid()}) is using the store" in err
        assert len(err.splitlines()) == 1
        assert await asyncio.to_thread(written.read_bytes) == before
        assert load_config(None).policy.workspaces == (str(first),)
    assert main(["dev-config", "--workspace", str(other), "--claude", FAKE_CLAUDE]) == 0
    assert load_config(None).policy.workspaces == (str(other),)


def test_logs_are_json_and_redacted(log_stream: io.StringIO) -> None:
    log = structlog.get_logger("t")
    structlog.contextvars.bind_contextvars(run_id="r-1")
    try:
        log.info(
            "spawn_failed",
            error=f"env says ANTHROPIC_API_KEY={PLANTED_SECRET}",
            headers={"Authorization": "Bearer abc.def.ghi"},
        )
        log.debug("not_shown")
    finally:
        structlog.contextvars.clear_contextvars()
    logging.getLogger("aiohttp.server").error("Error handling request: token=%s", PLANTED_SECRET)
    lines = log_stream.getvalue().strip().splitlines()
    assert len(lines) == 2
    stdlib = json.loads(lines[1])
    assert stdlib["level"] == "error"
    assert "Error handling request" in stdlib["event"]
    assert PLANTED_SECRET not in lines[1]
    lines = lines[:1]
    event = json.loads(lines[0])
    assert event["event"] == "spawn_failed"
    assert event["run_id"] == "r-1"
    assert event["level"] == "info"
    assert PLANTED_SECRET not in lines[0]
    assert "abc.def.ghi" not in lines[0]


async def test_a_run_in_this_process_logs_its_lines_to_the_log_stream_with_its_run_id(
    log_stream: io.StringIO, daemon: Daemon
) -> None:
    # The daemon's module loggers, not a fresh one: what a later test's capture must see too.
    resp = await daemon.post_run("hello", wait=True)
    run_id = (await resp.json())["run_id"]
    events = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    assert [e["event"] for e in events if e.get("run_id") == run_id][-1] == "run_finished"


def test_each_log_capture_sees_a_daemon_modules_lines_whatever_captured_them_before() -> None:
    # A module logger used under one capture must not stay bound to it (the order of tests).
    from codelegate.daemon.serving import server

    captured = []
    for _ in range(2):
        with log_lines() as stream:
            server._log.info("probe")
        captured.append(stream.getvalue())
    with structlog.testing.capture_logs() as events:
        server._log.info("probe")
    assert ['"probe"' in lines for lines in captured] == [True, True]
    assert [e["event"] for e in events] == ["probe"]


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port: int = probe.getsockname()[1]
    return port


def _tcp_config(tmp_path: Path, token: bytes, claude: str, port: int | None = None) -> Path:
    token_file = tmp_path / "token"
    token_file.write_bytes(token)
    token_file.chmod(0o600)
    config = tmp_path / "c.toml"
    (tmp_path / "ws").mkdir(exist_ok=True)  # the token outside it: a run could read it there
    config.write_text(  # doctor binds the port as serve would: a free one unless told
        f'[server]\ntcp = "127.0.0.1:{port or _free_port()}"\ntoken_file = "{token_file}"\n'
        f'socket = "{tmp_path / "d.sock"}"\n'
        f'[claude]\npath = "{claude}"\n[policy]\nworkspaces = ["{tmp_path / "ws"}"]\n'
        f'[store]\npath = "{tmp_path / "store.db"}"\n'
    )
    return config


def test_doctor_refuses_the_token_serve_refuses(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from codelegate.daemon.serving.binding import ServerError, read_token

    short = secrets.token_hex(3)[:5].encode()  # 5 bytes, as in the issue
    config = _tcp_config(tmp_path, short + b"\n", FAKE_CLAUDE)
    assert doctor(str(config), {}) == 1
    out = capsys.readouterr().out
    assert "PROBLEM server.token_file must hold a token of at least 16 bytes" in out
    with pytest.raises(ServerError, match="at least 16 bytes"):
        read_token(str(tmp_path / "token"))
    config = _tcp_config(tmp_path, secrets.token_hex(8).encode(), FAKE_CLAUDE)
    assert doctor(str(config), {}) == 0
    assert read_token(str(tmp_path / "token"))
    (tmp_path / "token").chmod(0o644)  # every user could call the API with it
    assert doctor(str(config), {}) == 1
    assert "PROBLEM server.token_file is open to every user" in capsys.readouterr().out
    with pytest.raises(ServerError, match="open to every user"):
        read_token(str(tmp_path / "token"))


def test_doctor_says_whether_the_cli_is_the_pinned_version(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = _tcp_config(tmp_path, secrets.token_hex(8).encode(), FAKE_CLAUDE)
    assert doctor(str(config), {}) == 0
    assert f"claude version: {CLAUDE_CODE_VERSION} (the pinned version)" in (
        capsys.readouterr().out
    )
    other = tmp_path / "claude"
    other.write_text("#!/bin/sh\necho '9.0.1 (Claude Code)'\n")
    other.chmod(0o755)
    config = _tcp_config(tmp_path, secrets.token_hex(8).encode(), str(other))
    assert doctor(str(config), {}) == 0  # a warning, not a problem: the operator may test it
    out = capsys.readouterr().out
    assert f"claude version: 9.0.1 -- WARNING: not the pinned {CLAUDE_CODE_VERSION}" in out


@pytest.mark.parametrize("drain", ["-1", "nan", "inf", "soon"])
def test_serve_refuses_a_drain_that_is_not_a_finite_number_of_seconds(
    drain: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--drain", drain])
    assert exited.value.code == 2
    assert f"expected seconds (0 or more), got {drain!r}" in capsys.readouterr().err


def test_watch_help_names_the_fleet_options_it_hands_on(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["watch", "--help"])
    assert "--redis URL [--prefix P] [--new]" in capsys.readouterr().out


def test_a_dev_config_error_is_prefixed_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dev-config", "--workspace", str(tmp_path / "nx")]) == 2
    assert capsys.readouterr().err == (
        f"codelegate: dev-config: --workspace: {tmp_path / 'nx'} is not a directory\n"
    )


async def test_doctor_finds_the_tcp_port_taken_unless_the_daemon_of_this_config_holds_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    config = _tcp_config(tmp_path, secrets.token_hex(16).encode(), FAKE_CLAUDE, port)
    try:
        assert await asyncio.to_thread(doctor, str(config), {}) == 1
    finally:
        taken.close()
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("PROBLEM")] == [
        f"PROBLEM server.tcp: cannot listen on 127.0.0.1:{port}: Address already in use; stop"
        " what listens there (ss -ltnp) or choose another [server] tcp port"
    ]
    assert await asyncio.to_thread(doctor, str(config), {}) == 0
    assert "PROBLEM" not in capsys.readouterr().out
    # Asked while its daemon serves (the second terminal of the Quick start): not a problem.
    async with running_daemon(load_config(str(config)), tmp_path):
        assert await asyncio.to_thread(doctor, str(config), {}) == 0
    out = capsys.readouterr().out
    assert f"tcp: 127.0.0.1:{port} is served now by the daemon (pid {os.getpid()})" in out
    assert "PROBLEM" not in out


def test_doctor_names_a_socket_path_too_long_for_af_unix_and_makes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, workspace: Path
) -> None:
    path = tmp_path / ("s" * 110) / "d.sock"
    config = tmp_path / "c.toml"
    config.write_text(
        f"[server]\nsocket = {json.dumps(str(path))}\n[claude]\npath = {json.dumps(FAKE_CLAUDE)}\n"
        f"[policy]\nworkspaces = [{json.dumps(str(workspace))}]\n"
        f"[store]\npath = {json.dumps(str(tmp_path / 'store.db'))}\n"
    )
    assert doctor(str(config), {}) == 1
    problems = [x for x in capsys.readouterr().out.splitlines() if x.startswith("PROBLEM")]
    assert problems == [
        f"PROBLEM server.socket: {path} is {len(str(path).encode())} bytes long, over the 107 a"
        " Unix socket path may have; choose a shorter [server] socket"
    ]
    assert not path.parent.exists()


def test_doctor_warns_when_runs_would_have_no_credentials_and_says_how_to_give_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    env = {"CODELEGATE_CLAUDE": FAKE_CLAUDE, "PATH": "", "HOME": str(home)}
    login = home / ".claude" / ".credentials.json"
    assert doctor(None, env) == 0  # a warning: the CLI may be logged in where doctor cannot see
    warnings = [x for x in capsys.readouterr().out.splitlines() if x.startswith("WARNING")]
    assert len(warnings) == 1
    assert warnings[0].startswith("WARNING auth: no credentials: none of ANTHROPIC_API_KEY")
    assert f"no login of its own in {login}" in warnings[0]
    login.parent.mkdir(parents=True)
    login.write_text(secrets.token_hex(16))  # `claude` then /login, as the daemon's user
    assert doctor(None, env) == 0
    assert "WARNING" not in capsys.readouterr().out
    login.unlink()
    key = secrets.token_hex(16)
    assert doctor(None, {**env, "ANTHROPIC_API_KEY": key}) == 0
    out = capsys.readouterr().out
    assert "WARNING" not in out
    assert key not in out
