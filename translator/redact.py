"""Redaction of credentials, and bounds on sizes (DESIGN invariants 6 and 7).

Used on every frame the translator builds, and by the daemon on its logs and the CLI's stderr.

Two rules hold whatever the input, and are property-tested:
- *idempotent*: cleaning clean output changes nothing (the daemon may clean twice);
- *bounded*: redaction happens before cutting, so a mask never pushes a value past its bound.

Shapes (:mod:`translator.shapes`) are what any text may hold; a :class:`Redactor` adds the exact
values a run is known to hold (the credentials the daemon passes to the CLI), with their base64,
hex, JSON- and URL-escaped forms, whatever their shape, and applies the bounds
(:mod:`translator.bounds`). A form also counts with line breaks anywhere in it, as encoding
commands print it (``base64`` wraps at 76 columns, ``xxd -p`` at 60, ``od -An -tx1`` spaces hex
over lines). The module-level functions are those of the redactor that knows no values.
"""

from __future__ import annotations

import base64
import json
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable
from typing import Any, Final
from urllib.parse import quote

from codelegate.translator.bounds import bound_chars, bound_text, utf8_len
from codelegate.translator.shapes import (
    KEY_CACHE_MAX,
    MASK,
    is_secret_key,
    mask_shapes,
    may_hold_a_secret,
    redact_text,
)

# How far past a bound a text is redacted before it is cut, and how much of that is dropped.
_MARGIN: Final = 512
_UNSURE: Final = 256
_LINE_CUT: Final = "\n[\0]"
_UNSURE_BEFORE_CUT: Final = re.compile(rf"[^\n]{{0,{_UNSURE}}}\n\[\0\]")


def _settle_cut(clean: str, redact: Callable[[str], str]) -> Callable[[str], str] | None:
    """What a cut of ``clean``, a text the screen passed, must be redacted with again: nothing
    when it is ASCII. The screen looks for lowercased literals and forms, and an ASCII text
    lowercases character by character, so every part of it passes too. (Elsewhere one character
    can lowercase differently at a cut: a final sigma.)"""
    return None if clean.isascii() else redact


# --- known values --------------------------------------------------------------------------------

_SIGMA: Final = "\u03c3"
_FINAL_SIGMA: Final = "\u03c2"

# A shorter value cannot be told from ordinary text: masking it everywhere would garble output
# and hide nothing a guess would not find.
MIN_KNOWN_CHARS: Final = 8


def known_forms(values: Iterable[str]) -> frozenset[str]:
    """Every form of ``values`` a text may carry: as is, JSON- and URL-escaped, hex (also spaced
    between bytes, as ``od -An -tx1`` prints a short value on one line), base64.

    Base64 is taken at each of the three alignments a value can have inside a longer encoded
    text (``Basic`` auth of ``user:token``, a config file dumped as base64), keeping only the
    characters that depend on the value alone: whatever surrounds it, those appear.
    """
    forms: set[str] = set()
    for value in values:
        if len(value) < MIN_KNOWN_CHARS:
            continue
        raw = value.encode("utf-8", "surrogatepass")
        found = {
            value,
            json.dumps(value)[1:-1],
            json.dumps(value, ensure_ascii=False)[1:-1],
            quote(value, safe=""),
            raw.hex(),
            raw.hex().upper(),
            raw.hex(" "),
            raw.hex(" ").upper(),
        }
        for pad in range(3):
            encoded = base64.b64encode(b"\0" * pad + raw).decode()
            # Characters whose 6 bits all come from the value: from bit 8*pad to 8*(pad+n).
            inner = encoded[-(-8 * pad // 6) : (8 * pad + 8 * len(raw)) // 6]
            found.add(inner)
            found.add(inner.replace("+", "-").replace("/", "_"))
        # A form inside the mask itself would make masking grow without end.
        forms.update(form for form in found if len(form) >= MIN_KNOWN_CHARS and form not in MASK)
    return frozenset(forms)


# What wrapping encoders put inside a form: line breaks. (Not spaces: removing them costs a
# copy of most texts, and a command spaces a value only as hex between bytes, a form of its own.)
# The pieces of a text kept to look for split forms in: its lines, and the line break of a cut
# mark (clean_lines), which no form of one line holds, so that no mask runs over a cut.
_LINE: Final = re.compile(rf"[^\r\n]+|\n(?={re.escape(_LINE_CUT[1:])})")


def _unbroken(low: str) -> str:
    """``low`` without its line breaks: where a form they split is whole again."""
    return low.replace("\n", "").replace("\r", "")


class Redactor:
    """Redaction and bounds for one run: the shapes above plus the exact values it knows.

    Built once per run (the forms of the known values are computed here, not per text); with no
    known value it is exactly the module-level functions. ``text`` and ``screen`` are the two
    calls every other method goes through.
    """

    __slots__ = (
        "_gram",
        "_grams",
        "_keys",
        "_known",
        "_lens",
        "_lined",
        "_lows",
        "_masked",
        "_plain",
        "_sampled",
        "_single",
        "_step",
        "screen",
        "text",
    )

    def __init__(self, known: Iterable[str] = ()) -> None:
        forms = known_forms(known)
        self._keys: dict[str, tuple[str, bool]] = {}
        # The keys of ``_keys`` that are kept as they are, with their value: one lookup each
        # in clean_flat.
        self._plain: set[str] = set()
        # Shortest first: a text is looked through only for the forms that fit in it (most texts
        # are shorter than any credential, and cost one comparison).
        lows = {form.lower().replace(_FINAL_SIGMA, _SIGMA) for form in forms}
        self._lows = tuple(sorted(lows, key=lambda f: (len(f), f)))
        self._lens = tuple(len(form) for form in self._lows)
        # In a text of several lines, the forms of one line are looked for in the text without
        # its line breaks (where a split one is whole again, and an unsplit one still is), the
        # others (a value that holds a line break) as they are.
        single = tuple(form for form in self._lows if _unbroken(form) == form)
        lined = tuple(form for form in self._lows if _unbroken(form) != form)
        self._single = (single, tuple(map(len, single)))
        self._lined = (lined, tuple(map(len, lined)))
        # Every ``_gram``-character piece of every form, for the sampling in _holds_known.
        shortest = self._lens[0] if forms else MIN_KNOWN_CHARS
        self._gram = gram = min(8, shortest // 2)
        self._step = shortest - gram + 1
        self._sampled = self._step * len(self._lows)
        self._grams = frozenset(
            form[i : i + gram] for form in self._lows for i in range(len(form) - gram + 1)
        )
        # Longest first, so that a value is masked whole rather than by a shorter form in it.
        ordered = sorted(forms, key=lambda form: (-len(form), form))
        self._known = re.compile("|".join(map(re.escape, ordered))) if forms else None
        # Plain functions in instance slots: no method binding on the hot path.
        self.text: Callable[[str], str] = self._text_known if forms else redact_text
        self.screen: Callable[[str], bool] = self._screen_known if forms else may_hold_a_secret
        # ``text`` of a text the screen passed, given its lowercase (not lowered nor screened
        # again).
        self._masked: Callable[[str, str], str] = self._masked_known if forms else mask_shapes

    def _holds_known(
        self, low: str, among: tuple[tuple[str, ...], tuple[int, ...]] | None = None
    ) -> bool:
        """Whether the lowercased ``low`` holds a form of a known value (``among`` some of them,
        shortest first, with their lengths)."""
        lows, lens = among or (self._lows, self._lens)
        if _FINAL_SIGMA in low:
            # A capital sigma lowercases by what stands around it: at a value's end it is final
            # alone and not when a letter follows it in the text (and so at its start after
            # one). The forms are compared with one sigma.
            low = low.replace(_FINAL_SIGMA, _SIGMA)
        n = len(low)
        if n < lens[0]:  # shorter than any form (most texts)
            return False
        if n <= self._sampled:
            # A form at ``p`` is at least ``_step + _gram - 1`` long, so the piece sampled at
            # the first multiple of ``_step`` from ``p`` lies inside it, and is one of its
            # pieces: where no sampled piece is, no form is. On a short text a few set
            # lookups cost less than an ``in`` for each form; on a long one they cost more.
            grams, gram = self._grams, self._gram
            for start in range(0, n - gram + 1, self._step):
                if low[start : start + gram] in grams:
                    break
            else:
                return False
        # A loop, not any(): this runs on many texts, and a generator costs more than the test.
        for form in lows[: bisect_right(lens, n)]:  # noqa: SIM110
            if form in low:
                return True
        return False

    def _holds_any(self, low: str) -> bool:
        """Whether the lowercased ``low`` holds a form of a known value, also one that line
        breaks split."""
        if "\n" not in low:
            return self._holds_known(low)
        unbroken = _unbroken(low).replace(_FINAL_SIGMA, _SIGMA)
        # Sampled at any length: a text of several lines without its line breaks can be one
        # that an ``in`` reads slowly for each form (line numbers run together into digits,
        # most of a hex form's alphabet), and a sampled piece of a form is rare in any text.
        grams, gram = self._grams, self._gram
        for start in range(0, len(unbroken) - gram + 1, self._step):
            if unbroken[start : start + gram] in grams:
                return self._holds_known(unbroken, self._single) or self._holds_lined(low)
        return self._holds_lined(low)

    def _holds_lined(self, low: str) -> bool:
        """Whether ``low`` holds a form that holds a line break itself (a value of several
        lines), which the text without line breaks cannot show."""
        return bool(self._lined[0]) and self._holds_known(low, self._lined)

    def _screen_known(self, low: str) -> bool:
        """Whether the lowercased ``low`` may hold a shape or a known value (never a miss)."""
        return may_hold_a_secret(low) or self._holds_any(low)

    def _mask_split(self, text: str, known: re.Pattern[str]) -> str:
        """``text`` with each form that its line breaks split masked whole: found in the text
        without them, and mapped back. A mask starts and ends on a character of the form, so
        the line breaks around a value (and a cut marked after one) stay."""
        runs = list(_LINE.finditer(text))
        starts: list[int] = []  # where each run starts in the text without line breaks
        at = 0
        for run in runs:
            starts.append(at)
            at += run.end() - run.start()
        out: list[str] = []
        kept = 0
        for found in known.finditer("".join(run.group() for run in runs)):
            first = bisect_right(starts, found.start()) - 1
            last = bisect_right(starts, found.end() - 1) - 1
            out.append(text[kept : runs[first].start() + found.start() - starts[first]])
            out.append(MASK)
            kept = runs[last].start() + found.end() - starts[last]
        out.append(text[kept:])
        return "".join(out)

    def _masked_known(self, text: str, low: str) -> str:
        return self._text_known(text)

    def _text_known(self, text: str) -> str:
        low = text.lower()
        if not self._holds_any(low):
            return mask_shapes(text, low) if may_hold_a_secret(low) else text  # not lowered again
        known = self._known
        assert known is not None  # noqa: S101 - set whenever this method is
        # A mask next to text can complete a known value that holds "[" or "]": mask again
        # until nothing changes; what never settles is masked whole.
        for _ in range(4):
            again = known.sub(MASK, text)
            if "\n" in again:
                again = self._mask_split(again, known)
            again = redact_text(again)
            if again == text:
                return text
            text = again
        return MASK

    def value(self, value: Any) -> Any:
        """A copy of a JSON-shaped value with secret keys masked at any depth, strings redacted."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            for key, item in value.items():
                if isinstance(key, str):
                    if is_secret_key(key):
                        out[self.text(key)] = MASK
                        continue
                    key = self.text(key)
                out[key] = self.value(item)
            return out
        if isinstance(value, list | tuple):
            return [self.value(item) for item in value]
        return value

    def clean_text(self, text: str, limit: int) -> str:
        """Redacted, then bounded to ``limit`` UTF-8 bytes: what any frame may carry of a text."""
        redact = self.text
        precut = limit + _MARGIN
        if len(text) <= precut:
            low = text.lower()
            if self.screen(low):
                return bound_text(self._masked(text, low), limit, settle=redact)
            if len(text) * 4 <= limit:  # the common case: nothing to mask, nothing to cut
                return text
            return bound_text(text, limit, settle=_settle_cut(text, redact))
        # Redacting megabytes only to keep 4 KiB is wasted work: cut past the bound first (a
        # character is at least a byte). A secret cut off at the end of the head might be too
        # short to be recognised: the head's last characters are dropped after redaction.
        head = text[:precut]
        low = head.lower()
        if self.screen(low):
            red = self._masked(head, low)[:-_UNSURE]
            settle: Callable[[str], str] | None = redact
        else:
            red = head[:-_UNSURE]
            settle = _settle_cut(red, redact)
        dropped = utf8_len(text) - utf8_len(red)
        return bound_text(red, limit, dropped=dropped, settle=settle)

    def clean_chars(self, text: str, limit: int) -> str:
        """Redacted, then bounded to ``limit`` characters (assistant text, card titles)."""
        redact = self.text
        precut = limit + _MARGIN
        if len(text) <= precut:
            red = redact(text)
            return red if len(red) <= limit else bound_chars(red, limit, settle=redact)
        red = redact(text[:precut])[:-_UNSURE]
        return bound_chars(red, limit, dropped=len(text) - len(red), settle=redact)

    def clean_lines(self, lines: Iterable[tuple[str, bool]], limit: int) -> str:
        """The last ``limit`` characters of ``(line, was_cut)`` pairs joined as one text (stderr).

        The lines are redacted as one text, so that a secret spread over lines (a PEM key) is
        masked whole, and only then cut. A line that was cut lost its end: a secret the cut went
        through may be too short to be recognised, so its last characters are dropped after
        redaction (as :meth:`clean_text` does), and it ends with ``" …[cut]"``.
        """
        # A cut is marked so that redaction cannot take it for part of a value: after a newline
        # (no bare or quoted value spans one) and "[" (no value starts with one), with a NUL no
        # line keeps (the daemon never passes a NUL in a value, so no known value holds one).
        text = "\n".join(
            line.replace("\0", "\ufffd") + _LINE_CUT if cut else line.replace("\0", "\ufffd")
            for line, cut in lines
        )
        red = _UNSURE_BEFORE_CUT.sub(" …[cut]", self.text(text))
        return red[-limit:] if limit > 0 else ""

    def clean_flat(
        self, value: dict[Any, Any], string_bytes: int, items: int, also: str = ""
    ) -> dict[Any, Any] | None:
        """``value`` itself when cleaning would not change it, else None (then use clean_value).

        The fast path for tool arguments, mostly a few short strings under known keys: one
        screen over all the strings at once instead of a full walk. A value returned also
        means that redaction would not change ``also`` (the call's id, screened in the same
        pass).
        """
        if len(value) > items:
            return None
        plain = self._plain
        texts: list[str] = [also]
        for key, item in value.items():
            if key not in plain:
                return None  # a key not seen yet, a secret key, or one that redaction changes
            kind = type(item)
            if kind is str:
                # Within its bound as bound_text's fast path sees it (a character is at most
                # four bytes, an ASCII one one): a Write's file content mostly is.
                if len(item) * 4 > string_bytes and not (
                    len(item) <= string_bytes and item.isascii()
                ):
                    return None
                texts.append(item)
            elif not (item is None or kind is bool or kind is int or kind is float):
                return None
        # Joined on NULs, which no literal of the screen contains (nor a value the daemon
        # passes, an environment variable's): a miss stays a miss. Not on newlines: those make
        # the screen look again for values split over lines.
        if self.screen("\0".join(texts).lower()):
            return None
        return value

    def clean_value(self, value: Any, *, string_bytes: int, depth: int = 6, items: int = 64) -> Any:
        """:meth:`value` and bounds in one walk (tool arguments, usage).

        Strings are cut to ``string_bytes``, nesting to ``depth`` and containers to ``items``
        entries (an over-full one keeps ``items - 1`` plus a marker, so cleaning twice changes
        nothing).
        """
        return self._clean(value, string_bytes, depth, items)

    def _learn_key(self, key: str) -> tuple[str, bool]:
        # Keys repeat (every Bash call has "command"): each distinct key is judged once.
        known = (self.text(key), is_secret_key(key))
        if len(self._keys) < KEY_CACHE_MAX:
            self._keys[key] = known
            if known == (key, False):
                self._plain.add(key)
        return known

    def _clean(self, value: Any, string_bytes: int, depth: int, items: int) -> Any:
        kind = type(value)
        if kind is str:
            return self.clean_text(value, string_bytes)
        if kind is dict:
            if depth <= 0:
                return f"[...{len(value)} keys cut]"
            out: dict[Any, Any] = {}
            over = len(value) > items
            clean_text = self.clean_text
            for n, (key, item) in enumerate(value.items()):
                if over and n == items - 1:
                    out["..."] = f"[...{len(value) - n} keys cut]"
                    break
                if type(key) is str:
                    known = self._keys.get(key)
                    if known is None:
                        known = self._learn_key(key)
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
                    out[key] = self._clean(item, string_bytes, depth - 1, items)
            return out
        if kind is list or kind is tuple:
            if depth <= 0:
                return f"[...{len(value)} items cut]"
            kept = value[: items - 1] if len(value) > items else value
            out_list = [self._clean(item, string_bytes, depth - 1, items) for item in kept]
            if len(value) > items:
                out_list.append(f"[...{len(value) - len(kept)} items cut]")
            return out_list
        return value


# The redactor that knows no values, and its methods as the module's functions.
PLAIN: Final = Redactor()
redact_value = PLAIN.value
clean_text = PLAIN.clean_text
clean_chars = PLAIN.clean_chars
clean_flat = PLAIN.clean_flat
clean_value = PLAIN.clean_value
