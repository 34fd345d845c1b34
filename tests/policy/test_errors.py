"""PolicyError / ConfigError: what the daemon and the operator see."""

from __future__ import annotations

import pytest

from codelegate.policy.errors import MODE_NOT_ALLOWED, ConfigError, PolicyError


def test_policy_error_carries_status_code_and_message() -> None:
    error = PolicyError(403, MODE_NOT_ALLOWED, "mode 'auto' is not allowed")
    assert (error.status, error.code, error.message) == (403, "mode_not_allowed", error.message)
    assert error.to_json() == {
        "error": {"code": "mode_not_allowed", "message": "mode 'auto' is not allowed"}
    }
    assert str(error) == "403 mode_not_allowed: mode 'auto' is not allowed"


def test_policy_error_refuses_a_status_the_api_does_not_use() -> None:
    with pytest.raises(ValueError, match="status"):
        PolicyError(500, "boom", "no")


def test_config_error_with_and_without_key() -> None:
    keyed = ConfigError("c.toml", "policy.default_mode", "expected one of: safe")
    assert str(keyed) == "c.toml: policy.default_mode: expected one of: safe"
    assert (keyed.source, keyed.key, keyed.expected) == (
        "c.toml",
        "policy.default_mode",
        "expected one of: safe",
    )
    assert str(ConfigError("c.toml", "", "expected valid TOML")) == "c.toml: expected valid TOML"
