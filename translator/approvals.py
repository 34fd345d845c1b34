"""Permission prompts and questions of the CLI (``can_use_tool``): frames out, answers as data.

With ``[approvals]`` on the CLI asks the host on its control channel and waits. Each request is
judged by policy first (``policy.approvals.judge``): denied at once (an ``approval_resolved``
``by: policy``, the deny line queued for the daemon), or put to a person as an
``approval_needed`` frame (``ask_user`` for AskUserQuestion) and kept pending until
:meth:`ApprovalRules.resolve` — by a client's answer, its timeout, a cancel, or the CLI
withdrawing it — which gives the ``approval_resolved`` frame and the one line to write, exactly
once per request. Off (no config, or ``enabled = false``), a request is denied at once with no
frame: runs fail closed as they always did.

The raw input is kept here (memory only) because an allow must send it back exactly as asked;
frames and the store get the redacted, bounded ``arguments``. A host deny has no
``system/permission_denied`` line: the card is marked denied here, so that its tool_result
closes it ``failed``/``permission_denied``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal

import msgspec

from codelegate.policy.approvals import (
    DENIED_MESSAGE,
    FILE_CHANGE_TOOLS,
    OFF_MESSAGE,
    QUESTION_TOOL,
    UNREADABLE_MESSAGE,
    ApprovalsConfig,
    Prompt,
    Verdict,
    check_answer,
    check_question_answers,
    judge,
    timeout_message,
)
from codelegate.translator.args import _shrink_args
from codelegate.translator.cards import Cards, _file_names
from codelegate.translator.control import allow, answer_questions, deny
from codelegate.translator.frames import (
    ApprovalNeeded,
    ApprovalResolved,
    AskUser,
    Frame,
    InvocationStatus,
    ResolvedBy,
    frame_id,
)
from codelegate.translator.inputs import NAME_CHARS
from codelegate.translator.prompts import (
    QUESTION_CHARS,
    Question,
    decode_request,
    provider_approval,
    read_questions,
    shown_questions,
)
from codelegate.translator.state import RunState
from codelegate.translator.summary import changed_path
from codelegate.translator.wire import ControlCancel, ControlRequest

Decision = Literal["allow", "deny"]

_WAITING: Final = "Waiting for your decision"
_WORKING: Final = "Working in the selected workspace"
_args_encoder: Final = msgspec.json.Encoder()


class Asked(msgspec.Struct, frozen=True, kw_only=True):
    """A pending request, for the daemon (its store row, its timer, the answer's checks)."""

    request_id: str  # ours: the approval_needed / ask_user frame's id, "<run_id>:<seq>"
    cli_request_id: str  # the CLI's; "" for one rebuilt from frames (nothing left to answer)
    kind: Literal["permission", "question"]
    tool: str  # redacted, as in frames
    tool_id: str
    arguments: Any  # redacted and bounded, as in the frame
    verdict: Verdict
    asked_at: float
    expires_at: float
    prompt: Prompt  # raw: the input to send back as asked. Memory only, never stored or logged

    @property
    def input(self) -> Mapping[str, Any]:
        """The tool input as the CLI asked (raw: memory only)."""
        return self.prompt.input


class ApprovalRules:
    """The approval transitions of one run: given its state and its card rules, composed by
    :class:`~translator.core.Translator` like the other rules."""

    def __init__(
        self,
        state: RunState,
        cards: Cards,
        invocation_frame: Callable[[InvocationStatus, str], None],
        cfg: ApprovalsConfig | None,
    ) -> None:
        self.s = state
        self.cards = cards
        self._invocation_frame = invocation_frame  # the Work Room's status (the translator's)
        self._approvals = cfg if cfg is not None and cfg.enabled else None
        self._pending: dict[str, Asked] = {}
        # Every request id of the CLI seen -> ours ("" when it was answered at once).
        self._by_cli: dict[str, str] = {}
        self._uses: dict[str, str] = {}  # ours -> the CLI's tool_use id (its card)
        self._control_out: list[bytes] = []
        self._asked_out: list[Asked] = []
        self._denied_out: dict[str, str] = {}  # request id -> what policy's deny told the model

    # --- the public API (with the Translator's) ------------------------------------------------

    @property
    def pending(self) -> Mapping[str, Asked]:
        """The requests waiting for an answer, by request id."""
        return self._pending

    def take_control(self) -> list[bytes]:
        """Lines to write to the CLI's stdin now (requests denied at once), oldest first."""
        out, self._control_out = self._control_out, []
        return out

    def take_asked(self) -> list[Asked]:
        """Requests put to a person since the last call (the daemon stores them, starts timers)."""
        out, self._asked_out = self._asked_out, []
        return out

    def take_denied(self) -> dict[str, str]:
        """What policy's denies since the last call told the model, by request id (for the
        daemon's approvals rows: the ``approval_resolved`` frame carries no message)."""
        out, self._denied_out = self._denied_out, {}
        return out

    def resolve(
        self,
        request_id: str,
        *,
        decision: Decision,
        by: ResolvedBy,
        now: float,
        scope: str = "once",
        message: str | None = None,
        answers: Mapping[str, str] | None = None,
        notes: Mapping[str, str] | None = None,
    ) -> tuple[list[Frame], bytes | None] | None:
        """End a pending request: its frames and the line to write (None for a cancel or a
        request the CLI withdrew: nothing is written then). None when the request is not
        pending (unknown, or resolved already: the first answer wins).

        Raises ``PolicyError`` for a session scope policy does not allow (403) or an allow of a
        question that answers none of its questions (400): the request stays pending. Raises
        ValueError for an allow by anyone but a client.
        """
        asked = self._pending.get(request_id)
        if asked is None or self.s.closed:
            return None
        if decision == "allow" and by != "client":
            raise ValueError("only a client's answer can allow")
        granted = check_answer(asked.verdict, approved=decision == "allow", scope=scope)
        if not asked.cli_request_id and by in ("client", "timeout"):
            return None  # rebuilt after a restart: the CLI that asked is gone
        if asked.kind == "question" and decision == "allow":
            keys = self._question_keys(asked)
            answers, notes = _keyed(answers, keys), _keyed(notes, keys)
            check_question_answers(set(keys.values()), answers, notes)
        self.s.now = now
        line = None
        if by not in ("cancel", "interrupted"):
            if by == "timeout" and not (message and message.strip()):
                cfg = self._approvals
                message = timeout_message(cfg.timeout_s if cfg is not None else 0.0)
            line = self._answer_line(asked, decision, granted, message, answers, notes)
        self._settle(asked, decision, granted, by)
        return self.s.take(), line

    def resolve_all(self, by: Literal["cancel", "interrupted"], now: float) -> list[Frame]:
        """End every pending request (a cancel, the end of the run): frames only, no line."""
        if self.s.closed:
            return []
        self.s.now = now
        for asked in list(self._pending.values()):
            self._settle(asked, "deny", "once", by, ending=True)
        return self.s.take()

    def restore(self, frames: Iterable[Frame]) -> None:
        """The requests still pending in a run's stored frames (after a daemon restart): they
        can only end ``interrupted`` now, the CLI that asked being gone."""
        for frame in frames:
            if isinstance(frame, ApprovalNeeded | AskUser):
                self._pending[frame.id] = Asked(
                    request_id=frame.id,
                    cli_request_id="",
                    kind="question" if isinstance(frame, AskUser) else "permission",
                    tool=frame.tool if isinstance(frame, ApprovalNeeded) else QUESTION_TOOL,
                    tool_id=frame.tool_id,
                    arguments=frame.arguments if isinstance(frame, ApprovalNeeded) else None,
                    verdict=Verdict(
                        ask=True, classification="unknown", allow_once=False, allow_session=False
                    ),
                    asked_at=frame.ts,
                    expires_at=frame.expires_at,
                    prompt=Prompt(tool_name="", input={}),
                )
            elif isinstance(frame, ApprovalResolved):
                self._pending.pop(frame.request_id, None)

    def end(self) -> None:
        """The run closes: what is still pending ends ``interrupted`` (nobody can answer it)."""
        for asked in list(self._pending.values()):
            self._settle(asked, "deny", "once", "interrupted", ending=True)

    # --- lines of the CLI -----------------------------------------------------------------------

    def control_request(self, msg: ControlRequest) -> None:
        cli_id = msg.request_id
        decoded = decode_request(msg.request)
        body, prompt = decoded if decoded is not None else (None, None)
        if body is not None and body.subtype != "can_use_tool":
            self.s.count("unknown_type")  # a request of a kind this daemon does not speak
            return
        if cli_id in self._by_cli:
            return  # the same line again: answered once already
        if not cli_id:
            self.s.count("malformed_line")  # nothing to answer it by
            return
        self._by_cli[cli_id] = ""
        if body is None or prompt is None or not body.tool_use_id:
            self.s.count("malformed_line")
            self._control_out.append(deny(cli_id, UNREADABLE_MESSAGE))
            return
        cfg = self._approvals
        if cfg is None:
            # Approvals off: denied as under --permission-prompts none, and no frame for it.
            self._control_out.append(deny(cli_id, OFF_MESSAGE))
            self.cards.mark_denied(body.tool_use_id, OFF_MESSAGE, prompt.tool_name)
            return
        verdict = judge(cfg, prompt, cwd=self.s.ctx.cwd, pending=len(self._pending))
        questions = read_questions(prompt.input) if prompt.question else None
        if prompt.question and not questions:
            verdict = msgspec.structs.replace(verdict, ask=False, deny_message=UNREADABLE_MESSAGE)
        tool_id = self.s.tool_id(body.tool_use_id)
        request_id = frame_id(self.s.run_id, self.s.seq + 1)
        if not verdict.ask:
            message = verdict.deny_message or UNREADABLE_MESSAGE
            self._control_out.append(deny(cli_id, message))
            self._denied_out[request_id] = message
            self.cards.mark_denied(body.tool_use_id, message, prompt.tool_name)
            self.s.frame(
                ApprovalResolved,
                request_id=request_id,
                decision="deny",
                scope="once",
                by="policy",
                tool=self.s.said(prompt.tool_name, NAME_CHARS),
                tool_id=tool_id,
            )
            return
        self._invocation_frame("awaiting_approval", _WAITING)
        request_id = frame_id(self.s.run_id, self.s.seq + 1)
        asked = Asked(
            request_id=request_id,
            cli_request_id=cli_id,
            kind="question" if questions else "permission",
            tool=self.s.said(prompt.tool_name, NAME_CHARS),
            tool_id=tool_id,
            arguments=self._arguments(body.tool_use_id, prompt.input),
            verdict=verdict,
            asked_at=self.s.now,
            expires_at=self.s.now + cfg.timeout_s,
            prompt=prompt,
        )
        agent = self.s.said(prompt.agent_id) if prompt.agent_id else None
        if questions:
            self._ask_user(asked, questions, agent)
        else:
            self._approval_needed(asked, body.description, agent)
        self._pending[request_id] = asked
        self._by_cli[cli_id] = request_id
        self._uses[request_id] = body.tool_use_id
        self._asked_out.append(asked)

    def control_cancel(self, msg: ControlCancel) -> None:
        # The CLI withdrew its request (it does so before answering our interrupt): nothing
        # may be written for it any more.
        request_id = self._by_cli.get(msg.request_id)
        asked = self._pending.get(request_id) if request_id is not None else None
        if asked is not None:
            self._settle(asked, "deny", "once", "interrupted")

    # --- frames -------------------------------------------------------------------------------

    def _approval_needed(self, asked: Asked, description: str | None, agent: str | None) -> None:
        name = asked.prompt.tool_name
        files = None
        if name in FILE_CHANGE_TOOLS:
            changed = changed_path(name, asked.prompt.input, self.s.ctx.cwd)
            said = self.s.said(changed) if changed else None
            # A sensitive file is known by where it is (.git/config, not "config"): the person
            # is shown its path, as the description and arguments carry it (redacted, bounded).
            if asked.prompt.sensitive and said:
                files = [said]
            else:
                files = _file_names(said, self.s.redactor.clean_chars)
        self.s.frame(
            ApprovalNeeded,
            request_id=asked.request_id,
            tool=asked.tool,
            arguments=asked.arguments,
            description=self.s.said(description) if description else None,
            tool_id=asked.tool_id,
            activityId=asked.tool_id if self.s.invocation is not None else None,
            expires_at=asked.expires_at,
            agent_id=agent,
            providerApproval=provider_approval(
                name, asked.verdict, files, sensitive=asked.prompt.sensitive
            ),
        )

    def _ask_user(self, asked: Asked, questions: list[Question], agent: str | None) -> None:
        shown = shown_questions(
            questions, lambda text: self.s.said(text, QUESTION_CHARS), self.s.limits.items
        )
        first = shown[0]
        self.s.frame(
            AskUser,
            request_id=asked.request_id,
            tool_id=asked.tool_id,
            question=first.question,
            options=[o.label for o in first.options],
            multi_select=first.multiSelect,
            questions=shown,
            expires_at=asked.expires_at,
            agent_id=agent,
        )

    def _arguments(self, use_id: str, raw: dict[str, Any]) -> Any:
        card = self.s.cards.get(use_id)
        if card is not None and not card.partial:
            return card.args  # the same input, cleaned and bounded once already
        limits = self.s.limits
        args = self.s.redactor.clean_value(raw, string_bytes=limits.arg_bytes, items=limits.items)
        if len(_args_encoder.encode(args)) > limits.arg_bytes:
            args = _shrink_args(self.s.redactor, args, limits.arg_bytes)
        return args

    # --- answers --------------------------------------------------------------------------------

    def _question_keys(self, asked: Asked) -> dict[str, str]:
        """Each question's text as its frame showed it (redacted, bounded) and as asked -> as
        asked: a client answers by the text it was shown, the CLI keys answers by the raw one."""
        raw = [q.question for q in read_questions(asked.prompt.input) or ()]
        keys = {self.s.said(text, QUESTION_CHARS): text for text in raw}
        return keys | {text: text for text in raw}

    def _answer_line(
        self,
        asked: Asked,
        decision: Decision,
        scope: str,
        message: str | None,
        answers: Mapping[str, str] | None,
        notes: Mapping[str, str] | None,
    ) -> bytes:
        cli_id, prompt = asked.cli_request_id, asked.prompt
        if decision == "deny":
            message = message if message and message.strip() else DENIED_MESSAGE
            self.cards.mark_denied(self._uses[asked.request_id], message, prompt.tool_name)
            return deny(cli_id, message)
        if asked.kind == "question":
            # Every key is a question asked (resolve checked): the CLI takes them as they are.
            return answer_questions(
                cli_id, dict(prompt.input), dict(answers or {}), dict(notes) if notes else None
            )
        rule = asked.verdict.session_rule if scope == "session" else None
        return allow(cli_id, prompt.input, rule)

    def _settle(
        self, asked: Asked, decision: Decision, scope: str, by: ResolvedBy, ending: bool = False
    ) -> None:
        del self._pending[asked.request_id]
        self._uses.pop(asked.request_id, None)
        self.s.frame(
            ApprovalResolved,
            request_id=asked.request_id,
            decision=decision,
            scope=scope,
            by=by,
            tool=asked.tool,
            tool_id=asked.tool_id,
        )
        # Back to work once nothing waits; not when the run is ending (a cancel, the close).
        if not self._pending and by != "cancel" and not ending:
            self._invocation_frame("running", _WORKING)


def _keyed(texts: Mapping[str, str] | None, keys: Mapping[str, str]) -> dict[str, str]:
    """``texts`` keyed by the questions' raw texts (a key no question has is kept, refused)."""
    return {keys.get(key, key): text for key, text in (texts or {}).items()}
