"""The child environment of one config: the allowlist of ``policy.environment`` applied.

Above the config schema (it reads ``[claude]``), below the launch that composes it: what a run's
CLI gets of the daemon's environment, what of it are credentials, and which auth variables
``doctor`` may name.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Final

from codelegate.policy.config import Config
from codelegate.policy.environment import (
    AUTH_VARS,
    BEDROCK_VARS,
    NONESSENTIAL_TRAFFIC_VAR,
    RUN_MARKER_VAR,
    VERTEX_VARS,
    always_passed,
    is_vertex_var,
    refused_pass_env,
    secret_values,
)

# Where the pinned CLI keeps a login of its own (`claude` then /login), as its bundle reads it:
# .credentials.json in $CLAUDE_SECURESTORAGE_CONFIG_DIR when that is set (empty: ~/.claude),
# else in its config folder, $CLAUDE_CONFIG_DIR or ~/.claude.
CLI_LOGIN_FILE: Final = ".credentials.json"
SECURE_STORAGE_VAR: Final = "CLAUDE_SECURESTORAGE_CONFIG_DIR"
# Auth variables that say where, not who: no credential by themselves.
WHERE_VARS: Final = frozenset({"CLAUDE_CONFIG_DIR", "ANTHROPIC_BASE_URL"})


def _allowed(config: Config, name: str) -> bool:
    """Whether the allowlist for this config admits ``name``."""
    claude = config.claude
    if always_passed(name):
        return True
    if claude.enable_bedrock and name in BEDROCK_VARS:
        return True
    if claude.enable_vertex and is_vertex_var(name):
        return True
    # Checked again here, not only at config load, in case a Config was built by hand.
    return name in claude.pass_env and refused_pass_env(name) is None


def _passed(config: Config, parent_env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``parent_env`` the allowlist for this config admits, as they are."""
    return {
        key: value
        for key, value in parent_env.items()
        if "\x00" not in key and "\x00" not in value and _allowed(config, key)
    }


def child_environment(
    config: Config, parent_env: Mapping[str, str], *, marker: tuple[str, str]
) -> dict[str, str]:
    """The complete environment of a run's CLI: the allowlist of ``parent_env`` plus our own."""
    name, run_id = marker
    if name != RUN_MARKER_VAR or not run_id or "\x00" in run_id:
        raise ValueError(f"the run marker must be ({RUN_MARKER_VAR!r}, <run id>)")
    env = _passed(config, parent_env)
    env[NONESSENTIAL_TRAFFIC_VAR] = "1"
    env[RUN_MARKER_VAR] = run_id
    return env


def passed_secrets(config: Config, parent_env: Mapping[str, str]) -> tuple[str, ...]:
    """The credentials of ``parent_env`` that every run gets: :func:`secret_values` of what
    :func:`child_environment` passes on, known before any run starts (the daemon masks them in
    its own log lines, which belong to no run)."""
    return secret_values(_passed(config, parent_env))


def auth_variables_present(config: Config, parent_env: Mapping[str, str]) -> list[str]:
    """Names (never values) of the authentication variables a run would get, for ``doctor``."""
    names = set(AUTH_VARS)
    if config.claude.enable_bedrock:
        names |= BEDROCK_VARS
    if config.claude.enable_vertex:
        names |= VERTEX_VARS
    return sorted(name for name in names if parent_env.get(name))


def credential_variables(config: Config, parent_env: Mapping[str, str]) -> list[str]:
    """:func:`auth_variables_present` but those that only say where the CLI looks or goes."""
    return [name for name in auth_variables_present(config, parent_env) if name not in WHERE_VARS]


def cli_login_file(config: Config, parent_env: Mapping[str, str], *, home: str) -> str:
    """The file a run's CLI would read its own login from, in the environment a run gets.

    ``home``: the daemon's home in the user database, for an environment without HOME (where
    the CLI's ``os.homedir()`` finds it too).
    """
    env = _passed(config, parent_env)
    default = posixpath.join(env.get("HOME") or home, ".claude")
    if SECURE_STORAGE_VAR in env:
        folder = env[SECURE_STORAGE_VAR] or default
    else:
        folder = env.get("CLAUDE_CONFIG_DIR") or default
    return posixpath.join(folder, CLI_LOGIN_FILE)
