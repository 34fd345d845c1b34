"""Property: no config and no request, however generated, yields a bypass launch."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import event, given, settings
from hypothesis import strategies as st

from codelegate.policy.argv import FIXED_FLAGS
from codelegate.policy.config import Config, parse_config
from codelegate.policy.environment import RUN_MARKER_VAR
from codelegate.policy.errors import ConfigError, PolicyError
from codelegate.policy.launch import LaunchPlan, plan_launch
from codelegate.policy.modes import DANGEROUS_FLAGS, REQUEST_MODES, SAFE_CLI_MODES, names_bypass
from codelegate.policy.request import decode_run_request
from tests.policy.conftest import flag_values

SID = "0b6f6d52-3b9e-4bb1-9d4c-5a3e2f0c1d2e"
HOSTILE = [
    "bypassPermissions",
    "bypass",
    "BYPASS",
    "bypass_permissions",
    "dontAsk",
    "full_access",
    "--dangerously-skip-permissions",
    "--allow-dangerously-skip-permissions",
    "--permission-mode",
    "-p",
    "acceptEdits",
    "manual",
]
WORDS = st.sampled_from([*REQUEST_MODES, *HOSTILE, "Read", "Bash(git diff:*)", "sonnet"])
STRINGS = WORDS | st.text(max_size=12)
MODES = st.sampled_from(REQUEST_MODES)
TOOLS = st.sampled_from(["Read", "Edit", "Bash(git diff:*)"])


@st.composite
def mostly(draw: st.DrawFn, plausible: st.SearchStrategy[str]) -> str:
    """Usually a plausible value, sometimes anything: so that many configs reach plan_launch."""
    return draw(STRINGS) if draw(st.sampled_from(range(6))) == 5 else draw(plausible)


def toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(item, ensure_ascii=False) for item in items) + "]"


@st.composite
def config_texts(draw: st.DrawFn) -> str:
    lines = ["[policy]", 'workspaces = ["/srv/workspaces/demo"]']
    modes = draw(st.lists(mostly(MODES), min_size=1, max_size=4))
    default = draw(mostly(st.sampled_from(modes)))
    lines.append(f"allowed_modes = {toml_list(modes)}")
    lines.append(f"default_mode = {json.dumps(default, ensure_ascii=False)}")
    if draw(st.booleans()):
        lines.append(f"allowed_tools = {toml_list(draw(st.lists(mostly(TOOLS), max_size=3)))}")
    if draw(st.booleans()):
        tools = draw(st.lists(mostly(TOOLS), max_size=3))
        lines.append(f"disallowed_tools = {toml_list(tools)}")
    lines.append("[claude]")
    if draw(st.booleans()):
        models = draw(st.lists(mostly(st.just("sonnet")), max_size=3))
        lines.append(f"allowed_models = {toml_list(models)}")
    if draw(st.booleans()):
        lines.append(
            f"pass_env = {toml_list(draw(st.lists(mostly(st.just('NO_PROXY')), max_size=2)))}"
        )
    if draw(st.booleans()):
        key, value = draw(mostly(st.just("model"))), draw(STRINGS)
        lines.append(f"settings = {{ {json.dumps(key)} = {json.dumps(value)}, sandbox = {{}} }}")
    return "\n".join(lines)


@st.composite
def request_bodies(draw: st.DrawFn) -> bytes:
    body: dict[str, Any] = {"task": draw(STRINGS | st.just("do the task"))}
    for key, values in (
        ("mode", mostly(MODES)),
        ("model", mostly(st.just("sonnet"))),
        ("cwd", st.sampled_from([".", "src", "/srv/workspaces/demo"])),
        ("resume", st.sampled_from([SID, SID.upper(), "bypassPermissions"])),
        ("max_budget_usd", st.floats(min_value=0.01, max_value=100)),
    ):
        if draw(st.booleans()):
            body[key] = draw(values)
    # Fields the API does not have: always refused, so tried only now and then.
    if draw(st.sampled_from(range(6))) == 5:
        body[draw(st.sampled_from(["permission_mode", "dangerously_skip_permissions"]))] = True
    return json.dumps(body).encode()


def strings_in(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in [key, *strings_in(item)]]
    if isinstance(value, list):
        return [s for item in value for s in strings_in(item)]
    return []


@settings(max_examples=300)
@given(text=config_texts(), body=request_bodies())
def test_nothing_generated_yields_a_bypass(text: str, body: bytes) -> None:
    try:
        config = parse_config(text.encode(), "generated.toml")
    except ConfigError:
        event("config refused")
        return
    assert not any(names_bypass(s) for s in strings_in(msgspec.to_builtins(config)))
    launch = attempt(config, body)
    if isinstance(launch, PolicyError):
        assert launch.status in (400, 403, 413)
        event(f"request refused: {launch.code}")
        return
    event("launch planned")
    assert_safe_argv(launch.argv)
    assert set(launch.env) <= {"PATH", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", RUN_MARKER_VAR}


def attempt(config: Config, body: bytes) -> LaunchPlan | PolicyError:
    """The daemon's path from body to launch plan, with the refusal returned instead of raised."""
    try:
        request = decode_run_request(body, max_task_bytes=config.limits.task_bytes)
        return plan_launch(
            config,
            request,
            cwd="/srv/workspaces/demo",
            session_id=request.resume or SID,
            resumed=request.resume is not None,
            parent_env={"PATH": "/usr/bin", "CLAUDE_BYPASS": "1", "NODE_OPTIONS": "-r x"},
            marker=(RUN_MARKER_VAR, "run_1"),
        )
    except PolicyError as refusal:
        return refusal


def assert_safe_argv(argv: tuple[str, ...]) -> None:
    modes = flag_values(argv, "--permission-mode")
    assert len(modes) == 1
    assert modes[0] in SAFE_CLI_MODES
    assert not DANGEROUS_FLAGS & set(argv)
    assert not any(names_bypass(arg) for arg in argv)
    assert argv[1 : 1 + len(FIXED_FLAGS)] == FIXED_FLAGS


def test_the_fixed_flags_pin_headless_fail_closed_behaviour() -> None:
    # What each fixed flag is for, asserted as that purpose (their list is policy.argv's).
    assert FIXED_FLAGS[0] == "-p"  # headless: one prompt, no terminal UI
    assert flag_values(FIXED_FLAGS, "--output-format") == ["stream-json"]
    assert "--verbose" in FIXED_FLAGS  # -p with stream-json refuses to start without it
    assert "--safe-mode" in FIXED_FLAGS  # no CLAUDE.md, hooks, plugins or MCP servers
    assert flag_values(FIXED_FLAGS, "--setting-sources") == [""]  # no settings file at all
    assert flag_values(FIXED_FLAGS, "--permission-prompts") == ["none"]  # a prompt is a denial
    assert "--permission-mode" not in FIXED_FLAGS  # the mode is the request's, checked apart
    assert not DANGEROUS_FLAGS & set(FIXED_FLAGS)
    assert not any(names_bypass(arg) for arg in FIXED_FLAGS)
