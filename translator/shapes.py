"""Credential shapes: what any text may hold, and how it is masked (DESIGN invariant 6).

Keys (``api_key``, ``Authorization`` …) mark a value as secret whatever it is; inside a text,
``NAME=value`` pairs with a credential keyword in ``NAME``, bearer tokens, URL userinfo, private
keys and the token formats of the big providers are masked. The mask ``[redacted]`` cannot begin
a credential-shaped value (values never start with ``[``), which keeps redaction idempotent. The
exact values a run is known to hold are :class:`~translator.redact.Redactor`'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Final

_native_screen: Callable[[str], bool] | None
try:
    from codelegate.translator._screen import screen as _native_screen
except ImportError:  # the source build: no native code
    _native_screen = None

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
    "accountkey",
)
_SECRET_KEYS_EXACT: Final = frozenset({"auth", "pwd", "jwt", "bearer", "xauth"})
_NON_ALNUM: Final = re.compile(r"[^a-z0-9]")
_key_cache: dict[str, bool] = {}
KEY_CACHE_MAX: Final = 4096


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
    if len(_key_cache) < KEY_CACHE_MAX:
        _key_cache[key] = hit
    return hit


# --- values inside strings -----------------------------------------------------------------------


# NAME=value / NAME: value / "NAME": "value" (env dumps, .env, YAML, JSON text) with a
# credential keyword in NAME, also JSON-escaped (``{\"api_key\": \"…\"}`` in a Write's
# content, a diff, ``cat`` of a JSON string). An "Authorization: Bearer x" header is one secret,
# scheme included. A quoted value is masked whole; a bare one up to a space or quote; it never
# starts with "[" (see the module docstring).
_VALUE_ONLY: Final = (
    r"""[ \t]*(?:(?:bearer|basic|token)\s+)?+"""
    # A private key as the value (a service account's "private_key": "-----BEGIN …") is left to
    # its own branch, which masks the whole block: a bare value would stop at the header's
    # first space and leave the key's body.
    r"""(?![\\"']*-----begin)"""
    r"""(?:\\*"([^"\n\\]*)\\*"|'([^'\n]*)'|\\*["']?([^\s"',;\[\\][^\s"',;]*))"""
)
_VALUE: Final = r"""[a-z0-9_.-]*\\*["']?[ \t]*[=:]""" + _VALUE_ONLY
_KEYWORDS: Final = (
    "token(?!s)",  # "input_tokens" is a counter, not a secret
    "secret",
    "pass(?:w(?:or)?d|phrase)",
    "api[_-]?key",
    "private[_-]?key",
    "acc(?:ess|ount)[_-]?key",  # AccountKey=…: Azure connection strings
    "credentials?",
    "cookie",
)
# One alternation, run once over the lowercased text. Every branch starts with a literal, so
# that the regex engine skips ahead on a set of first characters; a branch starting with a group
# or an assertion would make it try every position (checks that need one are done in
# ``_spans``). The masked part is the branch's group when it has one, else the whole match.
# Branches with the same first letters share one (each branch costs a test wherever the text
# has its first letter).
_SECRET_SOURCE: Final = "|".join(
    (
        *(keyword + _VALUE for keyword in _KEYWORDS),
        # auth_key / authorization as names, and a JSON "auth" key (docker's config.json),
        # not "author".
        r"auth(?:(?:[_-]?key|orization)" + _VALUE + r"""|\\*["'][ \t]*:""" + _VALUE_ONLY + ")",
        r"bearer\s+(?!-----begin)([a-z0-9._~+/-]{8,}=*)",  # not a private key's header
        # A URL's userinfo (postgres://u:p@h/db, https://x:token@github.com): all of it, since
        # a token may stand where the user name does. Up to the last "@" before the host.
        r"://([^\s/?#\[]+)@",
        # A PEM or PGP private key: the whole block (to the end of the text when it was cut off).
        r"-----begin[a-z ]{0,40} private key(?: block)?-----"
        r"(?:.*?-----end[a-z ]{0,40} private key(?: block)?-----|.*)",
        r"sk-ant-[a-z0-9_-]{8,}",
        r"sk-[a-z0-9_-]{20,}",  # not after a letter or digit (checked in _spans)
        r"gh[pousr]_[a-z0-9]{16,}",
        r"github_pat_[a-z0-9_]{16,}",
        r"xox[abprs]-[a-z0-9-]{10,}",
        # AWS key ids, upper case in the text, and Google API keys, "AIza" in the text (both
        # checked in _spans).
        r"a(?:[ks]ia[a-z0-9]{16}|iza[a-z0-9_-]{35})",
        r"eyj[a-z0-9_-]{8,}\.[a-z0-9_-]{8,}\.[a-z0-9_-]*",
    )
)
_SECRET: Final = re.compile(_SECRET_SOURCE, re.DOTALL)
# How many matches in a row that end inside an earlier one are searched for (``_overlapping``).
_INSIDE_SEARCHES: Final = 4
# For the rare text whose lowercasing changes its length (so spans would not fit the text).
_SECRET_ANYCASE: Final = re.compile(_SECRET_SOURCE, re.DOTALL | re.IGNORECASE)


_LITERALS: Final = re.compile(
    "token(?!s)|secret|pass|key|auth(?:orization|\\\\|[\"'])|credential|cookie|bearer|-----begin"
    "|sk-|gh|github_pat_|xox"
    "|akia|asia|eyj|aiza"
    r"|://[^\s/?#\[]+@"  # a URL with userinfo, not every URL
)
# Up to this length the chain of ``in`` below is the cheaper screen; past it one regex pass is,
# unless the text lacks "=" and ":" (then the chain skips most of its scans: see below).
_CHAIN_CHARS: Final = 1024


def _odd_case(low: str) -> bool:
    """Whether ``low`` holds a letter the case-blind regex takes for an ASCII one though
    lowercasing leaves them apart: the long s ("ſ" matches "s") and the dotless i ("ı" matches
    "i"), and U+0307, which stands in the lowercase of a text that held a dotted capital I
    (whose lowercase is longer). ``_spans`` searches a text holding one in its own case,
    case-blind, and no literal can rule a match out."""
    # Three ``in`` tests, each a memchr, not a character class: a regex search steps through
    # the text (a tenth of the screen's time on the texts that are not ASCII, measured).
    return "\u0307" in low or "\u017f" in low or "\u0131" in low


def screen_chain(low: str) -> bool:
    """Whether the lowercased ``low`` holds a literal some credential shape needs, by the chain
    alone whatever its length: what the compiled build's screen answers (``_screen.c``)."""
    if not low.isascii() and _odd_case(low):
        return True
    return _chain(low, "=" in low or ":" in low)


def _screen_source(low: str) -> bool:
    """:func:`may_hold_a_secret` of the source build."""
    # Every pattern above needs one of these literals, and most texts hold none. On a short
    # text a chain of ``in`` is the cheapest test (each a fast search in C; a regex pays its
    # set-up per call); but each ``in`` reads the whole text again, and on a long one a single
    # regex pass costs less. Measured on the benchmark's texts, best of 15 rounds: past 1,024
    # characters the regex reads 5.8 ns a character and the chain 12.3; from 256 to 1,024 they
    # are even; below, the chain is cheaper.
    if not low.isascii() and _odd_case(low):  # isascii: a flag, not a scan
        return True
    keyed = "=" in low or ":" in low
    if keyed and len(low) > _CHAIN_CHARS:
        return _LITERALS.search(low) is not None
    return _chain(low, keyed)


def _chain(low: str, keyed: bool) -> bool:
    # ("key" covers every *key name, "auth" authorization, "sk-" sk-ant-; a URL has userinfo
    # only with an "@".)
    # Most literals are tested only when the text holds a character that every pattern they
    # start needs: a NAME=value pair (a keyword or "auth" in NAME) its "=" or ":", a Slack
    # token its "-", a GitHub token its "_", a JWT its ".". Looking for one character is a
    # memchr, nearly free, and most texts lack "=" and ":" (83 % of those the benchmark
    # screens): they skip seven scans. Bearer tokens, AWS and Google keys need no such
    # character. A literal holding a rare letter (the "x" of "xox", the "j" of "eyj", the "z"
    # of "aiza") is looked for only where that letter is: prose and commands seldom hold one.
    return (
        (
            keyed
            and (
                ("token" in low and _not_only_counters(low))
                or "secret" in low
                or "pass" in low
                or "key" in low
                or ("auth" in low and _auth_as_a_name(low))
                or "credential" in low
                or "cookie" in low
                or ("@" in low and "://" in low)
            )
        )
        or ("-" in low and ("sk-" in low or ("x" in low and "xox" in low) or "-----begin" in low))
        or ("_" in low and ("gh" in low or "github_pat_" in low))
        or ("." in low and "j" in low and "eyj" in low)
        or "bearer" in low
        or "akia" in low
        or "asia" in low
        or ("z" in low and "aiza" in low)
    )


# Whether the lowercased ``low`` may hold a credential shape (never a miss). The compiled build
# reads the text once, in C, whatever its length (``_screen.c``, which setup.py builds with it:
# bench/RESULTS.md §1); the source chains ``in`` tests, or makes one regex pass over a long
# text. None of them misses, and what is masked is the masking regex's to say: which screen
# answers changes how soon a text is passed, not what a frame carries.
may_hold_a_secret: Final[Callable[[str], bool]] = _native_screen or _screen_source


def _not_only_counters(low: str) -> bool:
    # "token" as a keyword is never followed by "s" (usage counters such as the CLI's
    # "subagent_tokens: 15", in every subagent's hand-back, are not secrets).
    return low.count("token") != low.count("tokens")


def _auth_as_a_name(low: str) -> bool:
    # "auth" starts a name only as authorization, a quoted key or auth_key (which "key" finds):
    # "authority" and "author" (also in every subagent's hand-back) are not.
    return "authorization" in low or 'auth"' in low or "auth'" in low or "auth\\" in low


def _spans(text: str, low: str) -> list[tuple[int, int]]:
    same = len(low) == len(text) and (low.isascii() or not _odd_case(low))
    matches = _overlapping(_SECRET, low) if same else _overlapping(_SECRET_ANYCASE, text)
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
            if head == "aiza" and not text.startswith("AIza", start):
                continue
            # A generic sk- key must stand alone; sk-ant- keys are distinctive enough anywhere.
            glued = start and text[start - 1].isalnum() and not low.startswith("sk-ant-", start)
            if head[:3] == "sk-" and glued:
                continue
        spans.append((start, end))
    return spans


def _overlapping(pattern: re.Pattern[str], text: str) -> Iterator[re.Match[str]]:
    """Every match of ``pattern`` in ``text``, also those that start inside another."""
    # A branch that takes a value up to a space (or a bearer token up to a character it may not
    # hold) can end inside a second secret, whose own branch has to start there:
    # `api_key=x&-----BEGIN … KEY-----`, `Bearer x/api_key=y`. finditer would go on after the
    # first match only, and show the rest of the second. Each search from inside a match costs
    # up to that match's length again: after a few in a row that reach no further (`token=`
    # ten thousand times over), the search goes on from the furthest end, so that no text costs
    # more than a few passes.
    match = pattern.search(text)
    reach = inside = 0
    while match is not None:
        yield match
        if match.end() > reach:
            reach, inside = match.end(), 0
        else:
            inside += 1
        after = match.start() + 1 if inside < _INSIDE_SEARCHES else reach
        match = pattern.search(text, after)


def redact_text(text: str) -> str:
    """``text`` with credential-shaped values (tokens, keys, ``NAME=value`` secrets) masked."""
    low = text.lower()
    if not may_hold_a_secret(low):
        return text
    return mask_shapes(text, low)


def mask_shapes(text: str, low: str) -> str:
    """:func:`redact_text` of a ``text`` the screen passed (``low``: its lowercase)."""
    spans = _spans(text, low)
    if not spans:
        return text
    # Spans that overlap are masked as one; those that only touch, each on its own.
    out: list[str] = []
    pos = 0
    for start, end in sorted(spans):
        if start >= pos:
            out.append(text[pos:start])
            out.append(MASK)
            pos = end
        elif end > pos:
            pos = end
    out.append(text[pos:])
    return "".join(out)
