"""The hub alone: snapshot + live without gap or duplicate, lagging subscribers dropped, each
batch encoded once and written out once per tick, or once per window when a crowd follows."""

from __future__ import annotations

import asyncio
import random

import pytest

from codelegate.daemon import hub as hub_module
from codelegate.daemon.deliveries import (
    REPLAY_PAGE,
    Batch,
    Control,
    Delivery,
    Item,
    Replay,
    frames,
)
from codelegate.daemon.hub import WINDOW_MIN_SUBSCRIBERS, Hub
from codelegate.daemon.runlog import RunLog
from codelegate.daemon.subscriber import (
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL_ERROR,
    CLOSE_LAGGING,
    Subscriber,
)
from codelegate.daemon.wsframe import text_frame


class FakeRun:
    """A run's side of the contract, through its real log: frames one at a time, and a
    subscribe that reads the log and joins the hub in one step (as the daemon's door does)."""

    def __init__(self, hub: Hub, run_id: str = "r1", keep: int = 1 << 30) -> None:
        self.hub = hub
        self.run_id = run_id
        self.log = RunLog(run_id, hub, keep)

    def emit(self, *, last: bool = False) -> None:
        seq = self.log.last_seq + 1
        self.log.publish([Delivery(self.run_id, seq, b'{"seq":%d}' % seq, last)])

    def subscribe(self, sub: Subscriber, after: int) -> None:
        self.hub.join(sub, self.run_id, self.log.after(after), after)


async def published(n: int) -> FakeRun:
    """A run of a new hub that has published ``n`` frames, written out."""
    run = FakeRun(Hub())
    for _ in range(n):
        run.emit()
    await asyncio.sleep(0)
    return run


async def drain(sub: Subscriber, until_seq: int) -> list[int]:
    seqs: list[int] = []
    while not seqs or seqs[-1] < until_seq:
        items = await sub.get()
        if not items:
            break
        seqs.extend(d.seq for d in frames(items))
    return seqs


async def test_snapshot_plus_live_has_no_gap_and_no_duplicate() -> None:
    hub = Hub()
    run = FakeRun(hub)
    total = 500
    rng = random.Random(7)  # noqa: S311 - reproducible interleaving, not crypto
    subs: list[tuple[Subscriber, int]] = []

    async def publisher() -> None:
        for _ in range(total):
            run.emit()
            if rng.random() < 0.3:
                await asyncio.sleep(0)

    async def joiner() -> None:
        for _ in range(40):
            after = rng.randint(0, len(run.log))
            sub = Subscriber(max_queue=total + 1)
            run.subscribe(sub, after)
            subs.append((sub, after))
            await asyncio.sleep(0)

    await asyncio.gather(publisher(), joiner())
    for sub, after in subs:
        seqs = await drain(sub, total)
        assert seqs == list(range(after + 1, total + 1))


async def test_slow_subscriber_is_closed_and_others_get_everything() -> None:
    hub = Hub()
    run = FakeRun(hub)
    slow = Subscriber(max_queue=16, name="slow")
    fast = Subscriber(max_queue=16, name="fast")
    run.subscribe(slow, 0)
    run.subscribe(fast, 0)
    got: list[int] = []

    async def fast_reader() -> None:
        got.extend(await drain(fast, 100))

    reader = asyncio.create_task(fast_reader())
    for _ in range(100):
        run.emit()
        await asyncio.sleep(0)  # the fast reader keeps up; the slow one never reads
    await reader
    assert got == list(range(1, 101))
    assert slow.closed
    assert slow.close_code == CLOSE_LAGGING
    assert "after=" in slow.close_reason
    assert await slow.get() == []
    assert hub.stats.subscribers_dropped == 1
    assert hub.subscriber_count == 1


async def test_lag_reason_names_the_last_seq_delivered() -> None:
    hub = Hub()
    run = FakeRun(hub)
    sub = Subscriber(max_queue=16)
    run.subscribe(sub, 0)
    for _ in range(3):
        run.emit()
    for item in await sub.get():
        sub.sent(item)
    assert sub.last_seq == {"r1": 3}
    for _ in range(16):
        run.emit()
    hub.hand_out()  # one write-out: 16 queued, the bound
    assert not sub.closed
    run.emit()
    hub.hand_out()  # the next one finds the queue still full
    assert sub.close_reason == "lagging, reconnect with after=3"


async def test_follow_all_sees_new_runs_once_even_if_also_subscribed() -> None:
    hub = Hub()
    a, b = FakeRun(hub, "a"), FakeRun(hub, "b")
    sub = Subscriber(max_queue=100)
    hub.join_all(sub, [])
    a.subscribe(sub, 0)
    a.emit()
    b.emit()
    items = await sub.get()
    assert [(d.run_id, d.seq) for d in frames(items)] == [("a", 1), ("b", 1)]
    hub.leave(sub, "*")
    b.emit()
    a.emit()
    items = await sub.get()
    assert [(d.run_id, d.seq) for d in frames(items)] == [("a", 2)]


async def test_close_all_goes_away_and_wakes_waiters() -> None:
    hub = Hub()
    sub = Subscriber(max_queue=4)
    hub.attach(sub)
    waiter = asyncio.create_task(sub.get())
    await asyncio.sleep(0)
    hub.close_all(CLOSE_GOING_AWAY, "bye")
    assert await waiter == []
    assert sub.close_code == CLOSE_GOING_AWAY
    assert hub.subscriber_count == 0


async def test_replay_and_control_messages_do_not_count_against_the_bound() -> None:
    hub = Hub()
    run = FakeRun(hub)
    for _ in range(50):
        run.emit()
    sub = Subscriber(max_queue=16)
    run.subscribe(sub, 0)
    sub.control(b'{"type":"subscribed"}')
    run.emit()
    hub.hand_out()
    assert not sub.closed
    items = await sub.get()
    assert len(items) == 52


def test_text_frame_headers_follow_rfc6455_lengths() -> None:
    assert text_frame(b"") == b"\x81\x00"
    assert text_frame(b"x" * 125)[:2] == b"\x81\x7d"
    assert text_frame(b"x" * 126)[:4] == b"\x81\x7e\x00\x7e"
    assert text_frame(b"x" * 65535)[:4] == b"\x81\x7e\xff\xff"
    big = text_frame(b"x" * 65536)
    assert big[:10] == b"\x81\x7f" + (65536).to_bytes(8, "big")
    assert len(big) == 10 + 65536


async def test_a_batch_is_one_shared_item_encoded_once() -> None:
    hub = Hub()
    a, b = Subscriber(max_queue=16), Subscriber(max_queue=16)
    hub.join(a, "r1", [])
    hub.join(b, "r1", [])
    hub.publish_batch("r1", [Delivery("r1", 1, b"one")])
    hub.publish_batch("r1", [Delivery("r1", 2, b"two", last=True)])
    assert a.take() == []  # gathered until the write-out
    hub.hand_out()
    (item_a,) = a.take()  # both chunks, as one item
    (item_b,) = b.take()
    assert item_a is item_b
    assert isinstance(item_a, Batch)
    assert isinstance(item_b, Batch)
    assert item_a.ws is item_b.ws  # built once, for both
    assert item_a.ws == text_frame(b"one") + text_frame(b"two")
    assert item_a.ndjson == b"one\ntwo\n"
    assert item_a.last
    assert hub.stats.frames_queued == 4


async def test_a_batch_straddling_the_floor_is_cut_for_that_subscriber() -> None:
    hub = Hub()
    sub = Subscriber(max_queue=16)
    hub.join(sub, "r1", [], after=5)
    hub.publish_batch("r1", [Delivery("r1", s, b"%d" % s) for s in (1, 2, 3)])
    hub.publish_batch("r1", [Delivery("r1", s, b"%d" % s) for s in (4, 5)])
    hub.hand_out()
    assert sub.take() == []  # nothing queued: it has all of these
    # a later join may name a seq inside the next batch
    sub.floor["r1"] = 6
    hub.publish_batch("r1", [Delivery("r1", s, b"%d" % s) for s in (6, 7, 8)])
    hub.hand_out()
    items = sub.take()
    assert [d.seq for d in frames(items)] == [7, 8]
    assert sub.backlog == 0


class FakeSink:
    def __init__(self) -> None:
        self.open = True
        self.writes: list[list[int]] = []
        self.wrote = asyncio.Event()

    def ready(self) -> bool:
        return self.open

    def write(self, items: list[Item]) -> None:
        self.writes.append([d.seq for d in frames(items)])
        self.wrote.set()

    def write_batch(self, batch: Batch) -> bool:
        if self.open:
            self.write([batch])
        return self.open


def _with_sink(
    run: FakeRun, max_queue: int, sink: FakeSink | None = None
) -> tuple[Subscriber, FakeSink]:
    """A client of ``run`` whose connection the hub may write directly, and its sink."""
    sub = Subscriber(max_queue=max_queue)
    sub.sink = sink = sink or FakeSink()
    run.subscribe(sub, 0)
    return sub, sink


async def test_a_ready_sink_gets_everything_of_a_tick_in_one_write() -> None:
    hub = Hub()
    run = FakeRun(hub)
    sub, sink = _with_sink(run, 16)
    for _ in range(3):
        run.emit()
    assert sink.writes == []  # written at the end of the tick, not per publish
    await asyncio.sleep(0)  # one loop tick: the hub's flush runs before this task resumes
    assert sink.writes == [[1, 2, 3]]
    assert sub.last_seq == {"r1": 3}
    assert sub.backlog == 0
    run.emit()
    await asyncio.sleep(0)
    assert sink.writes == [[1, 2, 3], [4]]


async def test_a_paused_sink_leaves_frames_to_the_writer_and_then_lags() -> None:
    hub = Hub()
    run = FakeRun(hub)
    sub, sink = _with_sink(run, 8)
    run.emit()
    await asyncio.sleep(0)
    sink.open = False  # the client stopped reading: its transport is paused
    waiter = asyncio.create_task(sub.wait())
    for _ in range(8):
        run.emit()
    assert await waiter  # the writer task is woken to wait for that client alone
    assert sink.writes == [[1]]
    assert sub.backlog == 8
    run.emit()  # queue full as the next batch comes: closed, naming the last seq written
    hub.hand_out()
    assert sub.closed
    assert sub.close_code == CLOSE_LAGGING
    assert sub.close_reason == "lagging, reconnect with after=1"
    assert not await sub.wait()


class BrokenSink(FakeSink):
    def write_batch(self, batch: Batch) -> bool:
        raise RuntimeError("the handler is closed")


async def test_a_sink_that_fails_closes_its_subscriber_only() -> None:
    hub = Hub()
    run = FakeRun(hub)
    broken, _ = _with_sink(run, 16, BrokenSink())
    _, sink = _with_sink(run, 16)
    run.emit()
    await asyncio.sleep(0)
    assert broken.closed
    assert broken.close_code == CLOSE_INTERNAL_ERROR
    assert sink.writes == [[1]]
    run.emit()
    await asyncio.sleep(0)
    assert sink.writes == [[1], [2]]
    assert hub.subscriber_count == 1


async def _crowd_written_once(
    monkeypatch: pytest.MonkeyPatch, per_subscriber: float, cap: float
) -> tuple[Hub, FakeRun, list[FakeSink]]:
    """A run followed by enough ready clients for a window, after its first write-out."""
    monkeypatch.setattr(hub_module, "WINDOW_PER_SUBSCRIBER", per_subscriber)
    monkeypatch.setattr(hub_module, "WINDOW_MAX", cap)
    hub = Hub()
    run = FakeRun(hub)
    sinks = [_with_sink(run, 64)[1] for _ in range(WINDOW_MIN_SUBSCRIBERS)]
    run.emit()
    await asyncio.sleep(0)  # the first write-out comes at the end of the tick
    assert all(sink.writes == [[1]] for sink in sinks)
    return hub, run, sinks


async def test_a_crowded_run_is_written_once_per_window(monkeypatch: pytest.MonkeyPatch) -> None:
    hub, run, sinks = await _crowd_written_once(monkeypatch, 3600.0, 3600.0)  # no timer fires
    for _ in range(3):
        run.emit()
        await asyncio.sleep(0)  # ticks pass, but the window since that write-out has not
    assert all(sink.writes == [[1]] for sink in sinks)
    hub.close_all(CLOSE_GOING_AWAY, "bye")  # hands out what is gathered before closing
    assert all(sink.writes == [[1], [2, 3, 4]] for sink in sinks)


async def test_a_crowded_run_is_written_when_its_window_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, run, sinks = await _crowd_written_once(monkeypatch, 1.0, 0.01)
    sinks[0].wrote.clear()
    run.emit()
    run.emit()
    async with asyncio.timeout(30):  # nothing but the hub's timer writes it out
        await sinks[0].wrote.wait()
    assert all(sink.writes == [[1], [2, 3]] for sink in sinks)


async def test_a_new_subscriber_gets_gathered_frames_once_from_its_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub, run, sinks = await _crowd_written_once(monkeypatch, 3600.0, 3600.0)
    run.emit()  # gathered, not yet written out
    late = Subscriber(max_queue=64)
    run.subscribe(late, 0)  # its snapshot holds frame 2; the others get it now
    assert all(sink.writes == [[1], [2]] for sink in sinks)
    run.emit()
    hub.hand_out()
    assert [d.seq for d in frames(late.take())] == [1, 2, 3]


async def test_a_repeated_subscribe_replaces_what_is_still_queued_for_the_run() -> None:
    run = await published(300)
    sub = Subscriber(max_queue=1024)
    for _ in range(50):  # a client that never reads, repeating subscribe
        run.hub.leave(sub, run.run_id)
        run.subscribe(sub, 0)
    run.emit()  # and a live frame after the last subscribe
    await asyncio.sleep(0)
    assert [d.seq for d in frames(sub.take())] == list(range(1, 302))


async def test_writers_take_a_replay_a_page_at_a_time() -> None:
    run = await published(1000)
    sub = Subscriber(max_queue=1024)
    run.subscribe(sub, 0)
    pages = []
    while not sub.idle:
        pages.append([d.seq for d in frames(await sub.get(sub.page))])
    assert [len(p) for p in pages] == [REPLAY_PAGE] * 3 + [1000 - 3 * REPLAY_PAGE]
    assert [s for p in pages for s in p] == list(range(1, 1001))
    assert sub._replayed == 0  # live batches go the fast way again


async def test_a_stored_replay_is_read_a_page_at_a_time_as_the_writer_asks() -> None:
    stored = [Delivery("r1", s, b"%d" % s) for s in range(1, 1001)]
    fetches: list[tuple[int, int]] = []

    gate = asyncio.Event()
    gate.set()

    async def fetch(after: int, limit: int) -> list[Delivery]:
        fetches.append((after, limit))
        await gate.wait()  # a store read takes a while
        return [d for d in stored if d.seq > after][:limit]

    hub = Hub()
    sub = Subscriber(max_queue=100)  # the page follows the live bound
    live = [Delivery("r1", s, b"%d" % s) for s in (701, 702)]
    hub.join(sub, "r1", live, 0, stored=Replay("r1", fetch, 0, upto=700))
    assert fetches == []  # nothing is read before a writer asks
    first = await sub.get(sub.page)
    assert [d.seq for d in frames(first)] == list(range(1, 101))
    assert fetches == [(0, 100)]
    seqs = [d.seq for d in frames(first)]
    while not sub.idle:
        seqs.extend(d.seq for d in frames(await sub.get(sub.page)))
    assert seqs == list(range(1, 703))
    assert len(fetches) == 7
    assert sub.replay_pages == 7
    # A newer subscribe while a page is being read: the old replay's page is dropped.
    sub2 = Subscriber(max_queue=100)
    hub.join(sub2, "r1", [], 0, stored=Replay("r1", fetch, 0))
    gate.clear()
    reading = asyncio.ensure_future(sub2.get(sub2.page))
    await asyncio.sleep(0)
    assert fetches[-1] == (0, 100)  # being read
    hub.leave(sub2, "r1")
    hub.join(sub2, "r1", [], 990, stored=Replay("r1", fetch, 990))
    gate.set()
    assert await reading == []
    assert [d.seq for d in frames(await sub2.get(sub2.page))] == list(range(991, 1001))
    assert sub2.idle
    assert (sub._replayed, sub2._replayed) == (0, 0)


async def test_a_client_sending_messages_without_reading_the_answers_is_closed_as_lagging() -> None:
    sub = Subscriber(max_queue=16)
    for _ in range(16):
        sub.control(b'{"type":"subscribed"}')
    assert not sub.closed
    assert len(sub.take()) == 16  # read: room again
    for _ in range(17):
        sub.control(b'{"type":"subscribed"}')
    assert sub.closed
    assert sub.close_code == CLOSE_LAGGING


async def test_a_run_log_trims_to_its_bound_and_answers_after_a_seq() -> None:
    hub = Hub()
    log = RunLog("r1", hub, keep=8)
    assert (log.first_seq, log.last_seq, log.ended) == (0, 0, False)
    log.publish([Delivery("r1", s, b"%d" % s) for s in range(1, 11)])
    assert len(log) == 10  # within the quarter beyond keep: not trimmed yet
    log.publish([Delivery("r1", 11, b"11", last=True)])
    assert (len(log), log.first_seq, log.last_seq) == (8, 4, 11)
    assert log.ended
    assert [d.seq for d in log.after(9)] == [10, 11]
    assert log.trimmed_after(2)  # frame 3 is the store's now
    assert not log.trimmed_after(3)
    assert hub.stats.frames_published == 11  # every frame published, trimmed or not


def test_each_item_knows_its_wire_bytes() -> None:
    d = Delivery("r1", 1, b'{"a":1}')
    batch = Batch("r1", [d, Delivery("r1", 2, b"[]")])
    control = Control(b'{"type":"subscribed"}')
    assert (d.ws, d.ndjson) == (text_frame(b'{"a":1}'), b'{"a":1}\n')
    assert batch.ndjson == b'{"a":1}\n[]\n'
    assert list(batch.payloads) == [b'{"a":1}', b"[]"]
    assert (control.ws, control.ndjson) == (text_frame(control.data), b"")  # no NDJSON form
    assert list(frames([control, batch, d])) == [d, batch.frames[1], d]
    sub = Subscriber(max_queue=4)
    sub.sent(control)  # a control message names no frame to resume after
    sub.sent(batch)
    assert sub.last_seq == {"r1": 2}
