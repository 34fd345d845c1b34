"""The operator's Claude Code settings: ``[claude.settings]``, given to every run as ``--settings``.

Runs load no settings file of HOME or the workspace (``--setting-sources ""`` in the argv), so
this table and the machine's managed settings are the only settings a run gets. It is written as
TOML in the config, checked here, and handed to the CLI as one JSON argument.

Some keys are refused because another part of the config owns their fact, or because the value
would sit in the process list: the argv of a process can be read by every local user.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from codelegate.policy.environment import AUTH_VARS, refused_pass_env
from codelegate.policy.modes import names_bypass

# Far below Linux's 128 KiB limit on one argument, and far above any real settings file.
MAX_SETTINGS_BYTES: Final = 64 * 1024

_OWNED: Final[Mapping[str, str]] = {
    # One owner for permission rules and modes: the operator's deny list must always win, and
    # additionalDirectories would widen the workspace roots.
    "permissions": "permission rules and modes belong in [policy] allowed_tools, "
    "disallowed_tools, allowed_modes and workspaces",
}


def refused_settings(settings: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first problem with ``[claude.settings]`` as (dotted key below it, what is wrong)."""
    for key, reason in _OWNED.items():
        if key in settings:
            return key, reason
    env = settings.get("env", {})
    if not isinstance(env, Mapping):
        return "env", "expected a table of variable names and text values"
    for name, value in env.items():
        refused = _refused_env(name, value)
        if refused:
            return f"env.{name}", refused
    rendered = settings_json(settings)
    if len(rendered.encode()) > MAX_SETTINGS_BYTES:
        return "", f"expected at most {MAX_SETTINGS_BYTES} bytes as JSON"
    # The config already refuses every string naming a bypass; the JSON is checked as one
    # argument too, because the argv check reads it that way (squashed, across keys).
    if names_bypass(rendered):
        return "", "the settings, read as one argument, name a permission bypass"
    return None


def _refused_env(name: str, value: object) -> str | None:
    if not isinstance(value, str):
        return f"expected a text value; got {type(value).__name__}"
    if name.upper() in AUTH_VARS:
        # A credential here would be visible in the process list.
        return f"{name} comes from the daemon's environment, never from the settings"
    return refused_pass_env(name)


def settings_json(settings: Mapping[str, Any]) -> str:
    """The ``--settings`` argument: compact JSON with sorted keys, the same for the same table."""
    return msgspec.json.encode(settings, order="sorted").decode()
