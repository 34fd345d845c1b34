"""Cancel: the interrupt first, SIGTERM when the CLI does not answer it (a fake CLI)."""

from __future__ import annotations

import json
from pathlib import Path

from codelegate.daemon.serving.state import manager_of
from tests.daemon.conftest import (
    frames_until_result,
    make_config,
    next_frame,
    running_daemon,
)


async def _cancel_an_unanswering_cli(
    short_dir: Path, workspace: Path, tmp_path: Path, grace: float, scenario: str = ""
) -> tuple[dict[str, object], list[str]]:
    """Cancel a run of a CLI that reads stdin on but answers nothing; its state and the stdin
    lines it got after the prompt (plus "SIGTERM" when one reached it)."""
    record = tmp_path / "stdin.log"
    config = make_config(short_dir, workspace, policy={"interrupt_grace_s": grace})
    async with running_daemon(config, tmp_path) as d:
        resp = await d.post_run(f"fake: ignore_interrupt lines={record} {scenario}".strip())
        assert resp.status == 202
        run_id = (await resp.json())["run_id"]
        async with d.ws(f"?run={run_id}") as ws:
            while (await next_frame(ws)).get("type") != "tool_call":
                pass
            status, _ = await d.json("POST", f"/v1/runs/{run_id}/cancel")
            assert status == 202
            frames = await frames_until_result(ws)
        assert frames[-1]["result"]["status"] == "cancelled"
        run = manager_of(d.handle.app).get(run_id)
        assert run is not None
        await run.settled.wait()
        status, state = await d.json("GET", f"/v1/runs/{run_id}")
        assert status == 200
    return state, record.read_text().splitlines()


async def test_a_cli_that_ignores_the_interrupt_gets_sigterm_after_the_grace(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    state, lines = await _cancel_an_unanswering_cli(short_dir, workspace, tmp_path, 0.2)
    interrupt, term = lines
    assert json.loads(interrupt)["request"] == {"subtype": "interrupt"}
    assert term == "SIGTERM"
    assert state["status"] == "cancelled"
    assert state["exit_code"] == 143  # the fake's SIGTERM handler: the fallback path ended it


async def test_a_cancel_stops_every_open_background_task_before_the_interrupt(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    # The real CLI stops a background Bash or subagent on stop_task (tests/golden,
    # test_stop_task_*); the daemon asks it for each task the CLI last listed open.
    state, lines = await _cancel_an_unanswering_cli(
        short_dir, workspace, tmp_path, 0.2, "background=bk1,ag2"
    )
    *stops, interrupt, term = lines
    assert [json.loads(line)["request"] for line in stops] == [
        {"subtype": "stop_task", "task_id": "bk1"},
        {"subtype": "stop_task", "task_id": "ag2"},
    ]
    assert json.loads(interrupt)["request"] == {"subtype": "interrupt"}
    assert term == "SIGTERM"
    assert state["status"] == "cancelled"


async def test_with_no_interrupt_grace_a_cancel_sends_sigterm_alone(
    short_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    state, lines = await _cancel_an_unanswering_cli(short_dir, workspace, tmp_path, 0)
    assert lines == ["SIGTERM"]
    assert state["status"] == "cancelled"
