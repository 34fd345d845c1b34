"""check_environment: what stops a config from working on this machine, via callables."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from codelegate.policy.checks import (
    MIN_TOKEN_BYTES,
    UNIX_PATH_MAX,
    Problem,
    check_environment,
    credentials_warning,
    socket_path_problem,
    token_problem,
)
from codelegate.policy.child_env import cli_login_file
from codelegate.policy.config import Config
from tests.policy.conftest import make_config

UID = 4242


def yes(path: str) -> bool:
    return True


def check(config: Config, **callables: Any) -> list[Problem]:
    """check_environment with every callable saying yes but those given."""
    given = {"isdir": yes, "is_executable": yes, "can_enter": yes, "uid": UID, **callables}
    return check_environment(config, **given)


CONFIG = make_config(
    '[claude]\npath = "/opt/claude"\n[server]\ntcp = "127.0.0.1:8765"\ntoken_file = "/etc/tok"',
    roots=("/srv/a", "/srv/b"),
)


def test_all_good() -> None:
    problems = check(CONFIG, isfile=lambda p: True)
    assert problems == []


def test_every_problem_named() -> None:
    problems = check(
        CONFIG,
        isdir=lambda p: p == "/srv/a",
        is_executable=lambda p: False,
        isfile=lambda p: False,
    )
    assert [str(p) for p in problems] == [
        "policy.workspaces[1]: /srv/b is not an existing directory",
        "claude.path: /opt/claude is not an executable Claude Code CLI",
        "server.token_file: /etc/tok is not an existing file",
    ]
    assert problems[0] == Problem(key="policy.workspaces[1]", message=problems[0].message)


def test_token_file_checked_only_when_asked_and_configured() -> None:
    assert check(CONFIG) == []
    no_tcp = make_config()
    assert check(no_tcp, isfile=lambda p: False) == []


SANDBOXED = make_config("[claude.settings.sandbox]\nenabled = true")


def test_a_sandbox_without_its_programs_is_a_problem() -> None:
    problems = check(SANDBOXED, is_executable=lambda p: p not in ("bwrap", "socat"))
    assert [str(p) for p in problems] == [
        "claude.settings.sandbox: the CLI's sandbox needs bwrap and socat on PATH "
        "(apt install bubblewrap socat)"
    ]
    only_socat = check(SANDBOXED, is_executable=lambda p: p != "socat")
    assert "needs socat on PATH" in str(only_socat[0])


def test_the_sandbox_programs_are_checked_only_when_the_sandbox_is_on() -> None:
    for config in (make_config(), make_config("[claude.settings.sandbox]\nenabled = false")):
        assert check(config, is_executable=lambda p: p == "claude") == []
    assert check(SANDBOXED) == []


def test_a_bearer_token_needs_sixteen_bytes_whitespace_aside() -> None:
    token = secrets.token_hex(MIN_TOKEN_BYTES)[:MIN_TOKEN_BYTES].encode()
    assert token_problem(token + b"\n", 0o100600) is None
    problem = token_problem(b"  " + token[:-1] + b"\n", 0o100600)
    assert problem is not None
    assert "at least 16 bytes" in problem


def test_a_token_file_open_to_every_user_is_refused_whatever_it_holds() -> None:
    token = secrets.token_hex(MIN_TOKEN_BYTES).encode()
    assert token_problem(token, 0o100640) is None  # a group may share it
    for mode in (0o100644, 0o100604, 0o100602, 0o100601):
        problem = token_problem(token, mode)
        assert problem is not None
        assert f"mode {mode & 0o777:04o}" in problem
        assert "chmod o-rwx" in problem


def test_a_root_the_daemons_uid_may_not_enter_is_named_with_the_uid_and_the_fix() -> None:
    # Accepted before, and every run then failed as "cannot start claude: Permission denied".
    problems = check(CONFIG, can_enter=lambda p: p != "/srv/b")
    assert [p.key for p in problems] == ["policy.workspaces[1]"]
    message = problems[0].message
    assert message.startswith(
        f"uid {UID} may not enter /srv/b (Permission denied: no search permission)"
    )
    assert f"give uid {UID} search permission there" in message
    # A folder above every root: each root names it, not "is not an existing directory".
    above = check(CONFIG, can_enter=lambda p: p != "/srv", isdir=lambda p: p == "/srv")
    assert [str(p).split(",")[0] for p in above] == [
        f"policy.workspaces[{i}]: uid {UID} may not enter /srv (Permission denied: no search"
        " permission)"
        for i in (0, 1)
    ]


def test_a_missing_root_that_also_cannot_be_entered_is_said_to_be_missing() -> None:
    problems = check(CONFIG, isdir=lambda p: p != "/srv/a", can_enter=lambda p: p != "/srv/a")
    assert [str(p) for p in problems] == [
        "policy.workspaces[0]: /srv/a is not an existing directory"
    ]


def test_a_socket_path_over_the_unix_limit_is_named_with_its_length() -> None:
    fits = "/" + "s" * (UNIX_PATH_MAX - 1)
    assert socket_path_problem(fits) is None
    problem = socket_path_problem(fits + "s")
    assert problem == (
        f"{fits}s is 108 bytes long, over the 107 a Unix socket path may have; "
        "choose a shorter [server] socket"
    )
    wide = "/" + "é" * 54  # 109 bytes in 55 characters: the limit is in bytes
    assert socket_path_problem(wide) is not None
    assert "109 bytes" in str(socket_path_problem(wide))


HOME = "/home/op"


def test_no_credential_variable_and_no_cli_login_is_a_warning_naming_the_file() -> None:
    config = make_config()
    warning = credentials_warning(config, {"HOME": HOME}, home="/nowhere", isfile=lambda p: False)
    assert warning is not None
    assert warning.startswith(
        "no credentials: none of ANTHROPIC_API_KEY, ANTHROPIC_AUTH_TOKEN, CLAUDE_CODE_OAUTH_TOKEN"
        f" is set here and the CLI has no login of its own in {HOME}/.claude/.credentials.json"
    )
    assert "export ANTHROPIC_API_KEY" in warning
    assert "/login" in warning
    login = f"{HOME}/.claude/.credentials.json"
    assert credentials_warning(config, {"HOME": HOME}, home="/x", isfile={login}.__contains__) is (
        None
    )
    key = secrets.token_hex(16)
    for name in ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_AUTH_TOKEN"):
        assert credentials_warning(config, {name: key}, home=HOME, isfile=lambda p: False) is None


def test_where_the_cli_looks_is_no_credential() -> None:
    env = {"CLAUDE_CONFIG_DIR": "/etc/claude", "ANTHROPIC_BASE_URL": "https://gw.example"}
    warning = credentials_warning(make_config(), env, home=HOME, isfile=lambda p: False)
    assert warning is not None
    assert "/etc/claude/.credentials.json" in warning


def test_bedrock_credentials_count_once_bedrock_is_enabled() -> None:
    env = {"AWS_PROFILE": "ops", "CLAUDE_CODE_USE_BEDROCK": "1"}
    assert credentials_warning(make_config(), env, home=HOME, isfile=lambda p: False)
    bedrock = make_config("[claude]\nenable_bedrock = true")
    assert credentials_warning(bedrock, env, home=HOME, isfile=lambda p: False) is None


@pytest.mark.parametrize(
    ("extra", "env", "expected"),
    [
        ("", {"HOME": HOME}, f"{HOME}/.claude"),
        ("", {}, "/db/home/.claude"),  # no HOME: the user database's, as os.homedir()
        ("", {"HOME": ""}, "/db/home/.claude"),
        ("", {"HOME": HOME, "CLAUDE_CONFIG_DIR": "/etc/claude"}, "/etc/claude"),
        ("", {"HOME": HOME, "CLAUDE_CONFIG_DIR": ""}, f"{HOME}/.claude"),
        # The CLI's secure storage folder wins, but only a run that is passed it sees it.
        ("", {"HOME": HOME, "CLAUDE_SECURESTORAGE_CONFIG_DIR": "/s"}, f"{HOME}/.claude"),
        (
            '[claude]\npass_env = ["CLAUDE_SECURESTORAGE_CONFIG_DIR"]',
            {
                "HOME": HOME,
                "CLAUDE_CONFIG_DIR": "/etc/claude",
                "CLAUDE_SECURESTORAGE_CONFIG_DIR": "/s",
            },
            "/s",
        ),
        (
            '[claude]\npass_env = ["CLAUDE_SECURESTORAGE_CONFIG_DIR"]',
            {
                "HOME": HOME,
                "CLAUDE_CONFIG_DIR": "/etc/claude",
                "CLAUDE_SECURESTORAGE_CONFIG_DIR": "",
            },
            f"{HOME}/.claude",
        ),
    ],
)
def test_the_cli_login_file_is_where_the_pinned_cli_reads_it_in_a_runs_environment(
    extra: str, env: dict[str, str], expected: str
) -> None:
    login = cli_login_file(make_config(extra), env, home="/db/home")
    assert login == f"{expected}/.credentials.json"
