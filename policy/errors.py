"""The two ways policy says no.

``PolicyError`` refuses a caller's request: it carries the HTTP status, a stable machine code and
a message telling the caller what to change; the daemon turns it into
``{"error": {"code", "message"}}`` and spawns nothing. ``ConfigError`` refuses the operator's
config: it names the file, the dotted key and what was expected, so that ``serve`` and ``doctor``
can print one line the operator can act on.
"""

from __future__ import annotations

from typing import Final

# Stable error codes. Clients may branch on these, so they never change meaning.
BAD_REQUEST: Final = "bad_request"
EMPTY_TASK: Final = "empty_task"
TASK_TOO_LARGE: Final = "task_too_large"
MODE_NOT_ALLOWED: Final = "mode_not_allowed"
MODEL_NOT_ALLOWED: Final = "model_not_allowed"
BUDGET_TOO_HIGH: Final = "budget_too_high"
WORKSPACE_INVALID: Final = "workspace_invalid"
WORKSPACE_OUTSIDE_ROOTS: Final = "workspace_outside_roots"
WORKSPACE_NOT_DIRECTORY: Final = "workspace_not_directory"
RESUME_INVALID: Final = "resume_invalid"
RESUME_UNKNOWN: Final = "resume_unknown"
RESUME_OTHER_WORKSPACE: Final = "resume_other_workspace"
BYPASS_REFUSED: Final = "bypass_refused"

ALLOWED_STATUSES: Final = frozenset({400, 403, 404, 409, 413, 429, 503})


class PolicyError(Exception):
    """A refused request: ``status`` (HTTP), ``code`` (stable) and ``message`` (for the caller)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        if status not in ALLOWED_STATUSES:
            raise ValueError(f"PolicyError status must be one of {sorted(ALLOWED_STATUSES)}")
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message

    def to_json(self) -> dict[str, dict[str, str]]:
        """The HTTP error body of the design: ``{"error": {"code": …, "message": …}}``."""
        return {"error": {"code": self.code, "message": self.message}}


class ConfigError(Exception):
    """A refused config: ``source`` (file), ``key`` (dotted, may be empty) and ``expected``."""

    def __init__(self, source: str, key: str, expected: str) -> None:
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {expected}")
        self.source = source
        self.key = key
        self.expected = expected
