"""[claude.settings]: the operator's one place for Claude Code settings, checked, passed as JSON."""

from __future__ import annotations

import json

import msgspec
import pytest

from codelegate.policy.config import Config
from codelegate.policy.errors import ConfigError, PolicyError
from codelegate.policy.launch import build_argv, resolve_mode
from codelegate.policy.settings import refused_settings, settings_json
from tests.policy.conftest import flag_values, make_config

SID = "0b6f6d52-3b9e-4bb1-9d4c-5a3e2f0c1d2e"
SANDBOX = """
[claude.settings]
model = "sonnet"
[claude.settings.env]
NO_PROXY = "localhost"
[claude.settings.sandbox]
enabled = true
failIfUnavailable = true
[claude.settings.sandbox.filesystem]
denyRead = ["/var/lib/codelegate"]
"""


def with_settings(toml: str) -> Config:
    return make_config(toml)


def argv_of(config: Config) -> tuple[str, ...]:
    return build_argv(config, mode=resolve_mode(config, None), session_id=SID, resumed=False)


def test_the_operators_settings_reach_the_cli_as_one_json_argument() -> None:
    argv = argv_of(with_settings(SANDBOX))
    (settings,) = flag_values(argv, "--settings")
    assert json.loads(settings) == {
        "env": {"NO_PROXY": "localhost"},
        "model": "sonnet",
        "sandbox": {
            "enabled": True,
            "failIfUnavailable": True,
            "filesystem": {"denyRead": ["/var/lib/codelegate"]},
        },
    }
    # Still no settings file: the sources stay empty, whatever the operator's settings say.
    assert flag_values(argv, "--setting-sources") == [""]


def test_without_settings_no_settings_argument_is_passed() -> None:
    assert "--settings" not in argv_of(make_config())


def test_the_json_is_the_same_for_the_same_table_whatever_the_key_order() -> None:
    a = settings_json({"b": 1, "a": {"d": 2, "c": 3}})
    assert a == settings_json({"a": {"c": 3, "d": 2}, "b": 1}) == '{"a":{"c":3,"d":2},"b":1}'


@pytest.mark.parametrize(
    "toml",
    [
        '[claude.settings]\ndefaultMode = "bypassPermissions"',
        "[claude.settings.sandbox]\nbypassPermissions = true",
        '[claude.settings.env]\nSKIP_PERMISSIONS = "1"',
    ],
)
def test_a_bypass_in_the_settings_is_refused_like_anywhere_else(toml: str) -> None:
    with pytest.raises(ConfigError):
        with_settings(toml)


def test_hand_built_settings_that_policy_refuses_never_reach_the_cli() -> None:
    """Defence in depth: a Config built in code skips validation; build_argv checks again."""
    config = make_config()
    claude = msgspec.structs.replace(config.claude, settings={"permissions": {"allow": ["Bash"]}})
    with pytest.raises(PolicyError) as caught:
        argv_of(msgspec.structs.replace(config, claude=claude))
    assert (caught.value.status, caught.value.code) == (403, "bypass_refused")


def test_refused_settings_accepts_an_empty_table_and_plain_env() -> None:
    assert refused_settings({}) is None
    assert refused_settings({"env": {"NO_PROXY": "localhost"}}) is None
