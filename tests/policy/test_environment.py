"""The child environment: exactly the allowlist, plus what policy sets itself."""

from __future__ import annotations

import secrets

import msgspec
import pytest

from codelegate.policy.child_env import auth_variables_present, child_environment, passed_secrets
from codelegate.policy.config import Config
from codelegate.policy.environment import (
    NONESSENTIAL_TRAFFIC_VAR,
    RUN_MARKER_VAR,
    refused_pass_env,
    secret_values,
)
from tests.policy.conftest import make_config

MARKER = (RUN_MARKER_VAR, "run_0123")

DAEMON_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/var/lib/codelegate",
    "USER": "codelegate",
    "LOGNAME": "codelegate",
    "SHELL": "/bin/sh",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "LC_CTYPE": "C.UTF-8",
    "TZ": "UTC",
    "TMPDIR": "/tmp",
    "ANTHROPIC_API_KEY": "sk-ant-secret",
    "ANTHROPIC_BASE_URL": "http://127.0.0.1:9999",
    "CLAUDE_CONFIG_DIR": "/var/lib/codelegate/.claude",
    # Everything below must not reach the child.
    "AWS_ACCESS_KEY_ID": "AKIAXXXXXXXXXXXXXXXX",
    "AWS_REGION": "eu-west-1",
    "CLOUD_ML_REGION": "europe-west4",
    "VERTEX_REGION_CLAUDE_3_5_SONNET": "us-east5",
    "GITHUB_TOKEN": "ghp_secret",
    "NODE_OPTIONS": "--require /tmp/evil.js",
    "LD_PRELOAD": "/tmp/evil.so",
    "NOTIFY_SOCKET": "/run/systemd/notify",
    "INVOCATION_ID": "abc",
    "lc_all": "lowercase is not a locale variable",
    "LC_": "empty suffix",
    "CODELEGATE_RUN_ID": "someone-elses-run",
    NONESSENTIAL_TRAFFIC_VAR: "0",
    "HTTPS_PROXY": "http://proxy:3128",
    "WEIRD": "a\x00b",
}

BASE = {
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "CLAUDE_CONFIG_DIR",
    NONESSENTIAL_TRAFFIC_VAR,
    RUN_MARKER_VAR,
}


def test_exactly_the_allowlist(config: Config) -> None:
    env = child_environment(config, DAEMON_ENV, marker=MARKER)
    assert set(env) == BASE
    assert env[NONESSENTIAL_TRAFFIC_VAR] == "1"
    assert env[RUN_MARKER_VAR] == "run_0123"
    assert env["ANTHROPIC_API_KEY"] == "sk-ant-secret"


def test_the_credentials_every_run_gets_are_known_before_any_run() -> None:
    # What the daemon masks in its own log lines: the same values a run's plan names, no more.
    key, token, aws = (secrets.token_urlsafe(24) for _ in range(3))
    config = make_config('[claude]\npass_env = ["GITHUB_TOKEN"]')
    parent = {**DAEMON_ENV, "ANTHROPIC_API_KEY": key, "GITHUB_TOKEN": token}
    parent["AWS_SECRET_ACCESS_KEY"] = aws  # Bedrock is off: never passed, so not a run's secret
    run = child_environment(config, parent, marker=MARKER)
    assert passed_secrets(config, parent) == secret_values(run) == tuple(sorted({key, token}))


def test_bedrock_only_when_enabled() -> None:
    config = make_config("[claude]\nenable_bedrock = true")
    env = child_environment(config, DAEMON_ENV, marker=MARKER)
    assert set(env) == BASE | {"AWS_ACCESS_KEY_ID", "AWS_REGION"}


def test_vertex_only_when_enabled() -> None:
    config = make_config("[claude]\nenable_vertex = true")
    env = child_environment(config, DAEMON_ENV, marker=MARKER)
    assert set(env) == BASE | {"CLOUD_ML_REGION", "VERTEX_REGION_CLAUDE_3_5_SONNET"}


def test_pass_env_from_the_operator() -> None:
    config = make_config('[claude]\npass_env = ["HTTPS_PROXY", "NO_PROXY"]')
    env = child_environment(config, DAEMON_ENV, marker=MARKER)
    assert set(env) == BASE | {"HTTPS_PROXY"}


def test_a_hand_built_pass_env_still_cannot_inject(config: Config) -> None:
    claude = msgspec.structs.replace(
        config.claude, pass_env=("NODE_OPTIONS", "LD_PRELOAD", RUN_MARKER_VAR, "AWS_REGION")
    )
    env = child_environment(
        msgspec.structs.replace(config, claude=claude), DAEMON_ENV, marker=MARKER
    )
    assert set(env) == BASE
    assert env[RUN_MARKER_VAR] == "run_0123"


@pytest.mark.parametrize(
    "marker", [("OTHER", "run_1"), (RUN_MARKER_VAR, ""), (RUN_MARKER_VAR, "a\x00b")]
)
def test_the_marker_must_be_ours(config: Config, marker: tuple[str, str]) -> None:
    with pytest.raises(ValueError, match="run marker"):
        child_environment(config, DAEMON_ENV, marker=marker)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("1ABC", "environment variable name"),
        ("A-B", "environment variable name"),
        ("", "environment variable name"),
        (RUN_MARKER_VAR, "set by codelegate"),
        ("CODELEGATE_ANYTHING", "set by codelegate"),
        (NONESSENTIAL_TRAFFIC_VAR, "set by codelegate"),
        ("CLAUDE_CODE_SAFE_MODE", "set by codelegate"),
        ("CLAUDE_BYPASS", "permission"),
        ("CLAUDE_CODE_DANGEROUS", "permission"),
        ("DEFAULT_PERMISSION_MODE", "permission"),
        ("LD_PRELOAD", "load code"),
        ("DYLD_INSERT_LIBRARIES", "load code"),
        ("NODE_OPTIONS", "load code"),
        ("node_options", "load code"),
        ("BASH_ENV", "load code"),
        ("PYTHONPATH", "load code"),
        ("AWS_SECRET_ACCESS_KEY", "enable_bedrock"),
        ("GOOGLE_APPLICATION_CREDENTIALS", "enable_vertex"),
        ("VERTEX_REGION_CLAUDE_X", "enable_vertex"),
    ],
)
def test_refused_pass_env(name: str, words: str) -> None:
    reason = refused_pass_env(name)
    assert reason is not None
    assert words in reason


@pytest.mark.parametrize(
    "name", ["HTTPS_PROXY", "NO_PROXY", "SSL_CERT_FILE", "CLAUDE_CODE_MAX_OUTPUT_TOKENS"]
)
def test_accepted_pass_env(name: str) -> None:
    assert refused_pass_env(name) is None


def test_auth_variables_present_names_never_values() -> None:
    env = {"ANTHROPIC_API_KEY": "sk-ant-x", "ANTHROPIC_AUTH_TOKEN": "", "AWS_REGION": "eu"}
    assert auth_variables_present(make_config(), env) == ["ANTHROPIC_API_KEY"]
    both = make_config("[claude]\nenable_bedrock = true\nenable_vertex = true")
    assert auth_variables_present(both, env) == ["ANTHROPIC_API_KEY", "AWS_REGION"]
