"""The ``codelegate`` console script: ``serve``, ``run``, ``watch``, ``translate``, ``doctor``.

``run`` and ``watch`` are the terminal client (``daemon/terminal.py``); it is imported only when
used, so that ``serve`` does not pay for rich.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import BinaryIO

from policy.config import Config, FanoutConfig, development_config, parse_config
from policy.errors import ConfigError

CLAUDE_ENV = "CODELEGATE_CLAUDE"


def default_claude(environ: Mapping[str, str]) -> str:
    """The CLI for development defaults: $CODELEGATE_CLAUDE, else ``claude`` on PATH."""
    return environ.get(CLAUDE_ENV) or shutil.which("claude") or "claude"


def load_config(path: str | None, environ: Mapping[str, str] | None = None) -> Config:
    """The config in ``path``, or development defaults for the current directory."""
    env = os.environ if environ is None else environ
    if path is None:
        return development_config(os.getcwd(), default_claude(env))
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read the file ({exc.strerror})") from None
    return parse_config(data, path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="codelegate", description="Delegate coding tasks to Claude Code, with live cards."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument("--config", help="TOML config (default: development defaults under ./var)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    serve.add_argument(
        "--drain", type=float, default=10.0, help="seconds runs may finish on SIGTERM"
    )
    translate = sub.add_parser("translate", help="stream-json transcript → frames (NDJSON)")
    translate.add_argument("file", help="a transcript file, or - for stdin")
    translate.add_argument("--cwd", default="/srv/workspaces/demo", help="the run's cwd")
    translate.add_argument("--run-id", default="translate")
    doctor = sub.add_parser("doctor", help="explain the config and check this machine")
    doctor.add_argument("--config")
    for name, text in (("run", "delegate one task and watch it"), ("watch", "follow a run")):
        client = sub.add_parser(name, help=text, add_help=False)
        client.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["watch"] and any(a.partition("=")[0] == "--redis" for a in args_list):
        # The fleet through Redis ([fanout]) rather than one daemon's socket.
        return int(importlib.import_module("daemon.fleet").main(args_list[1:]))
    if args_list and args_list[0] in ("run", "watch"):
        # Lazy: rich is only needed by the terminal client.
        terminal = importlib.import_module("daemon.terminal")
        return int(terminal.main(args_list))
    args = _parser().parse_args(args_list)
    if args.command == "serve":
        return _serve(args.config, args.log_level, args.drain)
    if args.command == "translate":
        return _translate(args.file, cwd=args.cwd, run_id=args.run_id)
    return doctor(args.config)


def _serve(config_path: str | None, level: str, drain: float) -> int:
    from daemon import logs, server

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"codelegate: {exc}", file=sys.stderr)
        return 2
    logs.configure(level=level)
    return server.run(config, drain_s=drain)


def _translate(path: str, *, cwd: str, run_id: str) -> int:
    try:
        if path == "-":
            translate_stream(sys.stdin.buffer, sys.stdout.buffer, cwd=cwd, run_id=run_id)
        else:
            with open(path, "rb") as stream:
                translate_stream(stream, sys.stdout.buffer, cwd=cwd, run_id=run_id)
    except BrokenPipeError:
        # `codelegate translate x | head`: the reader left. Point stdout at /dev/null so the
        # interpreter's final flush does not complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        print(f"codelegate translate: {path}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def doctor(config_path: str | None, environ: Mapping[str, str] | None = None) -> int:
    """Print what the config means here; non-zero when something stops it from working."""
    from policy.checks import check_environment
    from policy.environment import auth_variables_present

    env = os.environ if environ is None else environ
    out: list[str] = []
    try:
        config = load_config(config_path, env)
    except ConfigError as exc:
        print(f"config: {exc}")
        return 2
    out.append(f"config: {config_path or 'development defaults (no --config)'}")
    server, policy, limits = config.server, config.policy, config.limits
    out.append(f"socket: {os.path.abspath(server.socket)} (mode {server.socket_mode})")
    who = (
        f"uids {list(server.allowed_uids)} gids {list(server.allowed_gids)}"
        if server.allowed_uids or server.allowed_gids
        else f"only uid {os.getuid()} (the daemon's own)"
    )
    out.append(f"peers allowed: {who}")
    if server.tcp:
        out.append(f"tcp: {server.tcp} (bearer token from {server.token_file})")
    out.append(f"store: {os.path.abspath(config.store.path)}")
    out.append("workspace roots: " + ", ".join(policy.workspaces))
    out.append(f"modes: default {policy.default_mode}; allowed {', '.join(policy.allowed_modes)}")
    if policy.allowed_tools:
        out.append("operator allow rules: " + ", ".join(policy.allowed_tools))
    out.append(
        f"limits: {policy.max_concurrent_runs} concurrent runs, timeout {policy.run_timeout_s:g}s,"
        f" budget cap {policy.max_budget_usd or 'none'}, task {limits.task_bytes} bytes"
    )
    resolved = shutil.which(config.claude.path)
    out.append(f"claude: {config.claude.path} -> {resolved or 'NOT FOUND'}")
    problems = [
        str(p)
        for p in check_environment(
            config,
            isdir=os.path.isdir,
            is_executable=lambda path: shutil.which(path) is not None,
            isfile=os.path.isfile,
        )
    ]
    if resolved:
        version = _claude_version(resolved)
        out.append(f"claude version: {version or 'did not answer --version'}")
        if version is None:
            problems.append("claude.path: the CLI did not answer --version")
    if config.fanout is not None:
        problems.extend(_doctor_fanout(config.fanout, out))
    present = auth_variables_present(config, env)
    out.append("auth variables present: " + (", ".join(present) if present else "none"))
    out.extend(f"PROBLEM {p}" for p in problems)
    print("\n".join(out))
    return 1 if problems else 0


def _doctor_fanout(fanout: FanoutConfig, out: list[str]) -> list[str]:
    """``[fanout]``: where frames go, and whether that Redis answers."""
    from daemon.fanout import probe  # redis-py only when [fanout] is configured
    from policy.config import fanout_host_id, redacted_url

    host_id = fanout_host_id(fanout, socket.gethostname())
    out.append(
        f"fanout: {redacted_url(fanout.redis_url)} prefix {fanout.stream_prefix!r}"
        f" host_id {host_id!r}"
    )
    problem = probe(fanout)
    return [f"fanout.redis_url: {problem}"] if problem else []


def _claude_version(path: str) -> str | None:
    try:
        done = subprocess.run(  # noqa: S603 - the operator's configured CLI, no shell
            [path, "--version"],
            capture_output=True,
            timeout=20,
            check=False,
            env={k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = done.stdout.decode("utf-8", "replace").strip()
    return text or None if done.returncode == 0 else None


def translate_stream(src: BinaryIO, dst: BinaryIO, *, cwd: str, run_id: str) -> None:
    """Frames the daemon would send for a stream-json transcript, one JSON object per line.

    Time is fixed at 0 so that the output of a transcript is reproducible.
    """
    from translator import RunContext
    from translator.transcript import translate_chunks

    chunks = iter(lambda: src.read(1 << 16), b"")
    for block in translate_chunks(chunks, RunContext(run_id=run_id, cwd=cwd, started_at=0.0)):
        dst.write(block)
    dst.flush()


if __name__ == "__main__":
    sys.exit(main())
