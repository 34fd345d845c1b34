"""``GET /v1/runs``: pages bounded in runs and in bytes, whatever the store holds, and followed
with ``before=`` they list every run once, newest first."""

from __future__ import annotations

import itertools
import re
import secrets
import time
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec

from codelegate.daemon.listing import LISTING_BYTES, Listing
from codelegate.daemon.record import RunState
from codelegate.daemon.store.queries import RunRecord
from codelegate.daemon.store.store import RunStore
from codelegate.policy.config import Config
from tests.daemon.conftest import BASE, Daemon, running_daemon

KiB = 1024


def _record(run_id: str, created_at: float, result_bytes: int | None) -> RunRecord:
    """A run that ended ``completed`` with a final result of about ``result_bytes`` (None: one
    still running, no result)."""
    rec = RunRecord(run_id=run_id, created_at=created_at, cwd="/srv/ws", mode="safe")
    if result_bytes is not None:
        text = secrets.token_hex(result_bytes // 2)
        result = {"run_id": run_id, "status": "completed", "result": text}
        rec.status, rec.finished_at, rec.exit_code = "completed", created_at + 1, 0
        rec.result = msgspec.Raw(msgspec.json.encode(result))
    return rec


async def _seed(store: RunStore, records: list[RunRecord]) -> None:
    for rec in records:
        await store.create_run(msgspec.structs.replace(rec, status="running", result=None))
        if rec.result is not None:
            await store.finish_run(rec)


async def _seeded(config: Config, sizes: list[int]) -> list[str]:
    """Runs of the last hour, a second apart, with results of ``sizes`` bytes in the store of
    ``config``, before the daemon opens it; their ids newest first."""
    start = time.time() - 3600
    records = [_record(f"run-{i:04}", start + i, n) for i, n in enumerate(sizes)]
    store = await RunStore.open(config.store.path)
    try:
        await _seed(store, records)
    finally:
        await store.close()
    return [rec.run_id for rec in reversed(records)]


async def _pages(d: Daemon, limit: int) -> list[tuple[bytes, dict[str, Any]]]:
    """Every page of the listing, followed by ``next_before``: (body, decoded)."""
    pages, before = [], ""
    while True:
        async with d.http.get(f"{BASE}/v1/runs?limit={limit}{before}") as resp:
            assert resp.status == 200
            body = await resp.read()
        pages.append((body, msgspec.json.decode(body)))
        cursor = pages[-1][1]["next_before"]
        if cursor is None:
            return pages
        before = f"&before={cursor}"


async def test_a_listing_of_many_large_results_stays_within_its_bytes_and_its_memory(
    config: Config, tmp_path: Path
) -> None:
    # 160 results of 64 KiB: 10 MiB, which the listing once read and answered in one piece.
    ids = await _seeded(config, [64 * KiB] * 160)
    async with running_daemon(config, tmp_path) as d:
        tracemalloc.start()
        try:
            async with d.http.get(f"{BASE}/v1/runs?limit=1000") as resp:
                body = await resp.read()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert resp.status == 200
        assert len(body) <= LISTING_BYTES
        # The store's rows, the runs encoded, the answer, what the client read: a few pages'
        # worth (3.8 MB measured), where answering the whole store at once took 45 MB.
        assert peak < 6 * LISTING_BYTES, f"{peak} bytes at the peak"
        page = msgspec.json.decode(body)
        listed = [run["run_id"] for run in page["runs"]]
        assert listed == ids[: len(listed)]
        assert page["next_before"] == listed[-1]
        # Each run whole, as GET /v1/runs/{id} answers it (the final result with it).
        async with d.http.get(f"{BASE}/v1/runs/{listed[0]}") as resp:
            assert page["runs"][0] == await resp.json()


async def test_following_next_before_lists_every_run_once_newest_first(
    config: Config, tmp_path: Path
) -> None:
    sizes = [(0, 1, 16, 200, 64)[i % 5] * KiB for i in range(60)]  # pages of a few to many
    ids = await _seeded(config, sizes)
    async with running_daemon(config, tmp_path) as d:
        for limit in (7, 1000):
            pages = await _pages(d, limit)
            assert all(len(body) <= LISTING_BYTES for body, _ in pages)
            assert all(len(page["runs"]) <= limit for _, page in pages)
            assert [run["run_id"] for _, page in pages for run in page["runs"]] == ids
            # A page ends where its runs or its bytes are full, never short of both.
            for (body, page), (_, following) in itertools.pairwise(pages):
                longer = len(body) + 1 + len(msgspec.json.encode(following["runs"][0]))
                assert len(page["runs"]) == limit or longer > LISTING_BYTES


async def test_a_run_larger_than_a_page_is_a_page_of_its_own(
    config: Config, tmp_path: Path
) -> None:
    ids = await _seeded(config, [1 * KiB, LISTING_BYTES + 1, 1 * KiB])
    async with running_daemon(config, tmp_path) as d:
        pages = await _pages(d, 50)
    assert [[run["run_id"] for run in page["runs"]] for _, page in pages] == [
        [ids[0]],
        [ids[1]],
        [ids[2]],
    ]
    assert len(pages[1][0]) > LISTING_BYTES  # whole, not cut


async def test_a_cursor_that_names_no_run_is_404(daemon: Daemon) -> None:
    status, body = await daemon.json("GET", "/v1/runs?before=no-such-run")
    assert (status, body["error"]["code"]) == (404, "run_not_found")
    status, body = await daemon.json("GET", "/v1/runs")
    assert (status, body) == (200, {"runs": [], "next_before": None})


async def test_a_run_memory_holds_and_the_store_not_yet_is_listed_once_in_its_place(
    tmp_path: Path,
) -> None:
    # Two stored runs of 400 KiB fill a page: the store's rows stop before a third.
    stored = [_record(f"s{i}", float(i), 400 * KiB) for i in range(1, 7)]
    unwritten = _record("m", 3.5, None)  # started, its row not written yet
    store = await RunStore.open(str(tmp_path / "store.db"))
    try:
        await _seed(store, stored)
        memory = {unwritten.run_id: unwritten}
        listing = Listing(
            store,
            held=memory.get,
            live=lambda: list(memory.values()),
            show=lambda rec: RunState(**msgspec.structs.asdict(rec)),
        )
        pages: list[list[str]] = []
        before = None
        while not pages or before is not None:
            page = msgspec.json.decode(await listing.page(50, before))
            pages.append([run["run_id"] for run in page["runs"]])
            before = page["next_before"]
    finally:
        await store.close()
    assert [run for page in pages for run in page] == ["s6", "s5", "s4", "m", "s3", "s2", "s1"]
    assert pages[0] == ["s6", "s5"]  # not "m" yet: "s4" and "s3" come before it


def test_the_readme_says_the_page_bound_the_daemon_applies() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    said = {int(n) for n in re.findall(r"(\d+) MiB of JSON", readme)}
    assert said == {LISTING_BYTES // (1024 * 1024)}
    assert LISTING_BYTES % (1024 * 1024) == 0
