"""Approval frames as O Chat shows them, through its own normalizer (tests/contract).

The normalizer handles the Work Room's invocation frames; approval_needed is taken by O Chat's
remote agent outside it (DESIGN "Approvals"), so here: the Work Room says it waits while a
request is pending and works again after, no approval frame adds an item of its own (one
would show the raw command or path outside the typed rows), and what O Chat makes of a card's
``files`` (names only: a sensitive file's path does not survive).
"""

from __future__ import annotations

import json

import msgspec

from codelegate.policy.approvals import ApprovalsConfig
from codelegate.translator import Translator
from codelegate.translator.frames import ApprovalNeeded, ApprovalResolved, Frame, ProviderActivity
from tests.contract.ochat import Show
from tests.contract.test_ochat import INVOCATION
from tests.golden.test_control_channel import sensitive_write
from tests.translator.helpers import (
    CWD,
    EXITED,
    assistant,
    context,
    init_line,
    line,
    result_line,
    tool_result,
    tool_use,
)


def test_o_chat_shows_the_work_room_waiting_for_a_decision_then_working_again(show: Show) -> None:
    translator = Translator(context(), approvals=ApprovalsConfig(enabled=True))
    write = {"file_path": f"{CWD}/n.txt", "content": "x"}
    request = {"subtype": "can_use_tool", "tool_name": "Write", "input": write, "tool_use_id": "t1"}
    frames: list[Frame] = translator.start(1000.0)
    frames += translator.receive_data(init_line(), 1000.0)
    frames += translator.receive_data(assistant(tool_use("t1", "Write", **write)), 1001.0)
    frames += translator.receive_data(
        line(type="control_request", request_id="r", request=request), 1002.0
    )
    (asked,) = translator.approvals.take_asked()
    out = translator.approvals.resolve(asked.request_id, decision="allow", by="client", now=1003.0)
    assert out is not None
    frames += out[0]
    frames += translator.receive_data(tool_result("t1", "ok") + result_line(), 1004.0)
    frames += translator.close(EXITED, 1005.0)
    (steps,) = show(frames)
    needed = next(i for i, f in enumerate(frames) if isinstance(f, ApprovalNeeded))
    resolved = next(i for i, f in enumerate(frames) if isinstance(f, ApprovalResolved))

    def work_room(step: int) -> dict[str, object]:
        (item,) = [i for i in steps[step] if i.get("id") == INVOCATION]
        return item

    assert (work_room(needed)["status"], work_room(needed)["currentSummary"]) == (
        "awaiting_approval",
        "Waiting for your decision",
    )
    assert work_room(resolved + 1)["status"] == "running"
    assert work_room(len(frames) - 1)["status"] == "completed"
    # An approval frame changes nothing O Chat's normalizer shows but the Work Room's status.
    for at in (needed, resolved):
        assert steps[at] == steps[at - 1]
    assert CWD not in json.dumps(steps[-1])


def test_o_chat_shows_a_sensitive_files_path_by_its_name_alone(show: Show) -> None:
    # The CLI's own "sensitive file" prompt (tests/golden: captured from the real CLI). The
    # frame names the file by its workspace path; O Chat shows names only. Its approval card is
    # built by RemoteAgent (connectonion-react src/connect/remote-agent.ts,
    # providerApprovalPresentation), which is not in the bundle: the normalizer takes no
    # approval frame at all. RemoteAgent cuts providerApproval.files with the same
    # providerFileName as the normalizer's Work Room rows, so a row carrying the card's files
    # shows what the card does. The card renders no other text of the frame that could say
    # where the file is: action, scope and reason are fixed texts, description never shown.
    translator = Translator(context(), approvals=ApprovalsConfig(enabled=True))
    path = f"{CWD}/.git/config"
    request = {**sensitive_write(path, ".git/config"), "tool_use_id": "t1"}
    frames: list[Frame] = translator.start(1000.0)
    frames += translator.receive_data(init_line(), 1000.0)
    frames += translator.receive_data(assistant(tool_use("t1", "Write", **request["input"])), 1001)
    frames += translator.receive_data(
        line(type="control_request", request_id="r", request=request), 1002.0
    )
    (needed,) = [f for f in frames if isinstance(f, ApprovalNeeded)]
    assert needed.providerApproval.files == [".git/config"]
    # The Write's rows, carrying the card's files.
    card_files = [
        msgspec.structs.replace(f, files=needed.providerApproval.files)
        if isinstance(f, ProviderActivity) and f.activityId == needed.tool_id
        else f
        for f in frames
    ]
    (steps,) = show(card_files)
    at = card_files.index(needed)
    assert steps[at] == steps[at - 1]
    (work_room,) = [item for item in steps[-1] if item.get("id") == INVOCATION]
    (row,) = [row for row in work_room["activities"] if row["id"] == needed.tool_id]
    assert row["files"] == ["config"]
