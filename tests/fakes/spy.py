"""A spy in front of the fault-injecting fake CLI: it records every start.

A tiny shell script: every start except ``--version`` (the daemon asks for it at start-up)
appends a line to a file, then the fake CLI runs as usual, so a test can say "this request
spawned nothing" by reading that file.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from tests.fakes import FAKE_CLAUDE


class Spy:
    """The spy CLI's path and the record of its starts."""

    def __init__(self, folder: Path) -> None:
        self.log = folder / "spawned.log"
        self.path = folder / "claude-spy"
        self.path.write_text(
            "#!/bin/sh\n"
            'case " $* " in *" --version "*) ;; *) echo "$$ $PWD" >> '
            + f"'{self.log}'"
            + " ;; esac\n"
            f"exec '{sys.executable}' '{FAKE_CLAUDE}' \"$@\"\n"
        )
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)

    @property
    def starts(self) -> list[str]:
        """One ``"<pid> <cwd>"`` line per start."""
        return self.log.read_text().splitlines() if self.log.exists() else []
