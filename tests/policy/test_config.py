"""Config parsing: the schema, its defaults, and that every refusal names file, key, expectation."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from codelegate.policy.config import (
    SECTIONS,
    Config,
    development_config,
    parse_config,
    parse_tcp,
    refuse_state_in_workspace,
    socket_mode_bits,
)
from codelegate.policy.errors import ConfigError
from codelegate.policy.settings import MAX_SETTINGS_BYTES
from tests.policy.conftest import ROOT, SOURCE, make_config

FULL = b"""
[server]
socket = "/run/codelegate/codelegate.sock"
socket_mode = "0660"
allowed_uids = [1000]
allowed_gids = [1001, 1002]
tcp = "127.0.0.1:8765"
token_file = "/etc/codelegate/token"
allowed_origins = ["https://chat.example.com", "http://127.0.0.1:3000", "http://[::1]:3000"]

[claude]
path = "/opt/claude/bin/claude"
allowed_models = ["sonnet", "claude-opus-4-1"]
pass_env = ["HTTPS_PROXY", "NO_PROXY"]
enable_bedrock = true
enable_vertex = false

[policy]
workspaces = ["/srv/workspaces/", "/home/dev/projects"]
default_mode = "safe"
allowed_modes = ["safe", "accept_edits", "plan", "auto"]
allowed_tools = ["Read", "Bash(git diff:*)", "mcp__fs__read_file"]
disallowed_tools = ["WebFetch"]
max_concurrent_runs = 8
run_timeout_s = 900
max_budget_usd = 2.5
cancel_grace_s = 3
interrupt_grace_s = 0.5

[limits]
arg_bytes = 8192
result_bytes = 8192
final_result_bytes = 131072
line_bytes = 16777216
task_bytes = 524288
text_chars = 32000
replay_frames = 20000
subscriber_queue = 256
stderr_lines = 500
pending_input_bytes = 524288

[store]
path = "/var/lib/codelegate/runs.db"
retention_days = 7
max_runs = 500
"""


def test_every_key_parses() -> None:
    config = parse_config(FULL, SOURCE)
    assert config.server.tcp == "127.0.0.1:8765"
    assert config.server.allowed_gids == (1001, 1002)
    assert config.claude.enable_bedrock is True
    # Roots are normalised: the trailing slash would break component-wise containment.
    assert config.policy.workspaces == ("/srv/workspaces", "/home/dev/projects")
    assert config.policy.run_timeout_s == 900.0
    assert config.policy.cancel_grace_s == 3.0
    assert config.policy.interrupt_grace_s == 0.5
    assert config.limits.stderr_lines == 500
    assert config.limits.pending_input_cap == 524288  # as set, not 4 x task_bytes
    assert config.store.max_runs == 500


def test_defaults() -> None:
    config = make_config()
    assert config.server.socket == "var/codelegate.sock"
    assert config.server.socket_mode == "0660"
    assert socket_mode_bits(config.server) == 0o660
    assert config.claude.path == "claude"
    assert config.claude.allowed_models == ()
    assert config.policy.default_mode == "safe"
    assert "auto" not in config.policy.allowed_modes
    assert config.policy.max_concurrent_runs == 4
    assert config.policy.max_budget_usd is None
    assert config.policy.interrupt_grace_s == 2.0
    assert config.limits.task_bytes == 1024 * 1024
    assert config.limits.line_bytes == 8 * 1024 * 1024
    assert config.limits.pending_input_cap == 4 * config.limits.task_bytes
    assert config.store.path == "var/codelegate.db"
    assert config.store.retention_days == 30


REFUSED = [
    # (toml, dotted key, words the message must contain)
    ("[policy]\nworkspaces = []", "policy.workspaces", "at least one"),
    ("", "policy.workspaces", "at least one"),
    ('[policy]\nworkspaces = ["srv/ws"]', "policy.workspaces[0]", "absolute"),
    ('[policy]\nworkspaces = ["/ok", "~/x"]', "policy.workspaces[1]", "absolute"),
    ('[policy]\nworkspaces = ["/"]', "policy.workspaces[0]", "whole machine"),
    ('[policy]\nworkspaces = ["//"]', "policy.workspaces[0]", "whole machine"),
    ('[policy]\nworkspaces = ["/a"]\nallowed_modes = []', "policy.allowed_modes", "at least"),
    (
        '[policy]\nworkspaces = ["/a"]\ndefault_mode = "auto"',
        "policy.default_mode",
        "allowed_modes",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\ndefault_mode = "plan"\nallowed_modes = ["safe"]',
        "policy.default_mode",
        "allowed_modes (safe)",
    ),
    ('[policy]\nworkspaces = ["/a"]\ndefault_mode = "yolo"', "policy.default_mode", "accept_edits"),
    ('[policy]\nworkspaces = ["/a"]\nallowed_modes = ["x"]', "policy.allowed_modes[0]", "plan"),
    ('[policy]\nworkspaces = ["/a"]\nallowed_tools = ["-x"]', "policy.allowed_tools[0]", "rule"),
    (
        '[policy]\nworkspaces = ["/a"]\ndisallowed_tools = ["Bash("]',
        "policy.disallowed_tools[0]",
        "rule",
    ),
    ('[policy]\nworkspaces = ["/a"]\nallowed_tools = [""]', "policy.allowed_tools[0]", "rule"),
    (
        '[policy]\nworkspaces = ["/a"]\nmax_concurrent_runs = 0',
        "policy.max_concurrent_runs",
        ">= 1",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\nmax_concurrent_runs = 1000',
        "policy.max_concurrent_runs",
        "<= 256",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\nmax_concurrent_runs = "4"',
        "policy.max_concurrent_runs",
        "`int`, got `str`",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\nmax_concurrent_runs = true',
        "policy.max_concurrent_runs",
        "got `bool`",
    ),
    ('[policy]\nworkspaces = ["/a"]\nrun_timeout_s = 0', "policy.run_timeout_s", ">= 1"),
    ('[policy]\nworkspaces = ["/a"]\nrun_timeout_s = inf', "policy.run_timeout_s", "<="),
    ('[policy]\nworkspaces = ["/a"]\nmax_budget_usd = 0', "policy.max_budget_usd", "> 0"),
    ('[policy]\nworkspaces = ["/a"]\nmax_budget_usd = nan', "policy.max_budget_usd", "> 0"),
    ('[policy]\nworkspaces = ["/a"]\ncancel_grace_s = -1', "policy.cancel_grace_s", ">= 0"),
    ('[policy]\nworkspaces = ["/a"]\ninterrupt_grace_s = -1', "policy.interrupt_grace_s", ">= 0"),
    ('[policy]\nworkspaces = ["/a"]\ninterrupt_grace_s = 61', "policy.interrupt_grace_s", "<= 60"),
    ('[policy]\nworkspaces = ["/a"]\ninterrupt_grace_s = nan', "policy.interrupt_grace_s", ""),
    ('[policy]\nworkspaces = ["/a"]\nworkspace = ["/b"]', "policy.workspace", "workspaces,"),
    ('[policy]\nworkspaces = ["/a"]\n[polcy]\nx = 1', "polcy", "server, claude, policy"),
    ("policy = 3", "policy", "expected `object`, got `int`"),
    ('[policy]\nworkspaces = ["/a"]\n[limits]\narg_bytes = 1', "limits.arg_bytes", ">= 256"),
    (
        '[policy]\nworkspaces = ["/a"]\n[limits]\ntask_bytes = 99999999999',
        "limits.task_bytes",
        "<=",
    ),
    ('[policy]\nworkspaces = ["/a"]\n[limits]\nline_bytes = 10', "limits.line_bytes", ">="),
    (
        '[policy]\nworkspaces = ["/a"]\n[limits]\npending_inputs = 0',
        "limits.pending_inputs",
        ">= 1",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[limits]\ntask_bytes = 4096\npending_input_bytes = 4095',
        "limits.pending_input_bytes",
        "at least task_bytes (4096)",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[limits]\npending_input_bytes = 1023',
        "limits.pending_input_bytes",
        ">= 1024",
    ),
    ('[policy]\nworkspaces = ["/a"]\n[limits]\nsize = 10', "limits.size", "arg_bytes"),
    ('[policy]\nworkspaces = ["/a"]\n[store]\nretention_days = 0', "store.retention_days", ">= 1"),
    ('[policy]\nworkspaces = ["/a"]\n[store]\nmax_runs = 0', "store.max_runs", ">= 1"),
    ('[policy]\nworkspaces = ["/a"]\n[store]\npath = ""', "store.path", "a path"),
    ('[policy]\nworkspaces = ["/a"]\n[server]\nsocket = ""', "server.socket", "a path"),
    ('[policy]\nworkspaces = ["/a"]\n[server]\nsocket_mode = 432', "server.socket_mode", "`str`"),
    ('[policy]\nworkspaces = ["/a"]\n[server]\nsocket_mode = "rw"', "server.socket_mode", "octal"),
    (
        '[policy]\nworkspaces = ["/a"]\n[server]\nsocket_mode = "0666"',
        "server.socket_mode",
        "others",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[server]\nallowed_uids = [-1]',
        "server.allowed_uids[0]",
        ">= 0",
    ),
    ('[policy]\nworkspaces = ["/a"]\n[server]\ntcp = "8765"', "server.tcp", "host:port"),
    (
        '[policy]\nworkspaces = ["/a"]\n[server]\ntcp = "127.0.0.1:8765"',
        "server.token_file",
        "bearer",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[server]\nallowed_origins = ["*"]',
        "server.allowed_origins[0]",
        "origin",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[server]\nallowed_origins = ["https://x.org/path"]',
        "server.allowed_origins[0]",
        "origin",
    ),
    ('[policy]\nworkspaces = ["/a"]\n[claude]\npath = ""', "claude.path", "claude binary"),
    ('[policy]\nworkspaces = ["/a"]\n[claude]\npath = "--help"', "claude.path", "claude binary"),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude]\nallowed_models = ["-x"]',
        "claude.allowed_models[0]",
        "model",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude]\npass_env = ["LD_PRELOAD"]',
        "claude.pass_env[0]",
        "load code",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude]\nenable_vertex = "yes"',
        "claude.enable_vertex",
        "`bool`",
    ),
    ('[policy]\nworkspaces = ["/a"]\n[claude]\nmodel = "x"', "claude.model", "allowed_models"),
    ('[policy]\nworkspaces = ["/a\\u0000b"]', "policy.workspaces[0]", "NUL"),
    # [claude.settings] (policy/settings.py), refused like every other key
    (
        '[policy]\nworkspaces = ["/a"]\n[claude.settings.permissions]\nallow = ["Bash"]',
        "claude.settings.permissions",
        "[policy]",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n'
        '[claude.settings.permissions]\nadditionalDirectories = ["/"]',
        "claude.settings.permissions",
        "workspaces",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude.settings]\nenv = "X=1"',
        "claude.settings.env",
        "table",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude.settings.env]\nDEBUG = 1',
        "claude.settings.env.DEBUG",
        "text value; got int",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude.settings.env]\nANTHROPIC_API_KEY = "sk-ant-x"',
        "claude.settings.env.ANTHROPIC_API_KEY",
        "daemon's environment",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude.settings.env]\nanthropic_auth_token = "x"',
        "claude.settings.env.anthropic_auth_token",
        "daemon's environment",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude.settings.env]\nNODE_OPTIONS = "-r x"',
        "claude.settings.env.NODE_OPTIONS",
        "load code",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude.settings.env]\nLD_PRELOAD = "/x.so"',
        "claude.settings.env.LD_PRELOAD",
        "load code",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude.settings.env]\nCLAUDE_CODE_SAFE_MODE = "0"',
        "claude.settings.env.CLAUDE_CODE_SAFE_MODE",
        "set by codelegate",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude.settings.env]\nCLAUDE_CODE_USE_BEDROCK = "1"',
        "claude.settings.env.CLAUDE_CODE_USE_BEDROCK",
        "enable_bedrock",
    ),
    # Each string alone is harmless; read as one argument they spell a bypass flag.
    (
        '[policy]\nworkspaces = ["/a"]\n[claude.settings]\na = "skip"\npermissionz = 1',
        "claude.settings",
        "bypass",
    ),
    (
        f'[policy]\nworkspaces = ["/a"]\n[claude.settings]\nnote = "{"x" * MAX_SETTINGS_BYTES}"',
        "claude.settings",
        "bytes",
    ),
    ('[policy]\nworkspaces = ["/a"]\nwhen = 1979-05-27', "policy.when", "unknown key"),
]


@pytest.mark.parametrize(("toml", "key", "words"), REFUSED)
def test_refused_configs_name_file_key_and_expectation(toml: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(toml.encode(), SOURCE)
    error = caught.value
    assert error.source == SOURCE
    assert error.key == key
    assert words in error.expected
    assert str(error).startswith(f"{SOURCE}: {key}: ")


BYPASS = [
    ('[policy]\nworkspaces = ["/a"]\ndefault_mode = "bypassPermissions"', "policy.default_mode"),
    (
        '[policy]\nworkspaces = ["/a"]\nallowed_modes = ["safe", "bypass"]',
        "policy.allowed_modes[1]",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\nallowed_modes = ["BYPASS_PERMISSIONS"]',
        "policy.allowed_modes[0]",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n'
        'allowed_tools = ["Bash(claude --dangerously-skip-permissions:*)"]',
        "policy.allowed_tools[0]",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n'
        'disallowed_tools = ["--allow-dangerously-skip-permissions"]',
        "policy.disallowed_tools[0]",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude]\npath = "claude --dangerously-skip-permissions"',
        "claude.path",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude]\nallowed_models = ["bypass-permissions"]',
        "claude.allowed_models[0]",
    ),
    (
        '[policy]\nworkspaces = ["/a"]\n[claude]\npass_env = ["SKIP_PERMISSIONS"]',
        "claude.pass_env[0]",
    ),
    ('[policy]\nworkspaces = ["/a"]\nbypassPermissions = true', "policy.bypassPermissions"),
    ('[policy]\nworkspaces = ["/a"]\n[policy.x]\nmode = "bypassPermissions"', "policy.x.mode"),
]


@pytest.mark.parametrize(("toml", "key"), BYPASS)
def test_bypass_is_refused_wherever_it_hides(toml: str, key: str) -> None:
    with pytest.raises(ConfigError, match="never allowed") as caught:
        parse_config(toml.encode(), SOURCE)
    assert caught.value.key == key


def test_invalid_toml_names_the_file_and_position() -> None:
    with pytest.raises(ConfigError, match=r"expected valid TOML .*line 1") as caught:
        parse_config(b"[policy\n", SOURCE)
    assert caught.value.key == ""
    assert str(caught.value).startswith(SOURCE + ": expected valid TOML")


def test_non_utf8_is_refused() -> None:
    with pytest.raises(ConfigError, match="UTF-8"):
        parse_config(b"\xff\xfe", SOURCE)


def test_auto_needs_to_be_listed_explicitly() -> None:
    config = make_config('default_mode = "auto"\nallowed_modes = ["auto", "safe"]')
    assert config.policy.default_mode == "auto"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:8765", ("127.0.0.1", 8765)),
        ("[::1]:80", ("::1", 80)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_parse_tcp(value: str, expected: tuple[str, int]) -> None:
    assert parse_tcp(value) == expected


@pytest.mark.parametrize("value", ["8765", ":8765", "[]:80", "h:0", "h:65536", "h:http", "h:"])
def test_parse_tcp_refuses(value: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        parse_tcp(value)


def test_development_config() -> None:
    config = development_config("/home/dev/proj/", "/opt/claude/bin/claude")
    assert isinstance(config, Config)
    assert config.policy.workspaces == ("/home/dev/proj",)
    assert config.server.socket == "/home/dev/proj/var/codelegate.sock"
    assert config.store.path == "/home/dev/proj/var/codelegate.db"
    assert config.claude.path == "/opt/claude/bin/claude"
    assert config.policy.default_mode == "safe"


def test_development_config_keeps_its_state_where_it_is_told_outside_the_root() -> None:
    config = development_config("/home/dev/proj", "claude", "/home/dev/.local/state/codelegate")
    assert config.server.socket == "/home/dev/.local/state/codelegate/codelegate.sock"
    assert config.store.path == "/home/dev/.local/state/codelegate/codelegate.db"
    for root in ("/home/dev", "/home/dev/.local/state/codelegate"):
        with pytest.raises(ConfigError, match="holds the daemon's state"):
            development_config(root, "claude", "/home/dev/.local/state/codelegate")
    # A sibling whose name starts like the root is not inside it.
    assert development_config("/home/dev/st", "claude", "/home/dev/state").policy.workspaces


def parsed(text: str) -> Config:
    return parse_config(text.encode(), SOURCE)


def test_an_explicit_config_whose_default_state_lands_in_the_workspace_is_refused() -> None:
    # Every key is optional: the relative default paths land in the daemon's cwd, here the root.
    config = parsed('[policy]\nworkspaces = ["/srv/ws"]\n')
    with pytest.raises(ConfigError, match="holds the daemon's state") as caught:
        refuse_state_in_workspace(config, SOURCE, cwd="/srv/ws/sub")
    assert caught.value.source == SOURCE
    assert caught.value.key == "server.socket"
    assert "/srv/ws/sub/var/codelegate.sock" in caught.value.expected
    refuse_state_in_workspace(config, SOURCE, cwd="/srv/wsx")  # a sibling is outside


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ('[store]\npath = "/srv/ws/.state/e.db"\n', "store.path"),
        ('[server]\ntcp = "127.0.0.1:8765"\ntoken_file = "/srv/ws/token"\n', "server.token_file"),
    ],
)
def test_a_store_or_token_file_inside_a_workspace_root_is_refused_by_name(
    section: str, key: str
) -> None:
    state = '[server]\nsocket = "/run/codelegate/c.sock"\n' if "[server]" not in section else ""
    config = parsed(f'{state}{section}[policy]\nworkspaces = ["/srv/a", "/srv/ws"]\n')
    with pytest.raises(ConfigError) as caught:
        refuse_state_in_workspace(config, SOURCE, cwd="/")
    assert caught.value.key == key
    assert "the workspace /srv/ws holds" in caught.value.expected


def test_state_outside_every_root_passes_and_a_symlink_into_one_does_not() -> None:
    config = parsed(
        '[server]\nsocket = "/run/codelegate/c.sock"\ntcp = "127.0.0.1:8765"\n'
        'token_file = "/etc/codelegate/token"\n[store]\npath = "/var/lib/codelegate/c.db"\n'
        '[policy]\nworkspaces = ["/srv/ws"]\n'
    )
    refuse_state_in_workspace(config, SOURCE, cwd="/")
    links = {"/var/lib/codelegate/c.db": "/srv/ws/hidden/c.db"}
    with pytest.raises(ConfigError) as caught:
        refuse_state_in_workspace(config, SOURCE, cwd="/", realpath=lambda p: links.get(p, p))
    assert caught.value.key == "store.path"
    assert "/srv/ws/hidden/c.db" in caught.value.expected


def test_development_config_needs_an_absolute_cwd() -> None:
    with pytest.raises(ValueError, match="absolute"):
        development_config("proj", "claude")


def test_development_config_refuses_root_cwd() -> None:
    with pytest.raises(ConfigError, match="whole machine") as caught:
        development_config("/", "claude")
    assert caught.value.source == "development defaults"


def test_config_root_constant_is_absolute() -> None:
    assert make_config().policy.workspaces == (ROOT,)


def test_roots_are_normalised_to_one_leading_slash() -> None:
    config = make_config(roots=("//srv/ws/", "/srv/a/./b"))
    assert config.policy.workspaces == ("/srv/ws", "/srv/a/b")


def test_the_documented_example_config_parses() -> None:
    """tests/policy/example_config.toml is the README's config reference: it must stay valid."""
    path = Path(__file__).with_name("example_config.toml")
    config = parse_config(path.read_bytes(), str(path))
    assert config.server.tcp == "127.0.0.1:8765"
    assert config.policy.workspaces == ("/srv/workspaces", "/home/dev/projects")
    assert config.claude.settings["sandbox"]["failIfUnavailable"] is True
    lines = path.read_text().splitlines()
    documented = {line.split("=")[0].strip() for line in lines}
    # A key holding a table is documented by its [section.key] header.
    documented |= {line.strip("[]").split(".")[1] for line in lines if line.startswith("[claude.")}
    for section, struct in SECTIONS.items():
        for field in msgspec.structs.fields(struct):
            assert field.name in documented, f"[{section}] {field.name} is not documented"
