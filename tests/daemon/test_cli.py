"""The console script: translate, doctor, config loading; and the log redaction."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from daemon import logs
from daemon.cli import doctor, load_config, main, translate_stream
from tests.conftest import REFERENCE
from tests.fakes import FAKE_CLAUDE, PLANTED_SECRET
from translator import RunContext, translate_transcript


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


def test_load_config_defaults_use_the_env_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(None, {"CODELEGATE_CLAUDE": "/opt/claude"})
    assert config.claude.path == "/opt/claude"
    assert config.server.socket == str(tmp_path / "var" / "codelegate.sock")


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    logs.configure(level="info", stream=stream)
    yield stream
    structlog.reset_defaults()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


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
