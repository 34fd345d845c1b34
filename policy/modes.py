"""Permission modes: the closed vocabulary a caller may ask for, and how it maps to the CLI.

Request modes ``safe | accept_edits | auto | plan`` map to the CLI's
``manual | acceptEdits | auto | plan`` and to O Chat's ``manual | auto_approve``. The map is
closed: there is no request, config or environment input that yields ``bypassPermissions`` or the
dangerous flags, and ``names_bypass`` lets every other module refuse a string that tries.

The vocabulary lives here, below the config schema that types ``[policy]`` with it; which mode
one run gets under one config is decided above it (``policy.launch.resolve_mode``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, Literal, get_args

import msgspec

RequestMode = Literal["safe", "accept_edits", "auto", "plan"]
CliMode = Literal["manual", "acceptEdits", "auto", "plan"]
OChatMode = Literal["manual", "auto_approve"]

REQUEST_MODES: Final[tuple[str, ...]] = get_args(RequestMode)
SAFE_CLI_MODES: Final[frozenset[str]] = frozenset(get_args(CliMode))

_CLI_MODE: Final[Mapping[str, CliMode]] = {
    "safe": "manual",
    "accept_edits": "acceptEdits",
    "auto": "auto",
    "plan": "plan",
}
# O Chat knows manual | auto_approve | full_access; full_access is never claimed.
_OCHAT_MODE: Final[Mapping[str, OChatMode]] = {
    "safe": "manual",
    "accept_edits": "auto_approve",
    "auto": "auto_approve",
    "plan": "manual",
}

# Flags that switch permission checks off. They are named here only so that they can be refused.
DANGEROUS_FLAGS: Final = frozenset(
    {"--dangerously-skip-permissions", "--allow-dangerously-skip-permissions"}
)
# Compared after lowercasing and dropping everything but letters and digits, so that
# "Bypass_Permissions", "bypass-permissions" and "--dangerously-skip-permissions" all match.
_BYPASS_MARKERS: Final = ("bypasspermission", "dangerouslyskip", "skippermission")
_NOT_ALNUM: Final = re.compile(r"[^a-z0-9]+")


class Mode(msgspec.Struct, frozen=True, kw_only=True):
    """A resolved permission mode in the three vocabularies that need it."""

    request: RequestMode
    cli: CliMode
    ochat: OChatMode


def names_bypass(value: str) -> bool:
    """True when ``value`` names a bypass mode or a permission-skipping flag, however spelled."""
    squashed = _NOT_ALNUM.sub("", value.lower())
    return squashed == "bypass" or any(marker in squashed for marker in _BYPASS_MARKERS)


def mode_for(request_mode: RequestMode) -> Mode:
    """The ``Mode`` for a request-vocabulary mode (total over ``RequestMode``)."""
    return Mode(request=request_mode, cli=_CLI_MODE[request_mode], ochat=_OCHAT_MODE[request_mode])
