"""Secrets the redactor must catch (README "Security model"): the values a run is known to hold,
in any encoding; shapes it used to miss; and every string the CLI or the model chooses.

Every secret is drawn fresh (Hypothesis), never a fixed string.
"""

from __future__ import annotations

import base64
import json
import secrets
import string
from typing import Any

import msgspec
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from codelegate.translator import Outcome, Translator
from codelegate.translator.bounds import cut_marker
from codelegate.translator.frames import ProviderActivity, ToolCall, encode_frame
from codelegate.translator.redact import PLAIN, Redactor, known_forms
from codelegate.translator.shapes import _INSIDE_SEARCHES, _SECRET, MASK, _overlapping
from tests.translator.helpers import (
    EXITED,
    assistant,
    context,
    encode,
    result_line,
    system,
    tool_result,
    tool_use,
)

TOKEN = st.text(string.ascii_letters + string.digits + "-_", min_size=16, max_size=48)
# "Whatever their shape": any printable text (spaces, quotes, brackets, non-ASCII) of 8 or more.
ANY_VALUE = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=8, max_size=40
)
AROUND = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
ENCODINGS = ("raw", "base64", "urlsafe_base64", "hex", "HEX", "json", "url")


@settings(max_examples=300)
@given(
    ANY_VALUE,
    st.sampled_from(ENCODINGS),
    st.binary(max_size=5),
    st.binary(max_size=5),
    AROUND,
    AROUND,
)
def test_a_known_value_never_survives_in_any_encoding(
    value: str, how: str, pre: bytes, post: bytes, before: str, after: str
) -> None:
    assume(value not in MASK)  # a value that is part of the mask shows nothing (known_forms)
    redactor = Redactor([value])
    blob, core = encode(value, how, pre, post)
    text = before + blob + after
    for out in (
        redactor.text(text),
        redactor.clean_text(text, 4096),
        redactor.clean_chars(text, 4096),
        json.dumps(redactor.clean_value({"k": [text]}, string_bytes=4096)),
    ):
        if how == "json":
            out = json.loads(json.dumps(out))
        assert core not in out


@settings(max_examples=300)
@given(st.lists(TOKEN, min_size=1, max_size=3), st.lists(st.sampled_from(["x", " ", "\n"]) | TOKEN))
def test_redacting_with_known_values_is_idempotent(values: list[str], parts: list[str]) -> None:
    redactor = Redactor(values)
    encoded = base64.b64encode(values[0].encode()).decode()
    # Also broken over lines, as `base64` and `od -An -tx1` print them (see the end of the file).
    text = "".join(parts + values + [encoded, wrapped(encoded, 7), od_hex(values[-1].encode())])
    once = redactor.text(text)
    assert redactor.text(once) == once
    for limit in (16, 64, 4096):
        cut = redactor.clean_text(text, limit)
        assert redactor.clean_text(cut, limit) == cut
        chars = redactor.clean_chars(text, limit)
        assert redactor.clean_chars(chars, limit) == chars
    for value in values:
        assert value not in once


def test_known_forms_skip_short_values_and_the_mask_itself() -> None:
    assert known_forms(["short", ""]) == frozenset()
    assert not {"redacted", MASK} & known_forms(["redacted", MASK])  # their encodings are kept
    assert Redactor(["short"]).text is PLAIN.text  # no known value: the plain redactor


@given(TOKEN)
def test_a_mask_that_completes_a_known_value_is_masked_again(core: str) -> None:
    # A value holding "]" is completed by the end of a mask next to it ("[redacted]" + "x…").
    value = "ed]" + core
    other = "Q" + core[::-1] + "Q"
    redactor = Redactor([value, other])
    out = redactor.text(other + core)
    assert value not in out
    assert other not in out
    assert redactor.text(out) == out


def test_a_text_that_never_settles_is_masked_whole() -> None:
    # Each round of masking completes a new known value: after a few rounds, mask everything.
    values = ["ed]" + "a" * n for n in range(8, 20)]
    assert Redactor(values).text("[redact" + "ed]" + "a" * 100) == MASK


# --- shapes (item 6) -----------------------------------------------------------------------------

SHAPES = st.sampled_from(
    [
        '{\\"api_key\\": \\"%s\\"}',  # JSON-escaped, as in a Write's content or a diff
        '{\\\\\\"password\\\\\\": \\\\\\"%s\\\\\\"}',  # escaped twice
        '"content": "{\\"client_secret\\": \\"%s\\"}"',
        "postgres://app:%s@db.internal:5432/prod",
        "DATABASE_URL=mysql://root:%s@localhost/db",
        "git clone https://bob:%s@github.com/x/y.git",
        "remote: https://%s@github.com/x.git",
        '{"auths": {"ghcr.io": {"auth": "%s"}}}',
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=%s;EndpointSuffix=x",
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n%s\n=abcd\n-----END PGP PRIVATE KEY BLOCK-----",
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: 1\n%s",  # cut off
        # A private key as a NAME's value: masked whole, not up to its header's first space.
        '"private_key": "-----BEGIN PRIVATE KEY-----\\n%s\\n-----END PRIVATE KEY-----\\n"',
        "private_key=-----BEGIN RSA PRIVATE KEY-----\n%s\n-----END RSA PRIVATE KEY-----",
        "Authorization: Bearer\n-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n%s\n=ab\n",
    ]
)


@settings(max_examples=300)
@given(SHAPES, TOKEN.filter(lambda t: t[0] not in "-_"), AROUND, AROUND)
def test_shapes_the_redactor_used_to_miss_never_survive(
    shape: str, secret: str, before: str, after: str
) -> None:
    assume(secret not in before + after)
    text = before + "\n" + shape % secret + "\n" + after
    assert secret not in PLAIN.text(text)
    assert secret not in PLAIN.clean_text(text, 4096)


# Shapes whose match may end inside what follows it (a bare value up to a space, a bearer
# token up to a character it may not hold), and shapes that must start where they do.
GLUED = st.sampled_from(
    [
        "-----BEGIN RSA PRIVATE KEY-----\n%s\n-----END RSA PRIVATE KEY-----",
        "-----BEGIN OPENSSH PRIVATE KEY-----\n%s",
        "sk-ant-api03-%s",
        "ghp_%s",
        "xoxb-%s",
        "eyJhbGciOiJIUzI1NiJ9.eyJ%s.abcdefgh",
        "postgres://app:%s@db/x",
        "api_key=%s",
        '"password": "%s"',
        "Bearer %s",
    ]
)


@settings(max_examples=300)
@given(GLUED, GLUED, st.sampled_from(["", " ", "\n", ",", ";", '"', "&", "/", "=", ":", "-", "_"]))
def test_two_secrets_glued_together_are_both_masked(first: str, second: str, glue: str) -> None:
    # The first one's match may end inside the second, which is then found where it starts.
    one, two = secrets.token_hex(12), secrets.token_hex(12)
    out = PLAIN.text(first % one + glue + second % two)
    assert one not in out
    assert two not in out
    assert PLAIN.text(out) == out


def test_matches_inside_another_are_searched_a_few_times_not_once_a_character() -> None:
    # Each search from inside a match costs up to its length again: a text of one value that
    # holds a keyword every few characters must not cost a pass per keyword.
    text = "token=" * 2000
    assert len(list(_overlapping(_SECRET, text))) == 1 + _INSIDE_SEARCHES
    assert PLAIN.text(text) == "token=" + MASK


@given(st.text(string.ascii_letters + string.digits + "_-", min_size=35, max_size=35))
def test_google_api_keys_are_masked(core: str) -> None:
    key = "AIza" + core
    assert PLAIN.text(f"key={key}&x") == f"key={MASK}&x"
    assert PLAIN.text(f"use {key} here") == f"use {MASK} here"
    assert PLAIN.text("aiza" + core.lower()) == "aiza" + core.lower()  # the case says it is one


def test_urls_without_userinfo_and_authors_are_left_alone() -> None:
    for text in (
        "see https://example.com/a@b and mail me@example.com",
        '{"author": "someone", "oauth_scopes": 3}',
        "https://[::1]:8080/x@y",
    ):
        assert PLAIN.text(text) == text


# --- every string the CLI or the model chooses (item 3) ------------------------------------------


def frames_text(frames: list[Any]) -> str:
    return b"".join(encode_frame(f) for f in frames).decode()


# Random hex: a TOKEN-shaped value may spell a word the frames carry anyway (Hypothesis found
# "permission_denie"), which no leak check can tell from a leak.
FRESH = st.binary(min_size=12, max_size=24).map(bytes.hex)


@settings(max_examples=100)
@given(st.from_regex(r"ghp_[A-Za-z0-9]{36}", fullmatch=True), FRESH)
def test_names_paths_and_ids_the_cli_reports_are_redacted(ghp: str, known: str) -> None:
    ant = "sk-ant-api03-" + known
    translator = Translator(context(), redactor=Redactor([known + "-daemon"]))
    lines = [
        system("init", session_id=ant, cwd="/w", tools=[]),
        assistant(
            tool_use("t1", "Write", file_path=f"/srv/workspaces/demo/tokens/{ghp}/notes.txt"),
            tool_use("t2", ant),  # a model-chosen tool name
            tool_use("t3", "Task", description="d", prompt="p"),
            tool_use("t4", "Bash", command="printenv ANTHROPIC_AUTH_TOKEN"),
        ),
        tool_result("t1", extra={"type": "create", "filePath": "x"}),
        system(
            "task_progress",
            tool_use_id="t3",
            task_id="k",
            description="working",
            last_tool_name=ant,
            usage={"tool_uses": 1},
        ),
        system("permission_denied", tool_use_id="t2", tool_name=ant),
        system("permission_denied", tool_use_id="t9", tool_name=ghp),
        tool_result("t4", f"{known}-daemon\n"),
        result_line(
            session_id=ant,
            permission_denials=[{"tool_name": ant, "tool_use_id": "t8", "tool_input": {}}],
        ),
    ]
    frames = translator.start(1000.0)
    frames += translator.receive_data(b"".join(lines), 1001.0)
    frames += translator.close(EXITED, 1002.0)
    text = frames_text(frames)
    for secret in (ghp, ant, known):
        assert secret not in text
    result = msgspec.json.decode(encode_frame(frames[-1]))["result"]
    assert result["files_changed"] == [f"tokens/{MASK}/notes.txt"]
    activity = [f for f in frames if isinstance(f, ProviderActivity) and f.files]
    assert activity[0].files == ["notes.txt"]  # a Work Room row names files, not paths
    assert {d["name"] for d in result["permission_denials"]} == {MASK}


def test_a_failed_runs_stderr_is_cleaned_with_the_runs_known_values() -> None:
    value = "v-" + "k" * 30
    translator = Translator(context(), redactor=Redactor([value]))
    translator.start(1000.0)
    outcome = Outcome(reason="exited", exit_code=1, stderr_tail=f"boom {value}")
    translator.close(outcome, 1001.0)
    assert translator.result is not None
    assert translator.result.stderr == f"boom {MASK}"


# --- stderr: redacted as one text, then cut (item 4) --------------------------------------------

PEM_LINE = st.text(string.ascii_letters + string.digits + "+/", min_size=64, max_size=64)


@settings(max_examples=100)
@given(
    st.lists(PEM_LINE, min_size=1, max_size=8),
    st.sampled_from(["RSA PRIVATE KEY", "PRIVATE KEY", "PGP PRIVATE KEY BLOCK"]),
    st.lists(st.text(string.ascii_letters + " ", max_size=30), max_size=4),
    st.integers(50, 4000),
)
def test_a_key_spread_over_stderr_lines_is_masked_whole(
    body: list[str], kind: str, noise: list[str], limit: int
) -> None:
    lines = [*noise, f"-----BEGIN {kind}-----", *body, f"-----END {kind}-----", *noise]
    tail = PLAIN.clean_lines(((text, False) for text in lines), limit)
    assert all(part[:16] not in tail for part in body)
    assert len(tail) <= limit


HEX = st.text("0123456789abcdef", min_size=40, max_size=40)


@settings(max_examples=200)
@given(HEX, st.sampled_from(["ghp_", "sk-ant-api03-", "token="]), st.integers(0, 2000), st.data())
def test_a_token_a_line_cut_went_through_leaves_nothing(
    core: str, head: str, filler: int, data: st.DataObject
) -> None:
    line = "x" * filler + " " + head + core + " more"
    # The daemon kept the line up to somewhere inside the token.
    at = data.draw(st.integers(filler + 1 + len(head) + 1, filler + 1 + len(head) + len(core)))
    tail = PLAIN.clean_lines([(line[:at], True), ("next line", False)], 10_000)
    assert tail.endswith(" …[cut]\nnext line")
    assert not any(core[i : i + 4] in tail for i in range(len(core) - 3))


@settings(max_examples=200)
@given(
    TOKEN,
    st.lists(st.tuples(AROUND, st.booleans()), max_size=6),
    st.integers(0, 6),
    st.sampled_from(ENCODINGS),
)
def test_a_known_value_on_stderr_never_survives(
    value: str, lines: list[tuple[str, bool]], where: int, how: str
) -> None:
    assume(all(value not in text for text, _ in lines))
    blob, core = encode(value, how, b"", b"")
    lines.insert(min(where, len(lines)), (f"ERROR {blob} rejected", False))
    tail = Redactor([value]).clean_lines(lines, 100_000)
    assert core not in tail
    assert "\0" not in tail
    assert Redactor([value]).clean_lines(lines, 0) == ""


@settings(max_examples=100, deadline=None)
@given(TOKEN, st.integers(1, 40), st.sampled_from(["", "[", "]", "[x"]))
def test_a_known_value_a_stderr_cut_went_through_is_not_joined_over_the_cut(
    core: str, at: int, end: str
) -> None:
    # Line breaks no longer stop a known value, but a cut still does: the line it ended keeps
    # its mark, and no NUL of the mark comes out.
    value = core + end
    at = min(at, len(value) - 1)
    redactor = Redactor([value])
    tail = redactor.clean_lines([("x " + value[:at], True), (value[at:] + " next", False)], 10_000)
    assert tail.startswith("x …[cut]\n") or tail.startswith(" …[cut]\n")
    assert "\0" not in tail
    assert (
        redactor.clean_lines([("x " + value[:at], False), (value[at:], False)], 99) == "x " + MASK
    )


@settings(max_examples=50)
@given(st.lists(st.from_regex(r"ghp_[A-Za-z0-9]{36}", fullmatch=True), min_size=2, max_size=4))
def test_tool_ids_the_cli_reports_are_redacted_and_stay_distinct(ids: list[str]) -> None:
    assume(len(set(ids)) == len(ids))
    parent, *children = ids
    lines = [
        assistant(tool_use(parent, "Task", description="d", prompt="p")),
        *(assistant(tool_use(i, "Read", file_path="a"), parent=parent) for i in children),
        system("permission_denied", tool_use_id=children[0], tool_name="Read"),
        *(tool_result(i, "ok", parent=parent) for i in children),
        result_line(
            permission_denials=[{"tool_name": "Read", "tool_use_id": i} for i in ids],
        ),
    ]
    translator = Translator(context())
    frames = translator.start(1000.0) + translator.receive_data(b"".join(lines), 1001.0)
    frames += translator.close(EXITED, 1002.0)
    text = frames_text(frames)
    assert not any(i in text for i in ids)
    calls = [f for f in frames if isinstance(f, ToolCall)]
    assert len({f.tool_id for f in calls}) == len(ids)
    assert {f.parent_tool_id for f in calls[1:]} == {calls[0].tool_id}
    assert translator.result is not None
    assert len(translator.result.permission_denials) == len(ids)


def test_a_tool_id_that_only_looks_like_a_secret_is_kept_as_it_is() -> None:
    translator = Translator(context())
    frames = translator.start(1000.0)
    frames += translator.receive_data(assistant(tool_use("toolu_token_01", "Read")), 1001.0)
    calls = [f for f in frames if isinstance(f, ToolCall)]
    assert [c.tool_id for c in calls] == ["claude:toolu_token_01"]


def test_a_reported_denial_without_a_tool_use_id_names_no_card() -> None:
    translator = Translator(context())
    translator.start(1000.0)
    translator.receive_data(
        result_line(permission_denials=[{"tool_name": "Bash", "tool_input": {}}]), 1001.0
    )
    frames = translator.close(EXITED, 1002.0)
    result = msgspec.json.decode(encode_frame(frames[-1]))["result"]
    assert result["permission_denials"] == []


@settings(deadline=None)  # 140 KB a text: over 200 ms on a loaded machine
@given(st.binary(min_size=16, max_size=16).map(bytes.hex))
def test_a_text_past_any_bound_is_still_screened_for_secrets(secret: str) -> None:
    filler = "x" * 70_000  # past the length where the screen takes one regex pass
    assert PLAIN.text(filler + " token=" + secret + " " + filler).count(secret) == 0
    assert PLAIN.text(filler) == filler


@given(st.binary(min_size=4, max_size=4).map(bytes.hex), st.integers(0, 3000))
def test_a_cut_that_ends_a_known_value_is_redacted_again(core: str, tail: int) -> None:
    # The screen reads lowercased text, and a capital sigma lowercases by what follows it: "σ"
    # before a letter, "ς" at the end. A text the screen passes can then have a cut that it does
    # not: here the cut ends right after the known value, whose lowercase ends in "ς".
    value = f"AB{core}ZΣ"
    text = value + "x" * (600 + tail)
    kept = len(value.encode())
    limit = kept + len(cut_marker(len(text.encode())))
    for redactor in (Redactor([value]), Redactor([value, secrets.token_hex(16)])):
        out = redactor.clean_text(text, limit)
        assert value not in out
        assert out.endswith("bytes cut]")


@settings(max_examples=200)
@given(
    st.sampled_from(["Σ", "ΣΣ", "ς", "σ"]),
    st.booleans(),
    st.sampled_from(["", "a", "Z", "1", " ", "Σ", "é"]),
    st.sampled_from(["", "b", "Y", "2", " ", "Σ", "é"]),
)
def test_a_known_value_with_a_sigma_at_its_end_survives_no_neighbour(
    sigma: str, at_end: bool, before: str, after: str
) -> None:
    # A capital sigma lowercases to a final sigma or not by its neighbours, which differ in the
    # text from the value alone.
    core = secrets.token_hex(6).upper()
    value = "AB" + core + sigma if at_end else sigma + core + "AB"
    redactor = Redactor([value])
    text = "x" + before + value + after + "y"
    for out in (
        redactor.text(text),
        redactor.clean_text(text, 4096),
        redactor.clean_chars(text, 4096),
        json.dumps(redactor.clean_value({"k": [text]}, string_bytes=4096), ensure_ascii=False),
    ):
        assert value not in out


# --- encoders that wrap or space their output (attacker finding 1) -------------------------------
# `base64` wraps at 76 columns, `xxd -p` at 60, `od -An -tx1` prints spaced hex 16 bytes a line:
# a credential of real length comes out over lines. Line breaks may fall anywhere inside the
# form; what must not survive is the value's part of it with the breaks (and spaces) taken out.

BREAKS = st.lists(st.integers(0, 10_000), max_size=12)
NEWLINE = st.sampled_from(["\n", "\r\n"])
# What stands between two bytes of spaced hex: one space, with a line break before or after it.
HEX_GAP = st.sampled_from([" ", " \n", "\n ", " \r\n", "\r\n "])


def squeezed(text: str) -> str:
    return text.replace(" ", "").replace("\r", "").replace("\n", "")


def broken(blob: str, cuts: list[int], newline: str) -> str:
    for at in sorted({cut % (len(blob) + 1) for cut in cuts}, reverse=True):
        blob = blob[:at] + newline + blob[at:]
    return blob


def cleaned(redactor: Redactor, text: str) -> list[str]:
    """Every way a frame carries a text: redacted, bounded as a result, as chars, in a value."""
    return [
        redactor.text(text),
        redactor.clean_text(text, 4096),
        redactor.clean_chars(text, 4096),
        redactor.clean_value({"k": [text]}, string_bytes=4096)["k"][0],
    ]


@settings(max_examples=300, deadline=None)  # a Redactor per example, on a busy machine
@given(
    ANY_VALUE,
    st.sampled_from(["base64", "urlsafe_base64", "hex", "HEX"]),
    st.binary(max_size=5),
    st.binary(max_size=5),
    BREAKS,
    NEWLINE,
    AROUND,
    AROUND,
)
def test_a_known_value_encoded_with_line_breaks_anywhere_never_survives(
    value: str,
    how: str,
    pre: bytes,
    post: bytes,
    cuts: list[int],
    newline: str,
    before: str,
    after: str,
) -> None:
    assume(value not in MASK)
    redactor = Redactor([value])
    blob, core = encode(value, how, pre, post)
    text = before + newline + broken(blob, cuts, newline) + newline + after
    for out in cleaned(redactor, text):
        assert core not in squeezed(out)
        assert redactor.text(out) == out


@settings(max_examples=300, deadline=None)  # a Redactor per example, on a busy machine
@given(ANY_VALUE, st.binary(max_size=5), st.binary(max_size=5), st.lists(HEX_GAP, min_size=1))
def test_a_known_value_as_hex_spaced_between_bytes_over_lines_never_survives(
    value: str, pre: bytes, post: bytes, gaps: list[str]
) -> None:
    assume(value not in MASK)
    redactor = Redactor([value])
    raw = value.encode()
    pairs = [f"{byte:02x}" for byte in pre + raw + post]
    text = "od: " + "".join(p + gaps[i % len(gaps)] for i, p in enumerate(pairs)) + "end"
    for out in cleaned(redactor, text):
        assert raw.hex() not in squeezed(out)
        assert redactor.text(out) == out


def od_hex(data: bytes) -> str:
    """What ``od -An -tx1`` prints: 16 bytes a line, each after a space."""
    rows = (data[i : i + 16] for i in range(0, len(data), 16))
    return "".join("".join(f" {byte:02x}" for byte in row) + "\n" for row in rows)


def wrapped(text: str, width: int) -> str:
    """What ``base64`` (76) and ``xxd -p`` (60) print: ``text`` in lines of ``width``."""
    return "".join(text[i : i + width] + "\n" for i in range(0, len(text), width))


@settings(max_examples=200, deadline=None)
@given(
    st.text(string.ascii_letters + string.digits + "-_", min_size=58, max_size=120),
    st.sampled_from(["base64", "od -An -tx1", "xxd -p"]),
)
def test_a_long_credential_piped_through_an_encoding_command_leaves_no_piece(
    value: str, command: str
) -> None:
    # printenv ends the value with a newline, which the command encodes with it.
    data = value.encode() + b"\n"
    if command == "base64":
        out, core = (
            wrapped(base64.b64encode(data).decode(), 76),
            encode(value, "base64", b"", b"\n")[1],
        )
    elif command == "xxd -p":
        out, core = wrapped(data.hex(), 60), value.encode().hex()
    else:
        out, core = od_hex(data), value.encode().hex()
    assert "\n" in out.strip()  # the command really broke the value over lines
    red = Redactor([value, secrets.token_hex(20), secrets.token_urlsafe(32)])
    for text in cleaned(red, out):
        flat = squeezed(text)
        assert not any(core[i : i + 12] in flat for i in range(len(core) - 11)), text
