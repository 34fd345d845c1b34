"""PolicyError / ConfigError: what the daemon and the operator see."""

from __future__ import annotations

import pytest

from codelegate.policy.codes import HTTP_ERROR, MODE_NOT_ALLOWED, TOO_MANY_RUNS
from codelegate.policy.errors import ConfigError, PolicyError


def test_policy_error_carries_its_codes_status_and_message() -> None:
    error = PolicyError(MODE_NOT_ALLOWED, "mode 'auto' is not allowed")
    assert (error.status, error.code, error.message) == (403, "mode_not_allowed", error.message)
    assert error.to_json() == {
        "error": {"code": "mode_not_allowed", "message": "mode 'auto' is not allowed"}
    }
    assert str(error) == "403 mode_not_allowed: mode 'auto' is not allowed"
    assert PolicyError(TOO_MANY_RUNS, "retry later", status=429).status == 429


def test_policy_error_refuses_a_code_not_in_the_list() -> None:
    with pytest.raises(ValueError, match="not in the list"):
        PolicyError("boom", "no")


def test_policy_error_refuses_a_status_its_code_does_not_come_with() -> None:
    with pytest.raises(ValueError, match="comes with status 403"):
        PolicyError(MODE_NOT_ALLOWED, "no", status=400)


def test_an_http_error_takes_the_status_aiohttp_chose_and_needs_one() -> None:
    assert PolicyError(HTTP_ERROR, "too many headers", status=431).status == 431
    with pytest.raises(ValueError, match="needs the status"):
        PolicyError(HTTP_ERROR, "which status?")


def test_config_error_with_and_without_key() -> None:
    keyed = ConfigError("c.toml", "policy.default_mode", "expected one of: safe")
    assert str(keyed) == "c.toml: policy.default_mode: expected one of: safe"
    assert (keyed.source, keyed.key, keyed.expected) == (
        "c.toml",
        "policy.default_mode",
        "expected one of: safe",
    )
    assert str(ConfigError("c.toml", "", "expected valid TOML")) == "c.toml: expected valid TOML"
