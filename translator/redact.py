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
from collections.abc import Callable
from typing import Any, Final

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


# NAME=value / NAME: value / "NAME": "value" (env dumps, .env, YAML, JSON text) with a
# credential keyword in NAME. An "Authorization: Bearer x" header is one secret, scheme included.
# A quoted value is masked whole; a bare one up to a space or quote; it never starts with "["
# (see the module docstring).
_VALUE: Final = (
    r"""[a-z0-9_.-]*["']?[ \t]*[=:][ \t]*(?:(?:bearer|basic|token)\s+)?+"""
    r"""(?:"([^"\n]*)"|'([^'\n]*)'|["']?([^\s"',;\[][^\s"',;]*))"""
)
_KEYWORDS: Final = (
    "token(?!s)",  # "input_tokens" is a counter, not a secret
    "secret",
    "pass(?:w(?:or)?d|phrase)",
    "api[_-]?key",
    "private[_-]?key",
    "access[_-]?key",
    "auth(?:[_-]?key|orization)",
    "credentials?",
    "cookie",
)
# One alternation, run once over the lowercased text. Every branch starts with a literal, so
# that the regex engine skips ahead on a set of first characters; a branch starting with a group
# or an assertion would make it try every position (checks that need one are done in
# ``_spans``). The masked part is the branch's group when it has one, else the whole match.
_SECRET_SOURCE: Final = "|".join(
    (
        *(keyword + _VALUE for keyword in _KEYWORDS),
        r"bearer\s+([a-z0-9._~+/-]{8,}=*)",
        # A PEM private key: the whole block (to the end of the text when it was cut off).
        r"-----begin[a-z ]{0,40} private key-----"
        r"(?:.*?-----end[a-z ]{0,40} private key-----|.*)",
        r"sk-ant-[a-z0-9_-]{8,}",
        r"sk-[a-z0-9_-]{20,}",  # not after a letter or digit (checked in _spans)
        r"gh[pousr]_[a-z0-9]{16,}",
        r"github_pat_[a-z0-9_]{16,}",
        r"xox[abprs]-[a-z0-9-]{10,}",
        r"akia[a-z0-9]{16}",  # upper case in the text (checked in _spans)
        r"asia[a-z0-9]{16}",
        r"eyj[a-z0-9_-]{8,}\.[a-z0-9_-]{8,}\.[a-z0-9_-]*",
    )
)
_SECRET: Final = re.compile(_SECRET_SOURCE, re.DOTALL)
# For the rare text whose lowercasing changes its length (so spans would not fit the text).
_SECRET_ANYCASE: Final = re.compile(_SECRET_SOURCE, re.DOTALL | re.IGNORECASE)


_LITERALS: Final = re.compile(
    "token|secret|pass|key|auth|credential|cookie|bearer|-----begin|sk-|gh|github_pat_|xox"
    "|akia|asia|eyj"
)


def _may_hold_a_secret(low: str) -> bool:
    # Every pattern above needs one of these literals, and most texts hold none. On short texts
    # a chain of ``in`` is the cheapest test; on long ones, one regex pass over them is.
    # ("key" covers every *key name, "auth" authorization, "sk-" sk-ant-.)
    if len(low) > 1024:
        return _LITERALS.search(low) is not None
    return (
        "token" in low
        or "secret" in low
        or "pass" in low
        or "key" in low
        or "auth" in low
        or "credential" in low
        or "cookie" in low
        or "bearer" in low
        or "-----begin" in low
        or "sk-" in low
        or "gh" in low
        or "github_pat_" in low
        or "xox" in low
        or "akia" in low
        or "asia" in low
        or "eyj" in low
    )


def _spans(text: str, low: str) -> list[tuple[int, int]]:
    same = len(low) == len(text)
    matches = _SECRET.finditer(low) if same else _SECRET_ANYCASE.finditer(text)
    spans: list[tuple[int, int]] = []
    for match in matches:
        group = match.lastindex
        if group is not None:  # a NAME=value or Bearer value
            start, end = match.span(group)
            if start == end:
                continue
        else:  # a token shape, masked whole
            start, end = match.span()
            head = low[start : start + 4]
            if head in ("akia", "asia") and not text[start:end].isupper():
                continue
            # A generic sk- key must stand alone; sk-ant- keys are distinctive enough anywhere.
            glued = start and text[start - 1].isalnum() and not low.startswith("sk-ant-", start)
            if head[:3] == "sk-" and glued:
                continue
        spans.append((start, end))
    return spans


def redact_text(text: str) -> str:
    """``text`` with credential-shaped values (tokens, keys, ``NAME=value`` secrets) masked."""
    low = text.lower()
    if not _may_hold_a_secret(low):
        return text
    spans = _spans(text, low)
    if not spans:
        return text
    # One regex pass: the spans come sorted and never overlap.
    out: list[str] = []
    pos = 0
    for start, end in spans:
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


# How far past a bound a text is redacted before it is cut, and how much of that is dropped.
_MARGIN: Final = 512
_UNSURE: Final = 256


def cut_marker(cut_bytes: int) -> str:
    """The marker left where ``cut_bytes`` bytes were cut."""
    return f"[...{cut_bytes} bytes cut]"


def bound_text(
    text: str, limit: int, *, dropped: int = 0, settle: Callable[[str], str] | None = None
) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, marker included, on a character boundary.

    ``dropped`` counts bytes already removed before this call, so that the marker stays true.
    ``settle`` (redaction) is applied again to what a cut keeps: see :func:`_settle`.
    """
    # Fast path: a str of n characters never encodes to more than 4n bytes.
    if not dropped and len(text) * 4 <= limit:
        return text
    raw = text.encode("utf-8", "surrogatepass")
    if not dropped and len(raw) <= limit:
        return text
    total = len(raw) + dropped
    room = max(limit - len(cut_marker(total)), 0)
    kept = _byte_prefix(raw, room)
    if settle is not None:
        kept = _settle(
            kept, settle, lambda s: _byte_prefix(s.encode("utf-8", "surrogatepass"), room)
        )
    marker = cut_marker(total - len(kept.encode("utf-8", "surrogatepass")))
    return (kept + marker) if len(marker) <= limit else kept


def _byte_prefix(raw: bytes, room: int) -> str:
    # Step back over UTF-8 continuation bytes (10xxxxxx) to land on a character's first byte.
    while room and room < len(raw) and raw[room] & 0xC0 == 0x80:
        room -= 1
    return raw[:room].decode("utf-8", "surrogatepass")


def _settle(kept: str, settle: Callable[[str], str], recut: Callable[[str], str]) -> str:
    # A cut can leave the start of kept text right after a "NAME=" ("password=Bearer [redacted]"
    # cut to "password=B"): redacting the kept part again makes cleaning idempotent. Masks
    # only grow, so a few rounds settle it; if not, keep nothing rather than something unsure.
    for _ in range(4):
        again = settle(kept)
        if again == kept:
            return kept
        kept = recut(again)
    return ""


def bound_chars(
    text: str, limit: int, *, dropped: int = 0, settle: Callable[[str], str] | None = None
) -> str:
    """``text`` cut to at most ``limit`` characters, marker included (O Chat cuts at 240)."""
    if not dropped and len(text) <= limit:
        return text
    total = len(text) + dropped
    room = min(max(limit - len(f"[...{total} chars cut]"), 0), len(text))
    marker = f"[...{total} chars cut]"
    if len(marker) > limit:
        room = limit  # no room for a marker: just the start
    kept = text[:room]
    if settle is not None:
        kept = _settle(kept, settle, lambda s: s[:room])
    marker = f"[...{total - len(kept)} chars cut]"
    return kept + marker if len(kept) + len(marker) <= limit else kept


def clean_text(text: str, limit: int) -> str:
    """Redacted, then bounded to ``limit`` UTF-8 bytes: what any frame may carry of a text."""
    # The common case first, in as few calls as possible: short, and nothing to mask.
    if len(text) * 4 <= limit and not _may_hold_a_secret(text.lower()):
        return text
    precut = limit + _MARGIN
    if len(text) <= precut:
        return bound_text(redact_text(text), limit, settle=redact_text)
    # Redacting megabytes only to keep 4 KiB is wasted work: cut past the bound first (a
    # character is at least a byte). A secret cut off at the end of the head might be too short
    # to be recognised: the head's last characters are dropped after redaction.
    red = redact_text(text[:precut])[:-_UNSURE]
    dropped = len(text.encode("utf-8", "surrogatepass")) - len(red.encode("utf-8", "surrogatepass"))
    return bound_text(red, limit, dropped=dropped, settle=redact_text)


def clean_chars(text: str, limit: int) -> str:
    """Redacted, then bounded to ``limit`` characters (assistant text, card titles)."""
    precut = limit + _MARGIN
    if len(text) <= precut:
        red = redact_text(text)
        return red if len(red) <= limit else bound_chars(red, limit, settle=redact_text)
    red = redact_text(text[:precut])[:-_UNSURE]
    return bound_chars(red, limit, dropped=len(text) - len(red), settle=redact_text)


def clean_flat(value: dict[Any, Any], string_bytes: int, items: int) -> dict[Any, Any] | None:
    """``value`` itself when cleaning would not change it, else None (then use clean_value).

    The fast path for tool arguments, mostly a few short strings under known keys: one screen
    over all the strings at once instead of a full walk.
    """
    if len(value) > items:
        return None
    texts: list[str] = []
    for key, item in value.items():
        known = _keys.get(key) if type(key) is str else None
        if known is None or known[1] or known[0] != key:
            return None  # a key not seen yet, a secret key, or one that redaction changes
        kind = type(item)
        if kind is str:
            if len(item) * 4 > string_bytes:
                return None
            texts.append(item)
        elif not (item is None or kind is bool or kind is int or kind is float):
            return None
    # Joined on newlines, which no literal of the screen contains: a miss stays a miss.
    if texts and _may_hold_a_secret("\n".join(texts).lower()):
        return None
    return value


def clean_value(value: Any, *, string_bytes: int, depth: int = 6, items: int = 64) -> Any:
    """:func:`redact_value` and bounds in one walk (tool arguments, usage).

    Strings are cut to ``string_bytes``, nesting to ``depth`` and containers to ``items`` entries
    (an over-full one keeps ``items - 1`` plus a marker, so cleaning twice changes nothing).
    """
    return _clean(value, string_bytes, depth, items)


# Keys repeat (every Bash call has "command"): each distinct key is redacted and judged once.
_keys: dict[str, tuple[str, bool]] = {}


def _learn_key(key: str) -> tuple[str, bool]:
    known = (redact_text(key), is_secret_key(key))
    if len(_keys) < _KEY_CACHE_MAX:
        _keys[key] = known
    return known


def _clean(value: Any, string_bytes: int, depth: int, items: int) -> Any:
    kind = type(value)
    if kind is str:
        return clean_text(value, string_bytes)
    if kind is dict:
        if depth <= 0:
            return f"[...{len(value)} keys cut]"
        out: dict[Any, Any] = {}
        over = len(value) > items
        for n, (key, item) in enumerate(value.items()):
            if over and n == items - 1:
                out["..."] = f"[...{len(value) - n} keys cut]"
                break
            if type(key) is str:
                known = _keys.get(key)
                if known is None:
                    known = _learn_key(key)
                key, secret = known
                if secret:
                    out[key] = MASK
                    continue
            # Tool arguments are mostly flat: strings and scalars without a call each.
            if type(item) is str:
                out[key] = clean_text(item, string_bytes)
            elif item is None or type(item) is bool or type(item) is int:
                out[key] = item
            else:
                out[key] = _clean(item, string_bytes, depth - 1, items)
        return out
    if kind is list or kind is tuple:
        if depth <= 0:
            return f"[...{len(value)} items cut]"
        kept = value[: items - 1] if len(value) > items else value
        out_list = [_clean(item, string_bytes, depth - 1, items) for item in kept]
        if len(value) > items:
            out_list.append(f"[...{len(value) - len(kept)} items cut]")
        return out_list
    return value
