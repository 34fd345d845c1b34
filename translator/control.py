"""The CLI's control channel on stdin: the lines the daemon writes, and when the run is over.

Every run speaks stream-json on stdin (``--input-format stream-json``): an ``initialize``
control request first, then the prompt as a user message, later control requests such as
``interrupt``. With stdin open the CLI does not exit after its ``result``, so somebody must say
when the run is over: :class:`Channel` follows the lines the translator reads and says so (the
last ``result`` with no background task open); the daemon closes stdin then. Pure: lines are
built here as bytes, the daemon writes them.

The CLI ends at a stdin line that is not JSON (measured on 2.1.332): every line is encoded here
whole, one JSON object and a newline, never assembled by hand.
"""

from __future__ import annotations

import json
import re
from collections import deque
from typing import TYPE_CHECKING, Any, Final

import msgspec

import codelegate.translator.wire as wire
from codelegate.policy.approvals import TOOL_NAME
from codelegate.translator.bounds import utf8_len
from codelegate.translator.lines import LineSplitter

if TYPE_CHECKING:
    from codelegate.policy.approvals import SessionRule

# The request id of the ``initialize`` request; one per process, so it needs nothing unique.
INITIALIZE_ID: Final = "initialize"


def _line(obj: dict[str, Any]) -> bytes:
    # ASCII escapes: a task may hold lone surrogates (a JSON escape of half a pair), which
    # UTF-8 cannot encode but a JSON reader takes back as they were.
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def control_request(request_id: str, subtype: str, **fields: str) -> bytes:
    """A control request of ours (``initialize``, ``interrupt``, ``stop_task`` with its
    ``task_id``) as one stdin line."""
    request = {"subtype": subtype, **fields}
    return _line({"type": "control_request", "request_id": request_id, "request": request})


def user_message(text: str) -> bytes:
    """A user message (the prompt) as one stdin line."""
    return _line(
        {
            "type": "user",
            "message": {"role": "user", "content": text},
            "parent_tool_use_id": None,
            "session_id": "",
        }
    )


# --- answers to the CLI's permission prompts (can_use_tool) -----------------------------------
# The only answers the daemon ever writes. Each is checked by _refuse_widening before it goes
# out: no mode change, no directory, no rule outside the session, whatever built the pieces.
_WIDENING: Final = frozenset({"setMode", "mode", "bypassPermissions", "addDirectories"})
_ANSWER_KEYS: Final = frozenset({"behavior", "updatedInput", "updatedPermissions", "message"})


def _answer(cli_request_id: str, response: dict[str, Any]) -> bytes:
    obj = {
        "type": "control_response",
        "response": {"subtype": "success", "request_id": cli_request_id, "response": response},
    }
    _refuse_widening(obj)
    return _line(obj)


# A rule's content we write: a path pattern over one folder (policy.approvals.session_rule).
_RULE_CONTENT: Final = re.compile(r"//[A-Za-z0-9._/@+-]+/\*\*", re.ASCII)


def session_rule(tool: str, content: str | None = None) -> dict[str, Any]:
    """The one permission update we write: an allow rule for this session only, for ``tool``
    (narrowed to ``content``, a path pattern, when given)."""
    rule = {"toolName": tool} if content is None else {"toolName": tool, "ruleContent": content}
    return {"type": "addRules", "rules": [rule], "behavior": "allow", "destination": "session"}


def allow(cli_request_id: str, asked_input: Any, rule: SessionRule | None = None) -> bytes:
    """Allow once, or for the session (with the session rule policy chose); the input exactly
    as asked: the CLI runs what it gets back, not what it asked about."""
    response: dict[str, Any] = {"behavior": "allow", "updatedInput": asked_input}
    if rule is not None:
        response["updatedPermissions"] = [session_rule(rule.tool_name, rule.rule_content)]
    return _answer(cli_request_id, response)


def deny(cli_request_id: str, message: str) -> bytes:
    """Deny with ``message`` for the model (the CLI refuses a deny without one as invalid)."""
    if not message.strip():
        raise ValueError("a deny needs a message")
    return _answer(cli_request_id, {"behavior": "deny", "message": message})


def answer_questions(
    cli_request_id: str,
    asked_input: dict[str, Any],
    answers: dict[str, str],
    notes: dict[str, str] | None = None,
) -> bytes:
    """AskUserQuestion's answers: an allow whose input is the asked one plus ``answers`` (question
    text -> a free string) and, per question, the person's ``notes`` in ``annotations``."""
    updated = {**asked_input, "answers": answers}
    if notes:
        updated["annotations"] = {q: {"notes": n} for q, n in notes.items()}
    return _answer(cli_request_id, {"behavior": "allow", "updatedInput": updated})


def _refuse_widening(obj: dict[str, Any]) -> None:
    """Raise ValueError unless ``obj`` is an answer of the shapes above: a mode change, a
    directory, a rule kept beyond the session never reach the CLI. ``updatedInput`` is the
    tool's own input as the CLI asked (its keys are the tool's) and ``message`` free text for
    the model, so neither is searched for the words of a widening."""
    response = obj.get("response")
    inner = response.get("response") if isinstance(response, dict) else None
    if (
        set(obj) != {"type", "response"}
        or obj["type"] != "control_response"
        or not isinstance(response, dict)
        or set(response) != {"subtype", "request_id", "response"}
        or response["subtype"] != "success"
        or not isinstance(response["request_id"], str)
        or not isinstance(inner, dict)
        or not set(inner) <= _ANSWER_KEYS
        or inner.get("behavior") not in ("allow", "deny")
    ):
        raise ValueError("refusing a control answer of an unknown shape")
    # The message is words for the model (a person's feedback may name anything): a string.
    if not isinstance(inner.get("message", ""), str):
        raise ValueError("refusing a control answer of an unknown shape")
    rest = {key: value for key, value in inner.items() if key not in ("updatedInput", "message")}
    if _names_widening(rest):
        raise ValueError("refusing a control answer that would widen permissions")
    for update in inner.get("updatedPermissions", []):
        rules = update.get("rules") if isinstance(update, dict) else None
        rule = rules[0] if isinstance(rules, list) and rules else None
        tool = rule.get("toolName") if isinstance(rule, dict) else None
        content = rule.get("ruleContent") if isinstance(rule, dict) else None
        if (
            not isinstance(tool, str)
            or not TOOL_NAME.fullmatch(tool)
            or (content is not None and not _RULE_CONTENT.fullmatch(str(content)))
            or update != session_rule(tool, content)
        ):
            raise ValueError("refusing a permission update other than one session rule")


def _names_widening(value: object) -> bool:
    if isinstance(value, dict):
        return any(
            key in _WIDENING
            or (key == "destination" and item != "session")
            or _names_widening(item)
            for key, item in value.items()
        )
    if isinstance(value, list):
        return any(_names_widening(item) for item in value)
    return isinstance(value, str) and value in _WIDENING


def opening(prompt: str) -> bytes:
    """What a run writes first: ``initialize``, then the prompt."""
    return control_request(INITIALIZE_ID, "initialize") + user_message(prompt)


def _taken(unread: deque[str], content: object, *, first: bool) -> int:
    """How many of the oldest ``unread`` messages an echo took in: as many as its text spells,
    joined by newlines (in the first echo, after the prompt's text: a message written before
    the CLI took the prompt in may join it). A later echo that spells none still takes one in,
    so that a wording the CLI changes cannot keep a run open; the first is the prompt then."""
    taken = 0
    if isinstance(content, str):
        joined = ""
        for count, text in enumerate(unread, 1):
            joined = f"{joined}\n{text}" if count > 1 else text
            if len(joined) > len(content):
                break
            if content.endswith(f"\n{joined}") if first else content == joined:
                taken = count
    return taken or (0 if first else min(1, len(unread)))


class Channel:
    """When the run is over, from what the CLI printed.

    ``over`` is true from a ``result`` line printed while no background task is open and no
    user message written mid-run is still unread, until the CLI says more (a background task
    that finishes starts a turn of its own, and its ``result`` is then the last one).
    Background tasks are known from ``background_tasks_changed``, which lists every open one
    (a foreground task is not listed); a cancel stops each with ``stop_task``. A user message
    written mid-run (steering) is taken in at the next tool boundary, or after the turn as a
    turn of its own. With ``--replay-user-messages`` the CLI echoes what it takes in (measured
    on 2.1.332): the prompt first; at a tool boundary each message on its own; after a turn
    every message it queued meanwhile as one message, their texts joined by newlines. So the
    messages written are kept, in order, until an echo spells them (:func:`_taken`), or until
    a turn answers one without the model (:meth:`result`).

    ``idle`` is true between a ``result`` and the next turn (its ``init`` line, or the main
    agent's first words): then no turn runs that an interrupt could end, and a cancel need not
    wait for a ``result`` that will not come (only background tasks are left, stopped first).
    """

    __slots__ = (
        "_echoed",
        "_results",
        "_unread",
        "_unread_bytes",
        "background",
        "idle",
        "over",
        "prompted",
    )

    def __init__(self) -> None:
        self.background: tuple[str, ...] = ()  # the open background tasks' ids
        self.over = False
        self.idle = False  # the prompt's turn runs from the start
        self.prompted = False  # the prompt's echo came
        # Messages written mid-run that no echo has spelled yet, oldest first, and their UTF-8
        # bytes. At most [limits] pending_inputs of them and pending_input_bytes in all (the
        # daemon refuses more), each at most task_bytes.
        self._unread: deque[str] = deque()
        self._unread_bytes = 0
        self._results = 0  # result lines so far
        self._echoed = False  # an echo came since the last result

    def result(self, num_turns: int | None = None) -> None:
        """A ``result`` line, ``num_turns`` its model calls. A turn of its own after a result
        that called no model and echoed nothing was the CLI answering the oldest unread message
        itself: a local command's answer is never echoed (measured on 2.1.332; policy refuses
        text the CLI takes as a command, so this is the fallback that keeps a run from waiting
        for an echo that will not come)."""
        if num_turns == 0 and self._results and not self._echoed and self._unread:
            self._unread_bytes -= utf8_len(self._unread.popleft())
        self._results += 1
        self._echoed = False
        self.idle = True
        self.over = not self.background and not self._unread

    def turn(self) -> None:
        """A turn runs: its ``init`` line came, or the main agent said something."""
        self.idle = False

    def input_written(self, text: str) -> None:
        """A user message was written mid-run: the run is not over before its turn's result."""
        self._unread.append(text)
        self._unread_bytes += utf8_len(text)
        self.over = False
        self.idle = False  # the CLI takes it in as a turn of its own, if none runs

    def replayed(self, content: object) -> None:
        """The CLI echoed what it took in (``isReplay``), ``content`` its message's content."""
        first = not self.prompted
        self.prompted = True
        self._echoed = True
        if not self._unread:
            return  # nothing written mid-run (most runs): no echo to match
        for _ in range(_taken(self._unread, content, first=first)):
            self._unread_bytes -= utf8_len(self._unread.popleft())

    @property
    def unread(self) -> int:
        """Messages written mid-run that the CLI has not taken in yet: what it holds queued."""
        return len(self._unread)

    @property
    def unread_bytes(self) -> int:
        """The UTF-8 bytes of those messages."""
        return self._unread_bytes

    def tasks(self, ids: tuple[str, ...] | None) -> None:
        if ids is not None:
            self.background = ids
        if self.background:
            self.over = False


class ResultWatch:
    """Whether a ``result`` line came in the bytes fed so far.

    For the interrupt of a cancelled run: its output is no longer translated (nothing of the
    process reaches a client after a stop but the closing frames), yet the daemon must see the
    turn's ``result`` to know that the CLI honoured the interrupt.
    """

    __slots__ = ("_splitter", "seen")

    def __init__(self, line_bytes: int) -> None:
        self._splitter = LineSplitter(line_bytes)
        self.seen = False

    def feed(self, data: bytes) -> bool:
        """True once a ``result`` line has come (``data`` in any chunking)."""
        if not self.seen:
            for line in self._splitter.feed(data):
                try:
                    kind = wire.line_type(line)
                except msgspec.DecodeError:
                    continue
                if kind == "result":
                    self.seen = True
                    break
        return self.seen
