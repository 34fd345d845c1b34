"""Resume rules: a session id is accepted only in the exact form this daemon issued it.

No normalisation, no fuzzy matching: ``{…}``, ``urn:uuid:``, uppercase, missing hyphens and
surrounding whitespace are refused rather than repaired, so that the id a caller sends is
byte-for-byte the id looked up in the run store.
"""

from __future__ import annotations

import re
import uuid
from typing import Final

from codelegate.policy.codes import RESUME_INVALID, RESUME_OTHER_WORKSPACE, RESUME_UNKNOWN
from codelegate.policy.errors import PolicyError

_CANONICAL: Final = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.ASCII
)


def is_session_id(value: str) -> bool:
    """True for a canonical lowercase hyphenated UUID, and only for that."""
    return _CANONICAL.fullmatch(value) is not None and str(uuid.UUID(value)) == value


def parse_session_id(value: str) -> str:
    """``value`` itself when it is a canonical session id; PolicyError 403 otherwise."""
    if not is_session_id(value):
        raise PolicyError(
            RESUME_INVALID,
            "resume must be the exact session_id an earlier run returned "
            "(lowercase, hyphenated: xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
        )
    return value


def check_resume(session_id: str, issued_workspace: str | None, workspace: str) -> None:
    """Refuse (403) a resume of a session this daemon never issued, or issued for another cwd.

    ``issued_workspace`` is what the run store says about the session (None: never issued);
    ``workspace`` is the resolved cwd of the new run.
    """
    parse_session_id(session_id)
    if issued_workspace is None:
        raise PolicyError(
            RESUME_UNKNOWN,
            f"session {session_id} was not issued by this daemon; start a new run instead",
        )
    if issued_workspace != workspace:
        raise PolicyError(
            RESUME_OTHER_WORKSPACE,
            f"session {session_id} belongs to another workspace; resume it with the cwd of the "
            "run that returned it",
        )
