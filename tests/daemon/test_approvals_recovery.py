"""A daemon that died with a request waiting: the next start closes it ``interrupted``, in the
run's frames and in its approvals list (the translator rebuilt from the stored frames)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from codelegate.daemon.approvals import asked_row
from codelegate.daemon.store.store import RunRecord, RunStore
from codelegate.policy.approvals import ApprovalsConfig
from codelegate.policy.config import Config
from codelegate.translator import RunContext, Translator
from codelegate.translator.frames import ApprovalNeeded, encode_frame
from tests.daemon.conftest import make_config, start_daemon, stop_daemon

RUN = "0a7d1f8e-4444-4b4b-8c8c-000000000001"
SESSION = "0a7d1f8e-5555-4b4b-8c8c-000000000002"


def _asking(cwd: str) -> bytes:
    """What the CLI prints up to a permission prompt for a Write inside the workspace."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "Write"}
    use["input"] = {"file_path": f"{cwd}/n.txt", "content": "x"}
    request = {
        "subtype": "can_use_tool",
        "tool_name": "Write",
        "display_name": "Write",
        "input": use["input"],
        "tool_use_id": "toolu_1",
        "description": "n.txt",
    }
    lines = [
        {"type": "system", "subtype": "init", "session_id": SESSION, "cwd": cwd, "tools": []},
        {
            "type": "assistant",
            "session_id": SESSION,
            "parent_tool_use_id": None,
            "message": {"id": "msg_1", "role": "assistant", "content": [use]},
        },
        {"type": "control_request", "request_id": "cli-1", "request": request},
    ]
    return b"".join(msgspec.json.encode(line) + b"\n" for line in lines)


async def test_a_request_left_waiting_by_a_dead_daemon_ends_interrupted(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    config: Config = make_config(short_dir, workspace, approvals={"enabled": True})
    cwd = config.policy.workspaces[0]
    translator = Translator(
        RunContext(run_id=RUN, cwd=cwd, session_id=SESSION, started_at=1.0),
        approvals=ApprovalsConfig(enabled=True),
    )
    frames = translator.start(1.0) + translator.receive_data(_asking(cwd), 2.0)
    (asked,) = translator.approvals.take_asked()
    assert [f for f in frames if isinstance(f, ApprovalNeeded)]
    store = await RunStore.open(config.store.path)
    await store.create_run(
        RunRecord(run_id=RUN, status="running", created_at=1.0, cwd=cwd, mode="safe")
    )
    for frame in frames:
        store.append_frame(RUN, frame.seq, encode_frame(frame))
    # As the dead daemon had written it: asked, not answered.
    store.put_approval(asked_row(RUN, asked))
    await store.flush()
    await store.close()

    d = await start_daemon(config, tmp_path)
    try:
        replay = await d.events(RUN)
        _, listed = await d.json("GET", f"/v1/runs/{RUN}/approvals")
        status, late = await d.json(
            "POST", f"/v1/runs/{RUN}/approvals/{asked.request_id}", json={"approved": True}
        )
    finally:
        await stop_daemon(d)
    resolved = [f for f in replay if f["type"] == "approval_resolved"]
    assert [(f["request_id"], f["decision"], f["by"]) for f in resolved] == [
        (asked.request_id, "deny", "interrupted")
    ]
    assert replay[-1]["result"]["status"] == "interrupted"
    (row,) = listed["approvals"]
    assert (row["request_id"], row["decision"], row["by"]) == (
        asked.request_id,
        "deny",
        "interrupted",
    )
    assert (status, late["error"]["code"]) == (409, "approval_resolved")
