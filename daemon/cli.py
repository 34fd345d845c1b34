"""The ``codelegate`` console script: ``serve``, ``run``, ``watch``, ``doctor``, ``dev-config``,
``translate``.

Without ``--config``, ``serve`` and ``doctor`` read the development config that ``make run``
writes (``codelegate dev-config``) into the state folder of ``clients.tool.state_dir()``,
whose socket ``run``, ``watch`` and the agent tool find by default: one place, from any directory.

``run`` and ``watch`` are the terminal client (``daemon/clients/terminal.py``); it is imported
only when used, so that ``serve`` does not pay for rich.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import importlib
import json
import math
import os
import pwd
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import BinaryIO

from codelegate.daemon.clients.tool import state_dir
from codelegate.daemon.pinned import CLAUDE_CODE_VERSION, translator_build
from codelegate.daemon.supervision.version import cli_version
from codelegate.policy.config import (
    Config,
    FanoutConfig,
    development_config,
    parse_config,
    refuse_state_in_workspace,
)
from codelegate.policy.errors import ConfigError

CLAUDE_ENV = "CODELEGATE_CLAUDE"
DEV_CONFIG = "config.toml"


def default_claude(environ: Mapping[str, str]) -> str:
    """The CLI for development defaults: $CODELEGATE_CLAUDE, else ``claude`` on PATH."""
    return environ.get(CLAUDE_ENV) or shutil.which("claude") or "claude"


def dev_config_path() -> str:
    """The development config ``make run`` writes and ``serve``/``doctor`` read by default."""
    return os.path.join(state_dir(), DEV_CONFIG)


def config_source(path: str | None) -> str | None:
    """The config file to read: ``path``, else the development config when there is one."""
    if path is not None:
        return path
    written = dev_config_path()
    return written if os.path.isfile(written) else None


def load_config(path: str | None, environ: Mapping[str, str] | None = None) -> Config:
    """The config in ``path`` (or the development config), else built-in development defaults:
    the current directory the root, the state in ``state_dir()``."""
    env = os.environ if environ is None else environ
    source = config_source(path)
    if source is None:
        return development_config(os.getcwd(), default_claude(env), state_dir())
    try:
        with open(source, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read the file ({exc.strerror})") from None
    config = parse_config(data, source)
    # What the development defaults refuse, an explicit config may not do either (serve, doctor).
    refuse_state_in_workspace(config, source, cwd=os.getcwd(), realpath=os.path.realpath)
    return config


def write_dev_config(workspace: str, claude: str) -> str:
    """Write the development config for one workspace; return its path.

    The CLI path goes in the config, so that ``doctor`` checks the very CLI ``serve`` runs.
    While a daemon serves the config there (it holds the store), nothing is written: ServerError.
    """
    root = os.path.abspath(os.path.expanduser(workspace))
    if not os.path.isdir(root):
        raise ConfigError("dev-config", "--workspace", f"{root} is not a directory")
    cli = shutil.which(claude) or claude
    config = development_config(root, os.path.abspath(cli) if os.sep in cli else cli, state_dir())
    path = dev_config_path()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    _refuse_while_served(config, path)
    q = json.dumps  # a JSON string is a valid TOML basic string
    text = (
        "# Written by `codelegate dev-config` (make run): development defaults for one\n"
        "# workspace. `make run WORKSPACE=DIR` rewrites it; `--config FILE` overrides it.\n"
        f"[server]\nsocket = {q(config.server.socket)}\n\n"
        f"[claude]\npath = {q(config.claude.path)}\n\n"
        f"[policy]\nworkspaces = [{q(config.policy.workspaces[0])}]\n\n"
        f"[store]\npath = {q(config.store.path)}\n"
    )
    staged = f"{path}.{os.getpid()}.tmp"
    with open(staged, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(staged, path)
    return path


def _refuse_while_served(config: Config, path: str) -> None:
    """ServerError when a daemon holds the store this config names: it serves the config there.

    Rewritten under it, doctor and the next restart would name another workspace than the one
    served, and the second `make run` that is then refused would have changed the first's. The
    store lock is the very test serve makes (taken and let go at once).
    """
    from codelegate.daemon.serving.binding import ServerError, lock_store

    try:
        os.close(lock_store(config.store.path))
    except ServerError as exc:
        raise ServerError(f"{path} is left as it is: {exc}") from None


def _seconds(text: str) -> float:
    """A finite, non-negative number of seconds (argparse says which option it was for)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected seconds (0 or more), got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="codelegate", description="Delegate coding tasks to Claude Code, with live cards."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument(
        "--config", help="TOML config (default: the development config make run writes)"
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    serve.add_argument(
        "--drain",
        type=_seconds,
        help="seconds runs may finish on SIGTERM before they are cancelled",
    )
    translate = sub.add_parser("translate", help="stream-json transcript → frames (NDJSON)")
    translate.add_argument("file", help="a transcript file, or - for stdin")
    translate.add_argument("--cwd", default="/srv/workspaces/demo", help="the run's cwd")
    translate.add_argument("--run-id", default="translate")
    doctor = sub.add_parser("doctor", help="explain the config and check this machine")
    doctor.add_argument("--config", help="TOML config (default: as serve)")
    dev = sub.add_parser("dev-config", help="write the development config (what make run does)")
    dev.add_argument("--workspace", default=".", help="the folder runs may work in (default: .)")
    dev.add_argument("--claude", default="", help="the CLI (default: $CODELEGATE_CLAUDE or PATH)")
    for name, text in (("run", "delegate one task and watch it"), ("watch", "follow a run")):
        client = sub.add_parser(name, help=text, add_help=False)
        client.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["watch"] and any(a.partition("=")[0] == "--redis" for a in args_list):
        # The fleet through Redis ([fanout]) rather than one daemon's socket.
        return int(importlib.import_module("codelegate.daemon.clients.fleet").main(args_list[1:]))
    if args_list and args_list[0] in ("run", "watch"):
        # Lazy: rich is only needed by the terminal client.
        terminal = importlib.import_module("codelegate.daemon.clients.terminal")
        return int(terminal.main(args_list))
    args = _parser().parse_args(args_list)
    if args.command == "serve":
        return _serve(args.config, args.log_level, args.drain)
    if args.command == "translate":
        return _translate(args.file, cwd=args.cwd, run_id=args.run_id)
    if args.command == "dev-config":
        return _dev_config(args.workspace, args.claude or default_claude(os.environ))
    return doctor(args.config)


def _dev_config(workspace: str, claude: str) -> int:
    from codelegate.daemon.serving.binding import ServerError

    try:
        print(write_dev_config(workspace, claude))
    except ConfigError as exc:
        print(f"codelegate: {exc}", file=sys.stderr)
        return 2
    except ServerError as exc:  # a daemon serves that config: exit 1, as a second serve does
        print(f"codelegate: {exc}", file=sys.stderr)
        return 1
    return 0


def _serve(config_path: str | None, level: str, drain: float | None) -> int:
    from codelegate.daemon import logs
    from codelegate.daemon.serving import server

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
    from codelegate.daemon.supervision.supervisor import can_enter
    from codelegate.policy.checks import check_environment, credentials_warning
    from codelegate.policy.child_env import auth_variables_present

    env = os.environ if environ is None else environ
    out: list[str] = []
    try:
        config = load_config(config_path, env)
    except ConfigError as exc:
        print(f"config: {exc}")
        return 2
    source = config_source(config_path)
    out.append(f"config: {source or 'built-in development defaults (no --config, no make run)'}")
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
            can_enter=can_enter,
            uid=os.geteuid(),
            isfile=os.path.isfile,
        )
    ]
    problems.extend(_path_problems(config))
    if server.tcp and server.token_file and os.path.isfile(server.token_file):
        problems.extend(_token_problems(server.token_file))
    if server.tcp:
        problems.extend(_tcp_problems(server.tcp, config.store.path, out))
    if resolved:
        version = asyncio.run(cli_version(resolved, os.environ))
        out.append(f"claude version: {version_note(version)}")
        if version is None:
            problems.append("claude.path: the CLI did not answer --version")
    out.append(f"translator: {translator_build()}")
    if config.fanout is not None:
        problems.extend(_doctor_fanout(config.fanout, out))
    present = auth_variables_present(config, env)
    out.append("auth variables present: " + (", ".join(present) if present else "none"))
    unauthenticated = credentials_warning(config, env, home=_home(), isfile=os.path.isfile)
    if unauthenticated:
        out.append(f"WARNING auth: {unauthenticated}")
    out.extend(f"PROBLEM {p}" for p in problems)
    print("\n".join(out))
    return 1 if problems else 0


def _home() -> str:
    """This uid's home in the user database: where the CLI's ``os.homedir()`` looks without HOME."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:  # a uid without an entry (a container's --user)
        return "/"


def folder_problem(key: str, path: str) -> str | None:
    """Why ``serve`` could not create, or write in, the folder the file ``path`` of setting
    ``key`` lives in, told without creating anything: the error serve's own ``makedirs``
    (``binding.make_folder``) or bind would meet, for this uid."""
    folder = os.path.dirname(os.path.abspath(path))
    existing = folder
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):  # makedirs meets a file: the folder itself, or on the way
        code = errno.EEXIST if existing == folder else errno.ENOTDIR
        return f"{key}: cannot create {folder}: {os.strerror(code)}"
    if not os.access(existing, os.W_OK | os.X_OK):
        verb = "write in" if existing == folder else "create"
        return f"{key}: cannot {verb} {folder}: {os.strerror(errno.EACCES)}"
    return None


def _path_problems(config: Config) -> list[str]:
    """The socket's and the store's folders and the store file, as ``serve`` would meet them.

    The socket's folder is checked under socket activation too: a daemon started without the
    socket unit binds there itself, and the units create it for the daemon's uid anyway.
    """
    from codelegate.daemon.store.queries import file_problem
    from codelegate.policy.checks import socket_path_problem

    too_long = socket_path_problem(os.path.abspath(config.server.socket))
    if too_long:  # serve refuses it before it makes the folder: the one problem of the setting
        socket: str | None = f"server.socket: {too_long}"
    else:
        socket = folder_problem("server.socket", config.server.socket)
    store = folder_problem("store.path", config.store.path)
    if store is None:  # the file only in a folder serve can use: one problem for the setting
        stored = file_problem(os.path.abspath(config.store.path))
        store = f"store.path: {stored}" if stored else None
    return [p for p in (socket, store) if p]


def _tcp_problems(tcp: str, store: str, out: list[str]) -> list[str]:
    """Whether serve could listen on ``[server] tcp``: bound (and let go) as serve binds it,
    unless a daemon serving this config holds the ``store``, and so the port too."""
    from codelegate.daemon.serving.binding import ServerError, bind_tcp, store_holder

    holder = store_holder(store)
    if holder is not None:
        out.append(f"tcp: {tcp} is served now by the daemon (pid {holder}) holding the store")
        return []
    try:
        bind_tcp(tcp).close()
    except ServerError as exc:
        return [f"server.tcp: {exc}"]
    return []


def _token_problems(path: str) -> list[str]:
    from codelegate.policy.checks import token_problem

    try:
        with open(path, "rb") as fh:
            token, mode = fh.read(), os.fstat(fh.fileno()).st_mode
    except OSError as exc:
        return [f"server.token_file: cannot read {path} ({exc.strerror})"]
    problem = token_problem(token, mode)  # the very check serve makes at start-up
    return [problem] if problem else []


def version_note(reported: str | None) -> str:
    """``claude --version``'s answer, said against the version the project pins and tests."""
    if reported is None:
        return "did not answer --version"
    if reported == CLAUDE_CODE_VERSION:
        return f"{reported} (the pinned version)"
    return (
        f"{reported} -- WARNING: not the pinned {CLAUDE_CODE_VERSION}, which the translator and "
        "tests are checked against; its stream-json may differ (README, upgrading the CLI)"
    )


def _doctor_fanout(fanout: FanoutConfig, out: list[str]) -> list[str]:
    """``[fanout]``: where frames go, and whether that Redis answers."""
    from codelegate.daemon.fanout_redis import probe  # redis-py only when [fanout] is configured
    from codelegate.policy.config import fanout_host_id, redacted_url

    host_id = fanout_host_id(fanout, socket.gethostname())
    out.append(
        f"fanout: {redacted_url(fanout.redis_url)} prefix {fanout.stream_prefix!r}"
        f" host_id {host_id!r}"
    )
    problem = probe(fanout)
    return [f"fanout.redis_url: {problem}"] if problem else []


def translate_stream(src: BinaryIO, dst: BinaryIO, *, cwd: str, run_id: str) -> None:
    """Frames the daemon would send for a stream-json transcript, one JSON object per line.

    Time is fixed at 0 so that the output of a transcript is reproducible.
    """
    from codelegate.translator import RunContext
    from codelegate.translator.transcript import translate_chunks

    chunks = iter(lambda: src.read(1 << 16), b"")
    for block in translate_chunks(chunks, RunContext(run_id=run_id, cwd=cwd, started_at=0.0)):
        dst.write(block)
    dst.flush()


if __name__ == "__main__":
    sys.exit(main())
