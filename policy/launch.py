"""One launch, decided: ``plan_launch`` composes every policy decision into a ``LaunchPlan``.

The daemon resolves the workspace and checks resume first (they need the filesystem and the run
store), then calls ``plan_launch`` and spawns exactly what it returns. Nothing here spawns
anything. The other decisions are re-exported so the daemon can import them from one place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from codelegate.policy.argv import build_argv
from codelegate.policy.child_env import child_environment
from codelegate.policy.codes import (
    BAD_REQUEST,
    BUDGET_TOO_HIGH,
    MODE_NOT_ALLOWED,
    MODEL_NOT_ALLOWED,
)
from codelegate.policy.config import Config
from codelegate.policy.environment import RUN_MARKER_VAR, secret_values
from codelegate.policy.errors import PolicyError
from codelegate.policy.modes import REQUEST_MODES, Mode, RequestMode, mode_for
from codelegate.policy.request import RunRequest
from codelegate.policy.session import check_resume, parse_session_id
from codelegate.policy.workspace import resolve_workspace

__all__ = [
    "RUN_MARKER_VAR",
    "LaunchPlan",
    "Mode",
    "build_argv",
    "check_budget",
    "check_model",
    "check_resume",
    "child_environment",
    "parse_session_id",
    "plan_launch",
    "resolve_mode",
    "resolve_workspace",
]


class LaunchPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the daemon needs to start one run, and nothing it would have to decide."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    # The task as the request gave it: the daemon writes ``initialize`` and then it as a user
    # message, the run's first stdin lines (translator.control.opening; stdin stays open).
    task: str
    # The request's mode, which the run's record keeps (the CLI's is in ``argv``).
    mode: RequestMode
    # The credentials among ``env``'s values: the daemon masks them in all of the run's output.
    secrets: tuple[str, ...] = ()


def resolve_mode(config: Config, requested: str | None) -> Mode:
    """The mode a run gets: the request's, or the operator's default; 403 when not allowed."""
    name = config.policy.default_mode if requested is None else requested
    allowed = config.policy.allowed_modes
    if name not in allowed or name not in REQUEST_MODES:
        raise PolicyError(
            MODE_NOT_ALLOWED,
            f"mode {name!r} is not allowed here; allowed modes: {', '.join(allowed)}",
        )
    return mode_for(name)


def check_model(config: Config, requested: str | None) -> str | None:
    """The model to pass, or None for the CLI's default; 403 when not in the allowlist.

    An empty ``allowed_models`` means callers may not choose a model at all (the safer reading:
    a model costs money, and the operator did not say which ones may be spent on).
    """
    if requested is None:
        return None
    allowed = config.claude.allowed_models
    if requested not in allowed:
        names = ", ".join(allowed) if allowed else "none: the operator's default model is used"
        raise PolicyError(
            MODEL_NOT_ALLOWED, f"model {requested!r} is not allowed; allowed models: {names}"
        )
    return requested


def check_budget(config: Config, requested: float | None) -> float | None:
    """The ``--max-budget-usd`` to pass: the request's (≤ the operator cap), else the cap."""
    cap = config.policy.max_budget_usd
    if requested is None:
        return cap
    if not math.isfinite(requested) or requested <= 0:
        raise PolicyError(BAD_REQUEST, "max_budget_usd: expected a positive number")
    if cap is not None and requested > cap:
        raise PolicyError(
            BUDGET_TOO_HIGH,
            f"max_budget_usd {requested} is above the operator's cap of {cap}",
        )
    return requested


def plan_launch(
    config: Config,
    request: RunRequest,
    *,
    cwd: str,
    session_id: str,
    resumed: bool,
    parent_env: Mapping[str, str],
    marker: tuple[str, str],
) -> LaunchPlan:
    """Decide one launch. ``cwd`` comes from ``resolve_workspace``; for a resume, ``session_id``
    is ``request.resume`` already checked with ``check_resume``, else a fresh uuid4 string.
    Raises PolicyError for anything the caller may not have.
    """
    mode = resolve_mode(config, request.mode)
    model = check_model(config, request.model)
    budget = check_budget(config, request.max_budget_usd)
    session_id = parse_session_id(session_id)
    # The daemon's bookkeeping must agree with the request: a mismatch is a daemon bug, and
    # launching anyway could continue a session nobody asked for.
    if resumed != (request.resume is not None) or (resumed and request.resume != session_id):
        raise ValueError("session_id/resumed do not match request.resume")
    env = child_environment(config, parent_env, marker=marker)
    argv = build_argv(
        config, mode, session_id=session_id, resumed=resumed, model=model, max_budget_usd=budget
    )
    return LaunchPlan(
        argv=argv,
        cwd=cwd,
        env=env,
        task=request.task,
        mode=mode.request,
        secrets=secret_values(env),
    )
