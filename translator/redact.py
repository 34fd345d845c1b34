"""Redaction of credentials, and bounds on sizes (DESIGN invariants 6 and 7).

Used on every frame the translator builds, and by the daemon on its logs and the CLI's stderr.

Two rules hold whatever the input, and are property-tested:
- *idempotent*: cleaning clean output changes nothing (the daemon may clean twice);
- *bounded*: redaction happens before cutting, so a mask never pushes a value past its bound.

Cuts fall on UTF-8 boundaries and leave a marker that starts with ``[`` and says how much was cut.
The marker and the mask ``[redacted]`` cannot begin a credential-shaped value (values never start
with ``[``), which is what keeps redaction idempotent on cut output.
"""

from __future__ import annotations

import re
from typing import Any, Final, NamedTuple

MASK: Final = "[redacted]"

# --- keys ----------------------------------------------------------------------------------------

# Matched against the key lowercased with every non-alphanumeric removed, so that
# ``X-Api-Key``, ``api_key`` and ``apiKey`` read the same.
_SECRET_KEY_PARTS: Final = (
    "authorization",
    "password",
    "passwd",
    "passphrase",
    "secret",
    "cookie",
    "credential",
    "privatekey",
    "apikey",
    "accesskey",
    "signingkey",
    "sessionkey",
)
_SECRET_KEYS_EXACT: Final = frozenset({"auth", "pwd", "jwt", "bearer", "xauth"})
_NON_ALNUM: Final = re.compile(r"[^a-z0-9]")
_key_cache: dict[str, bool] = {}
_KEY_CACHE_MAX: Final = 4096


def is_secret_key(key: str) -> bool:
    """True for credential-shaped keys (``token``, ``client_secret`` …), not ``input_tokens``."""
    hit = _key_cache.get(key)
    if hit is not None:
        return hit
    norm = _NON_ALNUM.sub("", key.lower())
    # "token" only as a suffix: usage counters end in "tokens" and are not secrets.
    hit = (
        norm in _SECRET_KEYS_EXACT
        or norm.endswith("token")
        or any(part in norm for part in _SECRET_KEY_PARTS)
    )
    if len(_key_cache) < _KEY_CACHE_MAX:
        _key_cache[key] = hit
    return hit


# --- values inside strings -----------------------------------------------------------------------


class _Rule(NamedTuple):
    literals: tuple[str, ...]  # lowercase; the rule runs only when one of them occurs
    pattern: re.Pattern[str]  # finds a secret; group 1 (or the whole match) is masked
    anycase: re.Pattern[str] | None  # for rules over the lowercased text: the same, on the text
    alone: bool = False  # the match must not follow a letter or digit


def _rule(literals: tuple[str, ...], pattern: str, *, lower: bool = False) -> _Rule:
    anycase = re.compile(pattern, re.IGNORECASE | re.DOTALL) if lower else None
    return _Rule(literals, re.compile(pattern, re.DOTALL), anycase)


# NAME=value / NAME: value / "NAME": "value" (env dumps, .env, YAML, JSON text) with a
# credential keyword in NAME. An "Authorization: Bearer x" header is one secret, scheme included.
# The value never starts with "[" (see the module docstring).
_VALUE: Final = (
    r"""[a-z0-9_.-]*["']?[ \t]*[=:][ \t]*(?:(?:bearer|basic|token)\s+)?+"""
    # A quoted value whole (spaces and all), else a bare word (a quote left open included).
    r"""(?:"([^"\n]*)"|'([^'\n]*)'|["']?([^\s"',;\[][^\s"',;]*))"""
)

# Every rule starts with a literal and runs only when that literal occurs; case-insensitive ones
# run over the lowercased text. A single case-insensitive alternation of all of them was about
# 100 x slower on ordinary source code.
_RULES: Final = (
    *(
        _rule((literal,), keyword + _VALUE, lower=True)
        for literal, keyword in (
            ("token", "token(?!s)"),
            ("secret", "secret"),
            ("pass", "pass(?:w(?:or)?d|phrase)"),
            ("key", "(?:api|private|access|auth)[_-]?key"),
            ("credential", "credentials?"),
            ("authorization", "authorization"),
            ("cookie", "cookie"),
        )
    ),
    _rule(("bearer",), r"bearer\s+([a-z0-9._~+/-]{8,}=*)", lower=True),
    # PEM private keys: the whole block (to the end of the text when it was cut off).
    _rule(
        ("-----begin",),
        r"-----BEGIN[A-Z ]{0,40} PRIVATE KEY-----(?:.*?-----END[A-Z ]{0,40} PRIVATE KEY-----|.*)",
    ),
    _rule(("sk-ant-",), r"sk-ant-[A-Za-z0-9_-]{8,}"),
    _rule(("sk-",), r"sk-[A-Za-z0-9_-]{20,}")._replace(alone=True),
    _rule(("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), r"gh[pousr]_[A-Za-z0-9]{16,}"),
    _rule(("github_pat_",), r"github_pat_[A-Za-z0-9_]{16,}"),
    _rule(("xox",), r"xox[abprs]-[A-Za-z0-9-]{10,}"),
    _rule(("akia", "asia"), r"(?:AKIA|ASIA)[A-Z0-9]{16}"),
    _rule(("eyj",), r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),
)


def _spans(text: str) -> list[tuple[int, int]]:
    low = text.lower()
    # A few characters change length when lowercased: then spans of ``low`` would not fit.
    same = len(low) == len(text)
    spans: list[tuple[int, int]] = []
    for rule in _RULES:
        for literal in rule.literals:
            if literal in low:
                break
        else:
            continue
        if rule.anycase is None:
            haystack, pattern = text, rule.pattern
        elif same:
            haystack, pattern = low, rule.pattern
        else:
            haystack, pattern = text, rule.anycase
        for match in pattern.finditer(haystack):
            # The masked part: the one group that took part in the match, or all of it.
            group = match.lastindex or 0
            start, end = match.span(group)
            if start == end:
                continue
            if rule.alone and start and haystack[start - 1].isalnum():
                continue
            spans.append((start, end))
    return spans


def redact_text(text: str) -> str:
    """``text`` with credential-shaped values (tokens, keys, ``NAME=value`` secrets) masked."""
    spans = _spans(text)
    if not spans:
        return text
    spans.sort()
    out: list[str] = []
    pos = 0
    for start, end in spans:
        # Overlapping finds (a "private_key:" holding a PEM block) become one mask.
        if end <= pos:
            continue
        if start >= pos:
            out.append(text[pos:start])
            out.append(MASK)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def redact_value(value: Any) -> Any:
    """A copy of a JSON-shaped value with secret keys masked at any depth and strings redacted."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(key, str):
                if is_secret_key(key):
                    out[redact_text(key)] = MASK
                    continue
                key = redact_text(key)
            out[key] = redact_value(item)
        return out
    if isinstance(value, list | tuple):
        return [redact_value(item) for item in value]
    return value


# --- bounds --------------------------------------------------------------------------------------


def cut_marker(cut_bytes: int) -> str:
    """The marker left where ``cut_bytes`` bytes were cut."""
    return f"[...{cut_bytes} bytes cut]"


def bound_text(text: str, limit: int, *, dropped: int = 0) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, marker included, on a character boundary.

    ``dropped`` counts bytes already removed before this call, so that the marker stays true.
    """
    # Fast path: a str of n characters never encodes to more than 4n bytes.
    if not dropped and len(text) * 4 <= limit:
        return text
    raw = text.encode("utf-8", "surrogatepass")
    if not dropped and len(raw) <= limit:
        return text
    total = len(raw) + dropped
    room = max(limit - len(cut_marker(total)), 0)
    # Step back over UTF-8 continuation bytes (10xxxxxx) to land on a character's first byte.
    while room and room < len(raw) and raw[room] & 0xC0 == 0x80:
        room -= 1
    room = min(room, len(raw))
    kept = raw[:room].decode("utf-8", "surrogatepass")
    marker = cut_marker(total - room)
    return (kept + marker) if len(marker) <= limit else kept


def bound_chars(text: str, limit: int, *, dropped: int = 0) -> str:
    """``text`` cut to at most ``limit`` characters, marker included (O Chat cuts at 240)."""
    if not dropped and len(text) <= limit:
        return text
    total = len(text) + dropped
    room = min(max(limit - len(f"[...{total} chars cut]"), 0), len(text))
    marker = f"[...{total - room} chars cut]"
    return text[:room] + marker if len(marker) <= limit else text[:limit]


def clean_text(text: str, limit: int) -> str:
    """Redacted, then bounded to ``limit`` UTF-8 bytes: what any frame may carry of a text."""
    # Redacting megabytes only to keep 4 KiB is wasted work: cut well past the bound first. The
    # margin keeps any secret that starts before the final cut whole enough to be recognised.
    precut = 2 * limit + 4096
    if len(text) > precut:
        head = text[:precut]
        dropped = len(text.encode("utf-8", "surrogatepass")) - len(
            head.encode("utf-8", "surrogatepass")
        )
        return bound_text(redact_text(head), limit, dropped=dropped)
    return bound_text(redact_text(text), limit)


def clean_chars(text: str, limit: int) -> str:
    """Redacted, then bounded to ``limit`` characters (assistant text, card titles)."""
    precut = 2 * limit + 4096
    if len(text) > precut:
        return bound_chars(redact_text(text[:precut]), limit, dropped=len(text) - precut)
    return bound_chars(redact_text(text), limit)


def clean_value(value: Any, *, string_bytes: int, depth: int = 6, items: int = 64) -> Any:
    """:func:`redact_value` and :func:`bound_value` in one walk (tool arguments, usage)."""
    if isinstance(value, str):
        return clean_text(value, string_bytes)
    if isinstance(value, dict):
        if depth <= 0:
            return f"[...{len(value)} keys cut]"
        out: dict[Any, Any] = {}
        over = len(value) > items
        for n, (key, item) in enumerate(value.items()):
            if over and n == items - 1:
                out["..."] = f"[...{len(value) - n} keys cut]"
                break
            if isinstance(key, str):
                if is_secret_key(key):
                    out[redact_text(key)] = MASK
                    continue
                key = redact_text(key)
            out[key] = clean_value(item, string_bytes=string_bytes, depth=depth - 1, items=items)
        return out
    if isinstance(value, list | tuple):
        if depth <= 0:
            return f"[...{len(value)} items cut]"
        kept = value[: items - 1] if len(value) > items else value
        out_list = [
            clean_value(item, string_bytes=string_bytes, depth=depth - 1, items=items)
            for item in kept
        ]
        if len(value) > items:
            out_list.append(f"[...{len(value) - len(kept)} items cut]")
        return out_list
    return value
