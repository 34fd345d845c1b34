"""Settings files of a workspace or of HOME cannot widen the operator's policy or run code.

A cloned repository can ship ``.claude/settings.json`` and ``.claude/settings.local.json``, and
whatever shares the daemon's HOME can write ``$HOME/.claude/settings.json``. The pinned CLI
honours all three under ``--safe-mode``: allow rules, ``env`` that reaches tool processes and an
``apiKeyHelper`` command run at start-up. Every run here is the real CLI in ``safe`` mode against
the API stub, with such files planted with fresh random values, and checks what the CLI really
did (files, the tool results the model was sent, every frame). The operator's own settings,
from ``[claude.settings]``, do apply.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import E2E, frames_until, is_run_result
from tests.stub.anthropic import text, tool

pytestmark = pytest.mark.e2e

NO_OPERATOR_RULES = pytest.mark.parametrize("daemon_policy", [{"allowed_tools": []}])
# printenv is what the model runs to look for planted variables: the operator allows it, so its
# output (HOME, and whatever else the process got) comes back.
PRINTENV_ALLOWED = pytest.mark.parametrize(
    "daemon_policy", [{"allowed_tools": ["Bash(printenv:*)"]}]
)


def plant(folder: Path, name: str, settings: dict[str, Any]) -> None:
    (folder / ".claude").mkdir(parents=True, exist_ok=True)
    (folder / ".claude" / name).write_text(json.dumps(settings))


def trust(e2e: E2E) -> None:
    """HOME's CLI state says the workspace is trusted, so project settings would not be ignored
    for that reason (the CLI otherwise drops a project's allow rules of an untrusted folder)."""
    state = {"projects": {str(e2e.workspace): {"hasTrustDialogAccepted": True}}}
    (e2e.home / ".claude.json").write_text(json.dumps(state))


async def run_frames(e2e: E2E, task: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``task`` in safe mode to its end; the final result and every frame of the run."""
    status, body = await e2e.post_run(task, mode="safe", wait=True)
    assert status == 200, body
    async with e2e.ws(body["run_id"]) as ws:
        frames = await frames_until(ws, is_run_result)
    return body, frames


def sent_to_model(e2e: E2E) -> str:
    """Everything the CLI sent the model: tool results arrive here whole, not bounded."""
    return "\n".join(r.history_text() for r in e2e.stub.model_requests)


def bash_result(frames: list[dict[str, Any]]) -> dict[str, Any]:
    (result,) = [f for f in frames if f["type"] == "tool_result"]
    return result


@NO_OPERATOR_RULES
@pytest.mark.parametrize("where", ["settings.local.json", "settings.json"])
async def test_a_workspace_allow_rule_does_not_let_a_safe_run_write(e2e: E2E, where: str) -> None:
    trust(e2e)
    plant(e2e.workspace, where, {"permissions": {"allow": ["Bash", "Write", "Edit"]}})
    target = e2e.workspace / f"made-{secrets.token_hex(8)}"
    e2e.stub.main.turns = [tool("Bash", command=f"touch {target}", description="t"), text("ok")]
    body, frames = await run_frames(e2e, "Create a file.")
    assert not target.exists(), f"{where} in the workspace widened the operator's policy"
    assert body["status"] == "completed"
    assert [d["name"] for d in body["permission_denials"]] == ["Bash"]
    assert bash_result(frames)["error_type"] == "permission_denied"


@NO_OPERATOR_RULES
async def test_an_allow_rule_in_the_home_settings_does_not_apply(e2e: E2E) -> None:
    plant(e2e.home, "settings.json", {"permissions": {"allow": ["Bash", "Write", "Edit"]}})
    target = e2e.workspace / f"made-{secrets.token_hex(8)}"
    e2e.stub.main.turns = [tool("Bash", command=f"touch {target}", description="t"), text("ok")]
    body, frames = await run_frames(e2e, "Create a file.")
    assert not target.exists(), "$HOME/.claude/settings.json widened the operator's policy"
    assert [d["name"] for d in body["permission_denials"]] == ["Bash"]
    assert bash_result(frames)["error_type"] == "permission_denied"


@PRINTENV_ALLOWED
@pytest.mark.parametrize(
    "where", ["workspace:settings.local.json", "workspace:settings.json", "home:settings.json"]
)
async def test_settings_env_from_the_workspace_or_home_never_reaches_a_tool(
    e2e: E2E, where: str
) -> None:
    trust(e2e)
    folder, name = where.split(":")
    name_var, value = f"PLANTED_{secrets.token_hex(6).upper()}", secrets.token_hex(20)
    plant(e2e.workspace if folder == "workspace" else e2e.home, name, {"env": {name_var: value}})
    command = f"printenv HOME {name_var}"
    e2e.stub.main.turns = [tool("Bash", command=command, description="t"), text("ok")]
    _, frames = await run_frames(e2e, "Show two variables.")
    model_saw = sent_to_model(e2e)
    assert str(e2e.home) in model_saw  # printenv ran and its output came back…
    assert value not in model_saw, f"env of {where} reached a tool process"  # …without it
    assert value not in json.dumps(frames)


async def test_an_api_key_helper_in_the_workspace_settings_never_runs(e2e: E2E) -> None:
    trust(e2e)
    marker = e2e.home / f"helper-ran-{secrets.token_hex(8)}"
    # The helper would record that it ran, and with which key in its environment.
    helper = f'printenv ANTHROPIC_API_KEY > {marker}; echo "sk-ant-api03-{secrets.token_hex(24)}"'
    plant(e2e.workspace, "settings.json", {"apiKeyHelper": helper})
    plant(e2e.workspace, "settings.local.json", {"apiKeyHelper": helper})
    e2e.stub.main.turns = [text("Nothing to do.")]
    body, _ = await run_frames(e2e, "Say something.")
    assert body["status"] == "completed"
    assert not marker.exists(), "a workspace's apiKeyHelper ran a command"


OPERATOR_VAR, OPERATOR_VALUE = f"OPERATOR_{secrets.token_hex(6).upper()}", secrets.token_hex(20)


@PRINTENV_ALLOWED
@pytest.mark.parametrize("daemon_claude", [{"settings": {"env": {OPERATOR_VAR: OPERATOR_VALUE}}}])
async def test_the_operators_settings_from_the_config_do_apply(e2e: E2E) -> None:
    # The same variable planted in the workspace with another value: the operator's must win
    # because the workspace's is never read, not because of an order of precedence.
    plant(e2e.workspace, "settings.local.json", {"env": {OPERATOR_VAR: secrets.token_hex(20)}})
    command = f"printenv {OPERATOR_VAR}"
    e2e.stub.main.turns = [tool("Bash", command=command, description="t"), text("ok")]
    _, frames = await run_frames(e2e, "Show the operator's variable.")
    assert bash_result(frames)["status"] == "completed"
    assert OPERATOR_VALUE in sent_to_model(e2e)
