"""The operator's writes in the back: binds never wait behind bookkeeping."""

from __future__ import annotations

import threading
import time

import pytest

from kai_ray.effects import scheduling_loop
from kai_ray.effects.kube import Urgency, WriteBacklog


class Writes:
    """Counts writes that hold until `until` is set (or `seconds` pass): how many
    ran at once at most, and how many ended."""

    def __init__(self, until: threading.Event, seconds: float) -> None:
        self.until, self.seconds = until, seconds
        self.busy = self.most = self.done = 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.busy += 1
            self.most = max(self.most, self.busy)
        self.until.wait(self.seconds)
        with self.lock:
            self.busy -= 1
            self.done += 1


def test_binds_go_out_while_bookkeeping_is_stuck_and_bookkeeping_is_bounded() -> None:
    stop, release = threading.Event(), threading.Event()
    backlog = WriteBacklog(workers=2, stop=stop, bookkeepers=2)
    slow_status = Writes(release, 10)
    try:
        for i in range(6):
            backlog.status("PodGroup", f"ns/g{i}", slow_status)
            backlog.later(slow_status, Urgency.EVENT)
        deadline = time.monotonic() + 5
        while slow_status.busy == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the bookkeepers are stuck before any bind arrives
        assert slow_status.busy >= 1, "no bookkeeper picked up a write"
        bound = [threading.Event() for _ in range(5)]
        for done in bound:
            backlog.later(done.set, Urgency.BIND)
        assert all(done.wait(5) for done in bound), "a bind waited behind bookkeeping"
        assert slow_status.most <= 2  # bookkeepers only, never a binder
    finally:
        release.set()
        stop.set()


def test_only_the_latest_status_of_an_object_is_written() -> None:
    stop, gate, written = threading.Event(), threading.Event(), []
    backlog = WriteBacklog(workers=1, stop=stop, bookkeepers=1)
    try:
        backlog.later(lambda: gate.wait(5), Urgency.EVENT)  # holds the one bookkeeper
        for body in ("first", "second", "third"):
            backlog.status("PodGroup", "ns/g", lambda b=body: written.append(b))
        done = threading.Event()
        backlog.later(done.set, Urgency.EVENT)
        gate.set()
        assert done.wait(5)
        assert written == ["third"]
    finally:
        stop.set()


def test_a_status_is_written_once_it_has_settled_and_only_its_latest_body() -> None:
    stop, written = threading.Event(), []
    backlog = WriteBacklog(workers=1, stop=stop, bookkeepers=2, status_settle_s=0.6)
    try:
        for body in ("Admitted", "bound", "Running"):  # a gang of a burst, within 0.3 s
            last_change = time.monotonic()
            backlog.status("PodGroup", "ns/g", lambda b=body: written.append((b, time.monotonic())))
            time.sleep(0.1)
        backlog.status("PodGroup", "ns/h", lambda: written.append(("other", time.monotonic())))
        backlog.status("Queue", "q", lambda: written.append(("queue", 0.0)), settle=False)
        assert backlog.pending() >= 2
        time.sleep(0.3)
        assert [body for body, _ in written] == ["queue"]  # PodGroups: not before they settle
        deadline = time.monotonic() + 5
        while len(written) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(body for body, _ in written) == ["Running", "other", "queue"]
        running = next(at for body, at in written if body == "Running")
        assert running - last_change >= 0.6  # settled: unchanged for 0.6 s
        assert backlog.pending() == 0
    finally:
        stop.set()


def test_a_status_that_keeps_changing_is_written_after_at_most_five_settle_periods() -> None:
    stop, written = threading.Event(), []
    backlog = WriteBacklog(workers=1, stop=stop, bookkeepers=1, status_settle_s=0.2)
    try:
        first = time.monotonic()
        while time.monotonic() - first < 2.5 and not written:
            backlog.status("PodGroup", "ns/g", lambda: written.append(time.monotonic()))
            time.sleep(0.05)
        assert written, "a status changing every 50 ms was never written"
        assert 0.9 <= written[0] - first <= 1.9
    finally:
        stop.set()


def test_while_binds_go_out_one_bookkeeper_works_and_the_rest_wait() -> None:
    stop, bind_gate, seen = threading.Event(), threading.Event(), threading.Event()
    backlog = WriteBacklog(workers=1, stop=stop, bookkeepers=3)
    status = Writes(seen, 0.05)

    try:
        backlog.later(lambda: bind_gate.wait(5), Urgency.BIND)  # a bind going out
        for i in range(6):
            backlog.status("PodGroup", f"ns/g{i}", status)
        time.sleep(1.0)  # six writes of 0.05 s, one bookkeeper at a time
        assert status.done == 6 and status.most == 1  # bookkeeping moved, one at a time
        bind_gate.set()
    finally:
        bind_gate.set()
        stop.set()


def test_a_cycle_hands_its_binds_over_early_only_while_the_writers_run_dry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The placement budget: 3 s of placing, or a quarter second while the bind
    writers have too little to do (a burst's first binds go out at once)."""
    clock = [100.0]
    monkeypatch.setattr(scheduling_loop.time, "monotonic", lambda: clock[0])
    idle = [True]
    budget = scheduling_loop._Budget(3.0, 0.25, lambda: idle[0])
    assert not budget()  # the clock starts at the first question
    clock[0] += 0.2
    assert not budget()
    clock[0] += 0.1
    assert budget()  # writers idle: spent after 0.25 s
    idle[0] = False
    busy = scheduling_loop._Budget(3.0, 0.25, lambda: idle[0])
    busy()
    clock[0] += 2.9
    assert not busy()  # writers busy: the cycle goes on placing
    clock[0] += 0.2
    assert busy()
    plain = scheduling_loop._Budget(3.0)
    plain()
    clock[0] += 2.9
    assert not plain()  # no writers to ask: the whole budget
