"""The two ways a refusal is said.

``PolicyError`` refuses a caller's request, whoever decides it (policy, the daemon's capacity,
the access checks): it carries a stable code of ``policy/codes.py``, the HTTP status that code
comes with, and a message telling the caller what to change; the daemon answers it as
``{"error": {"code", "message"}}`` and spawns nothing. ``ConfigError`` refuses the operator's
config: it names the file, the dotted key and what was expected, so that ``serve`` and ``doctor``
can print one line the operator can act on.
"""

from __future__ import annotations

from codelegate.policy.codes import STATUS


class PolicyError(Exception):
    """A refused request: ``code`` (stable), its ``status`` (HTTP) and ``message`` (for the caller).

    ``status`` is given only for a code whose status is aiohttp's choice (``http_error``).
    """

    def __init__(self, code: str, message: str, *, status: int | None = None) -> None:
        if code not in STATUS:
            raise ValueError(f"PolicyError code {code!r} is not in the list of policy/codes.py")
        table = STATUS[code]
        if table is None:
            if status is None:
                raise ValueError(f"PolicyError code {code!r} needs the status it comes with")
        elif status not in (None, table):
            raise ValueError(f"PolicyError code {code!r} comes with status {table}")
        else:
            status = table
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
