"""The operator's config: the TOML schema of DESIGN "Config", parsed once and validated.

Every section is a frozen msgspec Struct with ``forbid_unknown_fields``, so a typo is an error
naming the key rather than a silently ignored setting. Checks that need the filesystem live in
``policy.checks`` and take callables, so this module stays pure.
"""

from __future__ import annotations

import posixpath
import re
import tomllib
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Final

import msgspec

from codelegate.policy.approvals import ApprovalsConfig, approvals_problem
from codelegate.policy.environment import refused_pass_env
from codelegate.policy.errors import ConfigError
from codelegate.policy.limits import LimitsConfig, limits_problem
from codelegate.policy.modes import REQUEST_MODES, RequestMode, names_bypass
from codelegate.policy.paths import is_inside
from codelegate.policy.settings import refused_settings

_Port = Annotated[int, msgspec.Meta(ge=0, le=4_294_967_294)]
_Positive = Annotated[float, msgspec.Meta(gt=0)]


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[server]``: where the daemon listens and who may talk to it."""

    socket: str = "var/codelegate.sock"
    socket_mode: str = "0660"
    # Peers checked with SO_PEERCRED; empty lists mean "the daemon's own uid only".
    allowed_uids: tuple[_Port, ...] = ()
    allowed_gids: tuple[_Port, ...] = ()
    tcp: str | None = None
    token_file: str | None = None
    allowed_origins: tuple[str, ...] = ()
    # How long a connection may stay open without sending a whole request head: a new one
    # before its first request, a kept-alive one between requests. Streams being answered
    # (WebSocket, NDJSON, a waiting POST) are not idle. Above the 15 s after which aiohttp's
    # client (and most others) drop a pooled connection: none reuses one the daemon is closing.
    idle_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 30.0
    # Open connections per listener: past its cap, a new connection gets a 503 and is closed,
    # so that a flood on one listener cannot take every descriptor. TCP clients may be anyone
    # who can reach the port; Unix peers are local users the socket's mode let in (and many
    # WebSocket subscribers), hence a higher cap.
    tcp_max_connections: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 256
    unix_max_connections: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1024


class ClaudeConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[claude]``: the CLI binary and what a run may choose or inherit."""

    path: str = "claude"
    # Empty means callers may not choose a model: the CLI's default is used.
    allowed_models: tuple[str, ...] = ()
    pass_env: tuple[str, ...] = ()
    enable_bedrock: bool = False
    enable_vertex: bool = False
    # The only Claude Code settings a run gets (with the machine's managed settings): runs load
    # no settings file of HOME or the workspace. Passed as JSON with --settings; policy.settings
    # says which keys are refused.
    settings: dict[str, Any] = msgspec.field(default_factory=dict)


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[policy]``: the authority a delegated run gets."""

    workspaces: tuple[str, ...] = ()
    default_mode: RequestMode = "safe"
    # "auto" is left out on purpose: autonomous runs need the operator to list it.
    allowed_modes: tuple[RequestMode, ...] = ("safe", "accept_edits", "plan")
    allowed_tools: tuple[str, ...] = ()
    disallowed_tools: tuple[str, ...] = ()
    max_concurrent_runs: Annotated[int, msgspec.Meta(ge=1, le=256)] = 4
    run_timeout_s: Annotated[float, msgspec.Meta(ge=1, le=7 * 24 * 3600)] = 1800.0
    max_budget_usd: Annotated[float, msgspec.Meta(gt=0, le=10_000)] | None = None
    cancel_grace_s: Annotated[float, msgspec.Meta(ge=0, le=300)] = 5.0
    # How long a cancel waits for the CLI to end its turn on an ``interrupt`` (its session stays
    # resumable) before SIGTERM; 0 goes straight to SIGTERM.
    interrupt_grace_s: Annotated[float, msgspec.Meta(ge=0, le=60)] = 2.0


class StoreConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[store]``: the SQLite run store and how long runs are kept."""

    path: str = "var/codelegate.db"
    retention_days: Annotated[int, msgspec.Meta(ge=1, le=3650)] = 30
    max_runs: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] = 10_000


class FanoutConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[fanout]``: every frame published to Redis Streams as well (DESIGN "Beyond one host").

    The store stays the source of truth; Redis is the fleet's fan-out. Absent: nothing is
    published.
    """

    redis_url: str
    stream_prefix: str = "codelegate"
    # None: the machine's host name (the daemon asks; policy does no I/O), see fanout_host_id.
    host_id: str | None = None
    # The fleet index keeps about this many runs (a start and an end entry each); at start-up
    # the daemon catches up this many of its newest runs whose stream is behind its store.
    maxlen_runs: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] = 10_000


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The whole operator config. Relative socket/store paths are relative to the daemon's cwd."""

    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    claude: ClaudeConfig = msgspec.field(default_factory=ClaudeConfig)
    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    store: StoreConfig = msgspec.field(default_factory=StoreConfig)
    fanout: FanoutConfig | None = None
    approvals: ApprovalsConfig = msgspec.field(default_factory=ApprovalsConfig)


SECTIONS: Final[dict[str, type[msgspec.Struct]]] = {
    "server": ServerConfig,
    "claude": ClaudeConfig,
    "policy": PolicyConfig,
    "limits": LimitsConfig,
    "store": StoreConfig,
    "fanout": FanoutConfig,
    "approvals": ApprovalsConfig,
}

# A Claude Code permission rule such as ``Read``, ``Bash(git diff:*)`` or ``mcp__x__y``. It may not
# start with "-": the CLI would read it as another option.
_TOOL_RULE: Final = re.compile(r"[A-Za-z_][\w.-]*(\([^()\x00-\x1f\x7f]*\))?", re.ASCII)
MODEL_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/\[\]-]{0,199}", re.ASCII)
_SOCKET_MODE: Final = re.compile(r"0?[0-7]{3}", re.ASCII)
_ORIGIN: Final = re.compile(
    r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?|https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?"
)
# Redis keys are built from these: no spaces, no glob or hash-tag characters.
_STREAM_PREFIX: Final = re.compile(r"[A-Za-z0-9._:-]{1,64}", re.ASCII)
_HOST_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}", re.ASCII)
_REDIS_SCHEMES: Final = ("redis", "rediss", "unix")
_MSGSPEC_AT: Final = re.compile(r"(?s)(.*) - at `\$(.*)`")
_UNKNOWN_FIELD: Final = re.compile(r"Object contains unknown field `(.*)`")
_ENUM: Final = re.compile(r"Invalid enum value (.*)")


def parse_config(data: bytes, source: str) -> Config:
    """Parse and validate TOML config bytes; ``source`` names the file in every error."""
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(source, "", f"expected UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, "", f"expected valid TOML ({exc})") from None
    # Before the schema, so that a bypass attempt is refused as such, whatever key it hides in.
    for key, value in _walk(raw, ""):
        if "\x00" in value:
            raise ConfigError(source, key, "expected text without NUL bytes")
        if names_bypass(value):
            raise ConfigError(
                source,
                key,
                "bypassPermissions and the permission-skipping flags are never allowed; "
                f"remove {value!r}",
            )
    try:
        config = msgspec.convert(raw, Config)
    except msgspec.ValidationError as exc:
        key, expected = _explain(str(exc))
        raise ConfigError(source, key, expected) from None
    return _validate(config, source)


def _walk(value: object, key: str) -> Iterator[tuple[str, str]]:
    """Every string in the raw TOML (keys included) with its dotted key."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for name, item in value.items():
            child = f"{key}.{name}" if key else str(name)
            yield child, str(name)
            yield from _walk(item, child)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, f"{key}[{index}]")


def _explain(message: str) -> tuple[str, str]:
    """Turn msgspec's ``… - at `$.policy.x``` into a dotted key and an expectation."""
    match = _MSGSPEC_AT.fullmatch(message)
    text, path = (match.group(1), match.group(2).lstrip(".")) if match else (message, "")
    unknown = _UNKNOWN_FIELD.fullmatch(text)
    if unknown:
        name = unknown.group(1)
        section = SECTIONS.get(path)
        known = msgspec.structs.fields(section if section else Config)
        key = f"{path}.{name}" if path else name
        return key, f"unknown key; expected one of: {', '.join(f.name for f in known)}"
    enum = _ENUM.fullmatch(text)
    if enum and ("default_mode" in path or "allowed_modes" in path):
        return path, f"expected one of: {', '.join(REQUEST_MODES)}; got {enum.group(1)}"
    return path, text[:1].lower() + text[1:]


def _validate(config: Config, source: str) -> Config:
    """Checks the schema cannot express; returns the config with workspace roots normalised."""
    server, claude, policy = config.server, config.claude, config.policy

    def fail(key: str, expected: str) -> ConfigError:
        return ConfigError(source, key, expected)

    if not policy.workspaces:
        raise fail("policy.workspaces", "expected at least one absolute directory")
    roots: list[str] = []
    for index, root in enumerate(policy.workspaces):
        key = f"policy.workspaces[{index}]"
        if not root.startswith("/"):
            raise fail(key, f"expected an absolute path; got {root!r}")
        # normpath keeps a leading "//" (POSIX leaves its meaning open); Linux reads it as "/".
        normal = "/" + posixpath.normpath(root).lstrip("/")
        if normal == "/":
            raise fail(key, "expected a directory below /; / would contain the whole machine")
        roots.append(normal)
    if not policy.allowed_modes:
        raise fail("policy.allowed_modes", "expected at least one mode")
    if policy.default_mode not in policy.allowed_modes:
        raise fail(
            "policy.default_mode",
            f"expected one of allowed_modes ({', '.join(policy.allowed_modes)}); "
            f"got {policy.default_mode!r}",
        )
    for field in ("allowed_tools", "disallowed_tools"):
        for index, rule in enumerate(getattr(policy, field)):
            if not _TOOL_RULE.fullmatch(rule):
                raise fail(
                    f"policy.{field}[{index}]",
                    f"expected a permission rule such as 'Read' or 'Bash(git diff:*)'; "
                    f"got {rule!r}",
                )
    if not claude.path or claude.path.startswith("-"):
        raise fail("claude.path", f"expected a path to the claude binary; got {claude.path!r}")
    for index, model in enumerate(claude.allowed_models):
        if not MODEL_NAME.fullmatch(model):
            raise fail(f"claude.allowed_models[{index}]", f"expected a model name; got {model!r}")
    for index, name in enumerate(claude.pass_env):
        reason = refused_pass_env(name)
        if reason:
            raise fail(f"claude.pass_env[{index}]", reason)
    refused = refused_settings(claude.settings)
    if refused:
        key, reason = refused
        raise fail("claude.settings" + (f".{key}" if key else ""), reason)
    for key, value in (("server.socket", server.socket), ("store.path", config.store.path)):
        if not value:
            raise fail(key, "expected a path")
    if not _SOCKET_MODE.fullmatch(server.socket_mode):
        raise fail(
            "server.socket_mode",
            f"expected an octal mode such as '0660'; got {server.socket_mode!r}",
        )
    if socket_mode_bits(server) & 0o002:
        raise fail(
            "server.socket_mode", "expected a mode not writable by others (anyone could run tasks)"
        )
    if server.tcp is not None:
        try:
            parse_tcp(server.tcp)
        except ValueError as exc:
            raise fail("server.tcp", str(exc)) from None
        if not server.token_file:
            raise fail(
                "server.token_file",
                "expected a token file: the TCP listener requires a bearer token",
            )
    for index, origin in enumerate(server.allowed_origins):
        if not _ORIGIN.fullmatch(origin):
            raise fail(
                f"server.allowed_origins[{index}]",
                f"expected an origin such as 'https://chat.example.com'; got {origin!r}",
            )
    if config.fanout is not None:
        _validate_fanout(config.fanout, fail)
    problem = approvals_problem(config.approvals, policy.disallowed_tools)
    problem = problem or limits_problem(config.limits)
    if problem:
        raise fail(*problem)
    return msgspec.structs.replace(
        config, policy=msgspec.structs.replace(policy, workspaces=tuple(roots))
    )


def _validate_fanout(fanout: FanoutConfig, fail: Callable[[str, str], ConfigError]) -> None:
    problem = redis_url_problem(fanout.redis_url)
    if problem:
        raise fail("fanout.redis_url", problem)
    if not _STREAM_PREFIX.fullmatch(fanout.stream_prefix):
        raise fail(
            "fanout.stream_prefix",
            f"expected 1-64 letters, digits or ._:- such as 'codelegate'; "
            f"got {fanout.stream_prefix!r}",
        )
    if fanout.host_id is not None and not _HOST_ID.fullmatch(fanout.host_id):
        raise fail(
            "fanout.host_id",
            f"expected a host name (letters, digits, ._-); got {fanout.host_id!r}",
        )


def redis_url_problem(url: str) -> str:
    """What is wrong with a Redis URL (``""`` when nothing): redis://, rediss:// or unix://."""
    shown = redacted_url(url)
    expected = "expected a URL such as 'redis://127.0.0.1:6379/0'"
    if any(c.isspace() for c in url):
        return f"{expected}; got {shown!r}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in _REDIS_SCHEMES:
        return f"{expected} (redis://, rediss:// or unix://); got {shown!r}"
    if parts.scheme == "unix":
        ok = parts.path.startswith("/")
        return "" if ok else f"expected unix:///absolute/path; got {shown!r}"
    try:
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError:
        return f"{expected}; got a bad port in {shown!r}"
    return "" if parts.hostname else f"{expected}; got no host in {shown!r}"


def redacted_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: for logs, doctor and errors."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def fanout_host_id(fanout: FanoutConfig, hostname: str) -> str:
    """The host id this daemon publishes under: the configured one, else the host name."""
    return fanout.host_id if fanout.host_id is not None else hostname


def socket_mode_bits(server: ServerConfig) -> int:
    """The Unix socket's permission bits, from the octal string of the config."""
    return int(server.socket_mode, 8)


def parse_tcp(value: str, *, lowest_port: int = 1) -> tuple[str, int]:
    """``"127.0.0.1:8765"`` or ``"[::1]:8765"`` → (host, port); ValueError says what is wrong.

    ``lowest_port=0`` also takes port 0 (any free port: what tests listen on).
    """
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not lowest_port <= int(port) <= 65535:
        raise ValueError(f"expected host:port such as '127.0.0.1:8765'; got {value!r}")
    return host, int(port)


def development_config(cwd: str, claude_path: str, state_dir: str | None = None) -> Config:
    """Defaults for ``codelegate serve`` without a config: cwd the root, state in ``state_dir``.

    Without ``state_dir`` the state goes under ``cwd/var`` (what test fixtures use). A given
    ``state_dir`` must lie outside the root: a run may read and write anything in its workspace,
    and the store holds every run's frames.
    """
    if not cwd.startswith("/"):
        raise ValueError("development_config needs an absolute cwd")
    root = "/" + posixpath.normpath(cwd).lstrip("/")
    var = posixpath.join(root, "var") if state_dir is None else posixpath.normpath(state_dir)
    config = Config(
        server=ServerConfig(socket=posixpath.join(var, "codelegate.sock")),
        claude=ClaudeConfig(path=claude_path),
        policy=PolicyConfig(workspaces=(root,)),
        store=StoreConfig(path=posixpath.join(var, "codelegate.db")),
    )
    config = _validate(config, "development defaults")
    if state_dir is not None:
        refuse_state_in_workspace(
            config,
            "development defaults",
            cwd=root,
            hint="work in a folder below it, or move the state with XDG_STATE_HOME",
        )
    return config


def refuse_state_in_workspace(
    config: Config,
    source: str,
    *,
    cwd: str,
    realpath: Callable[[str], str] = posixpath.normpath,
    hint: str = "move it outside every workspace root",
) -> None:
    """ConfigError when the socket, the store or the token file lies inside a workspace root.

    A run may read anything in its workspace and an ``accept_edits`` run change it: the store
    holds every run's frames, the token opens the TCP listener, and the socket could be replaced.
    Relative paths are the daemon's, against ``cwd``; ``realpath`` follows symlinks when the
    caller can (the daemon passes ``os.path.realpath``), so that a link does not hide one.
    """
    owned = [("server.socket", config.server.socket), ("store.path", config.store.path)]
    if config.server.token_file:
        owned.append(("server.token_file", config.server.token_file))
    roots = [(root, realpath(root)) for root in config.policy.workspaces]
    for key, value in owned:
        path = realpath(posixpath.join(cwd, value))
        for root, real in roots:
            if is_inside(path, real):
                raise ConfigError(
                    source,
                    key,
                    f"the workspace {root} holds the daemon's state ({path}), which every run "
                    f"there could read; {hint}",
                )
