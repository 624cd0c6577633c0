"""Our own status writes coming back through the watch are kept in the cache but
wake no cycle (the simulator runs none for them either); any other change does."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kai_ray.effects.scheduling_loop import LoopOptions, SchedulingLoop
from kai_ray.state.cache import POD_GROUP, QUEUE
from kai_ray.values.config import SchedulerConfig


def _group() -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.kai-ray.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "g", "namespace": "ns", "resourceVersion": "1", "labels": {"a": "b"}},
        "spec": {"queue": "team-a", "minMember": 2},
        "status": {"phase": "Pending"},
    }


def _queue() -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.kai-ray.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": "team-a", "resourceVersion": "1"},
        "spec": {"resources": {"gpu": {"quota": 8}}},
        "status": {"usage": {"nvidia.com/gpu": "1"}},
    }


def _loop_with(kind: str, obj: dict[str, Any]) -> SchedulingLoop:
    loop = SchedulingLoop(None, LoopOptions(config=SchedulerConfig(), leader_elect=False))  # type: ignore[arg-type]
    loop._on_event(kind, "ADDED", obj)
    assert loop.changed.is_set(), "a new object wakes the loop"
    loop.changed.clear()
    return loop


def _status_written(obj: dict[str, Any]) -> dict[str, Any]:
    after = copy.deepcopy(obj)
    after["metadata"]["resourceVersion"] = "2"
    after["metadata"]["managedFields"] = [{"manager": "kai-ray", "subresource": "status"}]
    after["status"] = {"phase": "Running", "reason": "written back"}
    return after


def _spec_changed(obj: dict[str, Any]) -> dict[str, Any]:
    after = _status_written(obj)
    after["spec"] = {**after["spec"], "priorityClassName": "inference"}
    return after


def _labelled(obj: dict[str, Any]) -> dict[str, Any]:
    after = _status_written(obj)
    after["metadata"]["labels"] = {"a": "c"}
    return after


@pytest.mark.parametrize(("kind", "make"), [(POD_GROUP, _group), (QUEUE, _queue)])
def test_a_status_written_back_is_kept_but_wakes_no_cycle(kind: str, make: Any) -> None:
    obj = make()
    loop = _loop_with(kind, obj)
    after = _status_written(obj)
    loop._on_event(kind, "MODIFIED", after)
    assert not loop.changed.is_set()
    key = "ns/g" if kind == POD_GROUP else "team-a"
    assert loop.cache.get(kind, key) == after, "the cache holds the status written"


@pytest.mark.parametrize("change", [_spec_changed, _labelled], ids=["spec", "labels"])
@pytest.mark.parametrize(("kind", "make"), [(POD_GROUP, _group), (QUEUE, _queue)])
def test_any_other_change_wakes_the_loop(kind: str, make: Any, change: Any) -> None:
    obj = make()
    loop = _loop_with(kind, obj)
    loop._on_event(kind, "MODIFIED", change(obj))
    assert loop.changed.is_set()


def test_a_deletion_wakes_the_loop() -> None:
    obj = _group()
    loop = _loop_with(POD_GROUP, obj)
    loop._on_event(POD_GROUP, "DELETED", obj)
    assert loop.changed.is_set()
    assert loop.cache.get(POD_GROUP, "ns/g") is None
