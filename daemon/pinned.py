"""What this install runs: the Claude Code CLI version the project pins and tests against (the one
place it is written), and which build of the translator is installed.

The Makefile and the Dockerfile read the pin from this file, the tests and ``codelegate doctor``
import it. Upgrading the CLI starts by changing this line (README, "Upgrading the pinned Claude
Code CLI").
"""

from typing import Final

from codelegate.translator import compiled

CLAUDE_CODE_VERSION: Final = "2.1.332"


def translator_build() -> str:
    """The translator's build as ``doctor`` and the start-up log say it (README "Translator
    speed")."""
    if compiled():
        return "compiled (mypyc)"
    return "pure Python (a compiled build translates faster: make wheel)"
