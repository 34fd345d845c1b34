"""The disk is really full (a small tmpfs) when the daemon is told to stop: it says what it
could not write and exits 0, and after a restart no run reads ``completed`` without its frames.

Needs root for ``mount -t tmpfs`` (skipped otherwise; tests/store covers the same ordering with
an SQLite page limit)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.polling import until
from tests.reliability.conftest import cards_closed, stored_frames, stored_rows, wait_done
from tests.reliability.served import Served, write_config


@pytest.fixture
def small_disk(short_dir: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs: a real file system that fills up."""
    mount = short_dir / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace')}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk`` (until ENOSPC)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


def stored_status(db: Path) -> dict[str, tuple[str, int]]:
    rows = stored_rows(db, "SELECT run_id, status, last_seq FROM runs")
    return {r[0]: (str(r[1]), int(r[2])) for r in rows}


async def test_sigterm_on_a_full_disk_exits_zero_says_what_was_lost_and_keeps_order(
    small_disk: Path, tmp_path: Path
) -> None:
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    served = Served(write_config(small_disk, workspace), small_disk, home)
    served.log = tmp_path / "daemon.log"  # the log must not be on the full disk
    db = small_disk / "store.db"
    try:
        await served.start()
        status, body = await served.json(
            "POST", "/v1/runs", json={"task": "fake: tools n=40", "cwd": "."}
        )
        assert status == 202, body
        small_id = body["run_id"]
        status, body = await served.json(
            "POST", "/v1/runs", json={"task": "fake: tools n=20000 rate=4000", "cwd": "."}
        )
        assert status == 202, body
        flood_id = body["run_id"]

        async def state(run_id: str) -> dict[str, object]:
            code, st = await served.json("GET", f"/v1/runs/{run_id}")
            assert code == 200
            return dict(st)

        # The small run is done, and on disk, before the disk fills.
        await until(
            lambda: stored_status(db).get(small_id, ("", 0))[0] == "completed",
            30.0,
            what="the small run stored",
        )
        assert (await state(flood_id))["status"] == "running"
        fill(small_disk)
        # The flooding run goes on and completes, though the store can no longer write.
        done = await wait_done(served, flood_id)
        assert done["status"] == "completed"
        assert served.proc is not None
        await served.stop()
        assert served.proc.returncode == 0, served.log.read_text()[-3000:]
        lost = [
            json.loads(line)
            for line in served.log.read_text().splitlines()
            if '"store_unflushed"' in line
        ]
        assert len(lost) == 1, served.log.read_text()[-3000:]
        assert lost[0]["frames"] > 0
        assert lost[0]["final_statuses"] >= 1
        assert flood_id in lost[0]["runs"]

        os.unlink(small_disk / "filler")  # space comes back; the daemon starts again
        await served.start()
        flood = await state(flood_id)
        small = await state(small_id)
        flood_frames = await served.events(flood_id)
        small_frames = await served.events(small_id)
    finally:
        await served.stop()
    # The run whose finish could not be written with its frames reads interrupted, with the
    # gapless prefix that was stored and recovery's closing frames; never completed with a gap.
    assert flood["status"] == "interrupted"
    cards_closed(flood_frames)
    assert len(flood_frames) < 20_000
    assert small["status"] == "completed"
    cards_closed(small_frames)
    assert stored_frames(str(db), small_id) == small_frames
    for run_id, (status, last_seq) in stored_status(db).items():
        frames = stored_frames(str(db), run_id)
        assert [f["seq"] for f in frames] == list(range(1, last_seq + 1)), run_id
        if status == "completed":
            assert frames[-1]["type"] == "run_result"
