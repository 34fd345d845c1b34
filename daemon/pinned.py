"""The Claude Code CLI version this project pins and tests against: the one place it is written.

The Makefile and the Dockerfile read it from this file, the tests and ``codelegate doctor``
import it. Upgrading the CLI starts by changing this line (README, "Upgrading the pinned Claude
Code CLI").
"""

from typing import Final

CLAUDE_CODE_VERSION: Final = "2.1.332"
