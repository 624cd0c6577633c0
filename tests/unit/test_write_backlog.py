"""The operator's writes in the back: binds never wait behind bookkeeping."""

from __future__ import annotations

import threading

from kai_ray.effects.kube import Urgency, WriteBacklog


def test_binds_go_out_while_bookkeeping_is_stuck_and_bookkeeping_is_bounded() -> None:
    stop, release = threading.Event(), threading.Event()
    backlog = WriteBacklog(workers=2, stop=stop, bookkeepers=2)
    busy, most, lock = [0], [0], threading.Lock()

    def slow_status() -> None:
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        release.wait(10)
        with lock:
            busy[0] -= 1

    try:
        for i in range(6):
            backlog.status("PodGroup", f"ns/g{i}", slow_status)
            backlog.later(slow_status, Urgency.EVENT)
        bound = [threading.Event() for _ in range(5)]
        for done in bound:
            backlog.later(done.set, Urgency.BIND)
        assert all(done.wait(5) for done in bound), "a bind waited behind bookkeeping"
        assert 1 <= most[0] <= 2  # bookkeepers only, never a binder
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


def test_while_binds_go_out_one_bookkeeper_works_and_the_rest_wait() -> None:
    stop, bind_gate, seen = threading.Event(), threading.Event(), threading.Event()
    backlog = WriteBacklog(workers=1, stop=stop, bookkeepers=3)
    busy, most, done, lock = [0], [0], [0], threading.Lock()

    def status() -> None:
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        seen.wait(0.05)
        with lock:
            busy[0] -= 1
            done[0] += 1

    try:
        backlog.later(lambda: bind_gate.wait(5), Urgency.BIND)  # a bind going out
        for i in range(6):
            backlog.status("PodGroup", f"ns/g{i}", status)
        deadline = threading.Event()
        deadline.wait(1.0)
        assert done[0] == 6 and most[0] == 1  # bookkeeping moved, one writer at a time
        bind_gate.set()
    finally:
        bind_gate.set()
        stop.set()
