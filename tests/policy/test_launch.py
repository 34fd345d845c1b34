"""argv, caps and plan_launch: what the daemon spawns, decided without spawning anything."""

from __future__ import annotations

import secrets

import msgspec
import pytest

from codelegate.policy.argv import CHANNEL_FLAGS, FIXED_FLAGS
from codelegate.policy.config import Config
from codelegate.policy.environment import NONESSENTIAL_TRAFFIC_VAR, RUN_MARKER_VAR
from codelegate.policy.errors import PolicyError
from codelegate.policy.launch import (
    LaunchPlan,
    build_argv,
    check_budget,
    check_model,
    plan_launch,
    resolve_mode,
)
from codelegate.policy.modes import Mode
from codelegate.policy.request import RunRequest
from tests.policy.conftest import ROOT, make_config

SID = "0b6f6d52-3b9e-4bb1-9d4c-5a3e2f0c1d2e"
# The fixed flags are pinned once, in test_no_bypass; here they are what every argv starts with.
HEAD = ("claude", *FIXED_FLAGS, *CHANNEL_FLAGS, "--permission-mode")
ENV = {"PATH": "/usr/bin", "HOME": "/home/u", "SECRET_SAUCE": "x"}
MARKER = (RUN_MARKER_VAR, "run_1")


def plan(config: Config, request: RunRequest, *, resumed: bool = False) -> LaunchPlan:
    return plan_launch(
        config, request, cwd=ROOT, session_id=SID, resumed=resumed, parent_env=ENV, marker=MARKER
    )


def test_new_session_argv(config: Config) -> None:
    argv = build_argv(config, mode=resolve_mode(config, None), session_id=SID, resumed=False)
    assert argv == (*HEAD, "manual", "--session-id", SID)


def test_resumed_argv_with_model_budget_and_rules() -> None:
    config = make_config(
        'allowed_tools = ["Read", "Bash(git diff:*)"]\ndisallowed_tools = ["WebFetch"]\n'
        'allowed_modes = ["accept_edits", "safe"]'
    )
    argv = build_argv(
        config,
        mode=resolve_mode(config, "accept_edits"),
        session_id=SID,
        resumed=True,
        model="claude-sonnet-4-5",
        max_budget_usd=0.25,
    )
    assert argv == (
        *HEAD,
        "acceptEdits",
        "--resume",
        SID,
        "--model",
        "claude-sonnet-4-5",
        "--max-budget-usd",
        "0.25",
        "--allowed-tools",
        "Read",
        "Bash(git diff:*)",
        "--disallowed-tools",
        "WebFetch",
    )


@pytest.mark.parametrize("model", ["-x", "--permission-mode", "a b", ""])
def test_build_argv_refuses_option_shaped_models(config: Config, model: str) -> None:
    with pytest.raises(PolicyError, match="model_not_allowed"):
        build_argv(
            config, mode=resolve_mode(config, None), session_id=SID, resumed=False, model=model
        )


def test_build_argv_refuses_a_bad_session_id(config: Config) -> None:
    with pytest.raises(PolicyError, match="resume_invalid"):
        build_argv(config, mode=resolve_mode(config, None), session_id="x", resumed=True)


def rogue(config: Config, **policy: object) -> Config:
    return msgspec.structs.replace(config, policy=msgspec.structs.replace(config.policy, **policy))


@pytest.mark.parametrize(
    ("mode", "tools"),
    [
        (Mode(request="safe", cli="bypassPermissions", ochat="manual"), ()),  # type: ignore[arg-type]
        (Mode(request="safe", cli="dontAsk", ochat="manual"), ()),  # type: ignore[arg-type]
        (Mode(request="safe", cli="manual", ochat="manual"), ("--dangerously-skip-permissions",)),
        (Mode(request="safe", cli="manual", ochat="manual"), ("--permission-mode", "plan")),
        (Mode(request="safe", cli="manual", ochat="manual"), ("Bash(x)", "bypassPermissions")),
        # A second --setting-sources would be read instead of the empty one.
        (Mode(request="safe", cli="manual", ochat="manual"), ("--setting-sources", "user")),
        (Mode(request="safe", cli="manual", ochat="manual"), ("--setting-sources=project",)),
    ],
)
def test_build_argv_never_emits_a_bypass_even_from_hand_built_inputs(
    config: Config, mode: Mode, tools: tuple[str, ...]
) -> None:
    """Defence in depth: Structs built in code skip validation, build_argv checks anyway."""
    with pytest.raises(PolicyError) as caught:
        build_argv(rogue(config, allowed_tools=tools), mode=mode, session_id=SID, resumed=False)
    assert (caught.value.status, caught.value.code) == (403, "bypass_refused")


def test_check_model() -> None:
    closed = make_config()
    assert check_model(closed, None) is None
    with pytest.raises(PolicyError) as caught:
        check_model(closed, "sonnet")
    assert (caught.value.status, caught.value.code) == (403, "model_not_allowed")
    assert "allowed models: none" in caught.value.message
    listed = make_config('[claude]\nallowed_models = ["sonnet", "opus"]')
    assert check_model(listed, "opus") == "opus"
    with pytest.raises(PolicyError, match="allowed models: sonnet, opus"):
        check_model(listed, "Sonnet")


def test_check_budget() -> None:
    uncapped = make_config()
    assert check_budget(uncapped, None) is None
    assert check_budget(uncapped, 50.0) == 50.0
    capped = make_config("max_budget_usd = 2.0")
    assert check_budget(capped, None) == 2.0
    assert check_budget(capped, 2.0) == 2.0
    assert check_budget(capped, 0.5) == 0.5
    with pytest.raises(PolicyError) as caught:
        check_budget(capped, 2.01)
    assert (caught.value.status, caught.value.code) == (403, "budget_too_high")
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(PolicyError, match="bad_request"):
            check_budget(capped, bad)


def test_plan_launch_new_run(config: Config) -> None:
    result = plan(config, RunRequest(task="Fix the failing test ünïcode", mode="plan"))
    assert result.argv == (*HEAD, "plan", "--session-id", SID)
    assert result.cwd == ROOT
    # The task as given; the daemon writes it after ``initialize`` (tests/translator/test_control).
    assert result.task == "Fix the failing test ünïcode"
    # The request's mode for the run's record; the CLI's mode, session, model and budget are
    # what argv says (above: no --model, no --max-budget-usd).
    assert result.mode == "plan"
    assert result.env == {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        NONESSENTIAL_TRAFFIC_VAR: "1",
        RUN_MARKER_VAR: "run_1",
    }
    # The prompt never reaches argv.
    assert not any("Fix the failing" in arg for arg in result.argv)


def test_plan_launch_resume_with_caps() -> None:
    config = make_config('max_budget_usd = 3\n[claude]\nallowed_models = ["sonnet"]')
    request = RunRequest(task="go on", resume=SID, model="sonnet")
    result = plan(config, request, resumed=True)
    assert result.argv[-6:] == ("--resume", SID, "--model", "sonnet", "--max-budget-usd", "3.0")


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (RunRequest(task="x", mode="auto"), "mode_not_allowed"),
        (RunRequest(task="x", mode="bypassPermissions"), "mode_not_allowed"),
        (RunRequest(task="x", model="opus"), "model_not_allowed"),
    ],
)
def test_plan_launch_refuses(config: Config, request_: RunRequest, code: str) -> None:
    with pytest.raises(PolicyError) as caught:
        plan(config, request_)
    assert caught.value.code == code


@pytest.mark.parametrize(
    ("resume", "resumed"),
    [(None, True), (SID, False), ("1b6f6d52-3b9e-4bb1-9d4c-5a3e2f0c1d2e", True)],
)
def test_plan_launch_refuses_inconsistent_resume_bookkeeping(
    config: Config, resume: str | None, resumed: bool
) -> None:
    with pytest.raises(ValueError, match="resume"):
        plan(config, RunRequest(task="x", resume=resume), resumed=resumed)


def test_the_plan_names_the_credentials_it_passes_and_only_those() -> None:
    # Values are fresh: the rule is about names, never about what a value looks like.
    key, oauth, token, proxy = (secrets.token_urlsafe(24) for _ in range(4))
    config = make_config('[claude]\npass_env = ["GITHUB_TOKEN", "HTTPS_PROXY"]')
    parent = {
        **ENV,
        "ANTHROPIC_AUTH_TOKEN": key,
        "CLAUDE_CODE_OAUTH_TOKEN": oauth,
        "GITHUB_TOKEN": token,
        "HTTPS_PROXY": proxy,
        "ANTHROPIC_API_KEY": "",
    }
    launch = plan_launch(
        config,
        RunRequest(task="t"),
        cwd=ROOT,
        session_id=SID,
        resumed=False,
        parent_env=parent,
        marker=MARKER,
    )
    assert launch.secrets == tuple(sorted({key, oauth, token}))
    assert set(launch.secrets) <= set(launch.env.values())
