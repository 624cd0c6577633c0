"""The scheduling loop's pause between cycles: a pod that comes to an idle cluster is
placed at once; a cluster with gangs waiting keeps the cycle period."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from kai_ray.effects.scheduling_loop import LoopOptions, SchedulingLoop
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.names import QUEUE_LABEL
from tests.builders import make_node, make_pod, make_queue

PERIOD_S = 3.0


class InstantApi:
    """Every write answers at once; a bind comes back as the pod's watch event."""

    def __init__(self) -> None:
        self.loop: SchedulingLoop | None = None
        self.pods: dict[str, dict[str, Any]] = {}
        self.bound_at: dict[str, float] = {}

    def call(
        self,
        method: str,
        path: str,
        query: Any = None,
        body: Any = None,
        content_type: str = "",
    ) -> Any:
        parts = path.strip("/").split("/")
        if method == "POST" and parts[-1] == "binding" and self.loop is not None:
            key = f"{parts[-4]}/{parts[-2]}"
            pod = self.pods[key]
            pod = {**pod, "spec": {**pod["spec"], "nodeName": body["target"]["name"]}}
            self.bound_at[key] = time.monotonic()
            self.loop._on_event("Pod", "MODIFIED", pod)
        return body if method == "POST" and parts[-1] == "podgroups" else {}

    def add(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta.setdefault("resourceVersion", "1")
        self.pods[f"{meta['namespace']}/{meta['name']}"] = pod
        assert self.loop is not None
        self.loop._on_event("Pod", "ADDED", pod)


@pytest.fixture
def running() -> Iterator[tuple[SchedulingLoop, InstantApi]]:
    api = InstantApi()
    config = SchedulerConfig.model_validate({"spec": {"cyclePeriod": f"{PERIOD_S:g}s"}})
    loop = SchedulingLoop(api, LoopOptions(config=config, leader_elect=False))  # type: ignore[arg-type]
    api.loop = loop
    loop._on_list("Node", [make_node("n0").gpus(8).build()])
    loop._on_list("Queue", [make_queue("team").build()])
    for kind in ("PodGroup", "Pod", "Topology"):
        loop._on_list(kind, [])
    loop.synced = lambda: True  # type: ignore[method-assign]
    loop._thread.start()
    try:
        yield loop, api
    finally:
        loop.stop()


def _in_a_pause(loop: SchedulingLoop) -> None:
    """Make the loop run a cycle just after a period starts: after it, the loop
    pauses for most of the period (a change while it waits on no pause would
    start a cycle at once, with or without the early wake)."""
    time.sleep(0.3)  # its first cycle is done
    while time.monotonic() % PERIOD_S > 0.2:
        time.sleep(0.02)
    loop._on_event("Queue", "MODIFIED", make_queue("other").build())  # a cycle now
    time.sleep(0.3)


def _pod(name: str, gpus: int) -> dict[str, Any]:
    pod = make_pod(name).label(QUEUE_LABEL, "team").gpus(gpus).scheduler("kai-ray").build()
    pod.setdefault("status", {"phase": "Pending"})
    return pod


def test_a_pod_coming_to_an_idle_cluster_is_bound_well_within_the_period(
    running: tuple[SchedulingLoop, InstantApi],
) -> None:
    loop, api = running
    _in_a_pause(loop)
    came = time.monotonic()
    api.add(_pod("p", 1))
    deadline = came + PERIOD_S
    while "default/p" not in api.bound_at and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "default/p" in api.bound_at
    assert api.bound_at["default/p"] - came < PERIOD_S / 3, "it waited for the period"


def test_with_a_gang_waiting_a_new_pod_waits_for_the_next_period(
    running: tuple[SchedulingLoop, InstantApi],
) -> None:
    loop, api = running
    api.add(_pod("huge", 16))  # never fits the 8-GPU node: always waiting
    time.sleep(0.5)
    _in_a_pause(loop)
    came = time.monotonic()
    api.add(_pod("p", 1))
    deadline = came + 2 * PERIOD_S
    while "default/p" not in api.bound_at and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "default/p" in api.bound_at
    waited = api.bound_at["default/p"] - came
    assert PERIOD_S / 2 < waited < PERIOD_S + 1, waited
    assert "default/huge" not in api.bound_at
