"""decode_run_request: shape only, 400/413 with the field named."""

from __future__ import annotations

import json

import pytest

from codelegate.policy.errors import PolicyError
from codelegate.policy.request import Parent, RunRequest, decode_run_request, request_body_limit

LIMIT = 1024


def decode(body: object) -> RunRequest:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return decode_run_request(data, max_task_bytes=LIMIT)


def test_minimal_request_gets_defaults() -> None:
    assert decode({"task": "fix the test"}) == RunRequest(task="fix the test")
    request = decode({"task": "x"})
    assert (request.cwd, request.mode, request.resume, request.wait) == (".", None, None, False)


def test_every_field() -> None:
    body = {
        "task": "fix it",
        "cwd": "src",
        "mode": "plan",
        "resume": "0b6f6d52-3b9e-4bb1-9d4c-5a3e2f0c1d2e",
        "model": "sonnet",
        "max_budget_usd": 1,
        "parent": {"tool_call_id": "call_01:abc.def-9", "session_id": "sess-1"},
        "wait": True,
    }
    request = decode(body)
    assert request.parent == Parent(tool_call_id="call_01:abc.def-9", session_id="sess-1")
    assert request.max_budget_usd == 1.0
    assert request.wait is True


BAD = [
    (b"{", "not valid JSON"),
    (b"", "not valid JSON"),
    (b"[]", "request body: expected `object`, got `array`"),
    (b'"task"', "request body: expected `object`, got `str`"),
    ({}, "request body: object missing required field `task`"),
    ({"task": 1}, "task: expected `str`, got `int`"),
    ({"task": "x", "cwd": None}, "cwd: expected `str`, got `null`"),
    ({"task": "x", "wait": "yes"}, "wait: expected `bool`, got `str`"),
    ({"task": "x", "mode": 3}, "mode: expected `str | null`"),
    ({"task": "x", "max_budget_usd": -1}, "max_budget_usd: expected `float` > 0.0"),
    ({"task": "x", "max_budget_usd": 0}, "max_budget_usd: expected `float` > 0.0"),
    (b'{"task": "x", "max_budget_usd": 1e400}', "max_budget_usd: number out of range"),
    ({"task": "x", "cwd": "a" * 5000}, "cwd: expected `str` of length <= 4096"),
    (
        {"task": "x", "dangerously_skip_permissions": True},
        "dangerously_skip_permissions: unknown field",
    ),
    ({"task": "x", "permission_mode": "bypassPermissions"}, "permission_mode: unknown field"),
    (
        {"task": "x", "allowed_tools": ["Bash"]},
        "allowed_tools: unknown field; expected one of: task",
    ),
    ({"task": "x", "parent": {}}, "parent: object missing required field `tool_call_id`"),
    (
        {"task": "x", "parent": {"tool_call_id": "a", "x": 1}},
        "parent.x: unknown field; expected one of: tool_call_id, session_id",
    ),
    ({"task": "x", "parent": {"tool_call_id": "a b"}}, "parent.tool_call_id"),
    ({"task": "x", "parent": {"tool_call_id": ""}}, "parent.tool_call_id"),
    ({"task": "x", "parent": {"tool_call_id": "a" * 513}}, "parent.tool_call_id"),
    ({"task": "x", "parent": {"tool_call_id": "a/b"}}, "parent.tool_call_id"),
    ({"task": "x", "parent": {"tool_call_id": "a\n"}}, "parent.tool_call_id"),
    ({"task": "x", "parent": {"tool_call_id": "é"}}, "parent.tool_call_id"),
    ({"task": "x", "parent": {"tool_call_id": "a", "session_id": ""}}, "parent.session_id"),
]


@pytest.mark.parametrize(("body", "words"), BAD)
def test_bad_requests_are_400_naming_the_field(body: object, words: str) -> None:
    with pytest.raises(PolicyError) as caught:
        decode(body)
    assert caught.value.status == 400
    assert caught.value.code == "bad_request"
    assert words in caught.value.message


@pytest.mark.parametrize("task", ["", " ", "\n\t "])
def test_empty_task_is_refused(task: str) -> None:
    with pytest.raises(PolicyError) as caught:
        decode({"task": task})
    assert (caught.value.status, caught.value.code) == (400, "empty_task")


@pytest.mark.parametrize("task", ["/model haiku", "/heapdump", "/", "/tmp/notes.txt: tidy it"])
def test_a_task_whose_first_character_is_a_slash_is_refused(task: str) -> None:
    with pytest.raises(PolicyError) as caught:
        decode({"task": task})
    assert (caught.value.status, caught.value.code) == (400, "slash_command")
    assert caught.value.message.startswith('task must not start with "/"')


@pytest.mark.parametrize("task", [" /model haiku", "\n/cost", "see /tmp/notes.txt", "a\n/cost"])
def test_a_slash_after_the_first_character_is_plain_text(task: str) -> None:
    assert decode({"task": task}).task == task


def test_task_at_the_limit_passes_and_one_byte_more_is_413() -> None:
    assert len(decode({"task": "a" * LIMIT}).task) == LIMIT
    with pytest.raises(PolicyError) as caught:
        decode({"task": "a" * (LIMIT + 1)})
    assert (caught.value.status, caught.value.code) == (413, "task_too_large")
    assert f"at most {LIMIT} bytes" in caught.value.message


def test_task_size_is_counted_in_utf8_bytes() -> None:
    with pytest.raises(PolicyError, match="task_too_large"):
        decode({"task": "é" * (LIMIT // 2 + 1)})


def test_a_huge_body_is_refused_before_decoding() -> None:
    body = b'{"task": "' + b"a" * request_body_limit(LIMIT) + b'"}'
    with pytest.raises(PolicyError) as caught:
        decode_run_request(body, max_task_bytes=LIMIT)
    assert (caught.value.status, caught.value.code) == (413, "task_too_large")
    assert "request body too large" in caught.value.message


def test_a_body_at_the_limit_is_decoded() -> None:
    padding = b" " * (request_body_limit(LIMIT) - len(b'{"task": "x"}'))
    assert decode_run_request(b'{"task": "x"}' + padding, max_task_bytes=LIMIT).task == "x"
