"""Every error code of the API, and the HTTP status it comes with: the one table.

Clients branch on these codes, so a code never changes meaning. A refusal names its code only:
:class:`~codelegate.policy.errors.PolicyError` takes the status from :data:`STATUS`, so a code
cannot come with two statuses. README's "Errors" table lists the same codes (a test compares
both ways).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

# 400: the request is not what the API takes.
BAD_REQUEST: Final = "bad_request"
EMPTY_TASK: Final = "empty_task"
SLASH_COMMAND: Final = "slash_command"
# 401 / 403: who is asking, and what policy allows them.
UNAUTHORIZED: Final = "unauthorized"
MODE_NOT_ALLOWED: Final = "mode_not_allowed"
MODEL_NOT_ALLOWED: Final = "model_not_allowed"
BUDGET_TOO_HIGH: Final = "budget_too_high"
WORKSPACE_INVALID: Final = "workspace_invalid"
WORKSPACE_OUTSIDE_ROOTS: Final = "workspace_outside_roots"
WORKSPACE_NOT_DIRECTORY: Final = "workspace_not_directory"
WORKSPACE_PERMISSION_DENIED: Final = "workspace_permission_denied"
RESUME_INVALID: Final = "resume_invalid"
RESUME_UNKNOWN: Final = "resume_unknown"
RESUME_OTHER_WORKSPACE: Final = "resume_other_workspace"
BYPASS_REFUSED: Final = "bypass_refused"
PEER_NOT_ALLOWED: Final = "peer_not_allowed"
PEER_IS_A_RUN: Final = "peer_is_a_run"
PEER_UNKNOWN: Final = "peer_unknown"
ORIGIN_NOT_ALLOWED: Final = "origin_not_allowed"
APPROVAL_SCOPE_NOT_ALLOWED: Final = "approval_scope_not_allowed"
# 404 / 405 / 409: what the request names.
RUN_NOT_FOUND: Final = "run_not_found"
NOT_FOUND: Final = "not_found"
METHOD_NOT_ALLOWED: Final = "method_not_allowed"
SESSION_BUSY: Final = "session_busy"
RUN_FINISHED: Final = "run_finished"
APPROVAL_NOT_FOUND: Final = "approval_not_found"
APPROVAL_RESOLVED: Final = "approval_resolved"
# 413 / 429 / 503: sizes and the daemon's capacity.
TASK_TOO_LARGE: Final = "task_too_large"
BODY_TOO_LARGE: Final = "body_too_large"
TOO_MANY_RUNS: Final = "too_many_runs"
TOO_MANY_INPUTS: Final = "too_many_inputs"
TOO_MANY_INPUT_BYTES: Final = "too_many_input_bytes"
SHUTTING_DOWN: Final = "shutting_down"
TOO_MANY_CONNECTIONS: Final = "too_many_connections"
UNAVAILABLE: Final = "unavailable"
# 500, and whatever other status aiohttp itself answers with.
INTERNAL_ERROR: Final = "internal_error"
HTTP_ERROR: Final = "http_error"

# A WebSocket client's message the daemon cannot take (an error control message, no HTTP status;
# README "WebSocket protocol"). The WebSocket's other errors are the HTTP codes above.
BAD_MESSAGE: Final = "bad_message"
WEBSOCKET_ONLY: Final = frozenset({BAD_MESSAGE})

# The status of every code; None: the status aiohttp chose (HTTP_ERROR only).
STATUS: Final[Mapping[str, int | None]] = MappingProxyType(
    {
        BAD_REQUEST: 400,
        EMPTY_TASK: 400,
        SLASH_COMMAND: 400,
        UNAUTHORIZED: 401,
        MODE_NOT_ALLOWED: 403,
        MODEL_NOT_ALLOWED: 403,
        BUDGET_TOO_HIGH: 403,
        WORKSPACE_INVALID: 403,
        WORKSPACE_OUTSIDE_ROOTS: 403,
        WORKSPACE_NOT_DIRECTORY: 403,
        WORKSPACE_PERMISSION_DENIED: 403,
        RESUME_INVALID: 403,
        RESUME_UNKNOWN: 403,
        RESUME_OTHER_WORKSPACE: 403,
        BYPASS_REFUSED: 403,
        PEER_NOT_ALLOWED: 403,
        PEER_IS_A_RUN: 403,
        PEER_UNKNOWN: 403,
        ORIGIN_NOT_ALLOWED: 403,
        APPROVAL_SCOPE_NOT_ALLOWED: 403,
        RUN_NOT_FOUND: 404,
        NOT_FOUND: 404,
        METHOD_NOT_ALLOWED: 405,
        SESSION_BUSY: 409,
        RUN_FINISHED: 409,
        APPROVAL_NOT_FOUND: 404,
        APPROVAL_RESOLVED: 409,
        TASK_TOO_LARGE: 413,
        BODY_TOO_LARGE: 413,
        TOO_MANY_RUNS: 429,
        TOO_MANY_INPUTS: 429,
        TOO_MANY_INPUT_BYTES: 429,
        SHUTTING_DOWN: 503,
        TOO_MANY_CONNECTIONS: 503,
        UNAVAILABLE: 503,
        INTERNAL_ERROR: 500,
        HTTP_ERROR: None,
    }
)

# The code of an error aiohttp raises itself (routing, body size, a WebSocket handshake).
HTTP_STATUS_CODES: Final[Mapping[int, str]] = MappingProxyType(
    {
        400: BAD_REQUEST,
        404: NOT_FOUND,
        405: METHOD_NOT_ALLOWED,
        413: BODY_TOO_LARGE,
        500: INTERNAL_ERROR,
    }
)
