"""O Chat's own normalizer, run in node: what its Work Room shows for a stream of frames.

``mapEventToChatItem`` of ``@connectonion/react``, bundled for node beside the checkout
(``../shared/reference/connectonion-react/``, never copied into the project);
``ochat_items.cjs`` feeds it frames as O Chat's ``RemoteAgent`` does (upsert by id).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from codelegate.translator.frames import Frame, encode_frame
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parents[2]
MAPPER = ROOT.parent / "shared" / "reference" / "connectonion-react" / "mapper.bundle.cjs"
DRIVER = Path(__file__).with_name("ochat_items.cjs")

Items = list[dict[str, Any]]
# A frame as the translator made it, or as a client decoded it from the daemon's JSON.
Shown = Frame | Mapping[str, Any]
Show = Callable[..., list[list[Items]]]


def _text(frame: Shown) -> str:
    return json.dumps(frame) if isinstance(frame, Mapping) else encode_frame(frame).decode()


def normalizer() -> Show:
    """``show(feed, …)``: for each feed of frames, O Chat's items after each frame. Without the
    bundle or node the test is skipped (failed on CI)."""
    node = shutil.which("node")
    missing = None
    if not MAPPER.exists():
        missing = "O Chat's normalizer is not beside the checkout (../shared/reference/"
        missing += "connectonion-react/mapper.bundle.cjs)"
    elif node is None:
        missing = "node is not on PATH (O Chat's normalizer runs in node)"
    if missing is not None:
        unavailable(missing)
    assert node is not None

    def run(*feeds: Sequence[Shown]) -> list[list[Items]]:
        texts = [[_text(frame) for frame in feed] for feed in feeds]
        done = subprocess.run(
            [node, str(DRIVER), str(MAPPER)],
            input=json.dumps({"feeds": texts}),
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        out: list[list[Items]] = json.loads(done.stdout)["feeds"]
        return out

    return run
