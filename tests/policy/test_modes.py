"""Permission modes: a closed map, refused with the allowed ones named."""

from __future__ import annotations

import msgspec
import pytest

from codelegate.policy.config import Config
from codelegate.policy.errors import PolicyError
from codelegate.policy.launch import resolve_mode
from codelegate.policy.modes import (
    DANGEROUS_FLAGS,
    REQUEST_MODES,
    SAFE_CLI_MODES,
    mode_for,
    names_bypass,
)
from tests.policy.conftest import make_config

MAP = [
    ("safe", "manual", "manual"),
    ("accept_edits", "acceptEdits", "auto_approve"),
    ("auto", "auto", "auto_approve"),
    ("plan", "plan", "manual"),
]


@pytest.mark.parametrize(("request_mode", "cli", "ochat"), MAP)
def test_mode_map(request_mode: str, cli: str, ochat: str) -> None:
    config = make_config('allowed_modes = ["safe", "accept_edits", "auto", "plan"]')
    mode = resolve_mode(config, request_mode)
    assert (mode.request, mode.cli, mode.ochat) == (request_mode, cli, ochat)


def test_every_request_mode_maps_to_a_safe_cli_mode() -> None:
    assert {mode_for(m).cli for m in REQUEST_MODES} == SAFE_CLI_MODES  # type: ignore[arg-type]
    assert "bypassPermissions" not in SAFE_CLI_MODES
    assert "full_access" not in {mode_for(m).ochat for m in REQUEST_MODES}  # type: ignore[arg-type]


def test_no_mode_means_the_default(config: Config) -> None:
    assert resolve_mode(config, None).request == "safe"
    planned = make_config('default_mode = "plan"')
    assert resolve_mode(planned, None).cli == "plan"


@pytest.mark.parametrize(
    "requested", ["auto", "bypassPermissions", "bypass", "manual", "acceptEdits", "", "SAFE"]
)
def test_refused_modes_name_the_allowed_ones(config: Config, requested: str) -> None:
    with pytest.raises(PolicyError) as caught:
        resolve_mode(config, requested)
    assert caught.value.status == 403
    assert caught.value.code == "mode_not_allowed"
    assert "allowed modes: safe, accept_edits, plan" in caught.value.message


def test_a_hand_built_config_cannot_smuggle_a_mode(config: Config) -> None:
    # Structs built in code skip validation; resolve_mode still only knows the closed map.
    policy = msgspec.structs.replace(
        config.policy, allowed_modes=("bypassPermissions",), default_mode="bypassPermissions"
    )
    rogue = msgspec.structs.replace(config, policy=policy)
    with pytest.raises(PolicyError, match="not allowed"):
        resolve_mode(rogue, None)


@pytest.mark.parametrize(
    "value",
    [
        "bypassPermissions",
        "BypassPermissions",
        "bypass_permissions",
        "bypass-permissions",
        "Bypass",
        " bypass ",
        "--dangerously-skip-permissions",
        "--allow-dangerously-skip-permissions",
        "DANGEROUSLY_SKIP_PERMISSIONS",
        "skip_permissions",
        "Bash(claude --dangerously-skip-permissions)",
        *DANGEROUS_FLAGS,
    ],
)
def test_names_bypass(value: str) -> None:
    assert names_bypass(value)


@pytest.mark.parametrize(
    "value",
    ["safe", "acceptEdits", "Read", "Bash(git diff:*)", "/srv/bypass-road", "bypassed road"],
)
def test_names_bypass_leaves_ordinary_values(value: str) -> None:
    assert not names_bypass(value)
