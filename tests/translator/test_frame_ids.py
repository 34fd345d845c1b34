"""Every frame's id is frames.frame_id of its run and seq, however the run state stamps it."""

from __future__ import annotations

from codelegate.translator.frames import frame_id
from tests.translator.helpers import assistant, context, init_line, result_line, run, tool_use


def test_every_frame_of_a_run_has_the_id_frame_id_gives_its_run_and_seq() -> None:
    frames = run(
        [init_line(), assistant(tool_use("toolu_1", "Bash", command="ls")), result_line()],
        context(run_id="run:with:colons"),
    )
    assert len(frames) > 3
    assert [f.id for f in frames] == [frame_id("run:with:colons", f.seq) for f in frames]
    assert frames[0].id == f"run:with:colons:{frames[0].seq}"
