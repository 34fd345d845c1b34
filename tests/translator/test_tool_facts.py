"""The facts a tool's name says of its cards: worked out once per name, and bounded."""

from __future__ import annotations

from codelegate.translator.frames import RunResult, ToolCall
from codelegate.translator.inputs import Limits
from codelegate.translator.redact import PLAIN
from codelegate.translator.state import RunState
from codelegate.translator.tools import Tool

from .helpers import assistant, context, of_type, run, tool_use


def test_the_cards_of_many_invented_tool_names_keep_their_own_names_past_the_bound() -> None:
    # 300 names: more than a run remembers the facts of (256); the later ones are worked out
    # for each card, and say the same as the remembered ones would.
    names = [f"Tool{n}" for n in range(300)]
    calls = of_type(
        run([assistant(tool_use(f"toolu_{n}", name)) for n, name in enumerate(names)]),
        "tool_call",
    )
    assert [call["name"] for call in calls] == [f"Claude Code › {name}" for name in names]


def test_a_tool_name_is_looked_at_once_and_its_facts_are_shared_by_its_cards() -> None:
    s = RunState(context(), Limits(), PLAIN)
    bash = s.tool("Bash")
    assert s.tool("Bash") is bash
    assert (bash.name, bash.kind, bash.review, bash.changes_files) == (
        "Claude Code › Bash",
        "command",
        "Bash",
        False,
    )
    edit, unnamed = s.tool("Edit"), s.tool(None)
    assert (edit.kind, edit.review, edit.changes_files) == ("file_change", "Edit", True)
    assert (unnamed.tool, unnamed.review, unnamed.title) == ("unknown", None, None)
    assert isinstance(unnamed, Tool)


def test_a_tool_name_that_ends_like_bash_is_reviewed_as_the_restore_would() -> None:
    # The evidence reads a card's tool from its frame name (a restore has only frames): the
    # facts say the same for a name the model made up around a real one.
    frames = run(
        [
            assistant(tool_use("toolu_1", "x › Bash", command="make test")),
            assistant(tool_use("toolu_2", "Bash", command="make lint")),
        ]
    )
    calls = [frame for frame in frames if isinstance(frame, ToolCall)]
    assert [call.name for call in calls] == ["Claude Code › x › Bash", "Claude Code › Bash"]
    last = frames[-1]
    assert isinstance(last, RunResult)
    assert [command.command for command in last.result.commands] == ["make test", "make lint"]
